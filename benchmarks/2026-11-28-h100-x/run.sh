#!/usr/bin/env bash
# The portable decode family on paged caches against the contiguous cache, with the block table
# copied to the device once per plan's tables (three interleaved rounds, kv 32k and 8k).
# BIN holds quattn built at commit.txt.  Usage: run.sh OUT BIN
set -u
out=$1; b=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for round in 1 2 3; do
  for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
    for v in "--precision f16" "--precision f16 --page-size 16" "--precision f16 --page-size 64" "--precision f16 --page-size 256"; do
      timeout 40 $b/quattn bench --device cuda --strategy portable $v $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> $out/bench_paged.jsonl 2>> $out/run.log
    done
  done
done
python3 - $out/bench_paged.jsonl <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], r["precision"], s.get("page_size") or 0)].append(r["ms"])
for k in sorted(t):
    base = min(t[(k[0], "f16", 0)])
    print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4), f"x contiguous f16 {min(t[k]) / base:.3f}")
PY
