//! NVRTC compiles and SASS checks of the FP8 mma.sync family (`fwd_mma_fp8_*`, its V prepass)
//! for sm_89, sm_90 and sm_120a; runs on machines without a GPU. sm_89 and sm_120a are only
//! compiled and disassembled here (no such hardware is available); sm_90 is what an H100 runs
//! (`examples/mma_fp8_check.rs`).
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::report::{report_variant, KernelReport};
use quattn_native::{
    compile_family_report, sass, Arch, Fp8MmaConfig, Fp8MmaUnit, Fp8P, HmmaTile, Dtype, KernelCache, NativeError,
};

fn count(r: &KernelReport, op: &str) -> usize {
    r.instructions.get(op).copied().unwrap_or(0)
}

/// Matrix opcodes per KV tile of one warp's loop body, for a tile of `mt` m16 tiles and `bn` keys:
/// Q·Kᵀ issues `mt * bn/8 * hd/32` e4m3 m16n8k32; P·V issues `mt * hd/8 * bn/16` f16 m16n8k16
/// (P in f16) or `mt * hd/8 * bn/32` e4m3 m16n8k32 (P in e4m3).
fn per_tile(cfg: &Fp8MmaConfig, arch: Arch) -> (usize, usize) {
    let t = cfg.tile_for(arch).unwrap();
    let (mt, bn, hd) = ((t.rows_per_warp / 16) as usize, t.block_n as usize, cfg.head_dim as usize);
    let qk = mt * bn / 8 * hd / 32;
    let pv = match cfg.p {
        Fp8P::F16 => mt * hd / 8 * bn / 16,
        Fp8P::E4m3 => mt * hd / 8 * bn / 32,
    };
    (qk, pv)
}

#[test]
fn every_fp8_mma_variant_compiles_without_spills_and_uses_the_e4m3_mma() {
    if !tools_or_skip("every_fp8_mma_variant_compiles") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(Fp8MmaConfig::TARGETS), "fwd_mma_fp8")
        .into_iter()
        .filter(|r| r.kernel.starts_with("fwd_mma_fp8"))
        .collect();
    assert_eq!(reports.len(), Fp8MmaUnit::all().len() * Fp8MmaConfig::TARGETS.len());
    for r in &reports {
        println!("{} {:?}", r.summary(), r.instructions);
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for r in &reports {
        assert_eq!(r.spill_store_bytes, Some(0), "{}", r.summary());
        assert_eq!(r.spill_load_bytes, Some(0), "{}", r.summary());
        assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
        let regs = r.registers.expect("ptxas reported registers");
        assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
    }
    // The forward variants: the MMA forms and their counts. The KV loop body appears twice
    // (masked and mask-free tiles), so each per-tile count appears at least twice.
    for cfg in Fp8MmaConfig::all() {
        for arch in Fp8MmaConfig::TARGETS.iter().copied() {
            let (qk, pv) = per_tile(&cfg, arch);
            let r = reports.iter().find(|r| r.kernel == cfg.name() && r.arch == arch).unwrap();
            let fp8 = count(r, "QMMA.16832.F32.E4M3.E4M3");
            let f16 = count(r, "HMMA.16816.F32");
            match (arch, cfg.p) {
                // Native: Q·Kᵀ (and e4m3 P·V) on the FP8 MMA, f16 P·V on HMMA.16816.
                (Arch::Sm89 | Arch::Sm120a, Fp8P::F16) => {
                    assert!(fp8 >= 2 * qk && f16 >= 2 * pv, "{}", r.summary());
                    assert_eq!(f16 * qk, fp8 * pv, "{}: Q·Kᵀ and P·V counts out of proportion", r.summary());
                }
                (Arch::Sm89 | Arch::Sm120a, Fp8P::E4m3) => {
                    assert!(fp8 >= 2 * (qk + pv) && f16 == 0, "{}", r.summary());
                }
                // sm_90: every m16n8k32 becomes two f16 m16n8k16 on converted operands.
                (_, Fp8P::F16) => assert!(fp8 == 0 && f16 >= 2 * (2 * qk + pv), "{}", r.summary()),
                (_, Fp8P::E4m3) => assert!(fp8 == 0 && f16 >= 2 * 2 * (qk + pv), "{}", r.summary()),
            }
            // One MUFU.EX2 per score (plus the alpha of each row), in both loop copies.
            let t = cfg.tile_for(arch).unwrap();
            let scores = (t.rows_per_warp * t.block_n / 32) as usize;
            assert!(count(r, "MUFU.EX2") >= 2 * scores, "{}", r.summary());
        }
    }
}

