#!/usr/bin/env bash
# FP8 wgmma table variants: descriptors from per-loop bases (new) against per-wgmma descriptor
# arithmetic (old), alternating builds on one H200; the check of the new build.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== check new"; QUATTN_FP8_CHECK_ONLY=none timeout 150 "$bin/check_new" --check-only > "$out/check_new.txt" 2>&1; echo rc $?; grep -E "FAIL|ALL|SOME" "$out/check_new.txt" | head
for r in 1 2 3; do
  for b in old new; do
    echo "== bench $b round $r"; QUATTN_FP8_CHECK_ONLY=none timeout 100 "$bin/check_$b" --bench-only > "$out/bench_${b}_$r.txt" 2>&1; echo rc $?
    grep -E "^d(64|128) s(8|16)k" "$out/bench_${b}_$r.txt" | sed 's/(+prepass *[0-9.]*)//g; s/e4m3_f16_//g' | cut -c1-130
  done
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
