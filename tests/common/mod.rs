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
            if matches!(device, Device::Wgpu(_) | Device::WgpuSpirv(_)) && ci {
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
    check_plan(session, &plan, seed)
}

/// [`check`] of a given plan (one whose kernel a test has adjusted, say), with its problem's LSE.
pub fn check_plan(session: &Session, plan: &quattn::Plan, seed: u64) -> ErrorMetrics {
    let (p, precision) = (plan.problem.clone(), plan.precision);
    assert!(p.return_lse, "check_plan needs a plan that returns the LSE");
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

/// Inputs of the INT8 tests: the project's normal inputs with outliers, plus +8σ on a few K
/// channels (a per-channel offset shared by every key: what K smoothing removes and what
/// inflates the unsmoothed K scales).
pub fn int8_inputs(p: &AttentionProblem, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q, mut k, v) = inputs::qkv(p, seed);
    let st = p.k_strides();
    for b in 0..p.batch {
        for h in 0..p.kv_heads {
            for j in 0..p.kv_len {
                for c in [1, p.head_dim / 3, p.head_dim - 2] {
                    k[st.offset(b, h, j) + c] += quattn::inputs::OUTLIER_SIGMA;
                }
            }
        }
    }
    let r = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(Dtype::F16);
    (r(q), r(k), r(v))
}

/// Runs an INT8 precision through the public API and checks it twice:
/// * against the CPU emulation of the mode with the plan's blocking (same codes, scales and
///   logits; the emulation rounds P to f16 for P·V where the kernel keeps it in f32, and the
///   kernel writes O in f16): per element `|O − O_emu| ≤ 2⁻¹¹·(A + |O_emu|) + 2⁻²⁵·n·max|v| +
///   2⁻²⁰·A` with `A = Σ p|v| / l` (the emulation run on |V|: the f16 rounding of each p, of
///   relative size 2⁻¹¹ or absolute 2⁻²⁵ below f16's normal range, times |v|), and the LSE
///   within a few f32 roundings of its terms;
/// * against the f64 reference with the mode's tolerance (O and LSE).
pub fn check_int8(session: &Session, p: AttentionProblem, precision: Precision, seed: u64) -> ErrorMetrics {
    let p = p.with_lse(true);
    let plan = session.plan(&p, precision, Strategy::Portable).unwrap_or_else(|e| panic!("plan {precision} {p:?}: {e}"));
    let blocking = plan.blocking.expect("an INT8 plan records its blocking");
    let (q, k, v) = int8_inputs(&p, seed);
    let out = session.run(&plan, &q, &k, &v).unwrap_or_else(|e| panic!("run {precision} {p:?}: {e}"));
    let what = format!("{} {precision} {p:?} {blocking:?}", plan.kernel);

    let emu = quattn::emulation::emulate(&p, precision, &blocking, &q, &k, &v).unwrap();
    let v_abs: Vec<f32> = v.iter().map(|x| x.abs()).collect();
    let emu_abs = quattn::emulation::emulate(&p, precision, &blocking, &q, &k, &v_abs).unwrap();
    let v_max = v.iter().fold(0.0f32, |a, &x| a.max(x.abs())) as f64;
    let (os, u16, u32_) = (p.o_strides(), 2f64.powi(-11), 2f64.powi(-20));
    let mut worst = 0.0f64;
    for b in 0..p.batch {
        for h in 0..p.q_heads {
            for i in 0..p.q_len {
                let n = p.visible_keys(i) as f64;
                for c in 0..p.v_head_dim {
                    let at = os.offset(b, h, i) + c;
                    let (got, want, a) = (out.o[at] as f64, emu.o[at] as f64, emu_abs.o[at] as f64);
                    let tol = u16 * (a + want.abs()) + 2f64.powi(-25) * n * v_max + u32_ * a;
                    let err = (got - want).abs();
                    worst = worst.max(err / tol.max(1e-30));
                    assert!(err <= tol, "{what}: O({b},{h},{i},{c}) kernel {got} vs emulation {want}: {err:e} > {tol:e}");
                }
            }
        }
    }
    let lse = out.lse.as_ref().expect("LSE asked for");
    for (r, (&got, &want)) in lse.iter().zip(&emu.lse).enumerate() {
        if want == f32::NEG_INFINITY {
            assert_eq!(got, want, "{what}: LSE row {r} of an empty row");
            continue;
        }
        // m·ln 2 + ln l + shift: a few roundings of each term; |LSE| bounds none of them when
        // they cancel, so bound by the largest plausible term (|LSE| + 16).
        let tol = 64.0 * f32::EPSILON as f64 * (want.abs() as f64 + 16.0);
        assert!(((got - want) as f64).abs() <= tol, "{what}: LSE row {r} kernel {got} vs emulation {want}");
    }

    let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{what}: {m:?} outside {tol:?}");
    let lm = compare_lse(lse, &r.lse).unwrap_or_else(|| panic!("{what}: LSE infinities differ"));
    assert!(lm.max_abs <= tol.max_abs_rel, "{what}: LSE {lm:?}");
    println!("{what}: vs f64 rel_l2 {:.2e} cos {:.6}; vs emulation worst {:.2} of bound", m.rel_l2, m.cos_sim, worst);
    m
}

