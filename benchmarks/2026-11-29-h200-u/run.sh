#!/usr/bin/env bash
# The whole quick CUDA selftest (14 parallel shards) and 300 fuzz cases per seed on CUDA, on the
# build with the two-launch INT8 prepass.
set -u
out=$1; bin=$2; q=$bin/quattn; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-420} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 200) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"status":"fail"' "$out/selftest_cuda.jsonl" | cut -c1-300 | head -8
grep -h "passed" "$out/selftest_cuda.log" | head -20
echo "== fuzz cuda"
timeout $(lim 150) "$q" selftest --devices cuda --no-matrix --fuzz 300 --json > "$out/fuzz.jsonl" 2> "$out/fuzz.log"; echo "rc $?"
grep -h '^selftest' "$out/fuzz.jsonl" "$out/fuzz.log"; grep -h "^fuzz on" "$out/fuzz.log"; grep -h '"status":"fail"' "$out/fuzz.jsonl" | cut -c1-400 | head -4
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
