//! The CPU device against the f64 reference: every 16/32-bit precision, causal and not, GQA,
//! ragged lengths, both layouts, LSE.

use quattn::metrics::{compare_lse, ErrorMetrics, Tolerance};
use quattn::{inputs, reference, AttentionProblem, Device, HostSlice, Layout, Precision, Session, Strategy};

fn check(p: AttentionProblem, prec: Precision, seed: u64) -> ErrorMetrics {
    let p = p.with_lse(true);
    let s = Session::new(Device::Cpu).unwrap();
    let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
    let (q, k, v) = inputs::qkv(&p, seed);
    let dt = prec.input_dtype();
    let (q, k, v) = (HostSlice::F32(&q).rounded_to(dt), HostSlice::F32(&k).rounded_to(dt), HostSlice::F32(&v).rounded_to(dt));
    let out = s.run(&plan, &q, &k, &v).unwrap();
    let r = reference::attention_f64(&p, &q, &k, &v).unwrap();
    let m = ErrorMetrics::compare(&out.o, &r.o);
    let tol = Tolerance::for_precision(prec);
    let ref_max = r.o.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    assert!(tol.accepts(&m, ref_max), "{prec} {p:?}: {m:?} vs {tol:?}");
    let lm = compare_lse(out.lse.as_ref().unwrap(), &r.lse).expect("LSE infinities match");
    assert!(lm.max_abs < tol.max_abs_rel, "{prec} LSE {lm:?}");
    m
}

#[test]
fn f32_meets_1e6_on_the_readme_shape() {
    for seed in [1, 2, 3] {
        let m = check(AttentionProblem::new(1, 4, 512, 64), Precision::F32, seed);
        assert!(m.rel_l2 < 1e-6, "seed {seed}: {m:?}");
    }
}

#[test]
fn matrix_of_shapes_and_precisions() {
    let shapes = [
        AttentionProblem::new(1, 2, 1, 64).kv_len(77),
        AttentionProblem::new(1, 8, 17, 64).kv_heads(2).kv_len(45).causal(true),
        AttentionProblem::new(2, 4, 127, 32).causal(true).layout(Layout::Bshd),
        AttentionProblem::new(1, 2, 300, 128).kv_len(200).causal(true),
        AttentionProblem::new(1, 3, 40, 96).kv_heads(1).kv_len(130).layout(Layout::Bshd),
        AttentionProblem::new(1, 1, 33, 256).kv_len(65).v_head_dim(64),
    ];
    for (i, p) in shapes.into_iter().enumerate() {
        for prec in [Precision::F32, Precision::F16_DEFAULT, Precision::BF16_DEFAULT] {
            check(p.clone(), prec, 100 + i as u64);
        }
    }
}

#[test]
fn rows_that_see_no_key_are_zero_with_minus_infinite_lse() {
    // q_len 6 > kv_len 2, causal: rows 0..4 see no key.
    let p = AttentionProblem::new(1, 1, 6, 16).kv_len(2).causal(true).with_lse(true);
    let s = Session::new(Device::Cpu).unwrap();
    let plan = s.plan(&p, Precision::F32, Strategy::Auto).unwrap();
    let (q, k, v) = inputs::qkv(&p, 9);
    let out = s.run(&plan, &q, &k, &v).unwrap();
    let lse = out.lse.unwrap();
    for i in 0..4 {
        assert!(out.o[i * 16..(i + 1) * 16].iter().all(|&x| x == 0.0));
        assert_eq!(lse[i], f32::NEG_INFINITY);
    }
    assert!(lse[4].is_finite() && lse[5].is_finite());
}

#[test]
fn f16_and_bf16_host_inputs() {
    let p = AttentionProblem::new(1, 2, 33, 64).causal(true);
    let s = Session::new(Device::Cpu).unwrap();
    let (q, k, v) = inputs::qkv(&p, 4);
    let plan = s.plan(&p, Precision::F16_DEFAULT, Strategy::Auto).unwrap();
    let h = |x: &[f32]| x.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>();
    let a = s.run(&plan, &h(&q), &h(&k), &h(&v)).unwrap();
    let b = s.run(&plan, &q, &k, &v).unwrap();
    // The f32 inputs are rounded to f16 on upload, so both give the same bits.
    assert_eq!(a.o, b.o);
    let plan = s.plan(&p, Precision::BF16_DEFAULT, Strategy::Auto).unwrap();
    let hb = |x: &[f32]| x.iter().map(|&v| half::bf16::from_f32(v)).collect::<Vec<_>>();
    let c = s.run(&plan, &hb(&q), &hb(&k), &hb(&v)).unwrap();
    assert_ne!(a.o, c.o);
}

