//! The `quattn` command line as scripts use it.

use std::process::Command;

fn quattn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_quattn")).args(args).output().expect("run quattn")
}

#[test]
fn run_cpu_f32_json_meets_the_reference() {
    let out = quattn(&["run", "--device", "cpu", "--precision", "f32", "--batch", "1", "--heads", "4", "--seq", "512", "--head-dim", "64", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim().lines().count(), 1, "exactly one JSON object: {stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    for key in ["device", "adapter", "strategy", "kernel", "precision", "shape", "ms", "tflops", "rel_l2", "cos_sim", "max_abs"] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["precision"], "f32");
    assert!(v["rel_l2"].as_f64().unwrap() < 1e-6, "{v}");
    assert!(v["cos_sim"].as_f64().unwrap() > 0.999_999);
    assert!(v["ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn run_with_every_score_modifier_meets_the_reference() {
    let out = quattn(&[
        "run", "--device", "cpu", "--precision", "f32", "--heads", "4", "--seq", "96", "--kv-seq", "160", "--head-dim", "32", "--causal",
        "--window", "24,-1", "--softcap", "5", "--sinks", "--alibi", "--causal-align", "top-left", "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(v["shape"]["modifiers"], serde_json::json!(["window(24,-1)", "softcap(5)", "sinks", "alibi", "top-left"]), "{v}");
    assert!(v["accuracy"]["passed"].as_bool().unwrap(), "{v}");
    assert!(v["rel_l2"].as_f64().unwrap() < 1e-6, "{v}");
}

#[test]
fn run_varlen_meets_the_reference_and_reports_the_lengths() {
    let out = quattn(&["run", "--device", "cpu", "--precision", "f16", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--causal", "--varlen", "37,1,130,64", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    assert_eq!(v["shape"]["varlen"], serde_json::json!([37, 1, 130, 64]), "{v}");
    assert_eq!((v["shape"]["batch"].as_u64(), v["shape"]["seq"].as_u64()), (Some(4), Some(130)), "{v}");
    assert!(v["accuracy"]["passed"].as_bool().unwrap(), "{v}");
}

#[test]
fn invalid_inputs_exit_non_zero_with_a_message() {
    for (args, needle) in [
        (vec!["run", "--device", "cpu", "--heads", "4", "--kv-heads", "3"], "not a multiple"),
        (vec!["run", "--device", "cpu", "--seq", "0"], "q_len"),
        (vec!["run", "--device", "cpu", "--head-dim", "0"], "head_dim"),
        (vec!["run", "--device", "cpu", "--scale", "nan"], "not a finite"),
        (vec!["run", "--device", "cpu", "--scale", "-1"], "not positive"),
        (vec!["run", "--device", "cpu", "--scale", "0"], "not positive"),
        (vec!["run", "--device", "cpu", "--precision", "int8"], "not supported on cpu"),
        (vec!["run", "--device", "cpu", "--precision", "f64"], "unknown precision"),
        (vec!["run", "--device", "cpu", "--strategy", "native"], "not available on cpu"),
        (vec!["run", "--device", "cpu", "--window", "-2,0"], "sliding window"),
        (vec!["run", "--device", "cpu", "--window", "4"], "expected L,R"),
        (vec!["run", "--device", "cpu", "--softcap", "nan"], "softcap"),
        (vec!["run", "--device", "cpu", "--causal-align", "middle"], "causal-align"),
        (vec!["run", "--device", "cpu", "--window", "8,0", "--strategy", "reference"], "does not implement the sliding window"),
        (vec!["run", "--device", "cpu", "--varlen", "0,0"], "q_len"),
        (vec!["run", "--device", "cpu", "--varlen", "8,4", "--strategy", "reference"], "does not take variable-length batches"),
    ] {
        let out = quattn(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: stderr {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn bench_and_selftest_exist() {
    let out = quattn(&["bench", "--device", "cpu", "--head-dims", "32", "--seqs", "64", "--tokens", "64", "--width", "64", "--iters", "2", "--warmup", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2, "causal and non-causal rows");
    assert!(rows.iter().all(|r| r["tflops"].as_f64().unwrap() > 0.0));
    let out = quattn(&["selftest", "--devices", "cpu", "--quick"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("passed, 0 failed"), "{stdout}");
}

#[test]
fn native_kernels_compile_with_their_tensor_core_instructions() {
    // Needs NVRTC and a disassembler (installed by .ci/run); CI must run it, elsewhere a
    // missing toolchain skips with the reason. The Blackwell targets only: every family's own
    // compile test (native/tests/compile*.rs, hip_compile.rs) checks it on the targets up to
    // sm_90 and on gfx942/gfx950, and the whole report compiles every variant twice over.
    let out = quattn(&["kernels", "--json", "--arch", "sm_100a,sm_120a"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ci = std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false);
    let rows: Vec<serde_json::Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    // HIP rows (clang, AMD code objects) carry `scratch_bytes`; CUDA rows (NVRTC) spill counts.
    let is_hip = |r: &serde_json::Value| r.get("scratch_bytes").is_some();
    let cuda_rows: Vec<&serde_json::Value> = rows.iter().filter(|r| !is_hip(r)).collect();
    let toolchain_missing = cuda_rows.iter().all(|r| r["compiled"] == false) && !cuda_rows.is_empty();
    if toolchain_missing && !ci {
        println!("SKIPPED: NVRTC not found: {}", rows[0]["error"]);
        return;
    }
    assert!(out.status.success(), "quattn kernels failed:\n{stdout}");
    for arch in ["sm_100a", "sm_120a"] {
        assert!(rows.iter().any(|r| r["arch"] == arch && r["kernel"].as_str().unwrap().ends_with("f32_f32_d128")), "no {arch} row");
    }
    assert!(rows.iter().all(|r| r["arch"] == "sm_100a" || r["arch"] == "sm_120a"), "rows of targets not asked for");
    for r in &rows {
        if is_hip(r) {
            assert_eq!(r["scratch_bytes"], 0, "{r}");
            assert!(r["unexpected"].as_array().unwrap().is_empty(), "{r}");
        } else {
            assert_eq!(r["spill_store_bytes"], 0, "{r}");
        }
        assert!(r["missing"].as_array().unwrap().is_empty(), "{r}");
    }
    // An arch filter leaves the HIP variants out (hip_compile.rs compiles them).
    assert!(!rows.iter().any(is_hip), "HIP rows with a CUDA arch filter");
}

/// `quattn ... | head`: a reader that goes away ends the program quietly, never with a panic.
#[cfg(unix)]
#[test]
fn closed_stdout_is_not_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_quattn"))
        .args(["selftest", "--devices", "cpu", "--quick", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn quattn");
    drop(child.stdout.take()); // the reader leaves before the first line
    let out = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "stderr: {err}");
    assert_ne!(out.status.code(), Some(101), "exit code of a Rust panic; stderr: {err}");
}

/// `--shard I/N`: the N shards together run each case of the matrix exactly once.
#[test]
fn selftest_shards_partition_the_matrix() {
    let cases = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["selftest", "--devices", "cpu", "--quick", "--json"];
        args.extend_from_slice(extra);
        let out = quattn(&args);
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        let mut v: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().filter(|l| l.starts_with('{')).map(String::from).collect();
        v.sort();
        v
    };
    let whole = cases(&[]);
    let mut parts = [cases(&["--shard", "0/3"]), cases(&["--shard", "1/3"]), cases(&["--shard", "2/3"])];
    assert!(parts.iter().all(|p| !p.is_empty() && p.len() < whole.len()), "each shard runs a part");
    let mut joined: Vec<String> = parts.iter_mut().flat_map(std::mem::take).collect();
    joined.sort();
    assert_eq!(joined, whole);
    for bad in ["3/3", "1", "a/2", "0/0"] {
        let out = quattn(&["selftest", "--devices", "cpu", "--quick", "--shard", bad]);
        assert!(!out.status.success(), "--shard {bad} accepted");
    }
}
