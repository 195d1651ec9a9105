//! OCP 8-bit floats: E4M3 (`float8_e4m3fn`), E5M2 (`float8_e5m2`) and the unsigned UE4M3 used
//! for NVFP4 block scales. Encoding rounds to nearest, ties to even, subnormals included, as
//! the device conversions `cvt.rn{.satfinite}.e4m3x2/e5m2x2.f32` do.
//!
//! Rounding is done on the format's grid extended past its largest finite value, so the
//! overflow threshold is the midpoint between `max` and the next (unrepresentable) grid point,
//! with ties going to the even one:
//! * E4M3: max 448 = `0.1111.110`; the next grid point would be 480 (`0.1111.111`, which is
//!   NaN). 464 is the midpoint and rounds to 448 (even mantissa); anything above 464 overflows.
//! * E5M2: max 57344 = `0.11110.11`; the next grid point is 65536 (the inf code). 61440 is the
//!   midpoint and goes to 65536 (even), i.e. overflows; anything below it rounds to ≤ 57344.

use super::minifloat::Minifloat;
use crate::Fp8Format;

/// What an encoder does with magnitudes past the largest finite value (and with ±inf).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Saturation {
    /// Clamp to ±max (`.satfinite`): what quantization prepasses use, so an outlier costs
    /// accuracy, never a NaN.
    #[default]
    Saturate,
    /// OCP non-saturating conversion: E4M3 overflow gives NaN (it has no inf), E5M2 gives ±inf.
    NonSaturating,
}

const SIGN: u8 = 0x80;

/// Sign-magnitude encoding shared by both formats: NaN keeps its sign, magnitudes past
/// `max_code` (and ±inf) become ±max when saturating, else the format's overflow code.
fn encode_signed(format: Minifloat, x: f32, sat: Saturation, max_code: u8, overflow_code: u8, nan_code: u8) -> u8 {
    let sign = if x.is_sign_negative() { SIGN } else { 0 };
    if x.is_nan() {
        return sign | nan_code;
    }
    let a = x.abs();
    let code = if a.is_infinite() { u32::MAX } else { format.encode_magnitude(a) };
    if code > max_code as u32 {
        return sign
            | match sat {
                Saturation::Saturate => max_code,
                Saturation::NonSaturating => overflow_code,
            };
    }
    sign | code as u8
}

/// E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; finite only, NaN = `S.1111.111`.
pub mod e4m3 {
    use super::*;

    pub(crate) const FORMAT: Minifloat = Minifloat { man_bits: 3, bias: 7 };
    /// Largest finite magnitude.
    pub const MAX: f32 = 448.0;
    /// Code of +448.
    pub const MAX_CODE: u8 = 0x7E;
    /// Code of +NaN (`0xFF` is -NaN).
    pub const NAN_CODE: u8 = 0x7F;

    /// Nearest E4M3 code (RNE). NaN keeps its sign bit and becomes `S.1111.111`.
    pub fn encode(x: f32, sat: Saturation) -> u8 {
        // No inf in E4M3: a non-saturating overflow is NaN.
        encode_signed(FORMAT, x, sat, MAX_CODE, NAN_CODE, NAN_CODE)
    }

    pub fn decode(code: u8) -> f32 {
        let mag = code & !SIGN;
        if mag == NAN_CODE {
            return f32::NAN;
        }
        let v = FORMAT.decode_magnitude(mag as u32);
        if code & SIGN != 0 {
            -v
        } else {
            v
        }
    }
}

/// E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like with ±inf and NaNs. It is
/// exactly the top byte of an IEEE f16.
pub mod e5m2 {
    use super::*;

    pub(crate) const FORMAT: Minifloat = Minifloat { man_bits: 2, bias: 15 };
    /// Largest finite magnitude.
    pub const MAX: f32 = 57344.0;
    /// Code of +57344.
    pub const MAX_CODE: u8 = 0x7B;
    /// Code of +inf.
    pub const INF_CODE: u8 = 0x7C;
    /// The NaN code the encoder writes (with the input's sign); `0x7D..=0x7F` are all NaN.
    pub const NAN_CODE: u8 = 0x7F;

    /// Nearest E5M2 code (RNE). NaN keeps its sign bit and becomes `S.11111.11`.
    pub fn encode(x: f32, sat: Saturation) -> u8 {
        encode_signed(FORMAT, x, sat, MAX_CODE, INF_CODE, NAN_CODE)
    }

