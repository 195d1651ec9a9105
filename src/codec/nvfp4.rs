//! NVFP4: E2M1 elements, one UE4M3 scale per 16 consecutive elements, one f32 scale per tensor.
//!
//! # Quantization recipe (kernels and prepasses must match it bit for bit)
//! All arithmetic is f32 with round-to-nearest-even, in exactly this order:
//! 1. `amax = max |x|` over the tensor; `tensor_scale = amax / 2688` (2688 = 6 · 448, the largest
//!    E2M1 times the largest UE4M3, so the largest block scale lands near 448 and uses the
//!    full UE4M3 range). Guards: `amax == 0` gives `tensor_scale = 1` (every code is then 0);
//!    a result below `f32::MIN_POSITIVE` is raised to it, so the scale stays a normal float
//!    and the divisions below cannot overflow to inf. See [`tensor_scale_for`].
//! 2. Per block of 16 along a row: `block_scale = ue4m3::encode((amax_block / 6) / tensor_scale)`
//!    (RNE, saturating). See [`block_scale_code`].
//! 3. Per element: `denom = ue4m3::decode(block_scale) * tensor_scale`; if `denom == 0` the code
//!    is 0 (a block whose scale underflowed to 0), else `e2m1::encode(x / denom)` (a true
//!    division, RNE, saturating to ±6). See [`encode_element`].
//! 4. Decode: `(e2m1 * ue4m3) * tensor_scale` (the first product is exact). See
//!    [`decode_element`].
//!
//! Because the block scale is rounded to UE4M3, `amax_block / denom` can exceed 6 by up to the
//! UE4M3 rounding (a factor ≤ 1 + 2^-4 in the normal range) and the largest elements of a block
//! then saturate to ±6; this is inherent in the format.
//!
//! # Storage
//! Row-major `[rows, cols]`, blocks along `cols` (`cols % 16 == 0`). `packed[r * cols/2 + c/2]`
//! holds elements `c` (low nibble) and `c + 1` (high nibble) for even `c`;
//! `block_scales[r * cols/16 + c/16]`.

use super::fp4::e2m1;
use super::fp8::ue4m3;
use crate::{Error, Result};

/// Elements sharing one UE4M3 scale.
pub const BLOCK: usize = 16;
/// `6 · 448`: largest E2M1 magnitude times largest UE4M3 magnitude.
pub const TENSOR_SCALE_DIVISOR: f32 = 2688.0;

/// The per-tensor f32 scale for a tensor whose largest magnitude is `amax` (recipe step 1).
pub fn tensor_scale_for(amax: f32) -> f32 {
    if amax == 0.0 {
        return 1.0;
    }
    (amax / TENSOR_SCALE_DIVISOR).max(f32::MIN_POSITIVE)
}

/// The UE4M3 code of a block whose largest magnitude is `amax_block` (recipe step 2).
pub fn block_scale_code(amax_block: f32, tensor_scale: f32) -> u8 {
    ue4m3::encode((amax_block / e2m1::MAX) / tensor_scale)
}

/// The E2M1 code of `x` in a block with scale `block_code` (recipe step 3).
pub fn encode_element(x: f32, block_code: u8, tensor_scale: f32) -> u8 {
    let denom = ue4m3::decode(block_code) * tensor_scale;
    if denom == 0.0 {
        return 0;
    }
    e2m1::encode(x / denom)
}

/// The value of E2M1 code `code` in a block with scale `block_code` (recipe step 4).
pub fn decode_element(code: u8, block_code: u8, tensor_scale: f32) -> f32 {
    (e2m1::decode(code) * ue4m3::decode(block_code)) * tensor_scale
}

/// A row-major `[rows, cols]` tensor in NVFP4 (layout in the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Tensor {
    pub rows: usize,
    pub cols: usize,
    /// Two E2M1 codes per byte, element `2i` in the low nibble; `rows * cols / 2` bytes.
    pub packed: Vec<u8>,
    /// UE4M3 codes, `[rows, cols / 16]` row-major.
    pub block_scales: Vec<u8>,
    pub tensor_scale: f32,
}

impl Nvfp4Tensor {
    /// Quantizes `data` (`[rows, cols]`, row-major) with the tensor scale of its amax.
    pub fn quantize(data: &[f32], rows: usize, cols: usize) -> Result<Self> {
        check_input(data, rows, cols)?;
        let amax = data.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        Self::quantize_inner(data, rows, cols, tensor_scale_for(amax))
    }

