#!/usr/bin/env bash
# The native decode merge with its state loads batched (new) against the one before (old):
# decode_check against f64 on the new build, then both builds' Auto decode alternating, kv 8k
# and 32k, three rounds. Usage: run.sh OUT BIN (BIN/new: quattn, decode_check; BIN/old: quattn).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc10
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
timeout 120 $b/new/decode_check --check-only > $out/checks.txt 2>&1; echo "rc $? decode_check"; grep -E "FAIL|ALL OK|SOME FAILED" $out/checks.txt | tail -3
: > $out/bench.jsonl
for round in 1 2 3; do
  for which in old new; do
    for s in "8192 65536" "32768 262144"; do
      set -- $s
      QUATTN_CACHE_DIR=/tmp/qc10$which timeout 40 $b/$which/quattn bench --device cuda --strategy auto --precision f16 --seqs $1 --tokens $2 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 50 --json | sed "s/^{/{\"build\": \"$which\", \"round\": $round, /" >> $out/bench.jsonl
    done
  done
done
python3 - $out <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for l in open(f"{out}/bench.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); t[(r["shape"]["kv_seq"], r["build"])].append(r["ms"])
for k in sorted(t):
    print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4))
PY
