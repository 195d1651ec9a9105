//! NVRTC compiles and SASS checks of the decode family (`fwd_decode_*`, its splits merged in-kernel) for
//! every target it is built for; runs on machines without a GPU. sm_90 is what an H100 runs
//! (`examples/decode_check.rs` checks the numerics there).
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::report::{report_variant, KernelReport};
use quattn_native::{Arch, DecodeConfig, DecodeTile, DecodeUnit, Dtype, KernelCache, KernelVariant, ModVariant};

fn count(r: &KernelReport, op: &str) -> usize {
    r.instructions.get(op).copied().unwrap_or(0)
}

/// Reports of `units` on `archs`, compiled in parallel over the available cores.
fn reports(cache: &KernelCache, units: &[DecodeUnit], archs: &[Arch]) -> Vec<KernelReport> {
    let jobs: Vec<(DecodeUnit, Arch)> = units.iter().flat_map(|u| archs.iter().map(move |a| (*u, *a))).collect();
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(jobs.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((u, a)) = jobs.get(i) else { break };
                let r = report_variant(cache, u, *a);
                out.lock().unwrap().push((i, r));
            });
        }
    });
    let mut v = out.into_inner().unwrap();
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, r)| r).collect()
}

/// Every decode variant (the score-modifier variants too) on every target: compiled, the
/// intended HMMA form and nothing else, cp.async for K and V, no spill, no local memory; the
/// per-tile MMA counts of the loop body; the in-kernel merge's split counter (a global atomic);
/// two CTAs fit an SM by registers (the occupancy the split function counts on).
#[test]
fn every_decode_unit_compiles_without_spills_and_uses_the_intended_mma() {
    if !tools_or_skip("every_decode_unit_compiles") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let units = DecodeUnit::all();
    let reports = reports(&cache, &units, DecodeConfig::TARGETS);
    assert_eq!(reports.len(), units.len() * DecodeConfig::TARGETS.len());
    for r in &reports {
        println!("{} {:?}", r.summary(), r.instructions);
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing units:\n{}", failed.join("\n"));
    for r in &reports {
        assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
        let regs = r.registers.expect("ptxas reported registers");
        // 2 CTAs of 128 threads per SM need at most 255 registers a thread.
        assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
    }
    assert!(reports.iter().any(|r| r.kernel.ends_with("_mods_softcap_alibi")));
    for cfg in DecodeConfig::all().into_iter().chain(DecodeConfig::all_mods()) {
        let t = cfg.tile();
        // One warp's tile: Q·Kᵀ over its key slice (hd/16 k-steps x slice/8 n8 tiles) and P·V
        // (slice/16 k-steps x hd/8 n8 tiles): equal counts. The loop body appears twice (masked
        // and mask-free tiles).
        let slice = (t.block_n / (4 / cfg.warps_m())) as usize;
        let hd = cfg.head_dim as usize;
        let per_tile = hd / 16 * slice / 8 + slice / 16 * hd / 8;
        let mma = if cfg.input == Dtype::Bf16 { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
        for &arch in DecodeConfig::TARGETS {
            let r = reports.iter().find(|r| r.kernel == cfg.name() && r.arch == arch).unwrap();
            assert!(count(r, mma) >= 2 * per_tile, "{}: {} {mma}, expected at least {}", r.summary(), count(r, mma), 2 * per_tile);
            assert!(count(r, "LDSM.16.M88.4") > 0 && count(r, "LDSM.16.MT88.4") > 0, "{}: K / V fragments", r.summary());
            assert!(count(r, "MUFU.EX2") > 0, "{}", r.summary());
            assert!(r.instructions.keys().any(|k| k.starts_with("ATOMG")), "{}: the splits' counter", r.summary());
        }
    }
}

/// Forced pipelines of the sweep compile for the H100's target.
#[test]
fn sweep_tiles_compile_on_sm90() {
    if !tools_or_skip("decode_sweep_tiles_compile_on_sm90") {
        return;
    }
    let cache = KernelCache::new(None);
    let mut units = Vec::new();
    for (rows, tile) in [(16, DecodeTile::new(64, 4)), (16, DecodeTile::new(128, 2)), (64, DecodeTile::new(32, 4)), (16, DecodeTile::new(64, 2))] {
        let mut c = DecodeConfig::new(128, Dtype::F16, rows).unwrap();
        c.tile = Some(tile);
        units.push(DecodeUnit::Attention(c));
    }
    for r in reports(&cache, &units, &[Arch::Sm90]) {
        assert!(r.ok(), "{}", r.summary());
        assert!(r.kernel.contains("_n"), "{}", r.kernel);
        println!("{}", r.summary());
    }
    // The names keep forced tiles apart in the cache and the report.
    let names: Vec<String> = units.iter().map(|u| u.name()).collect();
    let mut d = names.clone();
    d.dedup();
    assert_eq!(d.len(), names.len());
}

/// The paged variants on the H100's target: the same matrix work as their strided twins (the
/// table changes only where rows are copied from), K and V still through cp.async, no local
/// memory; `append_kv` copies in 16-byte pieces.
#[test]
fn paged_variants_match_their_strided_twins_on_sm90() {
    if !tools_or_skip("decode_paged_variants_on_sm90") {
        return;
    }
    let cache = KernelCache::new(None);
    let paged: Vec<DecodeConfig> = DecodeConfig::all().into_iter().filter(|c| c.paged).collect();
    assert_eq!(paged.len(), DecodeConfig::all().len() / 2);
    let mut units: Vec<DecodeUnit> = paged.iter().flat_map(|c| [DecodeUnit::Attention(*c), DecodeUnit::Attention(c.with_paged(false))]).collect();
    units.push(DecodeUnit::AppendKv(quattn_native::append_kv::AppendKvConfig));
    let reports = reports(&cache, &units, &[Arch::Sm90]);
    for r in &reports {
        assert!(r.ok(), "{}", r.summary());
        assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
    }
    for pair in reports[..2 * paged.len()].chunks(2) {
        let (p, s) = (&pair[0], &pair[1]);
        assert!(p.kernel.starts_with("fwd_decode_paged_"), "{}", p.kernel);
        for op in ["HMMA.16816.F32", "HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4"] {
            assert_eq!(count(p, op), count(s, op), "{} vs {}: {op}", p.kernel, s.kernel);
        }
        // One copy of K and one of V per row a thread copies (BN / (128 threads / (hd / 8)
        // chunks) rows), at least once; the strided kernel also has its partial-tile path.
        let cp = "LDGSTS.E.BYPASS.LTC128B.128";
        let cfg = paged.iter().find(|c| c.name() == p.kernel).unwrap();
        let rows_per_thread = (cfg.tile().block_n / (128 / (cfg.head_dim / 8))) as usize;
        assert!(count(p, cp) >= 2 * rows_per_thread, "{}: {} {cp}", p.kernel, count(p, cp));
        assert!(count(s, cp) > 0);
        assert!(r_regs(p) <= 255, "{}", p.summary());
    }
    let append = reports.last().unwrap();
    assert_eq!(append.kernel, "fwd_decode_append_kv");
    assert!(append.instructions.keys().all(|k| !k.contains("MMA")), "{}", append.summary());
}

fn r_regs(r: &KernelReport) -> u32 {
    r.registers.expect("ptxas reported registers")
}

/// The score-modifier variants (every target's compile is checked above) against their plain
/// twins on the H100's target: the same matrix work (the modifiers touch scores only, and masked
/// and mask-free tiles are still two loop bodies), more MUFU.EX2 with softcap (its tanh)
/// compiled in, no local memory; on every target, the variants with only the band and sinks and
/// with one of softcap and ALiBi compile without local memory too.
#[test]
fn modifier_variants_match_their_plain_twins() {
    if !tools_or_skip("decode_modifier_variants") {
        return;
    }
    let cache = KernelCache::new(None);
    let mods = DecodeConfig::all_mods();
    let pairs: Vec<DecodeUnit> = mods.iter().flat_map(|c| [DecodeUnit::Attention(*c), DecodeUnit::Attention(c.with_mods(None))]).collect();
    let mut others = Vec::new();
    for v in [ModVariant::default(), ModVariant { softcap: true, alibi: false }, ModVariant { softcap: false, alibi: true }] {
        for paged in [false, true] {
            others.push(DecodeUnit::Attention(DecodeConfig::new(128, Dtype::Bf16, 24).unwrap().with_paged(paged).with_mods(Some(v))));
        }
    }
    let mut got = reports(&cache, &pairs, &[Arch::Sm90]);
    got.extend(reports(&cache, &others, DecodeConfig::TARGETS));
    for r in &got {
        println!("{} {:?}", r.summary(), r.instructions);
        assert!(r.ok(), "{}", r.summary());
        assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
        assert!(r_regs(r) <= 255, "{}", r.summary());
    }
    let at = |name: &str, arch: Arch| got.iter().find(|r| r.kernel == name && r.arch == arch).unwrap();
    for c in &mods {
        let (m, p) = (at(&c.name(), Arch::Sm90), at(&c.with_mods(None).name(), Arch::Sm90));
        for op in ["HMMA.16816.F32", "HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4"] {
            assert_eq!(count(m, op), count(p, op), "{} vs {}: {op}", m.summary(), p.summary());
        }
        assert!(count(m, "LDGSTS.E.BYPASS.LTC128B.128") > 0, "{}", m.summary());
        assert!(count(m, "MUFU.EX2") > count(p, "MUFU.EX2"), "{}: softcap's exp2", m.summary());
    }
}
