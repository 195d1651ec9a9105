#!/usr/bin/env bash
# Run aa: the packed-f16 FMA kernel (fma_half.rs, the f16-accumulating modes) on
# Vulkan through WGSL and on CUDA: tile sweep and every mode (bench_cuda), the f32-accumulating
# FMA kernel beside it, then the facade (quattn bench / selftest on wgpu).
# BIN: quattn (--features peer-cubek), bench_cuda (quattn-cubecl --features cuda --example bench_cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step wgsl-half; timeout 200 "$bin/bench_cuda" wgpu --d 128,64 --filter half_ --iters 10 > "$out/sweep_wgsl.txt" 2>> "$out/run.log"; echo "rc $?"
step wgsl-f32acc; timeout 60 "$bin/bench_cuda" wgpu --d 128 --filter fma_vec_bq64_bk32_t16x8_sin --iters 10 >> "$out/sweep_wgsl.txt" 2>> "$out/run.log"; echo "rc $?"
cat "$out/sweep_wgsl.txt"
step cuda-half; timeout 120 "$bin/bench_cuda" cuda --d 128,64 --filter half_ --iters 10 > "$out/sweep_cuda.txt" 2>> "$out/run.log"; echo "rc $?"
cat "$out/sweep_cuda.txt"
step facade
for p in f16 f16-2stage-pv16 f16-acc16-pv16 f16-2stage; do
  timeout 60 "$q" bench --device wgpu --precision $p --seqs 4096 --head-dims 64,128 --causal both --iters 10 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? ($p)"
done
cut -c1-330 "$out/bench_vulkan.jsonl"
step selftest; timeout 150 "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"
grep -c '"pass"' "$out/selftest_wgpu.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_wgpu.jsonl" | head -5 | cut -c1-600
grep '"f16-2stage-pv16"\|"f16-acc16"' "$out/selftest_wgpu.jsonl" | head -6 | cut -c1-500
step done
