#!/usr/bin/env bash
# The portable FP8 mma kernel with its stages decoded through the device's FP8 conversion,
# against the portable f16 kernel on compute-bound shapes (three interleaved rounds), and the
# FP8 portable tests on CUDA (prefill, decode, NaN codes in Q, K and V).
# BIN holds quattn and the fp8_portable test binary built at commit.txt.
# Usage: run.sh OUT BIN
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== fp8_portable on CUDA"
timeout 200 "$bin/fp8_portable" cuda_ --test-threads 1 > "$out/fp8_portable_cuda.txt" 2>&1; echo "rc $?"
grep -E "^test |test result" "$out/fp8_portable_cuda.txt"
echo "== compute-bound rounds"
for r in 1 2 3; do
  timeout 150 "$bin/quattn" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e5m2-block \
    --seqs 4096,16384 --head-dims 64,128 --causal both --iters 5 --warmup 2 --json >> "$out/bench_compute.jsonl" 2>> "$out/run.log"
  echo "round $r rc $?"
done
python3 - "$out/bench_compute.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
best = collections.defaultdict(float)
for r in rows:
    s = r['shape']; key = (s['head_dim'], s['seq'], s['causal'])
    best[key + (r['precision'],)] = max(best[key + (r['precision'],)], r['tflops'] or 0)
for key in sorted({k[:3] for k in best}):
    f16 = best[key + ('f16',)]
    print(key, 'f16 %.1f' % f16, ' '.join('%s %.1f (%.3fx)' % (p, best[key + (p,)], best[key + (p,)] / f16) for p in ['fp8-e4m3-head', 'fp8-e5m2-block'] if f16))
PY
