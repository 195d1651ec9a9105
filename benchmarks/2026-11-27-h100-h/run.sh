#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
# /tmp/q5: release quattn (cargo build --release -p quattn-demos --features peer-cubek)
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $R/gpu.csv 2>&1
q=/tmp/q5/quattn
: > $R/bench_decode.jsonl
for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
  timeout 100 $q bench --device cuda --strategy portable --precision f16,fp8-e4m3-head $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 20 --json >> $R/bench_decode.jsonl 2>> $R/bench.log; echo "rc $? cuda $shape"
done
: > $R/run_fp8.jsonl
for c in "--batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128 --precision fp8-e4m3-head" "--batch 2 --heads 16 --kv-heads 4 --seq 2 --kv-seq 3001 --head-dim 64 --precision fp8-e5m2-block --causal --layout bshd"; do
  timeout 30 $q run --device cuda --strategy portable $c --iters 2 --json >> $R/run_fp8.jsonl 2>> $R/run.log; echo "rc $? $c"
done
tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $R <<'PY'
import json,sys
R=sys.argv[1]
for l in open(R+'/bench_decode.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); s=r['shape']; print(r['kernel'], s['kv_seq'], r['ms'])
for l in open(R+'/run_fp8.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); print(r['kernel'], r['accuracy'].get('passed'), r['accuracy'].get('rel_l2'))
PY
