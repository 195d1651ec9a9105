//! The accumulation model of one tensor-core MMA chain: products of two low-precision operands
//! are exact in f32; each k-step of [`K_STEP`] products is summed in f32 and then added to the
//! accumulator, which is rounded to its own type (f32, or f16 for f16-accumulating MMAs). The
//! order inside a k-step is fixed (ascending index) so the emulation is deterministic; hardware
//! adds a k-step's products in an unspecified order with at least f32 precision, so a kernel can
//! differ from this by a few f32 ulps per k-step, never by the accumulator rounding.

use crate::codec::float16::round_f16;
use crate::QkAccum;

/// Reduction length of one `m16n8k16` MMA.
pub(crate) const K_STEP: usize = 16;

/// One k-step: the exact products summed in f32 in index order.
#[inline]
fn step_sum(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |s, (x, y)| s + x * y)
}

/// `a · b` accumulated as `accum` says, over k-steps of 16 (a partial last step is a step with
/// zero padding, which changes no sum). `chunk` is the TwoStage chunk length (a multiple of 16).
pub(crate) fn dot(a: &[f32], b: &[f32], accum: QkAccum, chunk: usize) -> f32 {
    let steps = || a.chunks(K_STEP).zip(b.chunks(K_STEP));
    match accum {
        QkAccum::F32 => steps().fold(0.0f32, |acc, (x, y)| acc + step_sum(x, y)),
        QkAccum::F16 => steps().fold(0.0f32, |acc, (x, y)| round_f16(acc + step_sum(x, y))),
        QkAccum::TwoStage => {
            a.chunks(chunk).zip(b.chunks(chunk)).fold(0.0f32, |acc, (x, y)| acc + dot(x, y, QkAccum::F16, chunk))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_accumulator_rounds_after_each_k_step() {
        // 2048 + 16 * 0.0625 = 2049: the step sum (1.0) is exact, and 2049 is not an f16
        // (spacing 2 at 2048), so the f16 accumulator ties to 2048; in f32 it stays 2049.
        let mut a = vec![1.0f32; 32];
        let mut b = vec![0.0625f32; 32];
        a[0] = 2048.0;
        b[0] = 1.0;
        for x in b.iter_mut().skip(1).take(15) {
            *x = 0.0;
        }
        // step 1: 2048 (+0), step 2: 16 · 0.0625 = 1.
        assert_eq!(dot(&a, &b, QkAccum::F32, 32), 2049.0);
        assert_eq!(dot(&a, &b, QkAccum::F16, 32), 2048.0);
        // TwoStage with one chunk of 32 rounds like F16 inside the chunk.
        assert_eq!(dot(&a, &b, QkAccum::TwoStage, 32), 2048.0);
        // With chunks of 16 the f16 partial sums (2048 and 1) meet in f32.
        assert_eq!(dot(&a, &b, QkAccum::TwoStage, 16), 2049.0);
    }
}
