#!/usr/bin/env bash
# Run af (second call: CUDA probe fixed, five more tiles in the sweep): packed-f16 multiply-add peak through CUDA and through Vulkan on the same
# GPU (fma_peak_cuda / wgsl_fma_peak, the same chains), the mixed f16x2 + f32 form, and the
# WGSL tile sweep of the packed-f16 attention kernel with the driver's shader cache kept
# (per-tile SASS and registers read offline from it).
# BIN: wgsl_fma_peak (quattn-cubecl --example), fma_peak_cuda (quattn-native --features cuda
# --example), bench_cuda (quattn-cubecl --features cuda --example bench_cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step cuda-peak; timeout 120 "$bin/fma_peak_cuda" --steps 256 2>&1 | tee "$out/peak_cuda.txt"
step wgsl-peak; mkdir -p /tmp/nvc-probe; __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-probe timeout 120 "$bin/wgsl_fma_peak" --steps 256 2>&1 | tee "$out/peak_wgsl.txt"
step sweep-wgsl; mkdir -p /tmp/nvc-sweep; __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-sweep timeout 400 "$bin/bench_cuda" wgpu --d 128 --filter half_2s_pv16 --iters 10 2>&1 | cut -c1-160 | tee "$out/sweep_wgsl.txt"
tar czf "$out/nvcache.tgz" -C /tmp nvc-probe nvc-sweep; ls -la "$out"
step done
