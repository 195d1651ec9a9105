#!/usr/bin/env bash
# CPU only: the f64 reference with Q and K replaced by their NVFP4 values.
cargo run --release --example nvfp4_error_budget > "$out/nvfp4_error_budget.txt"
