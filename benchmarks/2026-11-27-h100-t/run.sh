#!/usr/bin/env bash
# The prepass check (benchmarks/gpu-checks/prepass.sh) on the one-read FP8 pass that loads and
# publishes its next tile before waiting for the current tile's group.
# BIN holds quattn, fp8_prepass_bench and int8_prepass_bench built at prepass/commit.txt.
# Usage: run.sh OUT BIN
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
OUT=$1/prepass BIN=$2 DEADLINE=220 bash benchmarks/gpu-checks/prepass.sh > $1/prepass.log 2>&1
# compute-sanitizer on the FP8 prepass through the selftest's FP8 cases (each tool its own process):
#   for tool in memcheck racecheck synccheck initcheck; do
#     compute-sanitizer --tool $tool --error-exitcode 9 $BIN/quattn selftest --devices cuda --only fp8 --json > sanitize/${tool}_selftest_fp8.jsonl 2> sanitize/${tool}_selftest_fp8.log
#   done
