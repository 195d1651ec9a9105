//! NVRTC compiles and SASS checks of every kernel variant; runs on machines without a GPU.
//!
//! Needs libnvrtc and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the tests
//! print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use std::sync::Arc;

use quattn_native::{
    compile_family_report, report::report_variant, Arch, CompileRequest, HmmaConfig, Dtype, Int8Config,
    Int8Granularity, Int8Tile, KernelCache, ModVariant, NativeError, Origin, PvAccum, QkAccum,
};

/// The pre-Blackwell targets: every HMMA variant is compiled for the first two; sm_86 and sm_89
/// (the same instruction set as sm_80, another register file and shared memory size) for a
/// covering sample, every head dim, input type and accumulation mode at least once, since each
/// compile costs seconds on two cores (`quattn kernels` reports them all).
const FULL: [Arch; 2] = [Arch::Sm80, Arch::Sm90];
const SAMPLED: [Arch; 2] = [Arch::Sm86, Arch::Sm89];

/// The variants of `configs` that bring a head dim, input type or accumulation mode none before
/// them had.
fn covering(configs: impl IntoIterator<Item = HmmaConfig>) -> Vec<HmmaConfig> {
    let mut seen = std::collections::HashSet::new();
    configs
        .into_iter()
        .filter(|c| {
            let keys = [format!("d{}", c.head_dim), format!("in {:?}", c.input), format!("qk {:?}", c.qk), format!("pv {:?}", c.pv)];
            let new = keys.iter().any(|k| !seen.contains(k));
            seen.extend(keys);
            new
        })
        .collect()
}

