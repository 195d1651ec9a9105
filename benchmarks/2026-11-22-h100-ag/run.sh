#!/usr/bin/env bash
# Run ag: K/V staging of the packed-f16 kernel (KvLoads: Direct, TileChecked,
# Prefetch) on four tiles, through WGSL (Vulkan) and through CUDA, bench_cuda best of 3 loops;
# the driver's shader cache kept for the Vulkan SASS (registers) of each variant.
# BIN: bench_cuda (quattn-cubecl --features cuda --example bench_cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
F=half_2s_pv16_bq64_bk32_t16x8,half_2s_pv16_bq64_bk64_t16x16,half_2s_pv16_bq64_bk64_t8x16,half_2s_pv16_bq96_bk32_t24x8
step wgsl; mkdir -p /tmp/nvc-ag; __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc-ag timeout 330 "$bin/bench_cuda" wgpu --d 128 --filter $F --iters 10 2> "$out/wgsl.err" | cut -c1-170 | tee "$out/wgsl.txt"
step cuda; timeout 200 "$bin/bench_cuda" cuda --d 128 --filter $F --iters 20 2> "$out/cuda.err" | cut -c1-170 | tee "$out/cuda.txt"
tar czf "$out/nvcache.tgz" -C /tmp nvc-ag; ls -la "$out"
step done
