#!/usr/bin/env bash
# INT8 kernel-only timing: the previous build (a wait after every timed call) against this one (calls queued, one wait at the end), alternating, two rounds; then the whole quick CUDA selftest (14 shards) and 300 fuzz cases per seed on this build.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-560} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do for b in old new; do
  q=$bin/quattn; [ $b = old ] && q=$bin/quattn_old
  echo "== bench $b $r"; QUATTN_CACHE_DIR=/tmp/qc_$b timeout $(lim 60) "$q" bench --device cuda --precision int8,int8-thread,int8-block-pvfp8 --seqs 8192,16384 --head-dims 128 --causal non-causal --iters 20 --json > "$out/bench_${b}_$r.jsonl" 2> "$out/bench_${b}_$r.err"; echo rc $?
done; done
python3 - "$out" <<'PY'
import json,sys,glob,collections
out=sys.argv[1]; t=collections.defaultdict(list)
for f in sorted(glob.glob(out+'/bench_*_*.jsonl')):
    b=f.split('bench_')[1].split('_')[0]
    for l in open(f):
        if not l.startswith('{'): continue
        d=json.loads(l)
        if d.get('tflops') is None: continue
        t[(d['precision'],d['shape']['seq'],d['kernel'])].append((b,round(d['tflops'],1)))
for k,v in sorted(t.items()): print(k, v)
PY
q=$bin/quattn; export QUATTN_CACHE_DIR=/tmp/qcache
echo "== selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 200) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"status":"fail"' "$out/selftest_cuda.jsonl" | cut -c1-300 | head -8
echo "== fuzz cuda"
timeout $(lim 150) "$q" selftest --devices cuda --no-matrix --fuzz 300 --json > "$out/fuzz.jsonl" 2> "$out/fuzz.log"; echo "rc $?"
grep -h '^selftest' "$out/fuzz.jsonl" "$out/fuzz.log"; grep -h "^fuzz on" "$out/fuzz.log"; grep -h '"status":"fail"' "$out/fuzz.jsonl" | cut -c1-400 | head -4
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
