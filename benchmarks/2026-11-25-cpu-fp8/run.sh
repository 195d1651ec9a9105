#!/usr/bin/env bash
# The FP8 error budget on the CPU (no GPU): which quantized tensor costs what, in f64.
#   benchmarks/2026-11-25-cpu-fp8/run.sh > benchmarks/2026-11-25-cpu-fp8/fp8_error_budget.txt
cargo run --release --example fp8_error_budget -- 1024
