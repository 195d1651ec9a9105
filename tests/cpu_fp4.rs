//! The CPU 4-bit kernel: every NVFP4 mode and MXFP4 (with and without K smoothing) plans on it
//! with `Strategy::Auto` on `Device::Cpu`; its output, written over O and LSE that hold NaN until
//! it runs, against the f64 reference (the mode's tolerance) and against the CPU emulation with
//! the plan's blocking (the same codes, the same tiles and roundings, so what is left is at most
//! f32 rounding); the typed errors of the shapes and features it does not take.

mod common;

use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{
    inputs, reference, AttentionProblem, Device, Error, Family, HostSlice, KernelId, Layout, Nvfp4V, Precision, Session, Strategy, VarLen,
};

fn modes() -> Vec<Precision> {
    let mut v = Vec::new();
    for smooth_k in [false, true] {
        v.push(Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k });
        v.push(Precision::Nvfp4 { v: Nvfp4V::Nvfp4, smooth_k });
        v.push(Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k });
        v.push(Precision::Mxfp4 { smooth_k });
    }
    v
}

/// Head dims 64 and 128, GQA, causal and not, key counts that are no multiple of the 16-key
/// blocks or the 64-key tiles, both layouts, and rows that see no key (q_len > kv_len, causal).
fn shapes() -> Vec<AttentionProblem> {
    vec![
        AttentionProblem::new(1, 4, 37, 64).kv_heads(2).kv_len(100),
        AttentionProblem::new(2, 8, 29, 128).kv_heads(2).kv_len(77).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 2, 50, 128).kv_len(131),
        AttentionProblem::new(1, 4, 40, 64).kv_heads(1).kv_len(17).causal(true),
    ]
    .into_iter()
    .map(|p| p.with_lse(true))
    .collect()
}

#[test]
fn auto_runs_the_4bit_kernel_within_tolerance_and_with_its_emulation() {
    let s = Session::new(Device::Cpu).unwrap();
    for (si, p) in shapes().into_iter().enumerate() {
        for (mi, prec) in modes().into_iter().enumerate() {
            let what = format!("{prec} shape {si}");
            let plan = s.plan(&p, prec, Strategy::Auto).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(plan.kernel, KernelId::CpuFp4 { precision: prec, head_dim: p.head_dim }, "{what}");
            assert_eq!(plan.family(), Family::Cpu, "{what}");
            assert_eq!(plan.kernel_name(), format!("fwd_cpu_{}_d{}", prec.name(), p.head_dim));
            let blocking = plan.blocking.expect("the 4-bit plan records its tiles");

            let (q, k, v) = inputs::qkv(&p, 4000 + 10 * si as u64 + mi as u64);
            let dt = prec.input_dtype();
            let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
            let mut r = s.upload(&plan, &q, &k, &v).unwrap();
            // Before the kernel runs, O and LSE hold NaN: reading them back is the NaN policy's
            // overflow error (finite inputs, non-finite output), so every element the checks
            // below see finite was written by the kernel.
            assert!(matches!(s.download(&r), Err(Error::Overflow { .. })), "{what}: O is not poisoned before the run");
            s.execute(&mut r).unwrap();
            let out = s.download(&r).unwrap_or_else(|e| panic!("{what}: {e}"));
            let lse = out.lse.as_ref().unwrap();

            // Rows that see no key: O = 0 and LSE = -inf; every other row finite.
            let os = p.o_strides();
            for h in 0..p.q_heads {
                for b in 0..p.batch {
                    for i in 0..p.q_len {
                        let row = &out.o[os.offset(b, h, i)..][..p.v_head_dim];
                        let l = lse[(b * p.q_heads + h) * p.q_len + i];
                        if p.visible_keys(i) == 0 {
                            assert!(row.iter().all(|&x| x == 0.0) && l == f32::NEG_INFINITY, "{what}: empty row {i}");
                        } else {
                            assert!(row.iter().all(|x| x.is_finite()) && l.is_finite(), "{what}: row {i}");
                        }
                    }
                }
            }

            let reference = reference::attention_f64(&p, &q, &k, &v).unwrap();
            let m = ErrorMetrics::compare(&out.o, &reference.o);
            let tol = Tolerance::for_precision(prec);
            let ref_max = reference.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
            assert!(tol.accepts(&m, ref_max), "{what}: {m:?} vs {tol:?}");
            let lm = compare_lse(lse, &reference.lse).unwrap_or_else(|| panic!("{what}: LSE infinities differ"));
            assert!(lm.max_abs <= tol.max_abs_rel, "{what}: LSE {lm:?}");
            // Quantized: far from exact (the codes are really used).
            assert!(m.rel_l2 > 1e-2, "{what}: suspiciously exact {m:?}");

            // The emulation of the plan's blocking quantizes to the same codes and rounds P at
            // the same points in the same tiles. A probability within an ulp of a bf16 or E2M1
            // rounding boundary could round the other way under another f32 summation order:
            // one element of one row, far below this bound.
            let emu = quattn::emulation::emulate(&p, prec, &blocking, &q, &k, &v).unwrap();
            let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
            let me = ErrorMetrics::compare(&out.o, &e);
            assert!(me.rel_l2 < 1e-4, "{what}: kernel vs emulation {me:?} (vs f64: {m:?})");
            let el: Vec<f64> = emu.lse.iter().map(|&x| x as f64).collect();
            let lme = compare_lse(lse, &el).unwrap_or_else(|| panic!("{what}: LSE infinities differ from the emulation"));
            assert!(lme.max_abs < 1e-4, "{what}: LSE vs emulation {lme:?}");
        }
    }
}

