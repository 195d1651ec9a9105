#!/usr/bin/env bash
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== fp8 check"; timeout 200 "$bin/wgmma_fp8_check" > "$out/fp8_check.txt" 2>&1; echo rc $?
grep -E "FAIL|ALL" "$out/fp8_check.txt" | head -30
grep -E "_rs|w3" "$out/fp8_check.txt" | grep -v "^d" | head -20
grep -E "^d(64|128) s16k" "$out/fp8_check.txt" | cut -c1-3000
echo "== prepass"; OUT="$out/prepass" BIN="$bin/prepass" DEADLINE=300 timeout 320 bash "$bin/prepass.sh" > "$out/prepass.log" 2>&1; echo rc $?
cat "$out/prepass/summary.txt"; grep -E "d128" "$out/prepass/int8_prepass.txt" | grep -E "lag (8MB|-)" | head -30
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
