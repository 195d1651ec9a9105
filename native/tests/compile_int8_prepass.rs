//! NVRTC compiles and SASS checks of the INT8 quantization prepass (every report variant, for
//! every target it is compiled for: sm_80 to sm_120a, where ptxas allocates differently); runs
//! on machines without a GPU. Not a run: the codes are checked bit for bit against the codec by
//! `quattn selftest` on a GPU.
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::report::report_variant;
use quattn_native::{Arch, Int8PrepassConfig, KernelCache, KernelVariant, PrepassPass};

#[test]
fn every_prepass_pass_compiles_without_spills_with_its_instructions() {
    if !tools_or_skip("every_prepass_pass_compiles_without_spills_with_its_instructions") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let variants = Int8PrepassConfig::report_variants();
    // Both head dims; per head dim one kernel each: per-block unsmoothed and smoothed (with
    // stats items), per-thread smoothed, per-block smoothed with V in e4m3.
    assert_eq!(variants.len(), 2 * 4);
    assert!(variants.iter().all(|v| v.pass == PrepassPass::Quantize));
    assert!(variants.iter().any(|v| v.config.v_fp8 && v.config.has_stats()));
    for v in &variants {
        // The e4m3 V conversion exists from sm_89: V_FP8 prepasses target sm_89 and newer.
        assert_eq!(v.config.targets().contains(&Arch::Sm80), !v.config.v_fp8);
        for &arch in v.config.targets() {
            let r = report_variant(&cache, v, arch);
            println!("{} {:?}", r.summary(), r.instructions);
            assert!(r.compiled, "{}", r.summary());
            assert_eq!((r.spill_store_bytes, r.spill_load_bytes), (Some(0), Some(0)), "{}", r.summary());
            assert!(r.missing.is_empty(), "{}: missing {:?}", r.summary(), r.missing);
            assert!(r.ok(), "{}", r.summary());
        }
    }
}

/// A V_FP8 quantize pass forced onto sm_80 fails to compile with the reason.
#[test]
fn the_e4m3_v_prepass_refuses_sm80_at_compile_time() {
    if !tools_or_skip("the_e4m3_v_prepass_refuses_sm80_at_compile_time") {
        return;
    }
    let v = Int8PrepassConfig::report_variants().into_iter().find(|v| v.config.v_fp8 && v.pass == PrepassPass::Quantize).unwrap();
    let mut req = KernelVariant::request(&v, Arch::Sm90).unwrap();
    req.arch = Arch::Sm80;
    req.kernel.push_str("_forced_sm80");
    match KernelCache::new(None).get_or_compile(&req) {
        Err(quattn_native::NativeError::Compile { log, .. }) => assert!(log.contains("sm_89 or newer"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}
