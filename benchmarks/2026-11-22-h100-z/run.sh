#!/usr/bin/env bash
# Run z: after the tensor-map cache (TmaMapCache): every f16 and INT8 wgmma variant
# checked against f64 (many launches on changing buffers: cache misses and hits), the selftest,
# and f16 / INT8 Auto timed (repeated launches on the same buffers: cache hits).
# BIN: quattn (--features peer-cubek), wgmma_check, int8_check (quattn-native --features cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step checks; timeout 120 "$bin/wgmma_check" --check-only > "$out/checks.txt" 2>&1; echo "rc $?"; timeout 120 "$bin/int8_check" --wgmma-only --check-only >> "$out/checks.txt" 2>&1; echo "rc $?"; grep -c PASS "$out/checks.txt"; grep -E "FAIL|ALL" "$out/checks.txt"
step selftest; timeout 170 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"
step bench; timeout 60 "$q" bench --device cuda --precision f16,int8 --seqs 8192 --head-dims 128 --causal non-causal --json > "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $?"; cut -c1-300 "$out/bench.jsonl"
step done
