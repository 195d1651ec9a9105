//! NVRTC compiles and SASS checks of the INT8 tcgen05 UMMA family for sm_100a; runs on machines
//! without a GPU (there is no sm_100 device in CI or anywhere this was written: these checks
//! and the CPU emulation test are all the verification the kernel has).
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::report::report_variant;
use quattn_native::{compile_family_report, Arch, Int8UmmaConfig, KernelCache, NativeError, PvAccum, Int8Granularity};

#[test]
fn every_umma_variant_compiles_for_sm100a_with_umma_and_tmem_instructions_and_no_spill() {
    if !tools_or_skip("every_umma_variant_compiles_for_sm100a") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(&[Arch::Sm100a]), "fwd_int8_umma")
        .into_iter()
        .filter(|r| r.kernel.starts_with("fwd_int8_umma"))
        .collect();
    assert_eq!(reports.len(), Int8UmmaConfig::all().len());
    for r in &reports {
        println!("{}", r.summary());
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for (r, cfg) in reports.iter().zip(Int8UmmaConfig::all()) {
        assert_eq!(r.kernel, cfg.name());
        assert_eq!(r.arch, Arch::Sm100a);
        let regs = r.registers.expect("ptxas reported registers");
        assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
        let count = |op: &str| r.instructions.get(op).copied().unwrap_or(0);
        let block_k = cfg.blocking().unwrap().block_k;
        let hd = cfg.head_dim as usize;
        // One UMMA per 32-byte k-step, issued once in the tile loop: Q·Kᵀ has hd / 32 s8 steps,
        // P·V block_k / 16 f16 steps (the compiler may not duplicate an issue site).
        assert_eq!(count("UTCIMMA"), hd / 32, "{}", r.summary());
        assert_eq!(count("UTCHMMA"), block_k / 16, "{}", r.summary());
        // Two commits per tile: S ready, O updated.
        assert_eq!(count("UTCBAR"), 2, "{}", r.summary());
        // S read in 32-column pieces (masked and unmasked tiles), O rescaled and read back.
        assert!(count("LDTM.x32") >= 2 * block_k / 32 + 2 * hd / 32, "{}", r.summary());
        assert_eq!(count("STTM.x32"), hd / 32, "{}", r.summary());
        // No mma.sync anywhere: both GEMMs are on the 5th-generation tensor core.
        assert!(r.instructions.keys().all(|k| !k.starts_with("HMMA") && !k.starts_with("IMMA")), "{}", r.summary());
    }
    let json = serde_json::to_string(&reports).unwrap();
    assert!(json.contains("UTCIMMA") && json.contains("\"sm_100a\""));
}

#[test]
fn umma_family_is_reported_for_sm100a_only() {
    // No tools needed: which (variant, target) pairs the report would build.
    let jobs = quattn_native::report::all_targets(None);
    let umma: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("fwd_int8_umma")).collect();
    assert_eq!(umma.len(), Int8UmmaConfig::all().len());
    assert!(umma.iter().all(|(_, a)| *a == Arch::Sm100a));
    assert!(quattn_native::report::all_targets(Some(&[Arch::Sm90a, Arch::Sm120a]))
        .iter()
        .all(|(v, _)| !v.name().starts_with("fwd_int8_umma")));
}

#[test]
fn the_kernel_refuses_other_targets_at_compile_time() {
    if !tools_or_skip("the_kernel_refuses_other_targets_at_compile_time") {
        return;
    }
    let cfg = Int8UmmaConfig::new(64, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
    // The config refuses to build a request for another target ...
    assert!(matches!(cfg.request(Arch::Sm90a), Err(NativeError::UnsupportedConfig { .. })));
    // ... and the source itself stops with a clear #error if forced there.
    let mut req = cfg.request(Arch::Sm100a).unwrap();
    req.arch = Arch::Sm90a;
    req.kernel.push_str("_forced_sm90a");
    match KernelCache::new(None).get_or_compile(&req) {
        Err(NativeError::Compile { arch, log, .. }) => {
            assert_eq!(arch, Arch::Sm90a);
            assert!(log.contains("compiles for sm_100a only"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // A bad BLOCK_K trips the kernel's static_assert (the host table never produces one).
    let mut req = cfg.request(Arch::Sm100a).unwrap();
    req.defines.retain(|(k, _)| k != "BLOCK_K");
    req.defines.push(("BLOCK_K".into(), "48".into()));
    req.kernel.push_str("_bk48");
    match KernelCache::new(None).get_or_compile(&req) {
        Err(NativeError::Compile { log, .. }) => assert!(log.contains("BLOCK_K"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn single_variant_report_matches_its_config() {
    if !tools_or_skip("single_variant_report_matches_its_config") {
        return;
    }
    let cfg = Int8UmmaConfig::new(128, Int8Granularity::PerWarp, PvAccum::F32).unwrap();
    let r = report_variant(&KernelCache::new(None), &cfg, Arch::Sm100a);
    assert!(r.ok(), "{}", r.summary());
    assert_eq!(r.dynamic_smem_bytes, cfg.smem_bytes().unwrap());
    assert_eq!(r.spill_store_bytes, Some(0));
}
