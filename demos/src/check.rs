//! Accuracy checking shared by `run` and `selftest`: the kernel against the f64 reference, with
//! the project's per-precision tolerance.

use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{reference, AttentionProblem, Output, Precision};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Accuracy {
    pub rel_l2: f64,
    pub rel_l1: f64,
    pub cos_sim: f64,
    pub max_abs: f64,
    pub rmse: f64,
    /// Max |LSE − LSE_ref| over finite rows; `null` when the LSE was not returned.
    pub lse_max_abs: Option<f64>,
    pub tol_rel_l2: f64,
    pub tol_cos_sim: f64,
    pub passed: bool,
    /// Why the check failed, when it did.
    pub failure: Option<String>,
}

/// The inputs every path sees: random normal with outliers, rounded to the precision's input
/// element type so the reference and the kernel start from the same numbers.
pub fn inputs(problem: &AttentionProblem, precision: Precision, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q, k, v) = quattn::inputs::qkv(problem, seed);
    let dt = precision.input_dtype();
    let r = |x: Vec<f32>| quattn::HostSlice::F32(&x).rounded_to(dt);
    (r(q), r(k), r(v))
}

pub fn check(problem: &AttentionProblem, precision: Precision, q: &[f32], k: &[f32], v: &[f32], out: &Output) -> anyhow::Result<Accuracy> {
    let r = reference::attention_f64(problem, q, k, v)?;
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    let mut failure = None;
    if !tol.accepts(&m, ref_max) {
        failure = Some(format!(
            "O outside the {precision} tolerance: rel_l2 {:.3e} (max {:.1e}), cos_sim {:.6} (min {}), max_abs {:.3e} (max {:.3e})",
            m.rel_l2,
            tol.max_rel_l2,
            m.cos_sim,
            tol.min_cos_sim,
            m.max_abs,
            tol.max_abs_rel * ref_max
        ));
    }
    let lse_max_abs = match &out.lse {
        None => None,
        Some(lse) => match compare_lse(lse, &r.lse) {
            None => {
                failure.get_or_insert_with(|| "LSE infinities (fully masked rows) differ from the reference".into());
                Some(f64::INFINITY)
            }
            Some(lm) => {
                // LSE is a log: its absolute error is the relative error of the softmax sum,
                // bounded by the same relative tolerance as O.
                if !(lm.max_abs <= tol.max_abs_rel) {
                    failure.get_or_insert_with(|| format!("LSE max_abs {:.3e} above {:.1e}", lm.max_abs, tol.max_abs_rel));
                }
                Some(lm.max_abs)
            }
        },
    };
    Ok(Accuracy {
        rel_l2: m.rel_l2,
        rel_l1: m.rel_l1,
        cos_sim: m.cos_sim,
        max_abs: m.max_abs,
        rmse: m.rmse,
        lse_max_abs,
        tol_rel_l2: tol.max_rel_l2,
        tol_cos_sim: tol.min_cos_sim,
        passed: failure.is_none(),
        failure,
    })
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
