//! Helpers shared by the compile tests (each test file includes this module).

/// `true` if the tools are there; `false` (after saying why) to skip; panics under CI.
pub fn tools_or_skip(test: &str) -> bool {
    let nvrtc = quattn_native::nvrtc();
    let disasm = quattn_native::tools::find_any_disassembler();
    let problem = match (&nvrtc, &disasm) {
        (Err(e), _) => Some(e.to_string()),
        (_, None) => Some("no cuobjdump / nvdisasm found".to_string()),
        _ => None,
    };
    match problem {
        None => true,
        Some(p) if std::env::var_os("CI").is_some() => panic!("{test}: CUDA tools required under CI: {p}"),
        Some(p) => {
            eprintln!("skipping {test}: {p} (run .ci/install-cuda-tools.sh)");
            false
        }
    }
}
