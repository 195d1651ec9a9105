#!/usr/bin/env bash
# Run r: the cmma table's new first entry (4 planes x bk 32) on CUDA and on Vulkan
# SPIR-V: selftests, portable CUDA against torch in the same call, SPIR-V bench; and the WGSL FMA
# kernels host-timed by bench_cuda (to compare with quattn bench's wgpu timestamps).
# BIN: quattn (--features peer-cubek), quattn-spirv (--features spirv), bench_cuda
# (`cargo build --release -p quattn-cubecl --features cuda --example bench_cuda`).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn; qs=$bin/quattn-spirv
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
step selftest-cuda; timeout 200 "$q" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"
step selftest-spirv; timeout 120 "$qs" selftest --devices wgpu-spirv --quick --json > "$out/selftest_spirv.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_spirv.jsonl"
step portable; timeout 90 "$q" bench --device cuda --strategy portable --precision f16 --seqs 4096,16384 --causal non-causal --iters 20 --json > "$out/bench_portable.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,16384 --causal non-causal > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step spirv; timeout 90 "$qs" bench --device wgpu-spirv --precision f16 --seqs 4096 --iters 30 --warmup 5 --json > "$out/bench_spirv.jsonl" 2>> "$out/run.log"; echo "rc $?"
step wgsl-host; timeout 120 "$bin/bench_cuda" wgpu --filter fma_vec --d 64,128 --iters 10 > "$out/sweep_wgsl.txt" 2>&1; echo "rc $?"
step done