/// The accuracy requirement's inputs: Q, K, V from N(0, 1) (rounded to f16), K with +8σ on a
/// few channels for every key (the per-channel offset real K activations carry).
pub fn outlier_channel_inputs(p: &AttentionProblem, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (q, k, v) = quattn::inputs::qkv_k_outlier_channels(p, seed, 8.0);
    let r = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(Dtype::F16);
    (r(q), r(k), r(v))
}

/// Issue #5's accuracy requirement for `Int8Qk` with smoothing on [`outlier_channel_inputs`]:
/// cosine similarity ≥ 0.9995 and rel-L1 ≤ 0.02 against the f64 reference. `run` computes O
/// for a precision; the unsmoothed mode is computed and printed beside it (not required).
pub fn assert_int8_accuracy(label: &str, p: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32], run: impl Fn(Precision) -> Vec<f32>) {
    let r = reference::attention_f64(p, q, k, v).unwrap();
    for g in [quattn::Int8Granularity::PerBlock, quattn::Int8Granularity::PerWarp, quattn::Int8Granularity::PerThread] {
        let prec = |smooth_k| Precision::Int8Qk { granularity: g, smooth_k, pv: quattn::PvFormat::F16 };
        let smoothed = ErrorMetrics::compare(&run(prec(true)), &r.o);
        let plain = ErrorMetrics::compare(&run(prec(false)), &r.o);
        println!(
            "{label} hd{} {g:?}: smoothed cos {:.6} rel-L1 {:.4} | unsmoothed cos {:.6} rel-L1 {:.4}",
            p.head_dim, smoothed.cos_sim, smoothed.rel_l1, plain.cos_sim, plain.rel_l1
        );
        assert!(smoothed.cos_sim >= 0.9995 && smoothed.rel_l1 <= 0.02, "{label} hd{} {g:?} smoothed: {smoothed:?}", p.head_dim);
    }
}

