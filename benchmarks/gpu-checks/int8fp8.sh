#!/usr/bin/env bash
# INT8 Q·Kᵀ with e4m3 P·V (Precision::Int8Qk { pv: Fp8 }) on an H100, in under 150 s:
#   1. examples/int8_fp8_check.rs: the Auto plan on six shapes against the f64 reference and the
#      CPU emulation, the prepass's Q/K/V operands bit for bit against the codec; every e4m3
#      P·V variant (two-level P·V accumulation every 4 tiles / every tile / one level; 192- and
#      128-key tiles) and the f16 P·V one on 16k keys against f64; the prepass's device time
#      over seq 1k-16k against its bytes at 3 TB/s; kernel-only, prepass and end-to-end device
#      times and TOPS (4·b·h·q·kv·d / t) at hd 128, seq 8k and 16k, next to the s8 wgmma kernel
#      with f16 P·V, natively and through Session::time / time_kernel. Its last JSON line is
#      the verdict; exit status 0 when every check passes and every target is met.
#   2. `quattn bench` rows of int8 (f16 P·V) and int8-block-pvfp8 at the same shapes (end to
#      end and kernel only, as BENCHMARKS.md tabulates them).
#   3. With time left, compute-sanitizer memcheck on one small e4m3 P·V run.
#
# Run from the repository root on an H100 with CUDA 13 at /usr/local/cuda:
#   OUT=<output folder> bash benchmarks/gpu-checks/int8fp8.sh
# Binaries (release builds of this branch's tree) under .bin/int8fp8/: int8_fp8_check
# (cargo build --release --example int8_fp8_check), quattn (cargo build --release -p
# quattn-demos), and cache/ (the NVRTC cache of the kernels they load, compiled offline with
# the same NVRTC 13.0; without it they compile at first use).
set -u
OUT=${OUT:?set OUT to the output folder}
BIN=.bin/int8fp8
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# A writable copy of the shipped kernel cache (a missing kernel is compiled into it).
export QUATTN_CACHE_DIR=/tmp/quattn-int8fp8-cache
mkdir -p "$QUATTN_CACHE_DIR" && cp -r "$BIN/cache/." "$QUATTN_CACHE_DIR/" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$OUT/gpu.csv" 2>&1
start=$SECONDS

echo "== int8_fp8_check"
timeout 100 "$BIN/int8_fp8_check" > "$OUT/int8_fp8_check.jsonl" 2> "$OUT/int8_fp8_check.log"
echo "int8_fp8_check exit $? after $((SECONDS - start)) s"
grep '"section":"check"' "$OUT/int8_fp8_check.jsonl" | sed -E 's/.*"case":"([^"]*)".*"cos_sim":([^,]*).*"pass":([a-z]*).*/check \1 cos_sim \2 pass \3/'
grep '"section":"verdict"' "$OUT/int8_fp8_check.jsonl" || echo "no verdict line (see $OUT/int8_fp8_check.log)"

echo "== quattn bench"
timeout 35 "$BIN/quattn" bench --device cuda --precision int8,int8-block-pvfp8 --seqs 8192,16384 --head-dims 128 \
  --causal non-causal --warmup 3 --iters 20 --json > "$OUT/bench.jsonl" 2>> "$OUT/int8_fp8_check.log"
echo "bench exit $? after $((SECONDS - start)) s"

if (( SECONDS - start < 110 )) && command -v /usr/local/cuda/bin/compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck"
  timeout $((140 - (SECONDS - start))) /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 20 \
    "$BIN/quattn" run --device cuda --precision int8-block-pvfp8 --batch 1 --heads 2 --seq 300 --kv-seq 777 \
    --head-dim 128 --causal --iters 1 > "$OUT/memcheck.txt" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|accuracy" "$OUT/memcheck.txt"
fi
echo "total $((SECONDS - start)) s"
