//! Error metrics, per-precision tolerances and the one FLOP count of the project.

use crate::precision::{Fp8Format, Nvfp4V, Precision, PvAccum, PvFormat, QkAccum};
use crate::problem::AttentionProblem;

/// How far an output is from a reference. NaN anywhere in the output makes every metric NaN, so
/// no comparison with a tolerance can pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorMetrics {
    /// ‖x − r‖₂ / ‖r‖₂.
    pub rel_l2: f64,
    /// ‖x − r‖₁ / ‖r‖₁.
    pub rel_l1: f64,
    /// x·r / (‖x‖ ‖r‖).
    pub cos_sim: f64,
    /// max |x − r|.
    pub max_abs: f64,
    /// sqrt(mean (x − r)²).
    pub rmse: f64,
}

impl ErrorMetrics {
    /// Compares `x` with the reference `r` (same length; a length mismatch gives NaN metrics).
    pub fn compare<X: Copy + Into<f64>>(x: &[X], r: &[f64]) -> ErrorMetrics {
        let nan = ErrorMetrics { rel_l2: f64::NAN, rel_l1: f64::NAN, cos_sim: f64::NAN, max_abs: f64::NAN, rmse: f64::NAN };
        if x.len() != r.len() || x.is_empty() {
            return nan;
        }
        let (mut d2, mut r2, mut x2, mut d1, mut r1, mut dot, mut max) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0f64);
        for (&xi, &ri) in x.iter().zip(r) {
            let xi: f64 = xi.into();
            if xi.is_nan() {
                return nan;
            }
            let d = xi - ri;
            d2 += d * d;
            d1 += d.abs();
            r2 += ri * ri;
            r1 += ri.abs();
            x2 += xi * xi;
            dot += xi * ri;
            max = max.max(d.abs());
        }
        let safe = |num: f64, den: f64| if den > 0.0 { num / den } else if num == 0.0 { 0.0 } else { f64::INFINITY };
        ErrorMetrics {
            rel_l2: safe(d2.sqrt(), r2.sqrt()),
            rel_l1: safe(d1, r1),
            cos_sim: if x2 > 0.0 && r2 > 0.0 { dot / (x2.sqrt() * r2.sqrt()) } else if x2 == r2 { 1.0 } else { 0.0 },
            max_abs: max,
            rmse: (d2 / x.len() as f64).sqrt(),
        }
    }
}

/// Finite values of an LSE vector compared to a reference; infinities must match exactly
/// (rows that see no key have LSE = -inf). Returns `None` when the infinities differ.
pub fn compare_lse(x: &[f32], r: &[f64]) -> Option<ErrorMetrics> {
    if x.len() != r.len() {
        return None;
    }
    let mut xs = Vec::with_capacity(x.len());
    let mut rs = Vec::with_capacity(r.len());
    for (&xi, &ri) in x.iter().zip(r) {
        if ri.is_infinite() || xi.is_infinite() {
            if (xi as f64) != ri {
                return None;
            }
        } else {
            xs.push(xi);
            rs.push(ri);
        }
    }
    if xs.is_empty() {
        return Some(ErrorMetrics { rel_l2: 0.0, rel_l1: 0.0, cos_sim: 1.0, max_abs: 0.0, rmse: 0.0 });
    }
    Some(ErrorMetrics::compare(&xs, &rs))
}

/// Per-precision bounds on the error against the f64 reference, for inputs drawn from a unit
/// normal with a few outliers (what the tests and `quattn run` use). Each bound is set from the
/// format's unit roundoff and the places a kernel rounds, not from observed results.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub max_rel_l2: f64,
    pub min_cos_sim: f64,
    /// Bound on max-abs relative to the reference's largest magnitude.
    pub max_abs_rel: f64,
}