    /// Quantizes with a caller-chosen tensor scale (e.g. a fixed one for probabilities in
    /// `[0, 1]`: `tensor_scale_for(1.0)`). Elements past `6 · 448 · tensor_scale` saturate.
    pub fn quantize_with_tensor_scale(data: &[f32], rows: usize, cols: usize, tensor_scale: f32) -> Result<Self> {
        check_input(data, rows, cols)?;
        if !(tensor_scale.is_finite() && tensor_scale > 0.0) {
            return Err(Error::Quantization(format!(
                "NVFP4 tensor scale must be finite and positive, got {tensor_scale}"
            )));
        }
        Self::quantize_inner(data, rows, cols, tensor_scale)
    }

    fn quantize_inner(data: &[f32], rows: usize, cols: usize, tensor_scale: f32) -> Result<Self> {
        let mut packed = vec![0u8; rows * cols / 2];
        let mut block_scales = vec![0u8; rows * cols / BLOCK];
        for (bi, block) in data.chunks_exact(BLOCK).enumerate() {
            let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let sc = block_scale_code(amax, tensor_scale);
            block_scales[bi] = sc;
            for (pi, pair) in block.chunks_exact(2).enumerate() {
                let lo = encode_element(pair[0], sc, tensor_scale);
                let hi = encode_element(pair[1], sc, tensor_scale);
                packed[bi * BLOCK / 2 + pi] = lo | (hi << 4);
            }
        }
        Ok(Nvfp4Tensor { rows, cols, packed, block_scales, tensor_scale })
    }

    /// E2M1 code of element `(r, c)`.
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let i = r * self.cols + c;
        (self.packed[i / 2] >> (4 * (i % 2))) & 0xF
    }

    /// UE4M3 code of the block holding element `(r, c)`.
    pub fn block_scale(&self, r: usize, c: usize) -> u8 {
        self.block_scales[(r * self.cols + c) / BLOCK]
    }

    /// Decoded value of element `(r, c)` ([`super::fp4::BlockScaled4::element`]).
    pub fn value(&self, r: usize, c: usize) -> f32 {
        super::fp4::BlockScaled4::element(self, r, c)
    }

    /// All values, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        (0..self.rows * self.cols).map(|i| self.value(i / self.cols, i % self.cols)).collect()
    }
}

impl super::fp4::BlockScaled4 for Nvfp4Tensor {
    const BLOCK: usize = BLOCK;
    fn cols(&self) -> usize {
        self.cols
    }
    fn packed(&self) -> &[u8] {
        &self.packed
    }
    fn scale_codes(&self) -> &[u8] {
        &self.block_scales
    }
    fn decode_scale(code: u8) -> f32 {
        ue4m3::decode(code)
    }
    fn tensor_scale(&self) -> f32 {
        self.tensor_scale
    }
}

