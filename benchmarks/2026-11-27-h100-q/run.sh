#!/usr/bin/env bash
# The portable decode family on the contiguous cache and on pages of 16/64/256 keys, three rounds
# interleaved (kv 32k and 8k, CUDA), to separate the paged cost from call-to-call spread.
# Usage: run.sh OUT BIN (BIN: quattn).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc13
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
: > $out/bench.jsonl
for round in 1 2 3; do
  for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
    for pages in "" "--page-size 16" "--page-size 64" "--page-size 256"; do
      timeout 30 $b/quattn bench --device cuda --strategy portable --precision f16 $shape $pages --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> $out/bench.jsonl 2>> $out/run.log
    done
  done
done
python3 - $out <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1] + "/bench.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], s.get("page_size") or 0)].append(r["ms"])
for k in sorted(t):
    base = min(t[(k[0], 0)])
    print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4), f"{(min(t[k]) / base - 1) * 100:+.1f}%")
PY
