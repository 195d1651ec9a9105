#!/usr/bin/env bash
# Pipe probe: s32->f32 conversion (I2FP) against MUFU.EX2, alone and interleaved, and the exact iadd+fadd conversion.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,clocks.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do timeout 60 "$bin/xu_probe_cuda" > "$out/xu_probe_$r.txt" 2>&1; echo rc $?; cat "$out/xu_probe_$r.txt"; done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
