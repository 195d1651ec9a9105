#!/usr/bin/env bash
# Run p: the cmma kernel with the slimmer shared memory (Q stage reused, 32-column
# rescale) on CUDA and through SPIR-V on Vulkan; portable CUDA with torch in the same call.
# benchmarks/2026-11-22-h100-p/run.sh OUT BIN (BIN: quattn --features peer-cubek, quattn-spirv --features spirv)
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn; qs=$bin/quattn-spirv
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step selftest-cuda; timeout 200 "$q" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"
step selftest-spirv; timeout 150 "$qs" selftest --devices wgpu-spirv --quick --json > "$out/selftest_spirv.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_spirv.jsonl"
step portable; timeout 90 "$q" bench --device cuda --strategy portable --precision f16 --seqs 4096,16384 --causal non-causal --iters 20 --json > "$out/bench_portable.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,16384 --causal non-causal > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step spirv; timeout 120 "$qs" bench --device wgpu-spirv --precision f16 --seqs 1024,4096 --iters 30 --warmup 5 --json > "$out/bench_spirv.jsonl" 2>> "$out/run.log"; echo "rc $?"
step wgsl; timeout 90 "$q" bench --device wgpu --precision f16 --seqs 4096 --iters 30 --warmup 5 --json > "$out/bench_wgsl.jsonl" 2>> "$out/run.log"; echo "rc $?"
step done
