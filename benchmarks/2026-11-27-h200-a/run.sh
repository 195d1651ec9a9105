#!/usr/bin/env bash
# Tensors above 2^31 elements on the device-tensor path (examples/large_tensors.rs), one device
# call on an H200 (sm_90, the same kernels an H100 runs):
#   benchmarks/2026-11-27-h200-a/run.sh OUT BIN   (BIN: the large_tensors example binary)
set -u
out=${1:?OUT}; bin=${2:?BIN}
bash benchmarks/gpu-checks/large.sh "$out" "$bin"
