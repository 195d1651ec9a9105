//! Random test inputs as the project uses them everywhere (tests, `quattn run`, benchmarks):
//! unit normal values with a few large outliers, since real activations have them and they are
//! what breaks low-precision kernels.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::AttentionProblem;

/// Fraction of elements replaced by outliers.
pub const OUTLIER_FRACTION: f64 = 0.001;
/// Outlier magnitude in standard deviations.
pub const OUTLIER_SIGMA: f32 = 8.0;

/// `n` values from N(0, 1) where a fraction [`OUTLIER_FRACTION`] is ±[`OUTLIER_SIGMA`] times a
/// value from U(0.5, 1); deterministic in `seed`.
pub fn normal_with_outliers(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            if rng.random_bool(OUTLIER_FRACTION) {
                let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                sign * OUTLIER_SIGMA * rng.random_range(0.5f32..1.0)
            } else {
                rng.sample::<f32, _>(StandardNormal)
            }
        })
        .collect()
}

/// Q, K, V for `problem` (each from its own stream of `seed`).
pub fn qkv(problem: &AttentionProblem, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    (
        normal_with_outliers(problem.q_len_elems(), seed.wrapping_mul(3)),
        normal_with_outliers(problem.k_len_elems(), seed.wrapping_mul(3).wrapping_add(1)),
        normal_with_outliers(problem.v_len_elems(), seed.wrapping_mul(3).wrapping_add(2)),
    )
}

/// The K channels [`qkv_k_outlier_channels`] offsets: three spread over the head dim.
pub fn k_outlier_channels(head_dim: usize) -> [usize; 3] {
    [5.min(head_dim - 1), head_dim / 2, head_dim.saturating_sub(7)]
}

/// Q, K, V from N(0, 1) (one stream of `seed`: Q, then K, then V) with `offset` added to the
/// [`k_outlier_channels`] of every key: the per-channel outliers real keys have, which
/// INT8 K quantization without smoothing suffers from (issue #5's accuracy case; `offset` 8 is
/// +8σ).
pub fn qkv_k_outlier_channels(problem: &AttentionProblem, seed: u64, offset: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut normal = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect() };
    let (q, mut k, v) = (normal(problem.q_len_elems()), normal(problem.k_len_elems()), normal(problem.v_len_elems()));
    let st = problem.k_strides();
    for b in 0..problem.batch {
        for h in 0..problem.kv_heads {
            for j in 0..problem.kv_len {
                for c in k_outlier_channels(problem.head_dim) {
                    k[st.offset(b, h, j) + c] += offset;
                }
            }
        }
    }
    (q, k, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_and_outliers() {
        let x = normal_with_outliers(200_000, 7);
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.1, "var {var}");
        let big = x.iter().filter(|v| v.abs() >= 4.0).count();
        // ~200 outliers expected (0.1%); a pure normal gives ~13 values beyond 4σ.
        assert!((120..320).contains(&big), "outliers {big}");
        assert_ne!(x, normal_with_outliers(200_000, 8));
        assert_eq!(x, normal_with_outliers(200_000, 7));
    }
}

/// A paged cache for tests and demos ([`crate::paged`]): sequences of `seq_lens` keys in pages of
/// `page_size`, each given `ceil(len / page_size) + extra_pages` table columns (`max_pages` the
/// most of any), the pages they use drawn in a shuffled order from a pool of that many plus
/// `spare_pages` never-used ones; table entries past a sequence's pages are `-1`. Deterministic
/// in `seed`.
pub fn paged_kv(page_size: usize, seq_lens: &[usize], extra_pages: usize, spare_pages: usize, seed: u64) -> crate::PagedKv {
    let ps = page_size.max(1);
    let pages_of: Vec<usize> = seq_lens.iter().map(|&n| n.div_ceil(ps)).collect();
    let used: usize = pages_of.iter().sum();
    let max_pages = (pages_of.iter().max().copied().unwrap_or(0) + extra_pages).max(1);
    let num_pages = used + spare_pages;
    let mut order: Vec<usize> = (0..num_pages).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let mut table = vec![-1i32; seq_lens.len() * max_pages];
    let mut next = order.into_iter();
    for (b, &n) in pages_of.iter().enumerate() {
        for p in 0..n {
            table[b * max_pages + p] = next.next().map_or(-1, |x| x as i32);
        }
    }
    let lens: Vec<i32> = seq_lens.iter().map(|&n| n as i32).collect();
    crate::PagedKv::new(page_size, num_pages.max(1), table, lens)
}
