#!/usr/bin/env bash
# GPU checks of the native FP8 plumbing on an H100 (CUDA 13 at /usr/local/cuda), run from the
# repository root, under two minutes:
#
#   OUT=DIR bash benchmarks/gpu-checks/fp8plumb.sh
#
# Binaries in .bin/fp8plumb/:
#   quattn             cargo build --release -p quattn-demos
#   fp8_prepass_bench  cargo build --release -p quattn-native --example fp8_prepass_bench
#
# Steps and what passing looks like:
#   bench     the FP8 quantization prepass (f16 -> e4m3) timed against its bytes model (input
#             read once, codes written once, at 3 TB/s); exit status 0 means every slab size gave
#             the same codes and descales; the target is `x model` <= 1.5 (per-head rows; a
#             per-tensor descale of a tensor larger than the L2 needs two reads of it).
#   selftest  `quattn selftest --only fp8`: the device prepass against the codec bit for bit
#             (upload path and Session::quantize_fp8_cuda: f16/bf16, e4m3/e5m2, per tensor and
#             per head, GQA, ragged, both layouts, a NaN element, a multi-slab problem), the CUDA
#             device-tensor entry points (run_cuda on f16, run_cuda_fp8 on the host path's codes)
#             bit-identical to the host path, typed errors; pass = its last line says
#             "selftest: 68 passed, 0 failed, 0 skipped" (0 passed means no CUDA session opened).
set -u
bin=.bin/fp8plumb
out=${OUT:?set OUT to the output folder}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
# Both binaries share the compiled kernels.
export QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-$out/kernel-cache}
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null

echo "== bench $(date -u +%T)"
timeout 35 "$bin/fp8_prepass_bench" > "$out/fp8_prepass_bench.txt" 2>&1
echo "rc $?"
cat "$out/fp8_prepass_bench.txt"

echo "== selftest $(date -u +%T)"
timeout 75 "$bin/quattn" selftest --devices cuda --only fp8 --json > "$out/fp8_selftest.jsonl" 2> "$out/fp8_selftest.log"
echo "rc $?"
grep -h '"status":"fail"' "$out/fp8_selftest.jsonl" | cut -c1-600 | head -20
tail -1 "$out/fp8_selftest.jsonl"
echo "== done $(date -u +%T)"
