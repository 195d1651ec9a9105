//! NVRTC compiles and SASS checks of the INT8 wgmma family for sm_90a; runs on machines without
//! a GPU. These checks are not a run: the kernel is unverified until `examples/int8_check.rs`
//! passes on an H100.
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::report::{report_variant, KernelReport};
use quattn_native::{compile_family_report, Arch, Int8Granularity, Int8WgmmaConfig, Int8WgmmaPv, KernelCache, NativeError};

fn count(r: &KernelReport, prefix: &str) -> usize {
    r.instructions.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| *v).sum()
}

/// What every variant's SASS must hold: registers within the file, no spill, the s8 Q·Kᵀ wgmma
/// at every issue site and the P·V wgmma of its format (never the other one), no mma.sync.
fn check_variant(r: &KernelReport, cfg: &Int8WgmmaConfig) {
    assert!(r.ok(), "{}", r.summary());
    assert_eq!(r.kernel, cfg.name());
    let regs = r.registers.expect("ptxas reported registers");
    assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
    assert_eq!(r.spill_store_bytes, Some(0), "{}", r.summary());
    assert_eq!(r.spill_load_bytes, Some(0), "{}", r.summary());
    // Q·Kᵀ: head_dim / 32 s8 wgmmas per issue site (one tile step, instantiated for the first
    // tile and the loop, which ptxas may merge). P·V per site (loop, tail): f16 128 / 16 = 8
    // k16 wgmmas; e4m3 block_n / 32 k32 wgmmas. The compiler may duplicate sites but never
    // drop one.
    assert!(count(r, "IGMMA") >= (cfg.head_dim / 32) as usize, "{}", r.summary());
    match cfg.pv {
        Int8WgmmaPv::F16 => {
            assert!(count(r, "HGMMA") >= 2 * 8, "{}", r.summary());
            assert_eq!(count(r, "QGMMA"), 0, "{}", r.summary());
        }
        Int8WgmmaPv::E4m3 { block_n, .. } => {
            assert!(count(r, "QGMMA") >= 2 * (block_n / 32) as usize, "{}", r.summary());
            assert_eq!(count(r, "HGMMA"), 0, "{}", r.summary());
        }
    }
    // No mma.sync anywhere.
    assert!(r.instructions.keys().all(|k| !k.starts_with("HMMA") && !k.starts_with("IMMA")), "{}", r.summary());
}

#[test]
fn every_wgmma_int8_variant_compiles_for_sm90a_with_igmma_and_no_spill() {
    if !tools_or_skip("every_wgmma_int8_variant_compiles_for_sm90a") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(&[Arch::Sm90a]), "fwd_wgmma_int8")
        .into_iter()
        .filter(|r| r.kernel.starts_with("fwd_wgmma_int8"))
        .collect();
    assert_eq!(reports.len(), Int8WgmmaConfig::all().len());
    for r in &reports {
        println!("{} {:?}", r.summary(), r.instructions);
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for (r, cfg) in reports.iter().zip(Int8WgmmaConfig::all()) {
        check_variant(r, &cfg);
    }
}

/// The e4m3 P·V variant Auto plans on sm_90 (hd 128, per block): s8 Q·Kᵀ (IGMMA) and e4m3 P·V
/// (QGMMA) in one kernel, no spill, ptxas keeps the wgmma pipeline.
#[test]
fn the_e4m3_pv_table_variant_has_igmma_and_qgmma_and_no_spill() {
    if !tools_or_skip("the_e4m3_pv_table_variant_has_igmma_and_qgmma_and_no_spill") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    for hd in [128, 64] {
        let cfg = Int8WgmmaConfig::new_fp8(hd, Int8Granularity::PerBlock).unwrap();
        let r = report_variant(&cache, &cfg, Arch::Sm90a);
        println!("{} {:?}", r.summary(), r.instructions);
        check_variant(&r, &cfg);
        let c = cache.get_or_compile(&cfg.request(Arch::Sm90a).unwrap()).unwrap();
        assert!(!c.log.contains("serialized"), "{}: {}", cfg.name(), c.log);
    }
}

#[test]
fn wgmma_int8_family_is_reported_for_sm90a_only() {
    let jobs = quattn_native::report::all_targets(None);
    let w: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("fwd_wgmma_int8")).collect();
    assert_eq!(w.len(), Int8WgmmaConfig::all().len());
    assert!(w.iter().all(|(_, a)| *a == Arch::Sm90a));
}

#[test]
fn the_int8_kernel_refuses_other_targets_at_compile_time() {
    if !tools_or_skip("the_int8_kernel_refuses_other_targets_at_compile_time") {
        return;
    }
    let cfg = Int8WgmmaConfig::new(128, quattn_native::Int8Granularity::PerBlock).unwrap();
    assert!(matches!(cfg.request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
    let mut req = cfg.request(Arch::Sm90a).unwrap();
    req.arch = Arch::Sm90;
    req.kernel.push_str("_forced_sm90");
    match KernelCache::new(None).get_or_compile(&req) {
        Err(NativeError::Compile { log, .. }) => assert!(log.contains("sm_90a only"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn ptxas_keeps_the_int8_wgmma_pipeline() {
    // ptxas serializes wgmma (waits after every issue) when it cannot prove the async register
    // use safe, and says so in its log: that would silently undo the S / P·V overlap.
    if !tools_or_skip("ptxas_keeps_the_int8_wgmma_pipeline") {
        return;
    }
    let cache = KernelCache::new(None);
    for cfg in Int8WgmmaConfig::all() {
        let c = cache.get_or_compile(&cfg.request(Arch::Sm90a).unwrap()).unwrap();
        println!("{}: {}", cfg.name(), c.log.trim());
        assert!(!c.log.contains("serialized"), "{}: {}", cfg.name(), c.log);
    }
}
