//! Every invalid input gets its own typed error, before any work is done.

use quattn::{AttentionProblem, Device, Error, Layout, NativeKind, PortableKind, Precision, Session, Strategy, TensorName};

fn cpu() -> Session {
    Session::new(Device::Cpu).expect("the CPU device is always present")
}

fn plan_err(p: &AttentionProblem, prec: Precision, strategy: Strategy) -> Error {
    cpu().plan(p, prec, strategy).expect_err("plan must fail")
}

#[test]
fn zero_sizes_name_the_dimension() {
    let base = AttentionProblem::new(1, 2, 8, 64);
    let cases: [(&str, AttentionProblem); 7] = [
        ("batch", AttentionProblem { batch: 0, ..base.clone() }),
        ("q_heads", AttentionProblem { q_heads: 0, ..base.clone() }),
        ("kv_heads", AttentionProblem { kv_heads: 0, ..base.clone() }),
        ("q_len", AttentionProblem { q_len: 0, ..base.clone() }),
        ("kv_len", AttentionProblem { kv_len: 0, ..base.clone() }),
        ("head_dim", AttentionProblem { head_dim: 0, ..base.clone() }),
        ("v_head_dim", AttentionProblem { v_head_dim: 0, ..base.clone() }),
    ];
    for (name, p) in cases {
        match plan_err(&p, Precision::F32, Strategy::Auto) {
            Error::ZeroSize { name: n } => assert_eq!(n, name),
            e => panic!("{name}: wrong error {e}"),
        }
    }
}

#[test]
fn gqa_ratio_must_be_an_integer() {
    let p = AttentionProblem::new(1, 8, 16, 64).kv_heads(3);
    assert!(matches!(plan_err(&p, Precision::F32, Strategy::Auto), Error::GqaRatio { q_heads: 8, kv_heads: 3 }));
    // More KV heads than Q heads is not GQA either.
    let p = AttentionProblem::new(1, 2, 16, 64).kv_heads(4);
    assert!(matches!(plan_err(&p, Precision::F32, Strategy::Auto), Error::GqaRatio { .. }));
}

#[test]
fn non_finite_scale() {
    for s in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let p = AttentionProblem::new(1, 1, 4, 64).scale(s);
        match plan_err(&p, Precision::F32, Strategy::Auto) {
            Error::NonFiniteScale { scale } => assert!(!scale.is_finite()),
            e => panic!("wrong error {e}"),
        }
    }
}

/// A zero or negative scale is refused by `plan` with the same typed error on every device and
/// strategy (kernels track the max of the raw scores), never accepted on one backend and failed
/// at execution on another.
#[test]
fn non_positive_scale_is_the_same_plan_error_everywhere() {
    let mut sessions = vec![cpu()];
    sessions.extend(Session::new(Device::Wgpu(quattn::WgpuAdapter::Default)).ok());
    for s in &sessions {
        for scale in [0.0f32, -0.0, -0.125, -1.0] {
            let p = AttentionProblem::new(1, 2, 8, 64).scale(scale);
            for (prec, strategy) in [(Precision::F32, Strategy::Auto), (Precision::F16_DEFAULT, Strategy::Auto), (Precision::INT8_DEFAULT, Strategy::Reference)] {
                match s.plan(&p, prec, strategy) {
                    Err(Error::NonPositiveScale { scale: got }) => assert_eq!(got.to_bits(), scale.to_bits()),
                    r => panic!("{} {prec} {strategy:?} scale {scale}: {:?}", s.info().kind, r.map(|pl| pl.kernel_name())),
                }
            }
        }
        // The smallest positive scale plans.
        assert!(s.plan(&AttentionProblem::new(1, 2, 8, 64).scale(f32::MIN_POSITIVE), Precision::F32, Strategy::Auto).is_ok());
    }
}

#[test]
fn buffer_lengths_name_the_tensor() {
    let s = cpu();
    let p = AttentionProblem::new(1, 2, 8, 16).kv_len(5);
    let plan = s.plan(&p, Precision::F32, Strategy::Auto).unwrap();
    let q = vec![0.5f32; p.q_len_elems()];
    let k = vec![0.5f32; p.k_len_elems()];
    let v = vec![0.5f32; p.v_len_elems()];
    let short = |x: &Vec<f32>| x[..x.len() - 1].to_vec();
    for (t, (qq, kk, vv)) in [
        (TensorName::Q, (short(&q), k.clone(), v.clone())),
        (TensorName::K, (q.clone(), short(&k), v.clone())),
        (TensorName::V, (q.clone(), k.clone(), short(&v))),
    ] {
        match s.run(&plan, &qq, &kk, &vv) {
            Err(Error::BufferLength { tensor, expected, got }) => {
                assert_eq!(tensor, t);
                assert_eq!(got + 1, expected);
            }
            other => panic!("{t}: expected BufferLength, got {other:?}"),
        }
    }
    assert!(s.run(&plan, &q, &k, &v).is_ok());
}