    pub fn decode(code: u8) -> f32 {
        let mag = code & !SIGN;
        let v = if mag == INF_CODE {
            f32::INFINITY
        } else if mag > INF_CODE {
            return f32::NAN;
        } else {
            FORMAT.decode_magnitude(mag as u32)
        };
        if code & SIGN != 0 {
            -v
        } else {
            v
        }
    }
}

/// E4M3FNUZ: the FP8 of AMD CDNA3 (gfx942) MFMAs. 1 sign, 4 exponent (bias 8), 3 mantissa
/// bits; finite only (max 240 = `0.1111.111`), one zero (`0x00`) and one NaN (`0x80`, the code
/// that would be -0). Encoding rounds to nearest even like [`e4m3`]; -0 and negative values
/// that round to zero encode to `0x00`. The overflow midpoint is 248 (between 240, odd mantissa,
/// and the unrepresentable 256): it and anything above overflow.
pub mod e4m3fnuz {
    use super::*;

    pub(crate) const FORMAT: Minifloat = Minifloat { man_bits: 3, bias: 8 };
    /// Largest finite magnitude.
    pub const MAX: f32 = 240.0;
    /// Code of +240.
    pub const MAX_CODE: u8 = 0x7F;
    /// The only NaN.
    pub const NAN_CODE: u8 = 0x80;

    /// Nearest E4M3FNUZ code (RNE). NaN, and a non-saturating overflow, give `0x80`.
    pub fn encode(x: f32, sat: Saturation) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        let a = x.abs();
        let code = if a.is_infinite() { u32::MAX } else { FORMAT.encode_magnitude(a) };
        if code > MAX_CODE as u32 {
            return match sat {
                Saturation::Saturate => (if x < 0.0 { SIGN } else { 0 }) | MAX_CODE,
                Saturation::NonSaturating => NAN_CODE,
            };
        }
        if code == 0 {
            return 0;
        }
        (if x < 0.0 { SIGN } else { 0 }) | code as u8
    }

    pub fn decode(code: u8) -> f32 {
        if code == NAN_CODE {
            return f32::NAN;
        }
        let v = FORMAT.decode_magnitude((code & !SIGN) as u32);
        if code & SIGN != 0 {
            -v
        } else {
            v
        }
    }
}

/// UE4M3: E4M3 with the sign bit fixed at 0, the NVFP4 block-scale format. Codes `0x00..=0x7E`
/// are 0..448, `0x7F` is NaN; codes with the top bit set are not UE4M3 and decode to NaN so a
/// stray signed code cannot pass for a scale.
pub mod ue4m3 {
    use super::*;

    pub const MAX: f32 = 448.0;
    pub const MAX_CODE: u8 = 0x7E;
    pub const NAN_CODE: u8 = 0x7F;

    /// Nearest UE4M3 code, always saturating (a scale past 448 is clamped, never NaN). Scales
    /// are magnitudes: zero, negative values and -0 encode to 0; NaN encodes to NaN.
    pub fn encode(x: f32) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        if x <= 0.0 {
            return 0;
        }
        e4m3::encode(x, Saturation::Saturate)
    }

    pub fn decode(code: u8) -> f32 {
        if code & SIGN != 0 {
            return f32::NAN;
        }
        e4m3::decode(code)
    }
}

/// Largest finite magnitude of `format`.
pub fn max_finite(format: Fp8Format) -> f32 {
    match format {
        Fp8Format::E4M3 => e4m3::MAX,
        Fp8Format::E5M2 => e5m2::MAX,
    }
}

/// [`e4m3::encode`] or [`e5m2::encode`].
pub fn encode(format: Fp8Format, x: f32, sat: Saturation) -> u8 {
    match format {
        Fp8Format::E4M3 => e4m3::encode(x, sat),
        Fp8Format::E5M2 => e5m2::encode(x, sat),
    }
}