/// K smoothing is applied and undone: on keys with a +8σ offset on three channels the smoothed
/// modes are closer to f64 than the plain ones, in O and above all in the LSE, which would be
/// off by `scale · q·μ` (more than 0.5 here) if the shift were not added back.
#[test]
fn smoothing_on_the_cpu_kernel_helps_with_an_offset_k_channel() {
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 4, 64, 64).kv_heads(2).kv_len(256).with_lse(true);
    let (q, k, v) = inputs::qkv_k_outlier_channels(&p, 4100, 8.0);
    for plain in [Precision::Nvfp4 { v: Nvfp4V::Bf16, smooth_k: false }, Precision::Mxfp4 { smooth_k: false }] {
        let smooth = match plain {
            Precision::Nvfp4 { v, .. } => Precision::Nvfp4 { v, smooth_k: true },
            _ => Precision::Mxfp4 { smooth_k: true },
        };
        let dt = plain.input_dtype();
        let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
        let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
        let run = |prec| {
            let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
            assert!(matches!(plan.kernel, KernelId::CpuFp4 { .. }), "{}", plan.kernel);
            let out = s.run(&plan, &q, &k, &v).unwrap();
            (ErrorMetrics::compare(&out.o, &r.o), compare_lse(out.lse.as_ref().unwrap(), &r.lse).unwrap())
        };
        let ((o0, l0), (o1, l1)) = (run(plain), run(smooth));
        println!("{plain} -> {smooth}: O rel-L2 {:.4} -> {:.4}, LSE max {:.4} -> {:.4}", o0.rel_l2, o1.rel_l2, l0.max_abs, l1.max_abs);
        assert!(o1.rel_l2 < o0.rel_l2, "{smooth}: {o1:?} vs {o0:?}");
        assert!(l1.max_abs < 0.5 * l0.max_abs, "{smooth}: LSE {l1:?} vs {l0:?}");
    }
}

/// NVFP4 V with f16 P (`nvfp4-v4p16`) against NVFP4 V with NVFP4 P (`nvfp4-v4`) on the CPU
/// kernel, on the same inputs (the same Q, K and V codes): against attention in f64 on the
/// decoded codes, f16 P leaves only its own rounding (relative 2^-11 per probability) where
/// NVFP4 P leaves its 4-bit error; against f64 on the inputs, f16 P is the closer of the two.
#[test]
fn f16_p_is_closer_to_f64_than_nvfp4_p_on_the_same_codes() {
    let s = Session::new(Device::Cpu).unwrap();
    let shapes = [
        AttentionProblem::new(1, 4, 37, 64).kv_heads(2).kv_len(100),
        AttentionProblem::new(2, 4, 29, 128).kv_heads(1).kv_len(300).causal(true),
        AttentionProblem::new(1, 2, 8, 128).kv_len(1000),
    ];
    for (si, p) in shapes.into_iter().enumerate() {
        let p = p.with_lse(true);
        let (q, k, v) = inputs::qkv(&p, 4300 + si as u64);
        let dt = Precision::Nvfp4 { v: Nvfp4V::Nvfp4P16, smooth_k: false }.input_dtype();
        let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
        let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
        let (dq, dk, dv) = common::nvfp4_v_decoded(&p, &q, &k, &v);
        let rd = reference::attention_f64(&p, &dq, &dk, &dv).unwrap();
        let run = |v_fmt| {
            let prec = Precision::Nvfp4 { v: v_fmt, smooth_k: false };
            let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
            assert_eq!(plan.kernel, KernelId::CpuFp4 { precision: prec, head_dim: p.head_dim });
            let out = s.run(&plan, &q, &k, &v).unwrap();
            (ErrorMetrics::compare(&out.o, &r.o), ErrorMetrics::compare(&out.o, &rd.o))
        };
        let (p4, p4_codes) = run(Nvfp4V::Nvfp4);
        let (p16, p16_codes) = run(Nvfp4V::Nvfp4P16);
        println!("shape {si}: vs f64 rel-L2 P NVFP4 {:.4} P f16 {:.4}; vs f64 on the codes {:.2e} / {:.2e}", p4.rel_l2, p16.rel_l2, p4_codes.rel_l2, p16_codes.rel_l2);
        assert!(p16_codes.rel_l2 < 1e-3, "shape {si}: f16 P vs attention on the codes {p16_codes:?}");
        assert!(p4_codes.rel_l2 > 20.0 * p16_codes.rel_l2, "shape {si}: NVFP4 P {p4_codes:?} vs f16 P {p16_codes:?}");
        assert!(p16.rel_l2 < p4.rel_l2 && p16.cos_sim > p4.cos_sim, "shape {si}: f16 P {p16:?} vs NVFP4 P {p4:?}");
    }
}

