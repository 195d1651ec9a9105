#!/usr/bin/env bash
# Run ak: hd-128 tiles of the packed-f16 kernel in its fastest mode (f16 Q·Kᵀ,
# f16 P·V: `qk16_pv16`) through WGSL, with prefetched K/V (split stages where they fit);
# bench_cuda, best of 3 loops, two passes to see the spread.
# BIN: bench_cuda (quattn-cubecl --features cuda --example bench_cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
F='half_qk16_pv16_bq64_bk64_t16x16_sin$,half_qk16_pv16_bq64_bk32_t16x8_sin$,half_qk16_pv16_bq64_bk64_t16x8_sin$,half_qk16_pv16_bq64_bk64_t8x16_sin$,half_qk16_pv16_bq64_bk64_t8x8_sin$,half_qk16_pv16_bq96_bk32_t24x8_sin$,half_2s_pv16_bq64_bk64_t16x8_sin$'
for pass in 1 2; do
step wgsl-d128 pass $pass; timeout 250 "$bin/bench_cuda" wgpu --d 128 --filter "$F" --iters 10 2>/dev/null | cut -c1-190 | tee -a "$out/wgsl_d128.txt"
done
step done
