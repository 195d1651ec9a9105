//! NVRTC compiles and SASS checks of the FP8 quantization prepass (`fp8_prepass_*`, the amax,
//! quantize and one-read passes,
//! f16 and bf16 inputs, e4m3 and e5m2) for every target; runs on machines without a GPU. The
//! H100 runs the sm_90 build (`quattn selftest --only fp8` checks it against the codec).
//!
//! Needs libnvrtc 13.x and cuobjdump/nvdisasm (`.ci/install-cuda-tools.sh`). Without them the
//! tests print why and pass, except under `CI`, where a missing tool is a failure.
#![cfg(feature = "cuda")]

mod common;
use common::tools_or_skip;

use quattn_native::{compile_family_report, sass, Fp8PrepassConfig, KernelCache, KernelVariant, NativeKernelId};

#[test]
fn every_fp8_prepass_pass_compiles_without_local_memory_and_rounds_like_the_codec() {
    if !tools_or_skip("every_fp8_prepass_pass_compiles") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(Some(dir.path().to_path_buf()));
    let reports: Vec<_> = compile_family_report(&cache, Some(Fp8PrepassConfig::TARGETS), "fp8_prepass")
        .into_iter()
        .filter(|r| r.kernel.starts_with("fp8_prepass"))
        .collect();
    assert_eq!(reports.len(), Fp8PrepassConfig::all().len() * 3 * Fp8PrepassConfig::TARGETS.len());
    for r in &reports {
        println!("{}", r.summary());
    }
    let failed: Vec<String> = reports.iter().filter(|r| !r.ok()).map(|r| r.summary()).collect();
    assert!(failed.is_empty(), "failing variants:\n{}", failed.join("\n"));
    for r in &reports {
        assert_eq!(r.spill_store_bytes, Some(0), "{}", r.summary());
        assert_eq!(r.stack_frame_bytes, Some(0), "{}: local memory", r.summary());
        // The one-read pass's grid is sized by its co-resident CTAs: 5 of 256 threads per SM
        // (at most 48 registers) keep groups of up to 5 tiles per SM on that path.
        if r.kernel.contains("_onepass_") {
            assert!(r.registers.is_some_and(|n| n <= 48), "{}", r.summary());
        }
    }
    // The whole opcode histogram (the report keeps only the matrix and memory opcodes).
    for id in NativeKernelId::all().into_iter().filter(|id| id.family() == "fp8_prepass") {
        for &arch in id.targets() {
            let compiled = cache.get_or_compile(&KernelVariant::request(&id, arch).unwrap()).unwrap();
            let hist = sass::opcode_histogram(&sass::disassemble(&compiled.cubin).unwrap());
            let op = |prefix: &str| hist.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum::<usize>();
            let name = format!("{} {arch}", KernelVariant::name(&id));
            // Every thread loads its 4 pieces as 16-byte loads; no tensor-core op.
            assert!(op("LDG.E.128") >= 4, "{name}: {hist:?}");
            assert_eq!(op("HMMA") + op("QMMA") + op("IMMA"), 0, "{name}");
            if name.contains("_quant_") || name.contains("_onepass_") {
                // 32 values per thread, twice: under a descale in the fast range a product and
                // two FMAs each from one correctly rounded reciprocal, else 32 IEEE divisions
                // (each with its FCHK range check); 16 saturating pair conversions and four
                // 8-byte code stores per path.
                assert!(op("FCHK") >= 32, "{name}: {hist:?}");
                assert!(op("FFMA") >= 64, "{name}: {hist:?}");
                assert!(op("F2FP.SATFINITE") >= 32, "{name}: {hist:?}");
                assert!(op("STG.E.64") >= 8, "{name}: {hist:?}");
            }
            if name.contains("_onepass_") {
                // The first tile's take and publication before the loop and the next tile's
                // inside it: twice the work counter (an add), the group's max (an atomic max on
                // its bits, ATOMG or RED) and the arrival (an add whose result is unused: ATOMG
                // or RED); once the departure and the CTA's finishing count; polls of the
                // arrivals from L2 with a backoff sleep.
                assert!(op("ATOMG.E.ADD") >= 4, "{name}: {hist:?}");
                assert_eq!(op("ATOMG.E.ADD") + op("RED.E.ADD"), 6, "{name}: {hist:?}");
                assert_eq!(op("ATOMG.E.MAX") + op("RED.E.MAX"), 2, "{name}: {hist:?}");
                assert!(op("NANOSLEEP") >= 1, "{name}: {hist:?}");
                assert!(op("LDG.E.STRONG.GPU") >= 2, "{name}: {hist:?}");
                assert!(op("MEMBAR") >= 3, "{name}: {hist:?}");
            } else if name.contains("_amax_") {
                // One arrival per CTA; the group's partials read from L2 (ld.global.cg).
                assert_eq!(op("ATOMG.E.ADD"), 1, "{name}: {hist:?}");
                assert!(op("LDG.E.STRONG.GPU") >= 1, "{name}: {hist:?}");
            }
        }
    }
}