#[test]
fn typed_errors_of_the_4bit_kernel() {
    let s = Session::new(Device::Cpu).unwrap();
    // MXFP4's scale blocks are 32 wide: head dim 48 is refused (NVFP4's 16-wide blocks take it).
    let p48 = AttentionProblem::new(1, 2, 8, 48).kv_len(20);
    for smooth_k in [false, true] {
        match s.plan(&p48, Precision::Mxfp4 { smooth_k }, Strategy::Auto) {
            Err(Error::UnsupportedHeadDim { head_dim: 48, supported, .. }) => assert!(supported.contains(&64) && !supported.contains(&48)),
            other => panic!("MXFP4 hd 48: {:?}", other.map(|p| p.kernel)),
        }
    }
    let plan = s.plan(&p48, Precision::NVFP4_DEFAULT, Strategy::Auto).unwrap();
    assert!(matches!(plan.kernel, KernelId::CpuFp4 { head_dim: 48, .. }));
    // A head dim no 4-bit block divides.
    assert!(matches!(s.plan(&AttentionProblem::new(1, 1, 4, 40), Precision::NVFP4_DEFAULT, Strategy::Auto), Err(Error::UnsupportedHeadDim { head_dim: 40, .. })));

    let paged = AttentionProblem::new(3, 8, 1, 128).kv_heads(2).paged_kv(inputs::paged_kv(16, &[100, 9, 33], 1, 2, 7));
    let varlen = AttentionProblem::new(1, 8, 1, 128).kv_heads(2).varlen(VarLen::from_lengths(&[30, 1, 12], &[30, 40, 7]));
    let softcap = AttentionProblem::new(1, 2, 8, 64).softcap(20.0);
    for prec in modes() {
        match s.plan(&paged, prec, Strategy::Auto) {
            Err(Error::UnsupportedPagedKv { kernel }) => assert!(kernel.contains("4-bit"), "{kernel}"),
            other => panic!("{prec} paged: {:?}", other.map(|p| p.kernel)),
        }
        match s.plan(&varlen, prec, Strategy::Auto) {
            Err(Error::UnsupportedVarLen { kernel }) => assert!(kernel.contains("4-bit"), "{kernel}"),
            other => panic!("{prec} varlen: {:?}", other.map(|p| p.kernel)),
        }
        match s.plan(&softcap, prec, Strategy::Auto) {
            Err(Error::UnsupportedFeature { feature: "softcap", kernel }) => assert!(kernel.contains("4-bit"), "{kernel}"),
            other => panic!("{prec} softcap: {:?}", other.map(|p| p.kernel)),
        }
    }
}

/// `Strategy::Reference` runs MXFP4 through the session on the CPU emulation, within the mode's
/// tolerance of f64.
#[test]
fn mxfp4_reference_strategy_runs_the_emulation() {
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 4, 33, 64).kv_heads(2).kv_len(70).causal(true).with_lse(true);
    let prec = Precision::Mxfp4 { smooth_k: true };
    let plan = s.plan(&p, prec, Strategy::Reference).unwrap();
    assert_eq!(plan.family(), Family::Emulation);
    let dt = prec.input_dtype();
    let (q, k, v) = inputs::qkv(&p, 4200);
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let emu = s.run(&plan, &q, &k, &v).unwrap();
    let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&emu.o, &r.o);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(Tolerance::for_precision(prec).accepts(&m, ref_max), "{m:?}");
    assert!(m.rel_l2 > 1e-2, "suspiciously exact {m:?}");
}