#[test]
fn every_hmma_variant_compiles_without_spills_and_uses_the_intended_mma() {
    if !tools_or_skip("every_hmma_variant_compiles") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports = compile_family_report(&cache, Some(&FULL), "fwd_hmma");
    let mut reports: Vec<_> = reports.into_iter().filter(|r| r.kernel.starts_with("fwd_hmma")).collect();
    // The modifier and variable-length variants build for their own targets (`targets()`).
    let expected: usize = HmmaConfig::all().iter().map(|c| FULL.iter().filter(|a| c.targets().contains(a)).count()).sum();
    assert_eq!(reports.len(), expected);
    let mut sampled = 0;
    for arch in SAMPLED {
        for c in covering(HmmaConfig::all().into_iter().filter(|c| c.targets().contains(&arch))) {
            reports.push(report_variant(&cache, &c, arch));
            sampled += 1;
        }
    }
    assert!(sampled >= 2 * 6, "{sampled} sampled sm_86/sm_89 variants");
    for r in &reports {
        println!("{}", r.summary());
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for r in &reports {
        let regs = r.registers.expect("ptxas reported registers");
        assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
        // Every mode keeps both GEMMs on tensor cores: 2 MMAs per (k16, n16) step of each.
        let mmas: usize = r.instructions.iter().filter(|(k, _)| k.starts_with("HMMA")).map(|(_, v)| v).sum();
        assert!(mmas > 0, "{}: no HMMA", r.kernel);
    }
    // The JSON form the CLI prints must serialise.
    let json = serde_json::to_string(&reports).unwrap();
    assert!(json.contains("HMMA.16816.F32"));
}

/// The window-only modifier variant (band, alignment, sinks; no softcap, no ALiBi) runs the
/// plain f32 kernel's tile, 32 rows per warp, on every modifier target where that compiles
/// without spills (the compact one at hd64 on sm_90), next to the superset's 16 rows; both
/// without spills, with the shared memory their tiles say.
#[test]
fn window_only_modifier_variants_run_32_rows_per_warp_without_spills() {
    if !tools_or_skip("window_only_modifier_variants_run_32_rows_per_warp_without_spills") {
        return;
    }
    let cache = KernelCache::new(None);
    for hd in [64, 128] {
        for input in [Dtype::F16, Dtype::Bf16] {
            let plain = HmmaConfig::new(hd, input, QkAccum::F32, PvAccum::F32).unwrap();
            let window = HmmaConfig { mods: Some(ModVariant::default()), ..plain };
            let both = HmmaConfig { mods: Some(ModVariant { softcap: true, alibi: true }), ..plain };
            for &arch in HmmaConfig::MOD_TARGETS {
                let tile = window.tile_for(arch).unwrap();
                let want_rows = if matches!(arch, Arch::Sm80 | Arch::Sm90) { 32 } else { plain.tile_for(arch).unwrap().rows_per_warp };
                assert_eq!(tile.rows_per_warp, want_rows, "{} {arch:?}", window.name());
                let defines = window.defines(arch).unwrap();
                assert!(defines.contains(&("ROWS_PER_WARP".into(), want_rows.to_string())), "{defines:?}");
                for (d, c) in [(window, tile), (both, both.tile_for(arch).unwrap())] {
                    let r = report_variant(&cache, &d, arch);
                    println!("{}", r.summary());
                    assert!(r.ok(), "{}", r.summary());
                    let regs = r.registers.expect("ptxas reported registers");
                    assert!(regs > 0 && regs <= 255, "{}", r.summary());
                    assert_eq!((r.spill_store_bytes, r.spill_load_bytes), (Some(0), Some(0)), "{}", r.summary());
                    assert_eq!(r.dynamic_smem_bytes, c.smem_bytes(hd as u32), "{}", r.summary());
                    let mmas: usize = r.instructions.iter().filter(|(k, _)| k.starts_with("HMMA")).map(|(_, v)| v).sum();
                    // Each copy of the tile body: 2 GEMMs x 2 MMAs per (m16 tile, k16, n16).
                    let body = 4 * (c.rows_per_warp / 16) * (hd as u32 / 16) * (c.block_n / 16);
                    assert!(mmas > 0 && mmas % body as usize == 0, "{}: {mmas} HMMAs, {body} per tile", r.summary());
                }
                assert_eq!(both.tile_for(arch).unwrap().rows_per_warp, 16);
            }
        }
    }
}

#[test]
fn accumulation_modes_select_distinct_mma_forms() {
    if !tools_or_skip("accumulation_modes_select_distinct_mma_forms") {
        return;
    }
    let cache = KernelCache::new(None);
    let case = |qk, pv, input| HmmaConfig::new(128, input, qk, pv).unwrap();
    let f32 = report_variant(&cache, &case(QkAccum::F32, PvAccum::F32, Dtype::F16), Arch::Sm90);
    assert!(f32.ok(), "{}", f32.summary());
    assert!(f32.instructions.contains_key("HMMA.16816.F32"));
    assert!(!f32.instructions.contains_key("HMMA.16816.F16"));
    let f16 = report_variant(&cache, &case(QkAccum::F16, PvAccum::F16PerTile, Dtype::F16), Arch::Sm90);
    assert!(f16.ok(), "{}", f16.summary());
    assert!(f16.instructions.contains_key("HMMA.16816.F16"));
    assert!(!f16.instructions.contains_key("HMMA.16816.F32"));
    let bf16 = report_variant(&cache, &case(QkAccum::F32, PvAccum::F32, Dtype::Bf16), Arch::Sm80);
    assert!(bf16.ok(), "{}", bf16.summary());
    assert!(bf16.instructions.contains_key("HMMA.16816.F32.BF16"));
}

#[test]
fn second_cache_instance_hits_the_disk() {
    if !tools_or_skip("second_cache_instance_hits_the_disk") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = HmmaConfig::new(64, Dtype::F16, QkAccum::TwoStage, PvAccum::F32).unwrap();
    let req = cfg.request(Arch::Sm89).unwrap();

    let first = KernelCache::new(Some(dir.path().to_path_buf()));
    let a = first.get_or_compile(&req).unwrap();
    assert!(matches!(a.origin, Origin::Compiled { .. }), "{:?}", a.origin);
    // Same process, same cache: the in-memory entry, not a copy.
    assert!(Arc::ptr_eq(&a, &first.get_or_compile(&req).unwrap()));

    // A fresh cache on the same folder stands for a second process.
    let second = KernelCache::new(Some(dir.path().to_path_buf()));
    let b = second.get_or_compile(&req).unwrap();
    assert_eq!(b.origin, Origin::Disk);
    assert_eq!(a.cubin, b.cubin);
    assert_eq!(a.resources, b.resources);

    // Any compile-time parameter is part of the key: another arch misses.
    let other = second.get_or_compile(&cfg.request(Arch::Sm80).unwrap()).unwrap();
    assert!(matches!(other.origin, Origin::Compiled { .. }));
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 4, "a cubin and a log per compiled key");
}

