#!/usr/bin/env bash
# Run y: selftest after the review refactors (cta_tiles / cta_store_o in
# common.cuh: SASS opcode-identical; launch_matrix_kernel! for the cmma and mma launches), and
# the portable cmma / mma kernels forced once each at hd 128 seq 4k.
# BIN: quattn (--features peer-cubek).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step selftest; timeout 170 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest.jsonl" | head -5 | cut -c1-600
step forced
for fam in cmma mma; do timeout 60 "$q" run --device cuda --strategy portable --portable $fam --precision f16 --head-dim 128 --seq 4096 --batch 4 --heads 16 --json >> "$out/run_forced.jsonl" 2>> "$out/run.log"; echo "rc $? ($fam)"; done
cut -c1-400 "$out/run_forced.jsonl"
step done
