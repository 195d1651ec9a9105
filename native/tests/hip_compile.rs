//! Every HIP variant compiled by clang for gfx942 and gfx950, disassembled and checked: the
//! intended MFMA instructions present and no other MFMA form, no scratch (spills), LDS within
//! the arch's limit; the FP8 prepass with its arrival atomic and IEEE division. Needs LLVM
//! clang with the AMDGPU target (`clang-22`, which `.ci/run` installs); skips with the reason when it is absent. No GPU: the kernels are not run.

use quattn_native::hip::{all_variants, hip_compile_report, Clang, GfxArch, HipCache};

#[test]
fn every_hip_variant_compiles_with_its_mfma_and_no_scratch() {
    if let Err(e) = Clang::find() {
        // CI installs clang-22 (.ci/run): there the check must run.
        let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false);
        assert!(!ci, "CI has no clang for the HIP kernels: {e}");
        eprintln!("skipped: {e} (install clang-22 and lld-22)");
        return;
    }
    let cache = HipCache::new(None);
    let reports = hip_compile_report(&cache).expect("clang found above");
    assert_eq!(reports.len(), all_variants().iter().map(|k| k.targets().len()).sum::<usize>());
    // The prepass is among them, on both targets.
    assert_eq!(reports.iter().filter(|r| r.kernel.starts_with("fp8_prepass_")).count(), 8);
    let mut bad = Vec::new();
    for r in &reports {
        println!("{}", r.summary());
        if !r.ok() {
            bad.push(r.summary());
        }
        if r.compiled {
            // Every MFMA form of the listing is one the variant names; each expected one occurs.
            let mfma: usize = r.instructions.iter().filter(|(k, _)| k.starts_with("v_mfma")).map(|(_, n)| n).sum();
            assert!(mfma >= r.mfma_per_tile, "{}: {mfma} MFMAs in the code, the loop issues {} per tile", r.kernel, r.mfma_per_tile);
        }
    }
    assert!(bad.is_empty(), "failing variants:\n{}", bad.join("\n"));
}

/// A compile error comes back as a typed error with clang's diagnostics, not a panic.
#[test]
fn compile_errors_carry_the_log() {
    let Ok(clang) = Clang::find() else {
        eprintln!("skipped: no clang");
        return;
    };
    use quattn_native::hip::compile::HipCompiler;
    use quattn_native::hip::source::HipSource;
    static BROKEN: HipSource = HipSource { file: "broken.hip", entry: "broken", text: "#include \"common.h\"\n" };
    match clang.compile("broken", &BROKEN, GfxArch::Gfx950, &clang.options(GfxArch::Gfx950)) {
        Err(quattn_native::NativeError::HipCompile { log, .. }) => assert!(log.contains("MFMA_K"), "{log}"),
        other => panic!("expected a compile error, got {:?}", other.map(|(c, _)| c.len())),
    }
}
