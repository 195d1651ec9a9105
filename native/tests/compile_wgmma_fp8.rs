//! NVRTC compiles and SASS checks of the FP8 wgmma family (`fwd_wgmma_fp8.cu`) for sm_90a; run on
//! machines without a GPU. These checks are not a run: the kernel is checked on an H100 by
//! `examples/wgmma_fp8_check.rs`.
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::wgmma_fp8::{Fp8WgmmaConfig, Fp8WgmmaUnit};
use quattn_native::{compile_family_report, Dtype, Arch, KernelCache, KernelVariant, NativeError};

#[test]
fn every_fp8_wgmma_unit_compiles_for_sm90a_with_e4m3_hgmma_and_no_spill() {
    if !tools_or_skip("every_fp8_wgmma_unit_compiles_for_sm90a") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(&[Arch::Sm90a]), "fwd_fp8_wgmma")
        .into_iter()
        .filter(|r| r.kernel.starts_with("fwd_fp8_wgmma"))
        .collect();
    let units = Fp8WgmmaUnit::all();
    assert_eq!(reports.len(), units.len());
    for r in &reports {
        println!("{} {:?}", r.summary(), r.instructions);
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for (r, unit) in reports.iter().zip(units) {
        assert_eq!(r.kernel, unit.name());
        assert_eq!(r.spill_store_bytes, Some(0), "{}", r.summary());
        assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
        let count = |p: &str| -> usize { r.instructions.iter().filter(|(k, _)| k.starts_with(p)).map(|(_, v)| *v).sum() };
        match unit {
            Fp8WgmmaUnit::Attention(cfg) => {
                let regs = r.registers.expect("ptxas reported registers");
                assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
                // Q·Kᵀ: head_dim / 32 wgmmas m64n{block_n}k32 per issue site (one tile step, maybe
                // instantiated twice); P·V: block_n / 32 wgmmas m64n{pv_n}k32 per site (the loop and
                // the tail). The compiler may duplicate sites but never drop one.
                let s = format!("QGMMA.64x{}x32.F32.E4M3.E4M3", cfg.block_n);
                let pv = format!("QGMMA.64x{}x32.F32.E4M3.E4M3", cfg.pv_n());
                let n = |op: &str| r.instructions.get(op).copied().unwrap_or(0);
                let (s_min, pv_min) = ((cfg.head_dim / 32) as usize, 2 * (cfg.block_n / 32) as usize);
                if s == pv {
                    assert!(n(&s) >= s_min + pv_min, "{}", r.summary());
                } else {
                    assert!(n(&s) >= s_min && n(&pv) >= pv_min, "{}", r.summary());
                }
                // Nothing but E4M3 wgmma (QGMMA): no f16 HGMMA, no mma.sync.
                assert!(
                    r.instructions.keys().filter(|k| k.contains("MMA")).all(|k| k.ends_with(".E4M3.E4M3")),
                    "{}",
                    r.summary()
                );
                assert!(count("HMMA") == 0 && count("IMMA") == 0, "{}", r.summary());
            }
            Fp8WgmmaUnit::VTranspose { .. } => {
                assert_eq!(count("QGMMA") + count("HGMMA"), 0, "{}", r.summary());
            }
        }
    }
}

#[test]
fn fp8_wgmma_family_is_reported_for_sm90a_only() {
    let jobs = quattn_native::report::all_targets(None);
    let w: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("fwd_fp8_wgmma")).collect();
    assert_eq!(w.len(), Fp8WgmmaUnit::all().len());
    assert!(w.iter().all(|(_, a)| *a == Arch::Sm90a));
}

#[test]
fn ptxas_keeps_the_fp8_wgmma_pipeline_and_refuses_other_targets() {
    // ptxas serializes wgmma (waits after every issue) when it cannot prove the async register
    // use safe, and says so in its log: that would silently undo the S / P·V overlap.
    if !tools_or_skip("ptxas_keeps_the_fp8_wgmma_pipeline") {
        return;
    }
    let cache = KernelCache::new(None);
    for cfg in Fp8WgmmaConfig::all() {
        let c = cache.get_or_compile(&cfg.request(Arch::Sm90a).unwrap()).unwrap();
        println!("{}: {}", cfg.name(), c.log.trim());
        assert!(!c.log.contains("serialized"), "{}: {}", cfg.name(), c.log);
    }
    let cfg = Fp8WgmmaConfig::new(128, Dtype::F16).unwrap();
    assert!(matches!(cfg.request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
    let mut req = cfg.request(Arch::Sm90a).unwrap();
    req.arch = Arch::Sm90;
    req.kernel.push_str("_forced_sm90");
    match cache.get_or_compile(&req) {
        Err(NativeError::Compile { log, .. }) => assert!(log.contains("sm_90a only"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}
