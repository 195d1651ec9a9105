#!/usr/bin/env bash
# INT8 Q·Kᵀ with e4m3 P·V with the large-scale fallback decided once per tile: the INT8+FP8
# check (accuracy and speed next to the f16 P·V kernel), then the fuzz cases up to the one that
# found the LSE error.
#   benchmarks/2026-11-25-h100-k/run.sh OUT BIN   (BIN: quattn, int8_fp8_check)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
step check
timeout 60 "$bin/int8_fp8_check" > "$out/int8_fp8_check.jsonl" 2> "$out/int8_fp8_check.log"; echo "rc $?"
tail -1 "$out/int8_fp8_check.jsonl"
step fuzz
timeout 75 "$bin/quattn" selftest --devices cuda --no-matrix --fuzz 45 --fuzz-seed 0x58445c3665bc4b95 --json > "$out/fuzz.jsonl" 2> "$out/fuzz.log"; echo "rc $?"
grep -h '^selftest' "$out/fuzz.jsonl" "$out/fuzz.log"; grep -h '"status":"fail"' "$out/fuzz.jsonl" | cut -c1-400 | head -3
grep -h 'case 44 of' "$out/fuzz.jsonl" | cut -c1-300
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/k.tgz"
step done
