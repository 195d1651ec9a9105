#!/usr/bin/env bash
# Producer-only suspend-time hint on the empty-stage waits (new) against main (base): alternating
# bench rounds of the wgmma families; then Nsight Compute (full set) of the FP8 and the INT8+FP8
# kernels of main at hd 128, seq 16k.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-420} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do
  for b in base new; do
    echo "== bench $b $r"; date +%T
    QUATTN_CACHE_DIR=/tmp/qc_$b timeout $(lim 100) "$bin/quattn_$b" bench --device cuda --precision f16,fp8-e4m3-head-pfp8,int8-block-pvfp8 --seqs 8192,16384 --head-dims 64,128 --causal both --iters 20 --warmup 3 --json | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$out/bench.jsonl" 2>> "$out/run.log"; echo rc $?
  done
done
python3 - "$out/bench.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
best = collections.defaultdict(float)
for r in rows:
    s = r['shape']; k = (s['head_dim'], s['seq'], s['causal'], r.get('kernel',''), r['precision'], r['build'])
    best[k] = max(best[k], r['tflops'] or 0)
for k in sorted({k[:5] for k in best}):
    b, n = best[k + ('base',)], best[k + ('new',)]
    print(k, 'base %.1f new %.1f  %.3fx' % (b, n, n / b if b else 0))
PY
for p in fp8-e4m3-head-pfp8 int8-block-pvfp8; do
  echo "== ncu $p"; QUATTN_CACHE_DIR=/tmp/qc_base timeout $(lim 120) /usr/local/cuda/bin/ncu --set full -k regex:'fwd_wgmma_(fp8|int8)' --launch-count 1 -o /tmp/ncu_$p "$bin/quattn_base" bench --device cuda --precision $p --seqs 16384 --head-dims 128 --causal non-causal --iters 1 --warmup 0 > "$out/ncu_$p.log" 2>&1; echo rc $?
  /usr/local/cuda/bin/ncu -i /tmp/ncu_$p.ncu-rep --page details > "$out/ncu_${p}_details.txt" 2>&1
  /usr/local/cuda/bin/ncu -i /tmp/ncu_$p.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz -6 > "$out/ncu_${p}_sass.csv.xz"
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
