#!/usr/bin/env bash
# Run x: Vulkan through WGSL and SPIR-V with quattn bench's batched host clock (5
# launches per synchronization), seq 4k, non-causal and causal.
# BIN: quattn, quattn-spirv (--features spirv).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step wgsl; timeout 150 "$q" bench --device wgpu --precision f16 --seqs 4096 --head-dims 64,128 --causal both --iters 5 --warmup 2 --json > "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $?"
step spirv; timeout 120 "$bin/quattn-spirv" bench --device wgpu-spirv --precision f16 --seqs 4096 --head-dims 64,128 --causal both --iters 5 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $?"
python3 -c "
import json,sys
for l in open('$out/bench_vulkan.jsonl'):
    d=json.loads(l); s=d['shape']; print(d['device'], d['kernel'], s['head_dim'], s['causal'], round(d['ms'],3), round(d['tflops'],1))
"
step done
