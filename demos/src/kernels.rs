//! `quattn kernels`: every native kernel variant compiled with NVRTC for every architecture it
//! targets, disassembled and checked: registers, spills, and the tensor-core instructions it must
//! contain. Needs no GPU; CI runs it and fails on any missing instruction or spill.

use quattn_native::{compile_report, Arch, KernelCache};

use crate::args::KernelsArgs;

pub fn main(a: &KernelsArgs) -> anyhow::Result<i32> {
    let archs: Option<Vec<Arch>> = if a.arch.is_empty() {
        None
    } else {
        Some(a.arch.iter().map(|s| Arch::parse(s).ok_or_else(|| anyhow::anyhow!("unknown arch `{s}`"))).collect::<Result<_, _>>()?)
    };
    let reports = compile_report(KernelCache::global(), archs.as_deref());
    let bad = reports.iter().filter(|r| !r.ok()).count();
    for r in &reports {
        if a.json {
            println!("{}", serde_json::to_string(r)?);
        } else {
            println!("{}", r.summary());
        }
    }
    if !a.json {
        println!("kernels: {} passed, {} failed", reports.len() - bad, bad);
    }
    Ok(if bad == 0 && !reports.is_empty() { 0 } else { 1 })
}
