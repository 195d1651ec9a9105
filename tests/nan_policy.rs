//! The NaN policy (`quattn::nonfinite`) through the public API, on the CPU and wgpu (llvmpipe in
//! CI; the GPU selftest runs the same checks on CUDA): for one precision of each kind on every
//! kernel family the device plans, rows that see a NaN or ±inf are NaN and no other row
//! changes by a bit, rows that see no key are O = 0 and LSE = -inf, finite inputs beyond the
//! input type are `InputOverflow`, and intermediate overflow is `Overflow`.

mod common;

use quattn::fuzz::policy::{family_plans, nan_policy, overflow_policy, policy_problem};
use quattn::{Device, Precision, Strategy, WgpuAdapter};

/// One precision per kernel and accumulation kind: f32; f16 and bf16 with f32 accumulation;
/// f16 accumulation of Q·Kᵀ (two-stage) and of P·V (per tile); INT8 with and without
/// smoothing; FP8 per tensor and per head; NVFP4 with bf16 V, with NVFP4 V and K smoothing,
/// and with NVFP4 V and f16 P; MXFP4 with K smoothing.
fn precisions() -> Vec<Precision> {
    ["f32", "f16", "bf16", "f16-2stage", "f16-pv16", "int8-block", "int8-warp-nosmooth", "fp8-e4m3", "fp8-e5m2-head", "nvfp4", "nvfp4-v4-smooth", "nvfp4-v4p16", "mxfp4-smooth"]
        .iter()
        .map(|n| Precision::parse(n).unwrap_or_else(|| panic!("precision {n}")))
        .collect()
}

fn check(device: Device, reference: bool) {
    let Some(s) = common::open(device) else { return };
    let mut plans = family_plans(&s, &policy_problem(), &precisions());
    assert!(!plans.is_empty(), "{device} plans none of {:?}", precisions());
    if reference {
        // The CPU emulation of the modes no CPU kernel computes, and of the 4-bit ones.
        for p in ["f16-acc16", "f16-pv16", "int8-block", "int8-thread-pvfp8", "fp8-e4m3-pfp8", "nvfp4", "nvfp4-v4", "nvfp4-v4p16-smooth", "mxfp4"] {
            plans.push((Precision::parse(p).unwrap(), Strategy::Reference, format!("emulate_{p}")));
        }
    }
    let mut failures = Vec::new();
    for (precision, strategy, kernel) in &plans {
        for (what, r) in [("nan", nan_policy(&s, *precision, *strategy)), ("overflow", overflow_policy(&s, *precision, *strategy))] {
            match r {
                Ok(None) => println!("{device} {kernel} {precision} {what}: holds"),
                Ok(Some(why)) => println!("{device} {kernel} {precision} {what}: not applicable ({why})"),
                Err(e) => {
                    println!("{device} {kernel} {precision} {what}: VIOLATED: {e}");
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} violations:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn cpu_and_emulation() {
    check(Device::Cpu, true);
}

#[test]
fn wgpu() {
    check(Device::Wgpu(WgpuAdapter::Default), false);
}
