#!/usr/bin/env bash
# Row max and row sum of the wgmma kernels' softmax in four independent partials per row: the
# f16 and FP8 wgmma kernels before and after in one call (alternating binaries), every FP8 wgmma
# variant checked and timed, the CUDA selftest (14 shards) on the new binary.
#   benchmarks/2026-11-25-h100-f/run.sh OUT BIN   (BIN: quattn, quattn-before, wgmma_fp8_check,
#                                                  wgmma_fp8_check-before)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-570} ))
lim() { local l=$(( end - $(date +%s) - 15 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
step "fp8 variants: check (after)"
timeout $(lim 120) "$bin/wgmma_fp8_check" --check-only > "$out/fp8_check.txt" 2>&1; echo "rc $?"; tail -1 "$out/fp8_check.txt"
for b in before after before after; do
  sfx=""; [ $b = before ] && sfx="-before"
  step "fp8 variants bench ($b)"
  timeout $(lim 60) "$bin/wgmma_fp8_check$sfx" --bench-only >> "$out/fp8_bench_$b.txt" 2>&1; echo "rc $?"
  step "native f16 bench ($b)"
  timeout $(lim 45) "$bin/quattn$sfx" bench --device cuda --strategy native --precision f16 --seqs 4096,8192,16384 --head-dims 64,128 --causal both --iters 20 --json >> "$out/bench_f16_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
step "selftest cuda, 14 shards (after)"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 200) "$bin/quattn" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"fail"' "$out"/selftest_cuda.jsonl | head -10
step done
