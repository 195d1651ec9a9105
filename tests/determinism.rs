//! Same inputs, same bits: on the CPU and wgpu (llvmpipe in CI; the GPU selftest runs the same
//! check on CUDA), every kernel family the device plans gives bit-identical O and LSE when a
//! call is repeated on the same resident data and on a fresh upload. No path of these backends
//! splits the keys across work groups or accumulates with atomics, so none needs a flag for it.

mod common;

use quattn::fuzz::policy::{determinism, family_plans};
use quattn::fuzz::{Generator, Profile, FIXED_SEED};
use quattn::{AttentionProblem, Device, Precision, Strategy, WgpuAdapter};

/// Generator cases (ragged lengths, GQA, strides, layouts, planted NaNs...) with the kernel
/// configuration fixed to `precision` / `strategy` at head dim 64, causal, with the LSE: the
/// kernels the NaN-policy test compiles too.
fn cases_for(profile: &Profile, precision: Precision, strategy: Strategy, n: usize) -> Vec<quattn::fuzz::Case> {
    let g = Generator::new(FIXED_SEED ^ 0xde7, profile.clone());
    (0..)
        .map(|i| {
            let mut c = g.case(i);
            let p = c.problem;
            c.problem = AttentionProblem { head_dim: 64, v_head_dim: 64, causal: true, return_lse: true, strides: None, ..p };
            c.precision = precision;
            c.strategy = strategy;
            c
        })
        .filter(|c| c.problem.validate().is_ok())
        .take(n)
        .collect()
}

fn check(device: Device, precisions: &[&str], reference: bool) {
    let Some(s) = common::open(device) else { return };
    let profile = Profile::probe(&s).with_budget(300, 2.0e6);
    let precisions: Vec<Precision> = precisions.iter().map(|n| Precision::parse(n).unwrap()).collect();
    let probe = AttentionProblem::new(1, 2, 8, 64).causal(true).with_lse(true);
    let mut plans = family_plans(&s, &probe, &precisions);
    if reference {
        plans.extend(precisions.iter().map(|&p| (p, Strategy::Reference, format!("emulate_{p}"))));
    }
    assert!(!plans.is_empty());
    let (mut checked, mut failures) = (0, Vec::new());
    for (precision, strategy, kernel) in plans {
        for case in cases_for(&profile, precision, strategy, 4) {
            match determinism(&s, &case) {
                Ok(None) => checked += 1,
                Ok(Some(why)) => println!("{device} {kernel}: not checked ({why})"),
                Err(e) => failures.push(e),
            }
        }
        println!("{device} {kernel} {precision}: checked");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 0, "{device}: nothing checked");
}

#[test]
fn cpu_and_emulation() {
    check(Device::Cpu, &["f32", "f16", "bf16", "fp8-e4m3-block", "int8-warp", "f16-2stage-pv16", "nvfp4", "mxfp4"], true);
}

#[test]
fn wgpu() {
    check(Device::Wgpu(WgpuAdapter::Default), &["f32", "f16", "f16-2stage", "f16-pv16", "int8-block", "int8-warp-nosmooth", "fp8-e4m3", "fp8-e5m2-head"], false);
}