/// Kernel O against the f64 reference and against two CPU emulations of `precision`: with the
/// plan's blocking (the kernel's tile and k-step), and with the same blocking at the tensor-core
/// k-step of 16 (a kernel that rounds at other points). Returns (vs f64, vs the plan's
/// emulation, vs the k-step-16 emulation, the plan's emulation vs f64), rel-L2 each; checks O
/// and LSE against f64 with the mode's tolerance.
pub fn check_accumulation(session: &Session, p: AttentionProblem, precision: Precision, seed: u64) -> [f64; 4] {
    let p = p.with_lse(true);
    let plan = session
        .plan(&p, precision, Strategy::Portable)
        .unwrap_or_else(|e| panic!("plan {precision} {p:?}: {e}"));
    let blocking = plan.blocking.expect("an f16-accumulating plan records its blocking");
    let (q, k, v) = inputs::qkv(&p, seed);
    let r16 = |x: Vec<f32>| HostSlice::F32(&x).rounded_to(Dtype::F16);
    let (q, k, v) = (r16(q), r16(k), r16(v));
    let out = session
        .run(&plan, &q, &k, &v)
        .unwrap_or_else(|e| panic!("run {precision} {p:?}: {e}"));
    let what = format!("{} {precision} {p:?} {blocking:?}", plan.kernel);

    let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(precision);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{what}: {m:?} outside {tol:?}");
    let lse = out.lse.as_ref().expect("LSE asked for");
    let lm = compare_lse(lse, &r.lse).unwrap_or_else(|| panic!("{what}: LSE infinities differ"));
    assert!(lm.max_abs <= tol.max_abs_rel, "{what}: LSE {lm:?}");

    let emu = |blk: &quattn::emulation::Blocking| -> Vec<f64> {
        quattn::emulation::emulate(&p, precision, blk, &q, &k, &v)
            .unwrap()
            .o
            .iter()
            .map(|&x| x as f64)
            .collect()
    };
    let same = emu(&blocking);
    let other = emu(&quattn::emulation::Blocking { k_step: 16, ..blocking });
    let vs_same = ErrorMetrics::compare(&out.o, &same).rel_l2;
    let vs_other = ErrorMetrics::compare(&out.o, &other).rel_l2;
    let emu_err = ErrorMetrics::compare(&same.iter().map(|&x| x as f32).collect::<Vec<_>>(), &r.o).rel_l2;
    println!(
        "{what}: vs f64 {:.2e} (emulation {emu_err:.2e}); vs emulation {vs_same:.2e}, vs k-step-16 emulation {vs_other:.2e}",
        m.rel_l2
    );
    [m.rel_l2, vs_same, vs_other, emu_err]
}

/// Q, K and V as the NVFP4-V modes (`nvfp4-v4`, `nvfp4-v4p16`, unsmoothed) see them: rounded to
/// f16, quantized by the codec (Q and K along the head dim, V transposed along the keys, padded
/// to 16) and decoded back, in the problem's layout (BHSD with dense rows only). Attention in
/// f64 on these differs from those modes only by what they do to P.
pub fn nvfp4_v_decoded(p: &AttentionProblem, q: &[f32], k: &[f32], v: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    use quattn::codec::nvfp4::Nvfp4Tensor;
    assert_eq!(p.layout, quattn::Layout::Bhsd, "dense BHSD rows");
    assert_eq!(p.head_dim, p.v_head_dim);
    let f16 = |x: &[f32]| HostSlice::F32(x).rounded_to(Dtype::F16);
    let (q, k, v) = (f16(q), f16(k), f16(v));
    let d = p.head_dim;
    let deq = |x: &[f32]| Nvfp4Tensor::quantize(x, x.len() / d, d).unwrap().dequantize();
    let cols = p.kv_len.div_ceil(16) * 16;
    let rows = p.batch * p.kv_heads * d;
    let mut vt = vec![0.0f32; rows * cols];
    for bh in 0..p.batch * p.kv_heads {
        for j in 0..p.kv_len {
            for c in 0..d {
                vt[(bh * d + c) * cols + j] = v[(bh * p.kv_len + j) * d + c];
            }
        }
    }
    let vt = Nvfp4Tensor::quantize(&vt, rows, cols).unwrap().dequantize();
    let mut dv = vec![0.0f32; v.len()];
    for bh in 0..p.batch * p.kv_heads {
        for j in 0..p.kv_len {
            for c in 0..d {
                dv[(bh * p.kv_len + j) * d + c] = vt[(bh * d + c) * cols + j];
            }
        }
    }
    (deq(&q), deq(&k), dv)
}
