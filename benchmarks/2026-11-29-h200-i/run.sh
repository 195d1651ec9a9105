#!/usr/bin/env bash
# Portable FP8: CUDA tests against the emulation, per-block descale prefetch (pf) against main,
# and an ncu look at hd 64 causal (f16 vs FP8 per head).
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-540} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== cuda tests"
timeout $(lim 120) "$bin/fp8_portable" cuda_ --test-threads 1 > "$out/fp8_portable_cuda.txt" 2>&1; echo rc $?
tail -15 "$out/fp8_portable_cuda.txt"
for r in 1 2; do
  for b in main pf; do
    echo "== bench $b $r"
    timeout $(lim 60) "$bin/quattn_$b" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e4m3-block --seqs 4096,16384 --head-dims 128 --causal both --iters 5 --warmup 2 --json | sed "s/^{/{\"build\":\"$b\",/" >> "$out/bench_port.jsonl" 2>> "$out/run.log"; echo rc $?
  done
done
echo "== hd64 causal"
for b in main pf; do
  timeout $(lim 40) "$bin/quattn_$b" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e4m3-block --seqs 4096,16384 --head-dims 64 --causal both --iters 5 --warmup 2 --json | sed "s/^{/{\"build\":\"$b\",/" >> "$out/bench_port.jsonl" 2>> "$out/run.log"; echo rc $?
done
echo "== ncu"
for prec in f16 fp8-e4m3-head; do
  timeout $(lim 60) ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats -k regex:mma --launch-count 2 "$bin/quattn_main" bench --device cuda --strategy portable --precision $prec --seqs 4096 --head-dims 64 --causal true --iters 1 --warmup 0 > "$out/ncu_$prec.txt" 2>&1; echo rc $?
  grep -c "Section" "$out/ncu_$prec.txt"
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
    for b in ['main', 'pf']:
        f16 = best[key + (b, 'f16')]
        if f16: print(key, b, 'f16 %.1f' % f16, ' '.join('%s %.1f (%.3fx)' % (p, best[key + (b, p)], best[key + (b, p)] / f16) for p in ['fp8-e4m3-head', 'fp8-e4m3-block']))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
