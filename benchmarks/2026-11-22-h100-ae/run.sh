#!/usr/bin/env bash
# Run ae: does NVIDIA's Vulkan driver execute WGSL f16 math as packed f16?
# 1. examples/wgsl_fma_peak: register-only multiply-add throughput per WGSL form, and whether
#    each f16 form rounds every step in f16 (read back).
# 2. The driver's shader disk cache after the probe and after one WGSL attention bench (f16
#    f32-acc and f16-2stage-pv16, hd 128, s4k), kept to look for the compiled SASS offline.
# BIN: quattn (--features peer-cubek), wgsl_fma_peak (quattn-cubecl --example wgsl_fma_peak).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1
mkdir -p /tmp/nvc-probe /tmp/nvc-attn /tmp/nvc-attn32 ~/.cache/nvidia
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1; cat "$out/gpu.csv"
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step probe
__GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-probe timeout 120 "$bin/wgsl_fma_peak" --steps 256 --reps 10 2>&1 | tee "$out/probe.txt"
step probe-long; __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-probe timeout 120 "$bin/wgsl_fma_peak" --steps 1024 --reps 5 2>&1 | tail -11
step attn-f16
__GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-attn timeout 120 "$q" bench --device wgpu --precision f16-2stage-pv16 --seqs 4096 --head-dims 128 --causal non-causal --iters 5 --warmup 1 2>&1 | tail -4
__GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-attn32 timeout 120 "$q" bench --device wgpu --precision f16 --seqs 4096 --head-dims 128 --causal non-causal --iters 5 --warmup 1 2>&1 | tail -4
step caches
ls -laR /tmp/nvc-probe /tmp/nvc-attn /tmp/nvc-attn32 2>&1 | head -40; ls -la ~/.cache/nvidia 2>&1 | head
tar czf "$out/nvcache.tgz" -C /tmp nvc-probe nvc-attn nvc-attn32 2>&1; ls -la "$out"
step done
