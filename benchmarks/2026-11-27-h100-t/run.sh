#!/usr/bin/env bash
# The prepass check (benchmarks/gpu-checks/prepass.sh) on the one-read FP8 pass that loads and
# publishes its next tile before waiting for the current tile's group.
# BIN holds quattn, fp8_prepass_bench and int8_prepass_bench built at prepass/commit.txt.
# Usage: run.sh OUT BIN
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
OUT=$1/prepass BIN=$2 DEADLINE=220 bash benchmarks/gpu-checks/prepass.sh > $1/prepass.log 2>&1
