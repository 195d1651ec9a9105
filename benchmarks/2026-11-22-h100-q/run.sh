#!/usr/bin/env bash
# Run q: cmma tile sweep after the shared-memory slimming, on CUDA (NVRTC) and on
# Vulkan through SPIR-V, with quattn-cubecl's bench_cuda example (correctness check on a small
# shape against an f64 CPU reference, then seq 4096 throughput, one line per tiling).
# BIN: bench_cuda (`cargo build --release -p quattn-cubecl --features cuda --example bench_cuda`)
# and bench_spirv (the same with `--features cuda,spirv`).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
step cuda; timeout 240 "$bin/bench_cuda" cuda --filter cmma --d 64,128 --iters 20 > "$out/sweep_cuda.txt" 2>&1; echo "rc $?"
step spirv; timeout 240 "$bin/bench_spirv" wgpu --filter cmma --d 64,128 --iters 20 > "$out/sweep_spirv.txt" 2>&1; echo "rc $?"
step done
