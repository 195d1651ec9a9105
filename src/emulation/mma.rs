//! The accumulation model of one MMA or FMA chain: products of two low-precision operands are
//! exact in f32; each k-step of `k_step` products ([`K_STEP`] for a tensor-core `m16n8k16`, 1
//! for an FMA kernel) is summed in f32 and then added to the accumulator, which is rounded to
//! its own type (f32, or f16 for f16-accumulating MMAs and FMAs). The order inside a k-step is
//! fixed (ascending index) so the emulation is deterministic; hardware adds a k-step's products
//! in an unspecified order with at least f32 precision, so an MMA kernel can differ from this by
//! a few f32 ulps per k-step, never by the accumulator rounding. With `k_step = 1` every step
//! is one fused multiply-add, `round(acc + a·b)`, exactly (see [`add_f16`]).

use crate::codec::float16::round_f16;
use crate::QkAccum;

/// Reduction length of one `m16n8k16` MMA.
pub(crate) const K_STEP: usize = 16;

/// `round_f16(acc + step)` with one rounding: the sum is formed in f64 (exact for an f16
/// accumulator plus an f32 step whose exponents lie within 29 binades of each other), narrowed
/// to f32 by rounding to odd (which keeps the information a later rounding needs, f32 having 13
/// more bits than f16), then rounded to f16. So with `step = a·b` this is the f16 fused
/// multiply-add `HFMA(a, b, acc)`. Rounding the sum to nearest f32 first would round twice
/// (and `half`'s `f16::from_f64` goes through f32 the same way).
#[inline]
pub(crate) fn add_f16(acc: f32, step: f32) -> f32 {
    round_f16(f64_to_f32_round_to_odd(acc as f64 + step as f64))
}

/// `x` to f32 by round-to-odd: exact values stay, others get the f32 below them in magnitude
/// with the last mantissa bit set.
fn f64_to_f32_round_to_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if !x.is_finite() || nearest as f64 == x {
        return nearest;
    }
    // Toward zero first (sign-magnitude bits: one step down in magnitude), then odd.
    let truncated = if (nearest as f64).abs() > x.abs() { f32::from_bits(nearest.to_bits() - 1) } else { nearest };
    f32::from_bits(truncated.to_bits() | 1)
}

/// One k-step: the exact products summed in f32 in index order.
#[inline]
fn step_sum(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |s, (x, y)| s + x * y)
}

/// `a · b` accumulated as `accum` says, over k-steps of `k_step` (a partial last step is a
/// step with zero padding, which changes no sum). `chunk` is the TwoStage chunk length (a
/// multiple of `k_step`).
pub(crate) fn dot(a: &[f32], b: &[f32], accum: QkAccum, chunk: usize, k_step: usize) -> f32 {
    let steps = || a.chunks(k_step).zip(b.chunks(k_step));
    match accum {
        QkAccum::F32 => steps().fold(0.0f32, |acc, (x, y)| acc + step_sum(x, y)),
        QkAccum::F16 => steps().fold(0.0f32, |acc, (x, y)| add_f16(acc, step_sum(x, y))),
        QkAccum::TwoStage => a
            .chunks(chunk)
            .zip(b.chunks(chunk))
            .fold(0.0f32, |acc, (x, y)| acc + dot(x, y, QkAccum::F16, chunk, k_step)),
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
        assert_eq!(dot(&a, &b, QkAccum::F32, 32, K_STEP), 2049.0);
        assert_eq!(dot(&a, &b, QkAccum::F16, 32, K_STEP), 2048.0);
        // TwoStage with one chunk of 32 rounds like F16 inside the chunk.
        assert_eq!(dot(&a, &b, QkAccum::TwoStage, 32, K_STEP), 2048.0);
        // With chunks of 16 the f16 partial sums (2048 and 1) meet in f32.
        assert_eq!(dot(&a, &b, QkAccum::TwoStage, 16, K_STEP), 2049.0);
    }

    #[test]
    fn fma_steps_round_after_every_product() {
        // 2048 + 1·1: 2049 is not an f16, ties to even → 2048 after the first product already;
        // sixteen of them stay at 2048 with k_step 1, while a 16-wide step adds 16 first.
        let mut a = vec![1.0f32; 17];
        let b = vec![1.0f32; 17];
        a[0] = 2048.0;
        assert_eq!(dot(&a, &b, QkAccum::F16, 32, 1), 2048.0);
        assert_eq!(dot(&a, &b, QkAccum::F16, 32, K_STEP), 2064.0);
        // f32 accumulation is the same both ways here (every partial sum is exact).
        assert_eq!(dot(&a, &b, QkAccum::F32, 32, 1), 2064.0);
    }

    #[test]
    fn f16_add_rounds_once() {
        // 1 + 2^-11 + 2^-30 lies just above the f16 midpoint between 1 and 1 + 2^-10: one
        // rounding goes up. Through f32 the 2^-30 is lost first (f32 keeps 23 bits), leaving
        // the exact midpoint, which ties to even (down to 1).
        let step = 2f32.powi(-11) + 2f32.powi(-30);
        assert_eq!(step as f64, 2f64.powi(-11) + 2f64.powi(-30));
        assert_eq!(add_f16(1.0, step), 1.0 + 2f32.powi(-10));
        assert_eq!(crate::codec::float16::round_f16(1.0 + step), 1.0);
    }
}
