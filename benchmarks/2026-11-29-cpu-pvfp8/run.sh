#!/usr/bin/env bash
# The INT8 Q·K + E4M3 P·V error budget on the CPU (no GPU): which rounding costs what, in f64,
# and which reformulations of the E4M3 P·V reach cos-sim 0.9995.
#   benchmarks/2026-11-29-cpu-pvfp8/run.sh > benchmarks/2026-11-29-cpu-pvfp8/pvfp8_error_budget.txt
cargo run --release --example pvfp8_error_budget