fn check_input(data: &[f32], rows: usize, cols: usize) -> Result<()> {
    if !cols.is_multiple_of(BLOCK) {
        return Err(Error::Quantization(format!(
            "NVFP4 needs cols % {BLOCK} == 0 (one scale per {BLOCK}), got cols = {cols}"
        )));
    }
    if data.len() != rows * cols {
        return Err(Error::Quantization(format!(
            "NVFP4 input holds {} values, [{rows}, {cols}] needs {}",
            data.len(),
            rows * cols
        )));
    }
    if let Some(i) = data.iter().position(|x| !x.is_finite()) {
        return Err(Error::Quantization(format!("NVFP4 input element {i} is {} (must be finite)", data[i])));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_distr::{Distribution, Normal};

    /// Half the spacing of the E2M1 grid around magnitude `y` (≤ 6).
    fn e2m1_half_spacing(y: f32) -> f32 {
        if y <= 2.0 {
            0.25
        } else if y <= 4.0 {
            0.5
        } else {
            1.0
        }
    }

    fn random_with_outliers(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = Normal::new(0.0f32, 1.0).unwrap();
        (0..n)
            .map(|_| {
                let x = normal.sample(&mut rng);
                if rng.random::<f32>() < 0.01 {
                    x * 20.0
                } else {
                    x
                }
            })
            .collect()
    }

    #[test]
    fn rejects_bad_shapes_and_non_finite_input() {
        assert!(matches!(Nvfp4Tensor::quantize(&[0.0; 24], 1, 24), Err(Error::Quantization(_))));
        assert!(matches!(Nvfp4Tensor::quantize(&[0.0; 16], 2, 16), Err(Error::Quantization(_))));
        let mut x = vec![1.0; 16];
        x[3] = f32::NAN;
        assert!(Nvfp4Tensor::quantize(&x, 1, 16).is_err());
        assert!(Nvfp4Tensor::quantize_with_tensor_scale(&[0.0; 16], 1, 16, 0.0).is_err());
    }

    #[test]
    fn all_zero_tensor_uses_unit_scale() {
        let t = Nvfp4Tensor::quantize(&[0.0; 32], 2, 16).unwrap();
        assert_eq!(t.tensor_scale, 1.0);
        assert!(t.packed.iter().all(|&b| b == 0));
        assert!(t.block_scales.iter().all(|&b| b == 0));
        assert!(t.dequantize().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn packing_low_nibble_first() {
        // amax 6: tensor scale 6/2688, block scale (6/6)/(6/2688) ≈ 448 -> code 0x7E, so the
        // element divisor is ≈ 1 and 6 -> 0x7, -0.5 -> 0x9, 3 -> 0x5, -2 -> 0xC.
        let mut x = vec![0.0f32; 16];
        x[0] = 6.0;
        x[1] = -0.5;
        x[2] = 3.0;
        x[3] = -2.0;
        let t = Nvfp4Tensor::quantize(&x, 1, 16).unwrap();
        assert_eq!(t.block_scales, vec![0x7E]);
        assert_eq!(t.packed[0], 0x97);
        assert_eq!(t.packed[1], 0xC5);
        assert!(t.packed[2..].iter().all(|&b| b == 0));
    }

    #[test]
    fn round_trip_error_is_within_half_an_e2m1_ulp_of_the_block_scale() {
        let (rows, cols) = (37, 64);
        for seed in [11u64, 12, 13] {
            let x = random_with_outliers(seed, rows * cols);
            let t = Nvfp4Tensor::quantize(&x, rows, cols).unwrap();
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(t.tensor_scale, amax / 2688.0);
            let deq = t.dequantize();
            for r in 0..rows {
                for b in 0..cols / BLOCK {
                    let blk = &x[r * cols + b * BLOCK..][..BLOCK];
                    let bamax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let denom = ue4m3::decode(t.block_scale(r, b * BLOCK)) as f64 * t.tensor_scale as f64;
                    // UE4M3 RNE keeps the block scale within 2^-4 of its target (normal range).
                    let target = bamax as f64 / 6.0 / t.tensor_scale as f64;
                    if target >= 2f64.powi(-6) {
                        assert!((denom / t.tensor_scale as f64 / target - 1.0).abs() <= 1.0 / 16.0 + 1e-6);
                    }
                    for c in 0..BLOCK {
                        let i = r * cols + b * BLOCK + c;
                        let err = (x[i] as f64 - deq[i] as f64).abs();
                        let y = (x[i] as f64 / denom).abs();
                        let bound =
                            if y <= 6.0 { e2m1_half_spacing(y as f32) as f64 * denom } else { (y - 6.0) * denom };
                        // The slack covers the f32 rounding of the decode product.
                        assert!(
                            err <= bound * (1.0 + 1e-5) + (x[i] as f64).abs() * 1e-6,
                            "seed {seed} ({r},{c}): x {} deq {} bound {bound}",
                            x[i],
                            deq[i]
                        );
                        assert!(y <= 6.0 * (1.0 + 1.0 / 16.0) + 1e-6 || target < 2f64.powi(-6));
                    }
                }
            }
        }
    }

    #[test]
    fn fixed_tensor_scale_for_probabilities() {
        let p: Vec<f32> = (0..16).map(|i| i as f32 / 15.0).collect();
        let ts = tensor_scale_for(1.0);
        let t = Nvfp4Tensor::quantize_with_tensor_scale(&p, 1, 16, ts).unwrap();
        // (1 / 6) / (1 / 2688) = 448 (up to f32 rounding of 1/2688) -> the top UE4M3 code.
        assert_eq!(t.block_scales[0], 0x7E);
        assert_eq!(t.code(0, 15), 0x7);
        assert_eq!(t.value(0, 15), 2688.0 * ts);
        assert!((t.value(0, 15) - 1.0).abs() < 1e-6);
    }
}
