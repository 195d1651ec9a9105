//! FP8 tensors with f32 descales: the representation of Q, K and V in the FP8 attention mode.
//!
//! Recipe: over the elements sharing a descale, `descale = amax / max_finite(format)` (448 for
//! E4M3, 57344 for E5M2; `amax == 0` gives `descale = 1`); code
//! `encode(x / descale, Saturate)` (f32 division, RNE, saturating). Dequantize:
//! `decode(code) · descale`. Saturation, not NaN/inf, because an amax computed on the same data
//! keeps every `x / descale` within `±max` up to the division's rounding; saturating makes that
//! last half-ulp harmless.
//!
//! Descale tensors ([`DescaleLayout`]), for a tensor of `heads` heads and `len` rows per head:
//! * `DescaleGranularity::PerTensor`: `[1]`.
//! * `PerHead`: `[batch, heads]`.
//! * `PerBlock`: `[batch, heads, ceil(len / block_rows)]`, row `i` → `i / block_rows`; the
//!   last block of a ragged length is partial. Attention uses `block_rows = block_q` for Q and
//!   `block_k` for K and V (so one K or V descale per KV tile).
//!
//! GQA: Q descales are per Q head, K and V descales per KV head.

use super::fp8::{self, Saturation};
use crate::{DescaleGranularity, Error, Fp8Format, Result, Strides};

/// Shape and index map of one tensor's descales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescaleLayout {
    pub granularity: DescaleGranularity,
    pub batch: usize,
    pub heads: usize,
    pub len: usize,
    pub block_rows: usize,
}

impl DescaleLayout {
    pub fn blocks(&self) -> usize {
        self.len.div_ceil(self.block_rows.max(1))
    }

    pub fn shape(&self) -> Vec<usize> {
        match self.granularity {
            DescaleGranularity::PerTensor => vec![1],
            DescaleGranularity::PerHead => vec![self.batch, self.heads],
            DescaleGranularity::PerBlock => vec![self.batch, self.heads, self.blocks()],
        }
    }

    pub fn count(&self) -> usize {
        self.shape().iter().product()
    }

    /// Index of the descale of row `row` of head `h` in batch `b`.
    #[inline]
    pub fn index(&self, b: usize, h: usize, row: usize) -> usize {
        match self.granularity {
            DescaleGranularity::PerTensor => 0,
            DescaleGranularity::PerHead => b * self.heads + h,
            DescaleGranularity::PerBlock => (b * self.heads + h) * self.blocks() + row / self.block_rows,
        }
    }
}

/// Codes in the source tensor's layout plus descales laid out by [`DescaleLayout`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensor {
    pub format: Fp8Format,
    pub codes: Vec<u8>,
    pub descales: Vec<f32>,
    pub layout: DescaleLayout,
}

/// Descales of Q, K and V for `problem` with one descale per tensor or per (batch, head) (Q per
/// query head, K and V per KV head). `None` per block: the count depends on a kernel's tiles
/// ([`DescaleLayout::count`]).
pub fn descale_counts(problem: &crate::AttentionProblem, granularity: DescaleGranularity) -> Option<[usize; 3]> {
    let p = problem;
    match granularity {
        DescaleGranularity::PerTensor => Some([1, 1, 1]),
        DescaleGranularity::PerHead => Some([p.batch * p.q_heads, p.batch * p.kv_heads, p.batch * p.kv_heads]),
        DescaleGranularity::PerBlock => None,
    }
}

/// Descale for a group with largest magnitude `amax`.
pub fn descale_for(format: Fp8Format, amax: f32) -> f32 {
    if amax > 0.0 {
        amax / fp8::max_finite(format)
    } else {
        1.0
    }
}

impl Fp8Tensor {
    /// Quantizes a 4-d tensor whose rows of `dim` contiguous elements start at
    /// `strides.offset(b, h, row)`.
    pub fn quantize(format: Fp8Format, x: &[f32], strides: Strides, dim: usize, layout: DescaleLayout) -> Result<Self> {
        if layout.block_rows == 0 {
            return Err(Error::Quantization("FP8 descale block of 0 rows".into()));
        }
        // The strided extent: elements between rows (padding) are neither read nor checked.
        let expected = strides.extent(layout.batch, layout.heads, layout.len, dim);
        if Some(x.len()) != expected {
            return Err(Error::Quantization(format!("FP8 input holds {} values, the strided shape spans {expected:?}", x.len())));
        }
        let rows = || {
            (0..layout.batch).flat_map(move |b| {
                (0..layout.heads).flat_map(move |h| (0..layout.len).map(move |i| (b, h, i, strides.offset(b, h, i))))
            })
        };
        if let Some(i) = rows().flat_map(|(.., o)| o..o + dim).find(|&i| !x[i].is_finite()) {
            return Err(Error::Quantization(format!("FP8 input element {i} is {} (must be finite)", x[i])));
        }
        let mut amax = vec![0.0f32; layout.count()];
        for (b, h, i, o) in rows() {
            let a = &mut amax[layout.index(b, h, i)];
            *a = x[o..][..dim].iter().fold(*a, |m, v| m.max(v.abs()));
        }
        let descales: Vec<f32> = amax.iter().map(|&a| descale_for(format, a)).collect();
        let mut codes = vec![0u8; x.len()];
        for (b, h, i, o) in rows() {
            let d = descales[layout.index(b, h, i)];
            for c in 0..dim {
                codes[o + c] = fp8::encode(format, x[o + c] / d, Saturation::Saturate);
            }
        }
        Ok(Fp8Tensor { format, codes, descales, layout })
    }

    /// Decoded code at flat position `i` (without the descale).
    #[inline]
    pub fn raw(&self, i: usize) -> f32 {
        fp8::decode(self.format, self.codes[i])
    }
}