impl Tolerance {
    /// `for` is a keyword; this is `Tolerance::for(precision)`.
    pub fn for_precision(precision: Precision) -> Tolerance {
        // u = unit roundoff of the format the data passes through on its way to the output.
        let t = |rel_l2: f64, cos: f64, abs: f64| Tolerance { max_rel_l2: rel_l2, min_cos_sim: cos, max_abs_rel: abs };
        match precision {
            // f32 everywhere: error grows like u·sqrt(n) with u = 6e-8.
            Precision::F32 => t(1e-5, 0.999_999, 1e-4),
            // Inputs and P rounded to f16 (u = 4.9e-4): a few u in relative L2.
            Precision::F16 { qk, pv } => match (qk, pv) {
                (QkAccum::F32, PvAccum::F32) => t(2e-3, 0.999_99, 2e-2),
                (QkAccum::TwoStage, _) | (QkAccum::F32, PvAccum::F16PerTile) => t(4e-3, 0.999_9, 4e-2),
                // f16 accumulation of the logits: error per logit grows with head_dim·|s|.
                (QkAccum::F16, _) => t(1e-2, 0.999_5, 1e-1),
            },
            // bf16: u = 3.9e-3.
            Precision::Bf16 { qk, .. } => match qk {
                QkAccum::F32 => t(1.6e-2, 0.999_8, 1e-1),
                _ => t(3e-2, 0.999_5, 2e-1),
            },
            // INT8 Q/K (127 levels per scale group; an 8σ outlier makes the step 8/127 and the
            // logit error ~0.03) plus f16 P and V.
            Precision::Int8Qk { pv: PvFormat::F16, .. } => t(3e-2, 0.999_5, 2e-1),
            // With P and V in e4m3 (u = 2⁻⁴) the P·V product is as coarse as the FP8 mode's.
            Precision::Int8Qk { pv: PvFormat::Fp8, .. } => t(6e-2, 0.998, 3e-1),
            // FP8 Q, K and V: relative rounding error up to 2⁻⁴ (e4m3) or 2⁻³ (e5m2) per element,
            // ~2.6% (5.2%) rms. A logit q·k over d terms then carries an error of about
            // sqrt(2)·rms·|s|-scale ≈ 0.04 (0.08) and V another rms/√n_eff; the O error is a few
            // percent (twice that for e5m2) whatever the sequence length.
            Precision::Fp8 { format, .. } => match format {
                Fp8Format::E4M3 => t(1e-1, 0.995, 5e-1),
                Fp8Format::E5M2 => t(2e-1, 0.98, 8e-1),
            },
            Precision::Nvfp4 { v, .. } => match v {
                Nvfp4V::Bf16 => t(2.5e-1, 0.97, 1.0),
                Nvfp4V::Nvfp4 => t(3.5e-1, 0.94, 1.5),
                // NVFP4 V with f16 P: the same Q, K and V codes as `Nvfp4`, P only rounded to
                // f16, so V's 4-bit error is what it adds to the Q·Kᵀ error. The emulation
                // against f64 on `inputs::qkv`, the quick selftest shapes (3 seeds each, with and
                // without K smoothing): worst rel-L2 0.183, cos 0.9832, max-abs 0.35 of the
                // largest |O|, LSE 0.634 (the LSE does not see P or V: it is `Nvfp4`'s); `Nvfp4`
                // on the same data 0.206, 0.9792. The bounds keep the NVFP4 bounds' headroom
                // (×1.64 rel-L2, ×3.0 on 1 − cos, ×1.9 on the LSE, which sets `max_abs_rel`).
                Nvfp4V::Nvfp4P16 => t(3e-1, 0.95, 1.2),
            },
            // MXFP4 Q/K: the E8M0 scale is a power of two below the block's amax (OCP recipe),
            // so a block's largest element keeps one to two bits fewer than under NVFP4's
            // amax/6 scale, and values in (6, 8)·2^e clamp to 6·2^e (up to 25%). The emulation
            // against f64 on `inputs::qkv`, the quick selftest shapes (3 seeds each): worst
            // rel-L2 0.26, cos 0.968, max-abs 0.46 of the largest |O|, LSE 2.2 (NVFP4: 0.15,
            // 0.989, 0.41, 0.56); the LSE error comes from an 8σ Q outlier meeting a K outlier
            // in one channel, both clamped, which moves a dominant logit by ~2. The bounds keep
            // the NVFP4 bounds' headroom over the same measurement (×1.7 rel-L2, ×2.9 on
            // 1 − cos, ×1.9 on the LSE); `max_abs_rel`, which also bounds the LSE's absolute
            // error, is set by the LSE (O's max-abs alone would need 1.0).
            Precision::Mxfp4 { .. } => t(4.5e-1, 0.90, 4.5),
        }
    }

    /// Whether `m` (against a reference whose largest magnitude is `ref_max_abs`) is within bounds.
    pub fn accepts(&self, m: &ErrorMetrics, ref_max_abs: f64) -> bool {
        m.rel_l2 <= self.max_rel_l2 && m.cos_sim >= self.min_cos_sim && m.max_abs <= self.max_abs_rel * ref_max_abs.max(1e-30)
    }
}

