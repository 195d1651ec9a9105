//! K smoothing for NVFP4 Q·Kᵀ (CPU codec and emulation): subtracting the per-(batch, KV head)
//! mean of K over the keys shifts every logit of a query row by the same `q·μ`, so softmax and
//! O are unchanged and the LSE moves by `scale · q·μ`, which the mode adds back; on keys with an
//! offset channel it takes the offset out of the 16-element blocks before they are scaled, which
//! is what NVFP4's block scales suffer from.

use quattn::codec::int8::{lse_shift, smooth_k};
use quattn::emulation::{emulate, Blocking};
use quattn::metrics::{compare_lse, ErrorMetrics};
use quattn::{inputs, reference, AttentionProblem, Nvfp4V, Precision};

fn lse_shifts(p: &AttentionProblem, q: &[f32], mean: &[f32]) -> Vec<f32> {
    let (st, d) = (p.q_strides(), p.head_dim);
    let mut out = Vec::new();
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            let mu = &mean[(b * p.kv_heads + p.kv_head_of(h)) * d..][..d];
            for i in 0..p.q_len {
                out.push(lse_shift(&q[st.offset(b, h, i)..][..d], mu, p.softmax_scale()));
            }
        }
    }
    out
}

#[test]
fn smoothing_leaves_the_exact_result_unchanged() {
    let p = AttentionProblem::new(2, 4, 9, 64).kv_heads(2).kv_len(70).with_lse(true);
    let (q, k, v) = inputs::qkv_k_outlier_channels(&p, 61, 8.0);
    let sm = smooth_k(&p, &k).unwrap();
    let plain = reference::attention_f64(&p, &q, &k, &v).unwrap();
    let smoothed = reference::attention_f64(&p, &q, &sm.values, &v).unwrap();
    // O in f64 from the same probabilities: only the f32 rounding of K − μ differs.
    let m = ErrorMetrics::compare(&smoothed.o, &plain.o);
    assert!(m.max_abs < 1e-5, "O with smoothed K: {m:?}");
    // The LSE moves by exactly the shift (up to the f32 sums of q·μ).
    let shifts = lse_shifts(&p, &q, &sm.mean);
    let mut moved = 0.0f64;
    for ((s, r), sh) in smoothed.lse.iter().zip(&plain.lse).zip(&shifts) {
        assert!((s + *sh as f64 - r).abs() < 1e-4, "LSE {s} + shift {sh} vs {r}");
        moved = moved.max(sh.abs() as f64);
    }
    // With +8 on three channels the shift is not small: the check above could fail.
    assert!(moved > 0.5, "largest LSE shift {moved}");
}

#[test]
fn smoothing_reduces_the_nvfp4_error_on_keys_with_an_offset_channel() {
    for (d, seed) in [(64usize, 71u64), (128, 72)] {
        let p = AttentionProblem::new(1, 4, 64, d).kv_heads(2).kv_len(256).with_lse(true);
        let (q, k, v) = inputs::qkv_k_outlier_channels(&p, seed, 8.0);
        let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
        for v_fmt in [Nvfp4V::Bf16, Nvfp4V::Nvfp4, Nvfp4V::Nvfp4P16] {
            let run = |smooth_k| {
                let prec = Precision::Nvfp4 { v: v_fmt, smooth_k };
                let e = emulate(&p, prec, &Blocking::default(), &q, &k, &v).unwrap();
                let lse = compare_lse(&e.lse, &r.lse).expect("LSE infinities match");
                (ErrorMetrics::compare(&e.o, &r.o), lse)
            };
            let (plain, plain_lse) = run(false);
            let (smooth, smooth_lse) = run(true);
            println!("d {d} v {v_fmt:?}: O rel-L2 {:.4} -> {:.4} (cos {:.5} -> {:.5}), LSE max {:.4} -> {:.4}",
                plain.rel_l2, smooth.rel_l2, plain.cos_sim, smooth.cos_sim, plain_lse.max_abs, smooth_lse.max_abs);
            // O's error also holds P's and V's rounding (4-bit V with `v: Nvfp4` and `Nvfp4P16`,
            // 4-bit P with `Nvfp4`), which smoothing
            // does not touch: it must shrink, by how much depends on that share.
            assert!(smooth.rel_l2 < plain.rel_l2, "d {d} {v_fmt:?}: {smooth:?} vs unsmoothed {plain:?}");
            // The LSE depends on the logits alone (P's and V's formats do not enter it), so it
            // shows the Q·Kᵀ error directly; it is also the check that the shift is added back
            // (without it the LSE would be off by scale · q·μ, more than 0.5 here).
            assert!(smooth_lse.max_abs < 0.5 * plain_lse.max_abs, "d {d} {v_fmt:?}: LSE {smooth_lse:?} vs {plain_lse:?}");
        }
    }
}
