#!/usr/bin/env bash
# Run ab: what the packed-f16 kernel's inner loops cost on Vulkan (WGSL) and CUDA:
# the head-dim / key loops unrolled or not (QUATTN_X_UNROLL), `fma(a, b, c)` or `a * b + c`
# (QUATTN_X_MULADD; CubeCL's CUDA lowering turns f16 `fma` into f32 fmaf, so only `a * b + c`
# becomes HFMA2 there), two tiles, hd 128 and 64. BIN: bench_cuda.
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
for rt in wgpu cuda; do
  for v in none unroll muladd both; do
    case $v in none) e="";; unroll) e="QUATTN_X_UNROLL=1";; muladd) e="QUATTN_X_MULADD=1";; both) e="QUATTN_X_UNROLL=1 QUATTN_X_MULADD=1";; esac
    for f in half_2s_pv16_bq64_bk64_t8x16 half_2s_pv16_bq64_bk32_t16x8; do
      step "$rt $v $f"
      env $e timeout 60 "$bin/bench_cuda" $rt --d 128,64 --filter $f --iters 20 2>> "$out/run.log" | grep -v "^runtime" | tee -a "$out/ab.txt" | cut -c1-140
    done
  done
done
step done
