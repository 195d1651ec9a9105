#!/usr/bin/env bash
# FP8 wgmma: a cubic exp2 on the FMA pipes for every 2nd, 4th or 8th score (_p2c, _p4c, _p8c) against the table variants: check (f64, emulation, Vᵀ), interleaved bench, second bench round.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000 QUATTN_CACHE_DIR=/tmp/qc_fp8
end=$(( $(date +%s) + ${DEADLINE:-500} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
export QUATTN_FP8_CHECK_ONLY=_p2c,_p4c,_p8c
echo "== fp8 check"; timeout $(lim 200) "$bin/wgmma_fp8_check" > "$out/fp8_check.txt" 2>&1; echo rc $?
grep -E "FAIL|ALL|SOME|regs" "$out/fp8_check.txt" | head -30
echo "== bench round 2"; timeout $(lim 150) "$bin/wgmma_fp8_check" --bench-only > "$out/fp8_bench2.txt" 2>&1; echo rc $?
grep -E "^d(64|128) s" "$out/fp8_check.txt" | cut -c1-250
echo "-- round 2"; grep -E "^d(64|128) s" "$out/fp8_bench2.txt" | cut -c1-250
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
