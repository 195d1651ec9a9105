#!/usr/bin/env bash
# Run ai: separate K and V stages in the packed-f16 kernel (two barriers per tile
# instead of four; `split_kv`), against the four-barrier prefetch (`_pf4`), tile-checked (`_tc`)
# and direct loads, through WGSL (d128, d64) and CUDA (d128); bench_cuda, best of 3 loops.
# BIN: bench_cuda (quattn-cubecl --features cuda --example bench_cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step wgsl-d128; timeout 200 "$bin/bench_cuda" wgpu --d 128 --filter 'half_2s_pv16_bq64_bk32_t16x8,half_2s_pv16_bq64_bk64_t16x16_sin_pf4,half_2s_pv16_bq32_bk64_t8x16_sin_pf4,half_2s_pv16_bq32_bk64_t8x16_sin$' --iters 10 2>/dev/null | cut -c1-190 | tee "$out/wgsl_d128.txt"
step wgsl-d64; timeout 120 "$bin/bench_cuda" wgpu --d 64 --filter 'half_2s_pv16_bq64_bk32_t16x8,half_2s_pv16_bq64_bk64_t16x16_sin_pf4' --iters 10 2>/dev/null | cut -c1-190 | tee "$out/wgsl_d64.txt"
step cuda-d128; timeout 240 "$bin/bench_cuda" cuda --d 128 --filter 'half_2s_pv16_bq64_bk32_t16x8_sin_pf4,half_2s_pv16_bq64_bk64_t16x16_sin_pf4,half_2s_pv16_bq64_bk32_t16x8_sin$' --iters 20 2>/dev/null | cut -c1-190 | tee "$out/cuda_d128.txt"
step done
