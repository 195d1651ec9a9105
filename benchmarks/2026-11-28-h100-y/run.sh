#!/usr/bin/env bash
# The portable FP8 mma kernel with per-block descales at hd 64 on 8 x 1 warps, against the
# portable f16 kernel (two interleaved rounds).
# BIN holds quattn built at commit.txt.  Usage: run.sh OUT BIN
set -u
out=$1; b=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do
  timeout 100 $b/quattn bench --device cuda --strategy portable --precision f16,fp8-e4m3-block,fp8-e5m2-block \
    --seqs 4096,16384 --head-dims 64 --causal both --iters 5 --warmup 2 --json >> "$out/bench_block.jsonl" 2>> "$out/run.log"
  echo "round $r rc $?"
done
python3 - "$out/bench_block.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
best = collections.defaultdict(float)
for r in rows:
    s = r['shape']; key = (s['head_dim'], s['seq'], s['causal'])
    best[key + (r['precision'],)] = max(best[key + (r['precision'],)], r['tflops'] or 0)
for key in sorted({k[:3] for k in best}):
    f16 = best[key + ('f16',)]
    print(key, 'f16 %.1f' % f16, ' '.join('%s %.1f (%.3fx)' % (p, best[key + (p,)], best[key + (p,)] / f16) for p in ['fp8-e4m3-block', 'fp8-e5m2-block'] if f16))
PY
