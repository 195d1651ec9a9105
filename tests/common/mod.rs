//! Shared helpers of the integration tests: open a device (skipping only for real GPUs that are
//! absent), run through the public API, and judge the result against the f64 reference with the
//! project's tolerance plus FlashAttention's rule (kernel error ≤ 2 × the error of the same math
//! done naively on the CPU in the input dtype, + atol).
#![allow(dead_code)]

use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{inputs, reference, AttentionProblem, Device, Dtype, HostSlice, Precision, Session, Strategy};

/// Opens `device`. A CUDA GPU that is not present is skipped with a printed reason; a missing
/// wgpu adapter fails under CI (mesa's software adapter is installed there) and is skipped
/// with a reason elsewhere.
pub fn open(device: Device) -> Option<Session> {
    match Session::new(device) {
        Ok(s) => Some(s),
        Err(e) => {
            let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false);
            if matches!(device, Device::Wgpu(_)) && ci {
                panic!("CI must have a wgpu adapter (mesa-vulkan-drivers): {e}");
            }
            println!("SKIPPED on {device}: {e}");
            None
        }
    }
}

fn round(x: f64, dt: Dtype) -> f64 {
    match dt {
        Dtype::F32 => x as f32 as f64,
        Dtype::F16 => half::f16::from_f64(x).to_f64(),
        Dtype::Bf16 => half::bf16::from_f64(x).to_f64(),
    }
}

/// The same math done naively in `dt` (PyTorch's `attention_ref(upcast=False)`): logits
/// rounded to `dt`, softmax computed wide and rounded to `dt`, P·V accumulated wide and rounded.
pub fn naive_same_dtype(p: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32], dt: Dtype) -> Vec<f64> {
    let (qs, ks, vs, os) = (p.q_strides(), p.k_strides(), p.v_strides(), p.o_strides());
    let scale = p.softmax_scale() as f64;
    let mut o = vec![0.0; p.o_len_elems()];
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let kh = p.kv_head_of(h);
            for i in 0..p.q_len {
                let n = p.visible_keys(i);
                if n == 0 {
                    continue;
                }
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        let dot: f64 = (0..p.head_dim).map(|c| q[qs.offset(b, h, i) + c] as f64 * k[ks.offset(b, kh, j) + c] as f64).sum();
                        round(round(dot, dt) * scale, dt)
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let pr: Vec<f64> = s.iter().map(|x| round((x - m).exp() / l, dt)).collect();
                for c in 0..p.v_head_dim {
                    let acc: f64 = (0..n).map(|j| pr[j] * v[vs.offset(b, kh, j) + c] as f64).sum();
                    o[os.offset(b, h, i) + c] = round(acc, dt);
                }
            }
        }
    }
    o
}

/// Runs `precision` on `session` and checks O and LSE; returns the kernel's metrics.
pub fn check(session: &Session, p: AttentionProblem, precision: Precision, strategy: Strategy, seed: u64) -> ErrorMetrics {
    let p = p.with_lse(true);
    let plan = session.plan(&p, precision, strategy).unwrap_or_else(|e| panic!("plan {precision} {p:?}: {e}"));
    let (q, k, v) = inputs::qkv(&p, seed);
    let dt = precision.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let out = session.run(&plan, &q, &k, &v).unwrap_or_else(|e| panic!("run {precision} {p:?}: {e}"));
    let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{} {precision} {p:?}: {m:?} outside {tol:?}", plan.kernel);
    // FlashAttention's rule, on max-abs: the kernel may be at most twice as far from the f64
    // reference as the naive same-dtype computation, plus an absolute slack of a few ulps.
    let naive = naive_same_dtype(&p, &q, &k, &v, dt);
    let naive_err = ErrorMetrics::compare(&naive, &r.o).max_abs;
    let atol = match dt {
        Dtype::F32 => 1e-5,
        Dtype::F16 => 1e-3,
        Dtype::Bf16 => 8e-3,
    };
    assert!(m.max_abs <= 2.0 * naive_err + atol, "{} {precision} {p:?}: max_abs {:.3e} > 2 × naive {naive_err:.3e} + {atol:e}", plan.kernel, m.max_abs);
    let lse = out.lse.as_ref().expect("LSE asked for");
    let lm = compare_lse(lse, &r.lse).unwrap_or_else(|| panic!("{} {p:?}: LSE infinities differ", plan.kernel));
    assert!(lm.max_abs <= tol.max_abs_rel, "{} {precision} {p:?}: LSE {lm:?}", plan.kernel);
    m
}
