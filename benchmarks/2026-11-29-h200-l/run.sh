#!/usr/bin/env bash
# Portable FP8 mma kernel with the rare non-finite path at head dim 64 (constant descales) only
# (gate) against main: alternating bench rounds.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-420} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do
  for b in main gate; do
    echo "== bench hd64 $b $r"
    timeout $(lim 70) "$bin/quattn_$b" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e4m3-block --seqs 4096,16384 --head-dims 64 --causal both --iters 5 --warmup 2 --json | sed "s/^{/{\"build\":\"$b\",/" >> "$out/bench_port.jsonl" 2>> "$out/run.log"; echo rc $?
  done
done
for b in main gate; do
  echo "== bench hd128 $b"
  timeout $(lim 70) "$bin/quattn_$b" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e4m3-block --seqs 4096 --head-dims 128 --causal both --iters 5 --warmup 2 --json | sed "s/^{/{\"build\":\"$b\",/" >> "$out/bench_port.jsonl" 2>> "$out/run.log"; echo rc $?
done
python3 - "$out/bench_port.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
best = collections.defaultdict(float)
for r in rows:
    s = r['shape']; key = (s['head_dim'], s['seq'], s['causal'])
    k = key + (r['build'], r['precision'])
    best[k] = max(best[k], r['tflops'] or 0)
for key in sorted({k[:3] for k in best}):
    for b in ['main', 'gate']:
        f16 = best[key + (b, 'f16')]
        if f16: print(key, b, 'f16 %.1f' % f16, ' '.join('%s %.1f (%.3fx)' % (p, best[key + (b, p)], best[key + (b, p)] / f16) for p in ['fp8-e4m3-head', 'fp8-e4m3-block']))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
