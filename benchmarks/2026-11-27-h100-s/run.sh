#!/usr/bin/env bash
# Prepass (Markstein quotient, one-read pass), FP8 decode tests on CUDA, portable paged decode
# (table prefetch) three rounds, FP8 vs f16 portable decode three rounds. Usage: run.sh OUT BIN
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc15 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
cp $b/commit.txt $out/
end=$(( $(date +%s) + 570 ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "prepass"
OUT=$out/prepass BIN=$b/prepass DEADLINE=200 bash benchmarks/gpu-checks/prepass.sh > $out/prepass.log 2>&1; echo "rc $?"
cat $out/prepass/summary.txt; grep "PerHead" $out/prepass/fp8_prepass.txt | grep "onepass\|L2/2" | head -20

step "fp8_portable cuda tests"
timeout $(lim 90) $b/fp8_portable cuda_ --test-threads 1 > $out/fp8_portable_cuda.txt 2>&1; echo "rc $?"; grep -E "test result|panicked" $out/fp8_portable_cuda.txt | head -5

step "portable decode: paged (prefetch) and fp8 vs f16, three rounds"
: > $out/bench.jsonl
for round in 1 2 3; do
  for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
    for v in "--precision f16" "--precision f16 --page-size 16" "--precision f16 --page-size 64" "--precision f16 --page-size 256" "--precision fp8-e4m3-head"; do
      timeout $(lim 30) $b/quattn bench --device cuda --strategy portable $v $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> $out/bench.jsonl 2>> $out/run.log
    done
  done
done
python3 - $out/bench.jsonl <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], r["precision"], s.get("page_size") or 0)].append(r["ms"])
for k in sorted(t):
    base = min(t[(k[0], "f16", 0)])
    print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4), f"x contiguous f16 {min(t[k]) / base:.3f}")
PY
step done
tar -C $out -czf $out/../r15.tgz . && rm -rf $out