/// FLOPs of one forward pass: [`crate::AttentionShape::flops`], FlashAttention's count
/// (`4 · B · H · Sq · Sk · D`, D the mean of the head dims, halved for causal). With a sliding
/// window, top-left alignment, a variable-length batch or a paged cache the count is of the
/// (row, key) pairs each sequence's rows see, so that TFLOP/s are of the work asked for (a
/// packed batch's real tokens, not its longest sequence times the batch).
pub fn flops(problem: &AttentionProblem) -> f64 {
    let p = problem;
    if p.window.is_none() && p.causal_align == crate::CausalAlign::BottomRight && p.varlen.is_none() && p.paged.is_none() {
        return p.shape().flops();
    }
    // Sequences of their own lengths (variable-length batches, paged caches): the pairs each
    // sequence's rows see.
    let pairs: f64 = (0..p.batch)
        .map(|b| {
            let sp = p.sequence(b);
            (0..sp.q_len).map(|i| sp.visible_keys(i) as f64).sum::<f64>()
        })
        .sum();
    2.0 * p.q_heads as f64 * pairs * (p.head_dim + p.v_head_dim) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_of_known_vectors() {
        let r = [3.0, 4.0];
        let m = ErrorMetrics::compare(&[3.0f64, 4.0], &r);
        assert_eq!((m.rel_l2, m.max_abs, m.rmse), (0.0, 0.0, 0.0));
        assert!((m.cos_sim - 1.0).abs() < 1e-15);
        let m = ErrorMetrics::compare(&[3.0f64, 5.0], &r);
        assert!((m.rel_l2 - 0.2).abs() < 1e-15);
        assert!((m.rel_l1 - 1.0 / 7.0).abs() < 1e-15);
        assert_eq!(m.max_abs, 1.0);
        assert!((m.rmse - (0.5f64).sqrt()).abs() < 1e-15);
        let m = ErrorMetrics::compare(&[-3.0f64, -4.0], &r);
        assert!((m.cos_sim + 1.0).abs() < 1e-15);
    }

    #[test]
    fn nan_poisons_every_metric() {
        let m = ErrorMetrics::compare(&[1.0f32, f32::NAN], &[1.0, 1.0]);
        assert!(m.rel_l2.is_nan() && m.cos_sim.is_nan());
        assert!(!Tolerance::for_precision(Precision::F32).accepts(&m, 1.0));
    }

    #[test]
    fn lse_infinities_must_match() {
        assert!(compare_lse(&[f32::NEG_INFINITY, 1.0], &[f64::NEG_INFINITY, 1.0]).is_some());
        assert!(compare_lse(&[0.0, 1.0], &[f64::NEG_INFINITY, 1.0]).is_none());
    }

    #[test]
    fn flops_counts_and_halves_for_causal() {
        let p = AttentionProblem::new(2, 3, 5, 8).kv_len(7);
        assert_eq!(flops(&p), 4.0 * 2.0 * 3.0 * 5.0 * 7.0 * 8.0);
        assert_eq!(flops(&p.clone().causal(true)), flops(&p) / 2.0);
        // A window of 2 keys each side on 5 x 7, bottom-right (a(i) = i + 2): rows see
        // 5, 5, 5, 4, 3 keys.
        assert_eq!(flops(&p.clone().window(2, 2)), 4.0 * 2.0 * 3.0 * 22.0 * 8.0);
    }

    #[test]
    fn tolerances_tighten_with_precision() {
        let f32t = Tolerance::for_precision(Precision::F32);
        let f16t = Tolerance::for_precision(Precision::F16_DEFAULT);
        let bf16t = Tolerance::for_precision(Precision::BF16_DEFAULT);
        let fp8t = Tolerance::for_precision(Precision::FP8_DEFAULT);
        assert!(f32t.max_rel_l2 < f16t.max_rel_l2 && f16t.max_rel_l2 < bf16t.max_rel_l2 && bf16t.max_rel_l2 < fp8t.max_rel_l2);
        // NVFP4: bf16 V and P, then NVFP4 V with f16 P, then NVFP4 V and P.
        let nv = |v| Tolerance::for_precision(Precision::Nvfp4 { v, smooth_k: false });
        let (b, p16, p4) = (nv(Nvfp4V::Bf16), nv(Nvfp4V::Nvfp4P16), nv(Nvfp4V::Nvfp4));
        assert!(b.max_rel_l2 < p16.max_rel_l2 && p16.max_rel_l2 < p4.max_rel_l2);
        assert!(b.min_cos_sim > p16.min_cos_sim && p16.min_cos_sim > p4.min_cos_sim);
    }
}
