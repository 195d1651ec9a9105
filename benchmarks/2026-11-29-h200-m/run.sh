#!/usr/bin/env bash
# mbarrier waits with a suspend-time hint (new) against main (base): alternating bench rounds of
# the wgmma families, torch peers in the same call, then the new build's FP8 selftest.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-420} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== torch"; timeout $(lim 90) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 8192,16384 --head-dims 64,128 --causal both > "$out/torch.jsonl" 2>> "$out/run.log"; echo rc $?
for r in 1 2; do
  for b in base new; do
    echo "== bench $b $r"; date +%T
    QUATTN_CACHE_DIR=/tmp/qc_$b timeout $(lim 100) "$bin/quattn_$b" bench --device cuda --precision f16,fp8-e4m3-head-pfp8,int8-block-pvfp8 --seqs 8192,16384 --head-dims 64,128 --causal both --iters 20 --warmup 3 --json | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$out/bench.jsonl" 2>> "$out/run.log"; echo rc $?
  done
done
echo "== selftest new fp8"; QUATTN_CACHE_DIR=/tmp/qc_new timeout $(lim 120) "$bin/quattn_new" selftest --devices cuda --only fp8 > "$out/selftest_fp8.txt" 2>&1; echo rc $?
tail -3 "$out/selftest_fp8.txt"
for b in base new; do
  echo "== ncu $b"; QUATTN_CACHE_DIR=/tmp/qc_$b timeout $(lim 60) /usr/local/cuda/bin/ncu --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed_pipe_xu.sum -k regex:fwd_fp8_wgmma --launch-count 1 "$bin/quattn_$b" bench --device cuda --precision fp8-e4m3-head-pfp8 --seqs 16384 --head-dims 128 --causal non-causal --iters 1 --warmup 0 > "$out/ncu_$b.txt" 2>&1; echo rc $?
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
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
