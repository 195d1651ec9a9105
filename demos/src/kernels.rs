//! `quattn kernels`: every native kernel variant compiled with NVRTC for every architecture it
//! targets, disassembled and checked: registers, spills, and the tensor-core instructions it must
//! contain. Then the AMD (HIP) variants, compiled by clang for gfx942 and gfx950 and checked
//! the same way from the code objects (MFMA instructions, registers, LDS, scratch, occupancy);
//! those are compiled and disassembly-checked, not run on hardware. Needs no GPU; CI runs it
//! and fails on any missing instruction or spill.

use quattn_native::hip::{hip_compile_report, HipCache};
use quattn_native::{compile_report, Arch, KernelCache};

use crate::args::KernelsArgs;

pub fn main(a: &KernelsArgs) -> anyhow::Result<i32> {
    let archs: Option<Vec<Arch>> = if a.arch.is_empty() {
        None
    } else {
        Some(a.arch.iter().map(|s| Arch::parse(s).ok_or_else(|| anyhow::anyhow!("unknown arch `{s}`"))).collect::<Result<_, _>>()?)
    };
    let reports = compile_report(KernelCache::global(), archs.as_deref());
    let mut bad = reports.iter().filter(|r| !r.ok()).count();
    let mut total = reports.len();
    for r in &reports {
        if a.json {
            println!("{}", serde_json::to_string(r)?);
        } else {
            println!("{}", r.summary());
        }
    }
    // The HIP variants when no CUDA arch was asked for; without clang (ROCm's or LLVM's) they are
    // skipped with the reason on stderr (CI installs clang-22 and its test requires it).
    if a.arch.is_empty() {
        match hip_compile_report(HipCache::global()) {
            Ok(hip) => {
                total += hip.len();
                for r in &hip {
                    bad += !r.ok() as usize;
                    if a.json {
                        println!("{}", serde_json::to_string(r)?);
                    } else {
                        println!("{}", r.summary());
                    }
                }
            }
            Err(e) => eprintln!("kernels: HIP variants (gfx942, gfx950) skipped: {e}"),
        }
    }
    if !a.json {
        println!("kernels: {} passed, {} failed", total - bad, bad);
    }
    Ok(if bad == 0 && total > 0 { 0 } else { 1 })
}