/// Only the native CUDA prepass keeps INT8 operands to read back: the CPU device and the
/// emulation answer `None` (no error) for INT8 and float plans alike, after an execution.
#[test]
fn int8_operands_are_none_off_the_native_cuda_path() {
    let s = Session::new(Device::Cpu).unwrap();
    let p = AttentionProblem::new(1, 2, 20, 64).kv_len(30);
    let (q, k, v) = inputs::qkv(&p, 7);
    for (prec, strategy) in [(Precision::INT8_DEFAULT, Strategy::Reference), (Precision::F32, Strategy::Auto)] {
        let plan = s.plan(&p, prec, strategy).unwrap();
        let mut r = s.upload(&plan, &q, &k, &v).unwrap();
        s.execute(&mut r).unwrap();
        assert!(s.int8_operands(&r).unwrap().is_none(), "{prec} {strategy:?}");
    }
}

/// The CPU FP8 kernel (codes and descales at upload, decoded in the kernel): within the mode's
/// tolerance of f64, and next to its emulation (the same quantization; only summation order and
/// the place of the V descale differ).
#[test]
fn fp8_reads_codes_and_follows_its_emulation() {
    use quattn::{DescaleGranularity, Fp8Format, PvFormat};
    let shapes = [
        AttentionProblem::new(1, 4, 1, 64).kv_heads(2).kv_len(300),
        AttentionProblem::new(1, 2, 130, 128).kv_len(200).causal(true),
        AttentionProblem::new(2, 2, 33, 64).kv_len(65).layout(Layout::Bshd),
    ];
    let s = Session::new(Device::Cpu).unwrap();
    for (i, p) in shapes.into_iter().enumerate() {
        for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for descale in [DescaleGranularity::PerTensor, DescaleGranularity::PerHead, DescaleGranularity::PerBlock] {
                {
                    let pf = PvFormat::F16;
                    let prec = Precision::Fp8 { format, descale, p: pf };
                    let seed = 300 + i as u64;
                    check(p.clone(), prec, seed);
                    let p = p.clone().with_lse(true);
                    let plan = s.plan(&p, prec, Strategy::Auto).unwrap();
                    assert!(plan.kernel_name().starts_with("fwd_cpu_fp8"), "{}", plan.kernel_name());
                    let (q, k, v) = inputs::qkv(&p, seed);
                    let out = s.run(&plan, &q, &k, &v).unwrap();
                    // The emulation with the kernel's descale blocks.
                    let emu = quattn::emulation::emulate(&p, prec, &plan.blocking.unwrap(), &q, &k, &v).unwrap();
                    let e: Vec<f64> = emu.o.iter().map(|&x| x as f64).collect();
                    let m = ErrorMetrics::compare(&out.o, &e);
                    assert!(m.rel_l2 < 1e-3, "{prec} {p:?}: kernel vs emulation {m:?}");
                    let lm = compare_lse(out.lse.as_ref().unwrap(), &emu.lse.iter().map(|&x| x as f64).collect::<Vec<_>>()).unwrap();
                    assert!(lm.max_abs < 1e-4, "{prec} LSE vs emulation {lm:?}");
                }
            }
        }
    }
}

#[test]
fn fp8_p_on_the_cpu_kernel_is_a_typed_error() {
    use quattn::{DescaleGranularity, Fp8Format, PvFormat};
    let p = AttentionProblem::new(1, 1, 4, 16).kv_len(8);
    let s = Session::new(Device::Cpu).unwrap();
    let prec = Precision::Fp8 { format: Fp8Format::E4M3, descale: DescaleGranularity::PerTensor, p: PvFormat::Fp8 };
    let err = s.plan(&p, prec, Strategy::Auto).unwrap_err();
    assert!(matches!(err, quattn::Error::UnsupportedPrecision { .. }), "{err}");
    assert!(s.plan(&p, prec, Strategy::Reference).is_ok());
}

/// FP8 host inputs follow the NaN policy: the quantizer never sees the NaN (it refuses
/// non-finite values with a typed error), and the rows that see it come out NaN.
#[test]
fn fp8_non_finite_inputs_poison_the_rows_that_see_them() {
    let p = AttentionProblem::new(1, 1, 4, 16).kv_len(8).causal(true);
    let s = Session::new(Device::Cpu).unwrap();
    let plan = s.plan(&p, Precision::FP8_DEFAULT, Strategy::Auto).unwrap();
    let (q, mut k, v) = inputs::qkv(&p, 5);
    // Key 6 (channel 1): causal with kv_len - q_len = 4, rows 2 and 3 see it.
    k[6 * 16 + 1] = f32::NAN;
    let out = s.run(&plan, &q, &k, &v).unwrap();
    for i in 0..4 {
        let row = &out.o[i * 16..][..16];
        assert_eq!(row.iter().all(|x| x.is_nan()), i >= 2, "row {i}: {row:?}");
        assert!(i >= 2 || row.iter().all(|x| x.is_finite()), "row {i}: {row:?}");
    }
    let codec = quattn::codec::fp8_scaled::Fp8Tensor::quantize(
        quattn::Fp8Format::E4M3,
        &k,
        p.k_strides(),
        p.head_dim,
        quattn::codec::fp8_scaled::DescaleLayout {
            granularity: quattn::DescaleGranularity::PerTensor,
            batch: 1,
            heads: 1,
            len: 8,
            block_rows: 8,
        },
    );
    assert!(matches!(codec, Err(quattn::Error::Quantization(_))), "{codec:?}");
}
