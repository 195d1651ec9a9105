//! The WGSL that the portable kernels lower to, as checked-in artifacts in `shaders/`: each
//! case runs through the public API on a wgpu adapter with CubeCL's compilation log on, the
//! logged WGSL is validated by naga with every validation flag, and compared with the file in
//! `shaders/`. `QUATTN_BLESS=1 cargo test --release --test shaders` rewrites the files.
//! The snapshots are those of mesa's llvmpipe (no subgroups, f16 on), the adapter CI has.
//! A build with the `spirv` feature compiles llvmpipe's kernels to SPIR-V instead, so there
//! is no WGSL to check and the test is not built.
#![cfg(not(feature = "spirv"))]

use std::path::PathBuf;

use quattn::{inputs, AttentionProblem, Device, Precision, Strategy, WgpuAdapter};

/// (file stems in compilation order, problem, precision): one per distinct compile-time
/// configuration we ship. INT8 compiles its prepass (K mean partial sums and their sum, K, Q) before the attention kernel.
fn cases() -> Vec<(&'static [&'static str], AttentionProblem, Precision)> {
    vec![
        (&["fwd_portable_f32_d64"], AttentionProblem::new(1, 2, 40, 64).with_lse(true), Precision::F32),
        (&["fwd_portable_f16_d64_causal"], AttentionProblem::new(1, 2, 40, 64).causal(true).with_lse(true), Precision::F16_DEFAULT),
        (&["fwd_portable_f16_d128"], AttentionProblem::new(1, 2, 40, 128).with_lse(true), Precision::F16_DEFAULT),
        (
            &["fwd_portable_half_f16_2stage_pv16_d128"],
            AttentionProblem::new(1, 2, 40, 128).with_lse(true),
            Precision::F16 {
                qk: quattn::QkAccum::TwoStage,
                pv: quattn::PvAccum::F16PerTile,
            },
        ),
        (
            &[
                "quant_int8_k_mean_partial_f16_d64",
                "quant_int8_k_mean_finish_d64",
                "quant_int8_k_smoothed_f16_d64",
                "quant_int8_q_block_shift_f16_d64",
                "fwd_portable_int8_block_d64",
            ],
            AttentionProblem::new(1, 2, 40, 64).with_lse(true),
            Precision::INT8_DEFAULT,
        ),
    ]
}

/// WGSL sources of the quattn kernels in CubeCL's compilation log, in order.
fn logged_wgsl(log: &str) -> Vec<String> {
    log.split("[START_KERNEL_COMPILATION]")
        .filter(|entry| entry.contains("quattn_cubecl::"))
        .filter_map(|entry| {
            let start = entry.find("```wgsl\n")? + "```wgsl\n".len();
            let end = entry[start..].find("```")? + start;
            Some(entry[start..end].to_string())
        })
        .collect()
}

/// CubeCL's WGSL compiler declares a function's local variables in hash-map order, which changes
/// from run to run; sorting each run of consecutive `var l_…` declarations (order-free, they
/// carry no initializer) gives one text per kernel.
fn canonical(wgsl: &str) -> String {
    let mut out = Vec::new();
    let mut run: Vec<&str> = Vec::new();
    for line in wgsl.lines() {
        if line.starts_with("var l_") {
            run.push(line);
            continue;
        }
        run.sort_unstable();
        out.append(&mut run);
        out.push(line);
    }
    run.sort_unstable();
    out.append(&mut run);
    out.join("\n") + "\n"
}

fn validate(name: &str, wgsl: &str) {
    let module = naga::front::wgsl::parse_str(wgsl).unwrap_or_else(|e| panic!("{name}: WGSL does not parse:\n{}", e.emit_to_string(wgsl)));
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: naga validation failed:\n{}", e.emit_to_string(wgsl)));
}

#[test]
fn wgsl_snapshots_are_valid_and_current() {
    let log_path = std::env::temp_dir().join(format!("quattn-cubecl-log-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&log_path);
    // CubeCL reads this once, when its first client starts: before the session below.
    std::env::set_var("CUBECL_DEBUG_LOG", &log_path);
    let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false);
    let session = match quattn::Session::new(Device::Wgpu(WgpuAdapter::Software)) {
        Ok(s) => s,
        Err(e) if !ci => {
            println!("SKIPPED: no software wgpu adapter (mesa-vulkan-drivers): {e}");
            return;
        }
        Err(e) => panic!("CI must have mesa's software Vulkan adapter: {e}"),
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let bless = std::env::var("QUATTN_BLESS").is_ok_and(|v| v == "1");
    let mut seen = 0;
    for (stems, p, prec) in cases() {
        let plan = session.plan(&p, prec, Strategy::Portable).unwrap();
        let (q, k, v) = inputs::qkv(&p, 3);
        session.run(&plan, &q, &k, &v).unwrap();
        let log = std::fs::read_to_string(&log_path).expect("CubeCL wrote its compilation log");
        let sources = logged_wgsl(&log);
        assert_eq!(sources.len(), seen + stems.len(), "{stems:?}: expected exactly {} new quattn kernel compilations", stems.len());
        for (stem, raw) in stems.iter().zip(&sources[seen..]) {
            check_snapshot(&dir, bless, stem, raw);
        }
        seen = sources.len();
    }
    let _ = std::fs::remove_file(&log_path);
}

/// Validates one logged kernel and compares it with (or, blessing, writes) its file.
fn check_snapshot(dir: &std::path::Path, bless: bool, stem: &str, raw: &str) {
    validate(stem, raw);
    let wgsl = &canonical(raw);
    let file = dir.join(format!("{stem}.wgsl"));
    if bless {
        std::fs::write(&file, wgsl).unwrap();
    } else {
        let old = std::fs::read_to_string(&file).unwrap_or_default();
        if old != *wgsl {
            let _ = std::fs::write(std::env::temp_dir().join(format!("{stem}.new.wgsl")), wgsl);
        }
        assert!(old == *wgsl, "{} is stale: the kernel now lowers to other WGSL; rerun with QUATTN_BLESS=1 and review the diff", file.display());
        // The checked-in copy itself is valid too (it is what reviewers read).
        validate(stem, &old);
    }
}
