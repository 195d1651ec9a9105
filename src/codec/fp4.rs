//! 4-bit E2M1 elements and the E8M0 power-of-two scale of the OCP MX formats. The block-scaled
//! tensors built from them are in [`super::nvfp4`] and [`super::mxfp4`].

use super::minifloat::{pow2, Minifloat};

/// E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6};
/// no inf, no NaN. A code is the low nibble of a byte, sign in bit 3.
pub mod e2m1 {
    use super::*;

    const FORMAT: Minifloat = Minifloat { man_bits: 1, bias: 1 };
    pub const MAX: f32 = 6.0;
    pub const MAX_CODE: u8 = 0x7;
    const SIGN: u8 = 0x8;

    /// Nearest E2M1 code, ties to even, saturating to ±6 (also for ±inf).
    ///
    /// Ties: 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4. (Threshold
    /// encoders that test `|x| >= midpoint` round every tie up and so differ at exactly these
    /// seven magnitudes; device `cvt.rn.satfinite.e2m1x2.f32` rounds to even, as here.)
    /// NaN has no E2M1 code: it is treated as an overflow and gives ±6 with its sign bit; the
    /// tensor quantizers reject non-finite input before it gets here.
    pub fn encode(x: f32) -> u8 {
        let sign = if x.is_sign_negative() { SIGN } else { 0 };
        let a = x.abs();
        if !a.is_finite() {
            return sign | MAX_CODE;
        }
        let code = FORMAT.encode_magnitude(a).min(MAX_CODE as u32) as u8;
        sign | code
    }

    /// Value of the low nibble of `code` (the high nibble is ignored).
    pub fn decode(code: u8) -> f32 {
        let v = FORMAT.decode_magnitude((code & MAX_CODE) as u32);
        if code & SIGN != 0 {
            -v
        } else {
            v
        }
    }
}

/// E8M0: an unsigned biased exponent, value `2^(code - 127)`, code 255 = NaN; no zero.
pub mod e8m0 {
    use super::*;

    pub const NAN_CODE: u8 = 255;

    pub fn decode(code: u8) -> f32 {
        if code == NAN_CODE {
            return f32::NAN;
        }
        pow2(code as i32 - 127)
    }

    /// Code of `2^exponent`, the exponent clamped to the representable `[-127, 127]`.
    pub fn from_exponent(exponent: i32) -> u8 {
        (exponent.clamp(-127, 127) + 127) as u8
    }
}

/// What a kernel reads of a block-scaled 4-bit tensor ([`super::nvfp4::Nvfp4Tensor`],
/// [`super::mxfp4::Mxfp4Tensor`]): row-major `[rows, cols]` E2M1 codes packed two per byte
/// (element `2i` in the low nibble), one scale code per `BLOCK` consecutive elements of a row
/// (`[rows, cols / BLOCK]`), one f32 tensor scale. Element `(r, c)` is
/// `(e2m1 · decode_scale(scale)) · tensor_scale`.
pub trait BlockScaled4 {
    /// Elements sharing one scale.
    const BLOCK: usize;
    fn cols(&self) -> usize;
    fn packed(&self) -> &[u8];
    fn scale_codes(&self) -> &[u8];
    /// The value of a scale code.
    fn decode_scale(code: u8) -> f32;
    fn tensor_scale(&self) -> f32;
    /// Element `(r, c)`: `(e2m1 · decode_scale(scale)) · tensor_scale`.
    fn element(&self, r: usize, c: usize) -> f32 {
        let i = r * self.cols() + c;
        let code = self.packed()[i / 2] >> (4 * (i % 2));
        (e2m1::decode(code) * Self::decode_scale(self.scale_codes()[i / Self::BLOCK])) * self.tensor_scale()
    }
}

/// `floor(log2(a))` of a positive finite f32, read from its bits (exact, subnormals included).
pub(crate) fn floor_log2(a: f32) -> i32 {
    let bits = a.to_bits() & 0x7FFF_FFFF;
    let exp_field = (bits >> 23) as i32;
    if exp_field != 0 {
        exp_field - 127
    } else {
        -149 + (31 - bits.leading_zeros() as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The E2M1 magnitudes as the OCP MX spec tabulates them.
    const TABLE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

    #[test]
    fn e2m1_all_codes() {
        for c in 0..16u8 {
            let expected = if c & 8 != 0 { -TABLE[(c & 7) as usize] } else { TABLE[(c & 7) as usize] };
            let v = e2m1::decode(c);
            assert_eq!(v, expected, "{c:#x}");
            assert_eq!(v.is_sign_negative(), c & 8 != 0, "sign of {c:#x}");
            assert_eq!(e2m1::encode(v), c, "round trip {c:#x}");
        }
    }

    #[test]
    fn e2m1_midpoints_ties_and_neighbours() {
        for i in 0..7usize {
            let (lo, hi) = (TABLE[i], TABLE[i + 1]);
            let mid = (lo + hi) / 2.0;
            let even = if i % 2 == 0 { i } else { i + 1 } as u8;
            for (sign, s) in [(0u8, 1.0f32), (8, -1.0)] {
                assert_eq!(e2m1::encode(s * mid), sign | even, "tie {lo}..{hi}");
                assert_eq!(e2m1::encode(s * mid.next_up()), sign | (i as u8 + 1), "above {mid}");
                assert_eq!(e2m1::encode(s * mid.next_down()), sign | i as u8, "below {mid}");
            }
        }
        // The seven ties, spelled out.
        let ties = [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)];
        for (x, v) in ties {
            assert_eq!(e2m1::decode(e2m1::encode(x)), v, "{x}");
        }
    }

    #[test]
    fn e2m1_saturates() {
        assert_eq!(e2m1::encode(7.0), 0x7);
        assert_eq!(e2m1::encode(1e30), 0x7);
        assert_eq!(e2m1::encode(-100.0), 0xF);
        assert_eq!(e2m1::encode(f32::INFINITY), 0x7);
        assert_eq!(e2m1::encode(f32::NEG_INFINITY), 0xF);
        assert_eq!(e2m1::encode(-0.0), 0x8);
        assert_eq!(e2m1::encode(0.1), 0x0);
    }

    #[test]
    fn e8m0_all_codes() {
        for c in 0..=255u8 {
            let v = e8m0::decode(c);
            if c == 255 {
                assert!(v.is_nan());
            } else {
                assert_eq!(v as f64, 2f64.powi(c as i32 - 127), "{c}");
                assert_eq!(e8m0::from_exponent(c as i32 - 127), c);
            }
        }
        assert_eq!(e8m0::from_exponent(-300), 0);
        assert_eq!(e8m0::from_exponent(300), 254);
    }

    #[test]
    fn floor_log2_matches_f64() {
        for a in [1.0f32, 1.5, 2.0, 0.3, 6.0, 448.0, 1e-40, f32::from_bits(1), f32::MAX, 0.999] {
            assert_eq!(floor_log2(a), (a as f64).log2().floor() as i32, "{a}");
        }
    }
}
