//! NVRTC compiles and SASS checks of the wgmma family for sm_90a; runs on machines without a GPU.
//! These checks are not a run: the kernel is unverified until `examples/wgmma_check.rs` passes
//! on an H100.
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::{compile_family_report, Arch, KernelCache, NativeError, WgmmaConfig};

#[test]
fn every_wgmma_variant_compiles_for_sm90a_with_hgmma_and_no_spill() {
    if !tools_or_skip("every_wgmma_variant_compiles_for_sm90a") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(&[Arch::Sm90a]), "fwd_wgmma")
        .into_iter()
        .filter(|r| r.kernel.starts_with("fwd_wgmma") && !r.kernel.starts_with("fwd_wgmma_int8"))
        .collect();
    assert_eq!(reports.len(), WgmmaConfig::all().len());
    for r in &reports {
        println!("{} {:?}", r.summary(), r.instructions);
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for (r, cfg) in reports.iter().zip(WgmmaConfig::all()) {
        assert_eq!(r.kernel, cfg.name());
        let regs = r.registers.expect("ptxas reported registers");
        assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
        let tile = cfg.tile().unwrap();
        let hgmma: usize = r.instructions.iter().filter(|(k, _)| k.starts_with("HGMMA")).map(|(_, v)| *v).sum();
        // Q·Kᵀ: head_dim / 16 wgmmas per issue site (the first tile and the loop); P·V:
        // block_n / 16 per site (the loop and the tail). The compiler may duplicate sites (masked
        // and unmasked paths) but never drop one.
        let per_tile = (cfg.head_dim / 16 + tile.block_n / 16) as usize;
        assert!(hgmma >= 2 * per_tile, "{}: {hgmma} HGMMA", r.summary());
        // No mma.sync anywhere.
        assert!(r.instructions.keys().all(|k| !k.starts_with("HMMA")), "{}", r.summary());
    }
}

#[test]
fn wgmma_family_is_reported_for_sm90a_only() {
    let jobs = quattn_native::report::all_targets(None);
    let w: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("fwd_wgmma") && !v.name().starts_with("fwd_wgmma_int8")).collect();
    assert_eq!(w.len(), WgmmaConfig::all().len());
    assert!(w.iter().all(|(_, a)| *a == Arch::Sm90a));
}

#[test]
fn the_kernel_refuses_other_targets_at_compile_time() {
    if !tools_or_skip("the_kernel_refuses_other_targets_at_compile_time") {
        return;
    }
    let cfg = WgmmaConfig::new(128).unwrap();
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
fn ptxas_keeps_the_wgmma_pipeline() {
    // ptxas serializes wgmma (waits after every issue) when it cannot prove the async register
    // use safe, and says so in its log: that would silently undo the S / P·V overlap.
    if !tools_or_skip("ptxas_keeps_the_wgmma_pipeline") {
        return;
    }
    let cache = KernelCache::new(None);
    for cfg in WgmmaConfig::all() {
        let c = cache.get_or_compile(&cfg.request(Arch::Sm90a).unwrap()).unwrap();
        println!("{}: {}", cfg.name(), c.log.trim());
        assert!(!c.log.contains("serialized"), "{}: {}", cfg.name(), c.log);
        let sass = quattn_native::sass::disassemble(&c.cubin).unwrap();
        let waits: Vec<&str> = sass.lines().filter(|l| l.contains("WARPGROUP") || l.contains("HGMMA")).collect();
        if std::env::var_os("QUATTN_PRINT_SASS").is_some() {
            println!("{}", waits.join("\n"));
        }
    }
}