#[test]
fn shape_mismatch_names_the_tensor() {
    // K with another head dim than Q.
    let e = AttentionProblem::from_shapes(Layout::Bhsd, &[1, 4, 8, 64], &[1, 4, 8, 32], &[1, 4, 8, 64], false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { tensor: TensorName::K, .. }), "{e}");
    // V with another sequence length than K.
    let e = AttentionProblem::from_shapes(Layout::Bhsd, &[1, 4, 8, 64], &[1, 4, 8, 64], &[1, 4, 9, 64], false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { tensor: TensorName::V, .. }), "{e}");
    // Batch mismatch in BSHD.
    let e = AttentionProblem::from_shapes(Layout::Bshd, &[2, 8, 4, 64], &[1, 8, 4, 64], &[1, 8, 4, 64], false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { tensor: TensorName::K, .. }), "{e}");
    // Rank 3: the error names the rank and the shape given, not a made-up expected shape.
    let e = AttentionProblem::from_shapes(Layout::Bhsd, &[4, 8, 64], &[1, 4, 8, 64], &[1, 4, 8, 64], false).unwrap_err();
    assert!(matches!(&e, Error::Rank { tensor: TensorName::Q, expected: 4, got } if got == &vec![4, 8, 64]), "{e}");
    assert!(!e.to_string().contains("[0, 0, 0, 0]"), "{e}");
    // A good one, GQA in BSHD.
    let p = AttentionProblem::from_shapes(Layout::Bshd, &[2, 8, 4, 64], &[2, 16, 2, 64], &[2, 16, 2, 32], true).unwrap();
    assert_eq!((p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, p.v_head_dim), (4, 2, 8, 16, 64, 32));
}

/// The CPU kernels index with usize: a problem whose tensors span 8.6e9 elements plans there
/// (nothing is allocated at plan time); a problem past the address space is refused on every
/// path; the portable kernels (u32 offsets) refuse anything above 2^31 - 1 elements, naming
/// their limit, on wgpu where an adapter is present.
#[test]
fn size_limits_per_path() {
    let p = AttentionProblem::new(64, 64, 1 << 14, 128);
    let plan = cpu().plan(&p, Precision::F32, Strategy::Auto).expect("the CPU takes any size memory allows");
    assert_eq!(plan.family(), quattn::Family::Cpu);
    assert!(cpu().plan(&p, Precision::F16_DEFAULT, Strategy::Reference).is_ok());
    let fp8 = Precision::parse("fp8-e4m3").unwrap();
    assert_eq!(cpu().plan(&p, fp8, Strategy::Auto).expect("the CPU FP8 kernel too").family(), quattn::Family::Cpu);
    // 2^67 elements: more than any f32 tensor the address space holds.
    let huge = AttentionProblem::new(1 << 20, 1 << 10, 1 << 30, 128);
    match plan_err(&huge, Precision::F32, Strategy::Auto) {
        Error::TooLarge { what: "Q elements", value, limit, path } => {
            assert_eq!((value, limit), (1u128 << 67, quattn::problem::MAX_TENSOR_ELEMS as u128));
            assert!(path.contains("every path"), "{path}");
        }
        e => panic!("wrong error {e}"),
    }
    let Ok(wgpu) = Session::new(Device::Wgpu(quattn::WgpuAdapter::Default)) else { return };
    let big = AttentionProblem::new(1, 32, 600_000, 128).kv_len(256);
    for (prec, strategy) in [(Precision::F32, Strategy::Auto), (Precision::F16_DEFAULT, Strategy::PortableFamily(PortableKind::Fma)), (Precision::INT8_DEFAULT, Strategy::Auto)] {
        match wgpu.plan(&big, prec, strategy) {
            Err(Error::TooLarge { what: "Q elements", value, limit, path }) => {
                assert_eq!((value, limit), (32 * 600_000 * 128, i32::MAX as u128));
                assert!(path.contains("portable"), "{path}");
            }
            other => panic!("{prec} {strategy:?}: {:?}", other.map(|p| p.kernel_name())),
        }
    }
}

