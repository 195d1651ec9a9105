#!/usr/bin/env bash
# Run ac: the packed-f16 kernel on 2-wide f16 accumulators (QUATTN_X_VEC2: one
# 32-bit register per vector, the shape of an HFMA2 operand) against the 4-wide ones, through
# WGSL on Vulkan, with the loop unrolling and mul+add knobs of run ab. BIN: bench_cuda.
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
run() { rt=$1; v=$2; shift 2; for f in half_2s_pv16_bq64_bk64_t8x16 half_2s_pv16_bq64_bk32_t16x8; do
  step "$rt $v $f"; env "$@" timeout 60 "$bin/bench_cuda" $rt --d 128,64 --filter $f --iters 30 2>> "$out/run.log" | grep -v "^runtime" | tee -a "$out/ac.txt" | cut -c1-140; done; }
run wgpu v4 X=0
run wgpu v2 QUATTN_X_VEC2=1
run wgpu v2-muladd QUATTN_X_VEC2=1 QUATTN_X_MULADD=1
run wgpu v2-unroll-muladd QUATTN_X_VEC2=1 QUATTN_X_MULADD=1 QUATTN_X_UNROLL=1
run wgpu v4-unroll-muladd QUATTN_X_MULADD=1 QUATTN_X_UNROLL=1
run cuda v2-unroll-muladd QUATTN_X_VEC2=1 QUATTN_X_MULADD=1 QUATTN_X_UNROLL=1
step done
