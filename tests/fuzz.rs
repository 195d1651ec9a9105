//! The differential fuzzer (`quattn::fuzz`) on the CPU and on wgpu (mesa's llvmpipe in CI):
//! every case of a fixed seed and of a seed that changes every run, planned and run through the
//! public API and judged against the f64 reference, the CPU emulation of the quantized modes,
//! the plan's refusal rules and the NaN policy. A failure prints its case and the environment
//! that replays it (`QUATTN_FUZZ_SEED=… QUATTN_FUZZ_CASE=…`); `QUATTN_FUZZ_CASES` sets the
//! number of cases per seed, `QUATTN_FUZZ_VERBOSE=1` prints every case with its time.

mod common;

use std::time::{Duration, Instant};

use quattn::fuzz::{self, Generator, Profile, Summary};
use quattn::{Device, WgpuAdapter};

/// Cases per seed, from `QUATTN_FUZZ_CASES` or the default.
fn cases_per_seed(default: u64) -> u64 {
    std::env::var("QUATTN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs the budget on `device`: `per_seed` cases of the fixed and of a rotating seed (or the
/// replay the environment asks for), within `wall` seconds (a guard against a seed whose kernels
/// are slow to compile: the cases left are reported, and at least 40 must have run).
fn fuzz_device(device: Device, per_seed: u64, shape: impl Fn(Profile) -> Profile, wall: Duration) {
    let Some(session) = common::open(device) else { return };
    let profile = shape(Profile::probe(&session));
    println!(
        "{device}: precisions {:?}; strategies {:?}; head dims {:?}",
        profile.precisions.iter().map(|p| p.name()).collect::<Vec<_>>(),
        profile.strategies,
        profile.head_dims
    );
    let replay = fuzz::replay_from_env().unwrap_or_else(|e| panic!("{e}"));
    let runs: Vec<(u64, Vec<u64>)> = match replay {
        Some((seed, Some(case))) => vec![(seed, vec![case])],
        Some((seed, None)) => vec![(seed, (0..per_seed).collect())],
        None => vec![(fuzz::FIXED_SEED, (0..per_seed).collect()), (fuzz::rotating_seed(), (0..per_seed).collect())],
    };
    // QUATTN_FUZZ_VERBOSE=1 prints every case with its time.
    let verbose = std::env::var("QUATTN_FUZZ_VERBOSE").is_ok_and(|v| v == "1");
    let start = Instant::now();
    let mut summary = Summary::default();
    let mut failures = Vec::new();
    let planned: usize = runs.iter().map(|r| r.1.len()).sum();
    'seeds: for (seed, cases) in runs {
        println!("{device}: seed {seed:#x}, {} cases (replay: {}={seed:#x})", cases.len(), fuzz::SEED_ENV);
        let generator = Generator::new(seed, profile.clone());
        for i in cases {
            if start.elapsed() > wall {
                println!("{device}: wall-clock guard of {wall:?} reached after {} of {planned} cases", summary.cases);
                break 'seeds;
            }
            let t = Instant::now();
            let verdict = fuzz::run_case(&session, &generator.case(i));
            summary.add(&verdict);
            if verbose {
                println!("{:.2} s: {verdict}", t.elapsed().as_secs_f64());
            }
            if verdict.is_failure() {
                println!("{verdict}");
                failures.push(verdict.to_string());
            }
        }
    }
    println!("{device}: {summary} in {:.1} s", start.elapsed().as_secs_f64());
    println!("{device}: refusals {:?}", summary.refusals);
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), summary.cases, failures.join("\n"));
    assert!(summary.cases >= planned.min(40), "only {} of {planned} cases ran inside {wall:?}", summary.cases);
    // Most cases must run (refusals are the minority the generator aims for), or the fuzzer
    // tests nothing.
    assert!(summary.passed * 2 >= summary.cases, "{summary}");
}

#[test]
fn cpu() {
    fuzz_device(Device::Cpu, cases_per_seed(300), |p| p.with_budget(600, 2.0e7), Duration::from_secs(120));
}

/// On llvmpipe compiling a kernel costs 2 to 25 s (head dims up to 128; d256 kernels take
/// about 50 s and run in the GPU selftest instead), so each seed draws its cases from 5 kernel
/// configurations: two seeds compile at most 10 kernels.
#[test]
fn wgpu() {
    let profile = |p: Profile| p.with_budget(600, 4.0e6).max_head_dim(128).with_palette(5);
    fuzz_device(Device::Wgpu(WgpuAdapter::Default), cases_per_seed(60), profile, Duration::from_secs(150));
}
