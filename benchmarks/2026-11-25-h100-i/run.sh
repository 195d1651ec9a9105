#!/usr/bin/env bash
# The merged tree on the H100, one device call: the native FP8 plumbing (device quantization
# prepass, run_cuda on f16, run_cuda_fp8; benchmarks/gpu-checks/fp8plumb.sh), replays of the
# fuzz seeds whose strided INT8 cases failed at launch before INT8 plans checked strides, the
# whole CUDA selftest (14 shards), and the CUDA soak with a longer limit.
#   benchmarks/2026-11-25-h100-i/run.sh OUT BIN   (BIN: quattn, fp8_prepass_bench)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-575} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
mkdir -p .bin && ln -sfn "$bin" .bin/fp8plumb
step fp8plumb; OUT=$out/fp8plumb timeout $(lim 130) bash benchmarks/gpu-checks/fp8plumb.sh > "$out/fp8plumb.txt" 2>&1; echo "rc $?"; tail -30 "$out/fp8plumb.txt"
step "fuzz replays"
for s in 0x5eed0fa77e4710 0x58445c3665bc4b95 0x973bc7338ab073fa; do
  timeout $(lim 90) "$q" selftest --devices cuda --no-matrix --fuzz 100 --fuzz-seed $s --json > "$out/fuzz_$s.jsonl" 2> "$out/fuzz_$s.log" &
done
wait
for s in 0x5eed0fa77e4710 0x58445c3665bc4b95 0x973bc7338ab073fa; do echo "$s: $(grep -h '^selftest:' "$out/fuzz_$s.jsonl")"; grep -h '"status":"fail"' "$out/fuzz_$s.jsonl" | cut -c1-400 | head -4; grep -h "^fuzz on" "$out/fuzz_$s.log"; done
step "selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 150) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"status":"fail"' "$out/selftest_cuda.jsonl" | cut -c1-300 | head -8
l=$(lim 150); step "soak cuda ($l s)"
timeout "$l" "$q" soak --device cuda --calls 10000 --kernels 8 --max-work 4e6 --json > "$out/soak_cuda.jsonl" 2> "$out/soak.log"; echo "rc $?"
grep -h "^soak:" "$out/soak_cuda.jsonl"; tail -3 "$out/soak_cuda.jsonl" | cut -c1-400
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/i.tgz"
step done
