#!/usr/bin/env bash
# The new native families on the H100, in one device call: INT8 Q·Kᵀ with e4m3 P·V
# (benchmarks/gpu-checks/int8fp8.sh), split-KV decode next to torch SDPA (decode.sh), the NVFP4 /
# MXFP4 quantization prepass (nvfp4.sh), then compute-sanitizer on the decode and FP8 families.
#   benchmarks/2026-11-25-h100-g/run.sh OUT BIN   (BIN: quattn, int8_fp8_check, decode_check,
#                                                  nvfp4_check, wgmma_fp8_check)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-575} ))
left() { echo $(( end - $(date +%s) )); }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
mkdir -p .bin && ln -sfn "$bin" .bin/int8fp8
[ -f benchmarks/gpu-checks/int8fp8.sh ] && step int8fp8 && OUT=$out/int8fp8 timeout 160 bash benchmarks/gpu-checks/int8fp8.sh > "$out/int8fp8.txt" 2>&1; echo "rc $?"; tail -5 "$out/int8fp8.txt"
step decode; BIN=$bin OUT=$out/decode DEADLINE=150 timeout 160 bash benchmarks/gpu-checks/decode.sh > "$out/decode.txt" 2>&1; echo "rc $?"; tail -12 "$out/decode.txt"
step nvfp4; BIN=$bin OUT=$out/nvfp4 DEADLINE=80 timeout 90 bash benchmarks/gpu-checks/nvfp4.sh > "$out/nvfp4.txt" 2>&1; echo "rc $?"; tail -5 "$out/nvfp4.txt"
l=$(left); step "sanitize ($l s left)"
[ "$l" -gt 40 ] && timeout $(( l - 15 )) bash benchmarks/gpu-checks/sanitize.sh "$out/sanitize" "$bin/quattn" decode:f16 fp8-wgmma:fp8-e4m3-head-pfp8 fp8-mma:fp8-e4m3-head int8-wgmma:int8-block-pvfp8 > "$out/sanitize.txt" 2>&1; echo "rc $?"; grep -c '^ok' "$out/sanitize.txt"; grep '^ERROR' "$out/sanitize.txt" | head
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/g.tgz"
step done
