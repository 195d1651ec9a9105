//! NVRTC compiles and SASS checks of the NVFP4 family for sm_120a (no sm_120 device exists where
//! this runs: these checks, the lane-layout tests and the facade's emulation test are all the
//! verification the kernel has) and of the 4-bit quantization prepass on every target.
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::nvfp4::{Nvfp4Config, PvMode};
use quattn_native::nvfp4_quant::Nvfp4QuantConfig;
use quattn_native::report::report_variant;
use quattn_native::{compile_family_report, Arch, KernelCache, NativeError};

#[test]
fn every_nvfp4_variant_compiles_for_sm120a_with_the_block_scaled_mma_and_no_spill() {
    if !tools_or_skip("every_nvfp4_variant_compiles_for_sm120a") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let all = Nvfp4Config::all();
    for cfg in &all {
        let r = report_variant(&cache, cfg, Arch::Sm120a);
        println!("{}", r.summary());
        assert!(r.ok(), "{}\n{:?}", r.summary(), r.error);
        assert!(r.dynamic_smem_bytes <= 99 * 1024, "{}", r.summary());
        let regs = r.registers.expect("ptxas reported registers");
        assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
        let count = |op: &str| r.instructions.get(op).copied().unwrap_or(0);
        let omma = count("OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X");
        // The tile loop is unrolled over its n-tiles and k-steps and issued once: as many
        // block-scaled MMAs in the code as per tile (the compiler may not duplicate the loop).
        assert_eq!(omma as u32, cfg.omma_per_tile(), "{}", r.summary());
        let hmma: usize = r.instructions.iter().filter(|(k, _)| k.starts_with("HMMA")).map(|(_, n)| n).sum();
        assert_eq!(hmma as u32, cfg.hmma_per_tile(), "{}", r.summary());
        // The polynomial variant keeps half of its exp2 on MUFU.
        let ex2 = count("MUFU.EX2");
        assert!(ex2 > 0, "{}", r.summary());
    }
}

#[test]
fn the_polynomial_exp2_moves_scores_off_mufu() {
    if !tools_or_skip("the_polynomial_exp2_moves_scores_off_mufu") {
        return;
    }
    let cache = KernelCache::new(None);
    let ex2 = |poly| {
        let cfg = Nvfp4Config::new(128, PvMode::Half { bf16: true }, true, poly).unwrap();
        let r = report_variant(&cache, &cfg, Arch::Sm120a);
        assert!(r.ok(), "{}", r.summary());
        r.instructions.get("MUFU.EX2").copied().unwrap_or(0)
    };
    let (mufu, poly) = (ex2(0), ex2(2));
    println!("MUFU.EX2 in the SASS: {mufu} without the polynomial, {poly} with it");
    // 2 rows x 16 scores per lane per tile on MUFU without the polynomial; half of them with it.
    assert!(mufu >= 32, "{mufu}");
    assert!(poly + 16 <= mufu, "MUFU.EX2: {poly} with the polynomial, {mufu} without");
}

#[test]
fn nvfp4_family_is_reported_for_sm120a_only_and_the_prepass_everywhere() {
    let jobs = quattn_native::report::all_targets(None);
    let fwd: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("fwd_nvfp4")).collect();
    assert_eq!(fwd.len(), Nvfp4Config::all().len());
    assert!(fwd.iter().all(|(_, a)| *a == Arch::Sm120a));
    let quant: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("nvfp4_quant")).collect();
    assert_eq!(quant.len(), Nvfp4QuantConfig::all().len() * Nvfp4QuantConfig::TARGETS.len());
}

#[test]
fn the_kernel_refuses_other_targets_at_compile_time() {
    if !tools_or_skip("nvfp4: the_kernel_refuses_other_targets_at_compile_time") {
        return;
    }
    let cfg = Nvfp4Config::new(64, PvMode::Half { bf16: false }, false, 0).unwrap();
    assert!(matches!(cfg.request(Arch::Sm90a), Err(NativeError::UnsupportedConfig { .. })));
    let mut req = cfg.request(Arch::Sm120a).unwrap();
    req.arch = Arch::Sm90a;
    req.kernel.push_str("_forced_sm90a");
    match KernelCache::new(None).get_or_compile(&req) {
        Err(NativeError::Compile { log, .. }) => assert!(log.contains("compiles for sm_120a only"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn the_prepass_compiles_for_sm90_and_sm120a_without_spills() {
    if !tools_or_skip("the_prepass_compiles_for_sm90_and_sm120a") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(&[Arch::Sm90, Arch::Sm120a]), "nvfp4_quant")
        .into_iter()
        .filter(|r| r.kernel.starts_with("nvfp4_quant"))
        .collect();
    assert_eq!(reports.len(), 2 * Nvfp4QuantConfig::all().len());
    for r in &reports {
        println!("{}", r.summary());
        assert!(r.ok(), "{}\n{:?}", r.summary(), r.error);
    }
}
