//! NVRTC compiles and SASS checks of the variable-length (`VARLEN`) variants of the wgmma and
//! HMMA forward kernels, with and without score modifiers (`MODS`), and the typed errors of their
//! configs; runs on machines without a GPU.
//! These checks are not a run: `varlen_gpu.rs` runs them on a CUDA device.
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! compile tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::{
    report::report_variant, Arch, Dtype, HmmaConfig, KernelCache, KernelVariant, ModVariant, NativeError, NativeKernelId,
    PvAccum, QkAccum, WgmmaConfig,
};

fn varlen_ids() -> Vec<NativeKernelId> {
    NativeKernelId::all()
        .into_iter()
        .filter(|id| match id {
            NativeKernelId::Wgmma(c) => c.varlen,
            NativeKernelId::Hmma(c) => c.varlen,
            _ => false,
        })
        .collect()
}

fn mods_of(id: &NativeKernelId) -> Option<ModVariant> {
    match id {
        NativeKernelId::Wgmma(c) => c.mods,
        NativeKernelId::Hmma(c) => c.mods,
        _ => None,
    }
}

#[test]
fn the_registry_lists_a_varlen_variant_per_head_dim_and_input() {
    let ids = varlen_ids();
    let names: Vec<String> = ids.iter().map(|id| id.name()).collect();
    for want in [
        "fwd_wgmma_f16_d64_varlen",
        "fwd_wgmma_f16_d128_varlen",
        "fwd_hmma_f16_f32_f32_d64_varlen",
        "fwd_hmma_f16_f32_f32_d128_varlen",
        "fwd_hmma_bf16_f32_f32_d64_varlen",
        "fwd_hmma_bf16_f32_f32_d128_varlen",
        // With score modifiers: wgmma with softcap and ALiBi each compiled in or not, HMMA
        // without either and with both.
        "fwd_wgmma_f16_d64_mods_varlen",
        "fwd_wgmma_f16_d128_mods_softcap_varlen",
        "fwd_wgmma_f16_d128_mods_alibi_varlen",
        "fwd_wgmma_f16_d64_mods_softcap_alibi_varlen",
        "fwd_hmma_f16_f32_f32_d128_mods_varlen",
        "fwd_hmma_bf16_f32_f32_d64_mods_varlen",
        "fwd_hmma_f16_f32_f32_d64_mods_softcap_alibi_varlen",
        "fwd_hmma_bf16_f32_f32_d128_mods_softcap_alibi_varlen",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    let with_mods = ids.iter().filter(|id| mods_of(id).is_some()).count();
    assert_eq!((ids.len() - with_mods, with_mods), (6, 2 * 4 + 2 * 2 * 2));
    for id in &ids {
        let want: &[Arch] = match id {
            NativeKernelId::Wgmma(_) => &[Arch::Sm90a],
            _ => HmmaConfig::MOD_TARGETS,
        };
        assert_eq!(id.targets(), want, "{id}");
        // The define that selects the variant, and the modifiers' exactly when it has them.
        let req = KernelVariant::request(id, id.targets()[0]).unwrap();
        assert!(req.defines.contains(&("VARLEN".into(), "1".into())), "{id}: {:?}", req.defines);
        match mods_of(id) {
            Some(m) => {
                for (k, v) in [("MODS", true), ("MOD_SOFTCAP", m.softcap), ("MOD_ALIBI", m.alibi)] {
                    assert!(req.defines.contains(&(k.into(), (v as u32).to_string())), "{id}: {k} in {:?}", req.defines);
                }
            }
            None => assert!(!req.defines.iter().any(|(k, _)| k == "MODS"), "{id}"),
        }
    }
    // The dense variants compile without the define.
    let dense = WgmmaConfig::new(128).unwrap().request(Arch::Sm90a).unwrap();
    assert!(!dense.defines.iter().any(|(k, _)| k == "VARLEN"));
    let dense = HmmaConfig::new(128, Dtype::F16, QkAccum::F32, PvAccum::F32).unwrap().request(Arch::Sm90).unwrap();
    assert!(!dense.defines.iter().any(|(k, _)| k == "VARLEN"));
}

#[test]
fn varlen_configs_refuse_what_they_cannot_build_with_typed_errors() {
    assert!(matches!(WgmmaConfig::varlen(96), Err(NativeError::UnsupportedHeadDim { head_dim: 96, .. })));
    assert!(matches!(HmmaConfig::varlen(256, Dtype::F16), Err(NativeError::UnsupportedHeadDim { head_dim: 256, .. })));
    assert!(matches!(HmmaConfig::varlen(128, Dtype::F32), Err(NativeError::UnsupportedConfig { .. })));
    // Score modifiers combine with varlen batches, at head dims and targets the varlen variants have.
    let mods = ModVariant { softcap: true, alibi: false };
    let w = WgmmaConfig::varlen_with_mods(128, mods).unwrap();
    assert!(w.request(Arch::Sm90a).is_ok());
    assert!(matches!(w.request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
    assert!(matches!(WgmmaConfig::varlen_with_mods(80, mods), Err(NativeError::UnsupportedHeadDim { head_dim: 80, .. })));
    let h = HmmaConfig::varlen_with_mods(64, Dtype::Bf16, mods).unwrap();
    assert_eq!(h.targets(), HmmaConfig::MOD_TARGETS);
    assert!(matches!(HmmaConfig::varlen_with_mods(64, Dtype::F32, mods), Err(NativeError::UnsupportedConfig { .. })));
    // f16-accumulating modes have no varlen variant, with modifiers or without.
    let f16 = HmmaConfig { qk: QkAccum::F16, ..HmmaConfig::varlen(128, Dtype::F16).unwrap() };
    assert!(matches!(&f16.validate(), Err(NativeError::UnsupportedConfig { reason, .. }) if reason.contains("f32 accumulation")));
    let f16m = HmmaConfig { pv: PvAccum::F16PerTile, ..HmmaConfig::varlen_with_mods(128, Dtype::F16, mods).unwrap() };
    assert!(matches!(&f16m.validate(), Err(NativeError::UnsupportedConfig { .. })));
    // wgmma varlen exists for sm_90a only.
    assert!(matches!(WgmmaConfig::varlen(64).unwrap().request(Arch::Sm90), Err(NativeError::UnsupportedConfig { .. })));
}

#[test]
fn every_varlen_variant_compiles_with_its_tensor_core_instructions_and_no_spill() {
    if !tools_or_skip("every_varlen_variant_compiles") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let mut n = 0;
    for id in varlen_ids() {
        for &arch in id.targets() {
            let r = report_variant(&cache, &id, arch);
            println!("{} {:?}", r.summary(), r.instructions);
            assert!(r.ok(), "{}", r.summary());
            assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
            let regs = r.registers.expect("ptxas reported registers");
            assert!(regs > 0 && regs <= 255, "{}: {regs} registers", r.kernel);
            let count = |prefix: &str| -> usize {
                r.instructions.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| *v).sum()
            };
            match id {
                NativeKernelId::Wgmma(c) => {
                    let tile = c.tile().unwrap();
                    // As the dense kernel: every Q·Kᵀ and P·V issue site is a wgmma; no mma.sync.
                    let per_tile = (c.head_dim / 16 + tile.block_n / 16) as usize;
                    assert!(count("HGMMA") >= 2 * per_tile, "{}", r.summary());
                    assert_eq!(count("HMMA"), 0, "{}", r.summary());
                    // The tensor loads are among the expected opcodes, which r.ok() found.
                    assert!(r.expected.iter().any(|e| e == "UTMALDG.4D") && r.missing.is_empty(), "{}", r.summary());
                }
                NativeKernelId::Hmma(c) => {
                    let op = if c.input == Dtype::Bf16 { "HMMA.16816.F32.BF16" } else { "HMMA.16816.F32" };
                    assert!(r.instructions.get(op).copied().unwrap_or(0) > 0, "{}", r.summary());
                    assert_eq!(count("HGMMA"), 0, "{}", r.summary());
                }
                _ => unreachable!(),
            }
            n += 1;
        }
    }
    // 2 + 8 wgmma variants on sm_90a, 4 + 8 HMMA variants on their 3 targets.
    assert_eq!(n, 10 + 12 * HmmaConfig::MOD_TARGETS.len());
}

#[test]
fn ptxas_keeps_the_varlen_wgmma_pipeline() {
    // ptxas serializes wgmma when it cannot prove the async register use safe: that would undo
    // the S / P·V overlap the dense kernel has.
    if !tools_or_skip("ptxas_keeps_the_varlen_wgmma_pipeline") {
        return;
    }
    let cache = KernelCache::new(None);
    for id in varlen_ids() {
        let NativeKernelId::Wgmma(cfg) = id else { continue };
        let c = cache.get_or_compile(&cfg.request(Arch::Sm90a).unwrap()).unwrap();
        assert!(!c.log.contains("serialized"), "{}: {}", cfg.name(), c.log);
    }
}