/// Q, K and V of one FP8 call as quantized: what a device prepass wrote, read back, or what
/// [`Fp8Tensor::quantize`] computes on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Operands {
    pub q: Fp8Tensor,
    pub k: Fp8Tensor,
    pub v: Fp8Tensor,
}

impl Fp8Tensor {
    /// `Ok` when `self` holds `reference`'s format, descale layout, descales (bit for bit) and
    /// codes at every element of a `[batch, heads, len, dim]` tensor with `strides` (positions
    /// between rows are not compared); else the first difference, in words.
    pub fn matches(&self, reference: &Fp8Tensor, strides: Strides, dim: usize) -> std::result::Result<(), String> {
        if self.format != reference.format || self.layout != reference.layout {
            return Err(format!("format / layout {:?} {:?} vs {:?} {:?}", self.format, self.layout, reference.format, reference.layout));
        }
        if self.descales.len() != reference.descales.len() {
            return Err(format!("{} descales vs {}", self.descales.len(), reference.descales.len()));
        }
        if let Some(i) = (0..self.descales.len()).find(|&i| self.descales[i].to_bits() != reference.descales[i].to_bits()) {
            return Err(format!("descale {i}: {:e} vs {:e}", self.descales[i], reference.descales[i]));
        }
        let l = &self.layout;
        for b in 0..l.batch {
            for h in 0..l.heads {
                for row in 0..l.len {
                    let o = strides.offset(b, h, row);
                    let (Some(got), Some(want)) = (self.codes.get(o..o + dim), reference.codes.get(o..o + dim)) else {
                        return Err(format!("row ({b}, {h}, {row}) lies past the codes ({} / {} bytes)", self.codes.len(), reference.codes.len()));
                    };
                    if let Some(c) = (0..dim).find(|&c| got[c] != want[c]) {
                        return Err(format!("code ({b}, {h}, {row}, {c}): {:#04x} vs {:#04x}", got[c], want[c]));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layout;

    #[test]
    fn descale_index_by_hand() {
        let l =
            DescaleLayout { granularity: DescaleGranularity::PerBlock, batch: 2, heads: 3, len: 45, block_rows: 16 };
        assert_eq!(l.shape(), vec![2, 3, 3]);
        assert_eq!(l.index(1, 2, 44), 17);
        assert_eq!(l.index(0, 1, 15), 3);
        assert_eq!(DescaleLayout { granularity: DescaleGranularity::PerHead, ..l }.index(1, 2, 44), 5);
        assert_eq!(DescaleLayout { granularity: DescaleGranularity::PerTensor, ..l }.index(1, 2, 44), 0);
    }

    #[test]
    fn quantize_error_within_half_ulp_and_amax_maps_to_max() {
        let strides = Strides::new(Layout::Bshd, 3, 45, 8);
        let x: Vec<f32> = (0..2 * 3 * 45 * 8).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0).collect();
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for g in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
                let l = DescaleLayout { granularity: g, batch: 2, heads: 3, len: 45, block_rows: 16 };
                let t = Fp8Tensor::quantize(format, &x, strides, 8, l).unwrap();
                let mant = match format {
                    Fp8Format::E4M3 => 3,
                    Fp8Format::E5M2 => 2,
                };
                for b in 0..2 {
                    for h in 0..3 {
                        for i in 0..45 {
                            let d = t.descales[l.index(b, h, i)];
                            for c in 0..8 {
                                let o = strides.offset(b, h, i) + c;
                                let y = x[o] / d;
                                let err = (y - t.raw(o)).abs();
                                // Relative half-ulp in the normal range, absolute below.
                                let bound = (y.abs() * 2f32.powi(-mant - 1)).max(2f32.powi(-16));
                                assert!(err <= bound * 1.0001, "{format:?} {g:?}: {y} -> {}", t.raw(o));
                            }
                        }
                    }
                }
                let max_code = t.codes.iter().map(|&c| t.raw_code_abs(c)).fold(0.0f32, f32::max);
                assert_eq!(max_code, fp8::max_finite(format));
            }
        }
    }

    #[test]
    fn matches_names_the_first_difference() {
        let strides = Strides::new(Layout::Bhsd, 2, 5, 8);
        let x: Vec<f32> = (0..2 * 5 * 8).map(|i| (i as f32 - 40.0) / 3.0).collect();
        let l = DescaleLayout { granularity: DescaleGranularity::PerHead, batch: 1, heads: 2, len: 5, block_rows: 1 };
        let t = Fp8Tensor::quantize(Fp8Format::E4M3, &x, strides, 8, l).unwrap();
        assert_eq!(t.matches(&t, strides, 8), Ok(()));
        let mut code = t.clone();
        code.codes[8 * 5 + 3] ^= 1;
        assert_eq!(code.matches(&t, strides, 8).unwrap_err(), format!("code (0, 1, 0, 3): {:#04x} vs {:#04x}", t.codes[43] ^ 1, t.codes[43]));
        let mut d = t.clone();
        d.descales[1] = f32::from_bits(d.descales[1].to_bits() + 1);
        assert!(d.matches(&t, strides, 8).unwrap_err().starts_with("descale 1"));
        let mut short = t.clone();
        short.codes.truncate(70);
        assert!(short.matches(&t, strides, 8).unwrap_err().contains("past the codes"));
        let other = Fp8Tensor::quantize(Fp8Format::E5M2, &x, strides, 8, l).unwrap();
        assert!(other.matches(&t, strides, 8).is_err());
    }

    impl Fp8Tensor {
        fn raw_code_abs(&self, c: u8) -> f32 {
            fp8::decode(self.format, c).abs()
        }
    }
}