#[test]
fn unsupported_precision_on_the_cpu_kernel() {
    let p = AttentionProblem::new(1, 2, 16, 64);
    // (The NVFP4 and MXFP4 modes run on the CPU 4-bit kernel: tests/cpu_fp4.rs.)
    for prec in [Precision::INT8_DEFAULT, Precision::parse("fp8-e4m3-pfp8").unwrap(), Precision::parse("f16-acc16").unwrap()] {
        match plan_err(&p, prec, Strategy::Auto) {
            Error::UnsupportedPrecision { precision, device, .. } => {
                assert_eq!(precision, prec);
                assert_eq!(device, "cpu");
            }
            e => panic!("{prec}: wrong error {e}"),
        }
    }
}

#[test]
fn native_strategy_needs_a_gpu() {
    let p = AttentionProblem::new(1, 2, 16, 64);
    assert!(matches!(
        plan_err(&p, Precision::F16_DEFAULT, Strategy::Native(NativeKind::Hmma)),
        Error::UnsupportedStrategy { strategy: Strategy::Native(NativeKind::Hmma), .. }
    ));
}

#[test]
fn portable_families_are_cubecl_kernels() {
    let p = AttentionProblem::new(1, 2, 16, 64);
    for kind in [PortableKind::Fma, PortableKind::Cmma, PortableKind::Mma] {
        let strategy = Strategy::PortableFamily(kind);
        match plan_err(&p, Precision::F16_DEFAULT, strategy) {
            Error::UnsupportedStrategy { strategy: s, reason, .. } => {
                assert_eq!(s, strategy);
                assert!(reason.contains(kind.name()), "{reason}");
            }
            e => panic!("{kind:?}: wrong error {e}"),
        }
    }
}

#[test]
fn errors_display_what_is_wrong() {
    let p = AttentionProblem::new(1, 8, 16, 64).kv_heads(3);
    let msg = plan_err(&p, Precision::F32, Strategy::Auto).to_string();
    assert!(msg.contains("q_heads = 8") && msg.contains("kv_heads = 3"), "{msg}");
    let e: Box<dyn std::error::Error> = Box::new(plan_err(&AttentionProblem { batch: 0, ..p }, Precision::F32, Strategy::Auto));
    assert!(e.to_string().contains("batch"));
}

#[test]
fn head_dim_the_path_cannot_take() {
    // NVFP4 scales blocks of 16 along the head dim: 24 has no whole block.
    let p = AttentionProblem::new(1, 2, 16, 24);
    match plan_err(&p, Precision::NVFP4_DEFAULT, Strategy::Reference) {
        Error::UnsupportedHeadDim { head_dim: 24, supported, .. } => assert!(supported.contains(&64)),
        e => panic!("wrong error {e}"),
    }
}

#[test]
fn missing_device_is_a_typed_error() {
    match Session::new(Device::Cuda(97)) {
        Err(Error::DeviceUnavailable { device: Device::Cuda(97), reason }) => assert!(!reason.is_empty()),
        Err(Error::NotCompiledWith { feature: "cuda", .. }) => {}
        other => panic!("expected DeviceUnavailable, got {:?}", other.err()),
    }
}

#[test]
fn modes_no_hardware_computes() {
    let p = AttentionProblem::new(1, 2, 16, 64);
    let bf16_acc16 = Precision::Bf16 { qk: quattn::QkAccum::F16, pv: quattn::PvAccum::F32 };
    for strategy in [Strategy::Auto, Strategy::Reference] {
        assert!(matches!(plan_err(&p, bf16_acc16, strategy), Error::UnsupportedPrecision { .. }));
    }
}

/// Without the `spirv` feature, asking for CubeCL's SPIR-V compiler is a typed error (not WGSL
/// under another name).
#[cfg(all(feature = "wgpu", not(feature = "spirv")))]
#[test]
fn wgpu_spirv_needs_the_spirv_feature() {
    match Session::new(Device::WgpuSpirv(quattn::WgpuAdapter::Default)) {
        Err(Error::NotCompiledWith { feature: "spirv", .. }) => {}
        Err(e) => panic!("wrong error {e}"),
        Ok(s) => panic!("opened {:?} without the spirv feature", s.info()),
    }
}
