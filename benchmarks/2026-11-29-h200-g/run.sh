#!/usr/bin/env bash
# INT8 s8 wgmma kernels, descriptors from per-loop bases and the K-scale base per CTA (new2)
# against the previous build (old) on one H200, alternating: int8_check (f16 P·V variants,
# kernel only) and int8_fp8_check (e4m3 P·V variants: check against f64 / emulation and times).
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for b in old new2; do
  echo "== int8_check $b"; timeout 90 "$bin/int8_$b" --bench-only --wgmma-only > "$out/int8_bench_$b.txt" 2>&1; echo rc $?
  grep -E "int8_block_d(64|128)_tma2" "$out/int8_bench_$b.txt" | cut -c1-160
done
for b in old new2; do
  echo "== int8_fp8_check $b"; timeout 75 "$bin/i8f8_$b" > "$out/i8f8_$b.jsonl" 2> "$out/i8f8_$b.log"; echo rc $?; tail -4 "$out/i8f8_$b.log" | cut -c1-300
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
