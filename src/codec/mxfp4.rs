//! MXFP4 (OCP Microscaling v1.0): E2M1 elements with one E8M0 (power-of-two) scale per 32.
//!
//! Recipe (the spec's, section 6.3): per block, `shared_exp = floor(log2(amax_block)) - 2`
//! (2 = the largest E2M1 exponent, so the block's largest element lands in `[4, 8)` and the
//! E2M1 range is used from the top), clamped to E8M0's `[-127, 127]`; `X = 2^shared_exp`;
//! element code `e2m1::encode(x / X)` (exact division, RNE, saturating to ±6 — elements in
//! `(6, 8)` clamp, as the spec prescribes). A block of zeros gets `shared_exp = -127`.
//! Decode: `e2m1 · X`.
//!
//! Storage: row-major `[rows, cols]`, `cols % 32 == 0`; nibble packing as NVFP4 (element `2i`
//! in the low nibble); `scales[r * cols/32 + c/32]` are E8M0 codes.

use super::fp4::{e2m1, e8m0, floor_log2};
use crate::{Error, Result};

/// Elements sharing one E8M0 scale.
pub const BLOCK: usize = 32;
/// Exponent of the largest E2M1 value (6 = 1.5 · 2^2).
pub const E2M1_EMAX: i32 = 2;

/// The E8M0 scale code of a block whose largest magnitude is `amax_block`.
pub fn scale_code(amax_block: f32) -> u8 {
    if amax_block == 0.0 {
        return e8m0::from_exponent(-127);
    }
    e8m0::from_exponent(floor_log2(amax_block) - E2M1_EMAX)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Mxfp4Tensor {
    pub rows: usize,
    pub cols: usize,
    /// Two E2M1 codes per byte, element `2i` in the low nibble.
    pub packed: Vec<u8>,
    /// E8M0 codes, `[rows, cols / 32]` row-major.
    pub scales: Vec<u8>,
}

impl Mxfp4Tensor {
    pub fn quantize(data: &[f32], rows: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(Error::Quantization(format!("MXFP4 needs cols % {BLOCK} == 0, got cols = {cols}")));
        }
        if data.len() != rows * cols {
            return Err(Error::Quantization(format!(
                "MXFP4 input holds {} values, [{rows}, {cols}] needs {}",
                data.len(),
                rows * cols
            )));
        }
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(Error::Quantization(format!("MXFP4 input element {i} is {} (must be finite)", data[i])));
        }
        let mut packed = vec![0u8; rows * cols / 2];
        let mut scales = vec![0u8; rows * cols / BLOCK];
        for (bi, block) in data.chunks_exact(BLOCK).enumerate() {
            let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let sc = scale_code(amax);
            scales[bi] = sc;
            let x_scale = e8m0::decode(sc);
            for (pi, pair) in block.chunks_exact(2).enumerate() {
                let lo = e2m1::encode(pair[0] / x_scale);
                let hi = e2m1::encode(pair[1] / x_scale);
                packed[bi * BLOCK / 2 + pi] = lo | (hi << 4);
            }
        }
        Ok(Mxfp4Tensor { rows, cols, packed, scales })
    }

    pub fn code(&self, r: usize, c: usize) -> u8 {
        let i = r * self.cols + c;
        (self.packed[i / 2] >> (4 * (i % 2))) & 0xF
    }

    /// Decoded value of element `(r, c)` ([`super::fp4::BlockScaled4::element`]; the tensor
    /// scale is 1).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        super::fp4::BlockScaled4::element(self, r, c)
    }

    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.rows * self.cols).map(|i| self.value(i / self.cols, i % self.cols)).collect()
    }
}

/// MXFP4 has no tensor scale: it is 1.
impl super::fp4::BlockScaled4 for Mxfp4Tensor {
    const BLOCK: usize = BLOCK;
    fn cols(&self) -> usize {
        self.cols
    }
    fn packed(&self) -> &[u8] {
        &self.packed
    }
    fn scale_codes(&self) -> &[u8] {
        &self.scales
    }
    fn decode_scale(code: u8) -> f32 {
        e8m0::decode(code)
    }
    fn tensor_scale(&self) -> f32 {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};

    #[test]
    fn scale_codes_by_hand() {
        assert_eq!(scale_code(6.0), 127); // floor(log2 6) = 2 -> 2^0
        assert_eq!(scale_code(1.0), 125); // 0 - 2
        assert_eq!(scale_code(0.3), 123); // floor(log2 0.3) = -2 -> -4
        assert_eq!(scale_code(1000.0), 134); // 9 - 2 = 7
        assert_eq!(scale_code(0.0), 0);
        assert_eq!(scale_code(f32::from_bits(1)), 0); // 2^-149: clamped to -127
    }

    #[test]
    fn rejects_bad_input() {
        assert!(Mxfp4Tensor::quantize(&[0.0; 16], 1, 16).is_err());
        assert!(Mxfp4Tensor::quantize(&[f32::INFINITY; 32], 1, 32).is_err());
    }

    #[test]
    fn round_trip_error_bound() {
        let (rows, cols) = (9, 96);
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        let normal = Normal::new(0.0f32, 3.0).unwrap();
        let x: Vec<f32> = (0..rows * cols).map(|_| normal.sample(&mut rng)).collect();
        let t = Mxfp4Tensor::quantize(&x, rows, cols).unwrap();
        let deq = t.dequantize();
        for i in 0..rows * cols {
            let blk = &x[i / BLOCK * BLOCK..][..BLOCK];
            let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
            // The scale is the power of two 2^(floor(log2 amax) - 2), derived here in f64.
            let xs = 2f64.powf(amax.log2().floor() - 2.0);
            assert_eq!(e8m0::decode(t.scales[i / BLOCK]) as f64, xs);
            let y = (x[i] as f64 / xs).abs();
            assert!(y < 8.0);
            let half = if y <= 2.0 {
                0.25
            } else if y <= 4.0 {
                0.5
            } else {
                1.0
            };
            let bound = if y <= 6.0 { half * xs } else { (y - 6.0) * xs };
            let err = (x[i] as f64 - deq[i] as f64).abs();
            assert!(err <= bound + 1e-12, "element {i}: {} vs {}", x[i], deq[i]);
        }
    }
}