#[test]
fn nvrtc_diagnostics_come_back_as_a_typed_error() {
    if !tools_or_skip("nvrtc_diagnostics_come_back_as_a_typed_error") {
        return;
    }
    let cfg = HmmaConfig::new(128, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
    let mut req: CompileRequest<'static> = cfg.request(Arch::Sm90).unwrap();
    // A head dim without a tile entry trips the kernel's static_assert.
    req.defines.retain(|(k, _)| k != "HEAD_DIM");
    req.defines.push(("HEAD_DIM".into(), "96".into()));
    req.kernel.push_str("_broken");
    match KernelCache::new(None).get_or_compile(&req) {
        Err(NativeError::Compile { kernel, arch, log }) => {
            assert_eq!(arch, Arch::Sm90);
            assert!(kernel.ends_with("_broken"));
            assert!(log.contains("head dim 64 or 128"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn forced_tiles_compile_and_report() {
    if !tools_or_skip("forced_tiles_compile_and_report") {
        return;
    }
    let cache = KernelCache::new(None);
    let mut cfg = HmmaConfig::new(64, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
    cfg.tile = Some(quattn_native::HmmaTile::new(8, 64));
    let r = report_variant(&cache, &cfg, Arch::Sm90);
    assert!(r.ok(), "{}", r.summary());
    assert!(r.kernel.ends_with("_w8n64"));
    assert!(r.registers.unwrap_or(0) > 0, "{}", r.summary());
    // A tile the kernel's static_asserts would reject is refused before NVRTC.
    cfg.tile = Some(quattn_native::HmmaTile::new(8, 32));
    assert!(matches!(cfg.validate(), Err(NativeError::UnsupportedConfig { .. })));
}

/// The tiles `hmma_check`'s sweep is meant to compare: the original 16-row layouts and the
/// 32-row ones with Q in registers or shared memory. All must build with the intended MMA;
/// the f32 variant of each must not spill on sm_90 (the target the sweep runs on).
#[test]
fn sweep_tiles_compile_on_sm90() {
    if !tools_or_skip("sweep_tiles_compile_on_sm90") {
        return;
    }
    use quattn_native::HmmaTile;
    let r32 = |warps, block_n, q_in_regs| HmmaTile { rows_per_warp: 32, q_in_regs, ..HmmaTile::new(warps, block_n) };
    let cache = KernelCache::new(None);
    let tiles = [
        (64, HmmaTile::new(4, 64)),
        (64, HmmaTile::new(8, 64)),
        (64, r32(4, 64, true)),
        (64, r32(4, 64, false)),
        (128, HmmaTile::new(4, 64)),
        (128, HmmaTile::new(8, 64)),
        (128, r32(4, 64, false)),
        (128, r32(4, 32, false)),
    ];
    for (hd, tile) in tiles {
        let mut cfg = HmmaConfig::new(hd, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap();
        cfg.tile = Some(tile);
        let r = report_variant(&cache, &cfg, Arch::Sm90);
        println!("{}", r.summary());
        assert!(r.ok(), "{}", r.summary());
    }
}

#[test]
fn every_int8_variant_compiles_without_spills_and_uses_imma() {
    if !tools_or_skip("every_int8_variant_compiles") {
        return;
    }
    let cache = KernelCache::new(None);
    let reports = compile_family_report(&cache, Some(Int8Config::TARGETS), "fwd_int8");
    // `fwd_int8_umma_*` (the sm_100a UMMA family) shares the prefix; it has its own test.
    let reports: Vec<_> = reports
        .into_iter()
        .filter(|r| r.kernel.starts_with("fwd_int8") && !r.kernel.starts_with("fwd_int8_umma"))
        .collect();
    assert_eq!(reports.len(), Int8Config::all().len() * Int8Config::TARGETS.len());
    for r in &reports {
        println!("{}", r.summary());
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for r in &reports {
        let count = |op: &str| r.instructions.get(op).copied().unwrap_or(0);
        // Q·Kᵀ on IMMA only: no f16 MMA may have crept into the score GEMM, so the P·V HMMA
        // count is exactly what the tile needs, and the IMMA count half of it (per KV tile:
        // MT * N_FRAGS * D/32 IMMAs against MT * D/8 * BN/16 HMMAs).
        let imma = count("IMMA.16832.S8.S8");
        let hmma = count("HMMA.16816.F32") + count("HMMA.16816.F16");
        assert!(imma > 0 && hmma > 0, "{}", r.summary());
        assert_eq!(hmma, 2 * imma, "{}", r.summary());
        // No int -> float conversion of scores (I2F / I2FP.F32.S32, one per score with a plain
        // cast): the biased accumulator converts with an FADD. I2F.RP is the integer-division
        // idiom (head / kv_group), a handful per kernel.
        let i2f: Vec<_> = r.instructions.keys().filter(|k| k.starts_with("I2F") && *k != "I2F.RP").collect();
        assert!(i2f.is_empty(), "{}: {i2f:?}", r.summary());
    }
}

/// Forced tiles (a sweep's candidates) build on sm_90, the target the sweep runs on: the split
/// Q·Kᵀ and 16-row tiles with per-thread scales; tiles the kernel cannot build are refused
/// before NVRTC.
#[test]
fn int8_forced_tiles_compile_on_sm90() {
    if !tools_or_skip("int8_forced_tiles_compile_on_sm90") {
        return;
    }
    let cache = KernelCache::new(None);
    let split = Int8Tile { qk_split: true, ..Int8Tile::new(4, 64, 32) };
    for (hd, tile) in [(64, split), (64, Int8Tile::new(8, 64, 16)), (128, Int8Tile::new(8, 64, 16))] {
        let mut cfg = Int8Config::new(hd, Int8Granularity::PerThread, PvAccum::F32).unwrap();
        cfg.tile = Some(tile);
        let r = report_variant(&cache, &cfg, Arch::Sm90);
        println!("{}", r.summary());
        assert!(r.ok(), "{}", r.summary());
    }
    let mut cfg = Int8Config::new(128, Int8Granularity::PerBlock, PvAccum::F32).unwrap();
    cfg.tile = Some(Int8Tile::new(4, 24, 16));
    assert!(matches!(cfg.validate(), Err(NativeError::UnsupportedConfig { .. })));
}