/// The SASS opcode names the family's expectations are written against, per target: what
/// nvdisasm 13.0 prints for the e4m3 `mma.sync` and the e4m3 conversions. A change in the
/// toolkit's spelling shows here first.
#[test]
fn fp8_sass_spells_the_native_instructions() {
    if !tools_or_skip("fp8_sass_spells_the_native_instructions") {
        return;
    }
    let cache = KernelCache::new(None);
    for (p, arch, must) in [
        (Fp8P::F16, Arch::Sm89, &["QMMA.16832.F32.E4M3.E4M3", "HMMA.16816.F32", "F2FP.F16.E4M3.UNPACK_B"][..]),
        (Fp8P::E4m3, Arch::Sm89, &["QMMA.16832.F32.E4M3.E4M3", "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C"][..]),
        (Fp8P::E4m3, Arch::Sm120a, &["QMMA.16832.F32.E4M3.E4M3", "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C"][..]),
    ] {
        let cfg = Fp8MmaConfig::new(128, p, Dtype::F16).unwrap();
        let c = cache.get_or_compile(&cfg.request(arch).unwrap()).unwrap();
        let hist = sass::opcode_histogram(&sass::disassemble(&c.cubin).unwrap());
        for op in must {
            assert!(hist.contains_key(*op), "{} on {arch}: no {op} in {:?}", cfg.name(), hist.keys().collect::<Vec<_>>());
        }
    }
}

#[test]
fn fp8_forced_tiles_compile_and_bad_ones_are_refused() {
    if !tools_or_skip("fp8_forced_tiles_compile") {
        return;
    }
    let cache = KernelCache::new(None);
    let mut cfg = Fp8MmaConfig::new(128, Fp8P::F16, Dtype::F16).unwrap();
    cfg.tile = Some(HmmaTile::new(8, 64));
    for arch in [Arch::Sm89, Arch::Sm90] {
        let r = report_variant(&cache, &Fp8MmaUnit::Fwd(cfg), arch);
        println!("{}", r.summary());
        assert!(r.ok(), "{}", r.summary());
    }
    cfg.tile = Some(HmmaTile::new(4, 48));
    assert!(matches!(cfg.validate(), Err(NativeError::UnsupportedConfig { .. })));
    // Targets without e4m3 mma.sync are refused before NVRTC, and the kernel's own guard holds.
    let good = Fp8MmaConfig::new(64, Fp8P::E4m3, Dtype::F16).unwrap();
    assert!(matches!(good.request(Arch::Sm86), Err(NativeError::UnsupportedConfig { .. })));
    let mut req = good.request(Arch::Sm89).unwrap();
    req.arch = Arch::Sm86;
    req.kernel.push_str("_forced_sm86");
    match cache.get_or_compile(&req) {
        Err(NativeError::Compile { log, .. }) => assert!(log.contains("sm_89 or newer"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn fp8_family_is_reported_for_its_three_targets() {
    let jobs = quattn_native::report::all_targets(None);
    let f: Vec<_> = jobs.iter().filter(|(v, _)| v.name().starts_with("fwd_mma_fp8")).collect();
    assert_eq!(f.len(), Fp8MmaUnit::all().len() * 3);
    for arch in [Arch::Sm89, Arch::Sm90, Arch::Sm120a] {
        assert_eq!(f.iter().filter(|(_, a)| *a == arch).count(), Fp8MmaUnit::all().len());
    }
}