/// [`e4m3::decode`] or [`e5m2::decode`].
pub fn decode(format: Fp8Format, code: u8) -> f32 {
    match format {
        Fp8Format::E4M3 => e4m3::decode(code),
        Fp8Format::E5M2 => e5m2::decode(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E4M3 value straight from the OCP definition, in f64.
    fn e4m3_formula(c: u8) -> f64 {
        let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((c >> 3) & 0xF) as i32;
        let m = (c & 7) as f64;
        if e == 15 && m == 7.0 {
            return f64::NAN;
        }
        if e == 0 {
            s * (m / 8.0) * 2f64.powi(-6)
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        }
    }

    /// E5M2 value straight from the OCP (IEEE-style) definition, in f64.
    fn e5m2_formula(c: u8) -> f64 {
        let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((c >> 2) & 0x1F) as i32;
        let m = (c & 3) as f64;
        if e == 31 {
            return if m == 0.0 { s * f64::INFINITY } else { f64::NAN };
        }
        if e == 0 {
            s * (m / 4.0) * 2f64.powi(-14)
        } else {
            s * (1.0 + m / 4.0) * 2f64.powi(e - 15)
        }
    }

    fn same(a: f32, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || (a as f64 == b && a.is_sign_negative() == b.is_sign_negative())
    }

    #[test]
    fn decode_all_codes_matches_the_formula() {
        for c in 0..=255u8 {
            assert!(same(e4m3::decode(c), e4m3_formula(c)), "e4m3 {c:#04x}: {}", e4m3::decode(c));
            assert!(same(e5m2::decode(c), e5m2_formula(c)), "e5m2 {c:#04x}: {}", e5m2::decode(c));
        }
        assert_eq!(e4m3::decode(0x7E), 448.0);
        assert_eq!(e4m3::decode(0x01), 2f32.powi(-9));
        assert_eq!(e5m2::decode(0x7B), 57344.0);
        assert_eq!(e5m2::decode(0x01), 2f32.powi(-16));
    }

    #[test]
    fn e5m2_decode_is_the_top_byte_of_f16() {
        for c in 0..=255u8 {
            let h = half::f16::from_bits((c as u16) << 8).to_f32();
            assert!(same(e5m2::decode(c), h as f64), "{c:#04x}");
        }
    }

    fn is_nan_code(format: Fp8Format, c: u8) -> bool {
        decode(format, c).is_nan()
    }

    #[test]
    fn encode_inverts_decode_on_every_non_nan_code() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for c in 0..=255u8 {
                if is_nan_code(format, c) {
                    continue;
                }
                let v = decode(format, c);
                assert_eq!(encode(format, v, Saturation::NonSaturating), c, "{format:?} {c:#04x}");
                if v.is_finite() {
                    assert_eq!(encode(format, v, Saturation::Saturate), c, "{format:?} {c:#04x}");
                }
            }
        }
    }

    #[test]
    fn ties_go_to_the_even_code_and_neighbours_go_to_the_nearer() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let max = max_finite(format) as f64;
            // Adjacent positive finite codes c, c+1 (codes are monotone in magnitude).
            for c in 0..0x7Fu8 {
                let (lo, hi) = (decode(format, c) as f64, decode(format, c + 1) as f64);
                if hi.is_nan() || hi > max {
                    continue;
                }
                let mid64 = (lo + hi) / 2.0;
                let mid = mid64 as f32;
                assert_eq!(mid as f64, mid64, "midpoint must be exact in f32");
                let even = if c % 2 == 0 { c } else { c + 1 };
                for sat in [Saturation::Saturate, Saturation::NonSaturating] {
                    for (sign, s) in [(0u8, 1.0f32), (0x80, -1.0)] {
                        let enc = |x: f32| encode(format, s * x, sat);
                        assert_eq!(enc(mid), sign | even, "{format:?} tie between {lo} and {hi}");
                        assert_eq!(enc(mid.next_up()), sign | (c + 1), "{format:?} above {mid}");
                        assert_eq!(enc(mid.next_down()), sign | c, "{format:?} below {mid}");
                    }
                }
            }
        }
    }

    #[test]
    fn subnormals_and_signed_zero() {
        // E4M3: smallest subnormal 2^-9; half of it ties to 0.
        assert_eq!(e4m3::encode(2f32.powi(-10), Saturation::Saturate), 0x00);
        assert_eq!(e4m3::encode(2f32.powi(-10).next_up(), Saturation::Saturate), 0x01);
        assert_eq!(e4m3::encode(-2f32.powi(-10), Saturation::Saturate), 0x80);
        // 1.5 ulp ties between 1 and 2 ulps: to 2.
        assert_eq!(e4m3::encode(3.0 * 2f32.powi(-10), Saturation::Saturate), 0x02);
        // Largest subnormal 7·2^-9 and smallest normal 2^-6 = 8·2^-9.
        assert_eq!(e4m3::encode(7.5 * 2f32.powi(-9), Saturation::Saturate), 0x08);
        assert_eq!(e4m3::encode(7.5 * 2f32.powi(-9).next_down(), Saturation::Saturate), 0x07);
        // E5M2: smallest subnormal 2^-16.
        assert_eq!(e5m2::encode(2f32.powi(-17), Saturation::Saturate), 0x00);
        assert_eq!(e5m2::encode(2f32.powi(-17).next_up(), Saturation::Saturate), 0x01);
        // f32 subnormals are far below both formats.
        assert_eq!(e4m3::encode(f32::from_bits(1), Saturation::Saturate), 0x00);
        assert_eq!(e5m2::encode(-f32::from_bits(1), Saturation::Saturate), 0x80);
        assert_eq!(e4m3::encode(0.0, Saturation::Saturate), 0x00);
        assert_eq!(e4m3::encode(-0.0, Saturation::Saturate), 0x80);
        assert_eq!(e5m2::encode(-0.0, Saturation::Saturate), 0x80);
    }

    #[test]
    fn e4m3_overflow_boundary() {
        use Saturation::*;
        // 464 is the midpoint of 448 (mantissa 110, even) and 480 (111): ties to 448.
        assert_eq!(e4m3::encode(464.0, NonSaturating), 0x7E);
        assert_eq!(e4m3::encode(464.0f32.next_up(), NonSaturating), 0x7F);
        assert_eq!(e4m3::encode(464.0f32.next_up(), Saturate), 0x7E);
        assert_eq!(e4m3::encode(-464.0f32.next_up(), NonSaturating), 0xFF);
        assert_eq!(e4m3::encode(-464.0f32.next_up(), Saturate), 0xFE);
        assert_eq!(e4m3::encode(480.0, Saturate), 0x7E);
        assert_eq!(e4m3::encode(1e30, Saturate), 0x7E);
        assert_eq!(e4m3::encode(f32::MAX, NonSaturating), 0x7F);
        assert_eq!(e4m3::encode(f32::INFINITY, Saturate), 0x7E);
        assert_eq!(e4m3::encode(f32::NEG_INFINITY, Saturate), 0xFE);
        assert_eq!(e4m3::encode(f32::INFINITY, NonSaturating), 0x7F);
        assert_eq!(e4m3::encode(f32::NEG_INFINITY, NonSaturating), 0xFF);
        for sat in [Saturate, NonSaturating] {
            assert!(e4m3::decode(e4m3::encode(f32::NAN, sat)).is_nan());
            assert!(e4m3::decode(e4m3::encode(-f32::NAN, sat)).is_nan());
        }
    }

    #[test]
    fn e5m2_overflow_boundary() {
        use Saturation::*;
        // 61440 is the midpoint of 57344 (mantissa 11, odd) and 65536: ties up, to inf.
        assert_eq!(e5m2::encode(61440.0, NonSaturating), 0x7C);
        assert_eq!(e5m2::encode(61440.0, Saturate), 0x7B);
        assert_eq!(e5m2::encode(61440.0f32.next_down(), NonSaturating), 0x7B);
        assert_eq!(e5m2::encode(-61440.0, NonSaturating), 0xFC);
        assert_eq!(e5m2::encode(-61440.0, Saturate), 0xFB);
        assert_eq!(e5m2::encode(f32::INFINITY, NonSaturating), 0x7C);
        assert_eq!(e5m2::encode(f32::INFINITY, Saturate), 0x7B);
        assert_eq!(e5m2::encode(f32::NEG_INFINITY, Saturate), 0xFB);
        assert!(e5m2::decode(e5m2::encode(f32::NAN, Saturate)).is_nan());
    }

    /// e5m2 of an f16 value is the f16 bit pattern rounded (RNE) to its top byte; derived from
    /// f16 bits alone, so independent of the minifloat encoder.
    #[test]
    fn e5m2_matches_f16_top_byte_over_all_f16_values() {
        for bits in 0..=u16::MAX {
            let h = half::f16::from_bits(bits);
            if h.is_nan() {
                assert!(e5m2::decode(e5m2::encode(h.to_f32(), Saturation::NonSaturating)).is_nan());
                continue;
            }
            let (top, low) = (bits >> 8, bits & 0xFF);
            let up = low > 0x80 || (low == 0x80 && top & 1 == 1);
            let expected = (top + up as u16) as u8;
            assert_eq!(e5m2::encode(h.to_f32(), Saturation::NonSaturating), expected, "f16 {bits:#06x}");
        }
    }

    /// E4M3FNUZ straight from its definition (bias 8, 0x80 NaN, no -0), in f64.
    fn e4m3fnuz_formula(c: u8) -> f64 {
        if c == 0x80 {
            return f64::NAN;
        }
        let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((c >> 3) & 0xF) as i32;
        let m = (c & 7) as f64;
        if e == 0 {
            s * (m / 8.0) * 2f64.powi(-7)
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 8)
        }
    }

    #[test]
    fn e4m3fnuz_decode_encode_and_boundaries() {
        use Saturation::*;
        for c in 0..=255u8 {
            let v = e4m3fnuz::decode(c);
            assert!(same(v, e4m3fnuz_formula(c)), "{c:#04x}: {v}");
            if c != e4m3fnuz::NAN_CODE {
                assert_eq!(e4m3fnuz::encode(v, NonSaturating), c, "{c:#04x}");
                assert_eq!(e4m3fnuz::encode(v, Saturate), c, "{c:#04x}");
            }
        }
        assert_eq!(e4m3fnuz::decode(0x7F), 240.0);
        assert_eq!(e4m3fnuz::decode(0x01), 2f32.powi(-10));
        // One zero: -0 and negatives rounding to zero encode to 0x00 (0x80 is NaN).
        assert_eq!(e4m3fnuz::encode(-0.0, Saturate), 0x00);
        assert_eq!(e4m3fnuz::encode(-2f32.powi(-12), Saturate), 0x00);
        assert_eq!(e4m3fnuz::encode(-2f32.powi(-11).next_up(), Saturate), 0x81);
        // 248 ties between 240 (odd mantissa) and 256: to 256, an overflow.
        assert_eq!(e4m3fnuz::encode(248.0f32.next_down(), NonSaturating), 0x7F);
        assert_eq!(e4m3fnuz::encode(248.0, NonSaturating), 0x80);
        assert_eq!(e4m3fnuz::encode(248.0, Saturate), 0x7F);
        assert_eq!(e4m3fnuz::encode(-1e9, Saturate), 0xFF);
        assert_eq!(e4m3fnuz::encode(f32::INFINITY, NonSaturating), 0x80);
        assert_eq!(e4m3fnuz::encode(f32::NAN, Saturate), 0x80);
        // Same value grid as e4m3 one binade down: every finite e4m3 value below 240 that
        // e4m3fnuz has (not the e4m3 subnormal 2^-9) maps code for code with the exponent + 1.
        for c in 0x08..0x78u8 {
            assert_eq!(e4m3::decode(c) as f64, e4m3fnuz_formula(c + 8), "{c:#04x}");
        }
        // Ties to even between neighbours, as in the OCP formats.
        for c in 0..0x7Eu8 {
            let (lo, hi) = (e4m3fnuz::decode(c) as f64, e4m3fnuz::decode(c + 1) as f64);
            let mid = ((lo + hi) / 2.0) as f32;
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(e4m3fnuz::encode(mid, Saturate), even, "tie {lo}..{hi}");
            assert_eq!(e4m3fnuz::encode(mid.next_up(), Saturate), c + 1);
        }
    }

    #[test]
    fn ue4m3_all_codes() {
        for c in 0..=127u8 {
            let v = ue4m3::decode(c);
            assert!(same(v, e4m3_formula(c)), "{c:#04x}");
            if c != ue4m3::NAN_CODE {
                assert_eq!(ue4m3::encode(v), c);
            }
        }
        for c in 128..=255u8 {
            assert!(ue4m3::decode(c).is_nan(), "{c:#04x} is not a UE4M3 code");
        }
        assert_eq!(ue4m3::encode(-1.0), 0);
        assert_eq!(ue4m3::encode(-0.0), 0);
        assert_eq!(ue4m3::encode(1e9), 0x7E);
        assert_eq!(ue4m3::encode(f32::INFINITY), 0x7E);
        assert_eq!(ue4m3::encode(f32::NAN), 0x7F);
        assert_eq!(ue4m3::encode(1.0), 0x38); // 2^0: biased exponent 7
    }
}
