#!/usr/bin/env bash
# (1) The portable FP8 mma kernel with per-block descales folded into the softmax: quattn run
# against f64 (CUDA, portable strategy) and two interleaved bench rounds against the portable
# f16 kernel and per-head FP8. (2) INT8 s8 wgmma, descriptors from bases at hd 128 (new3)
# against the previous build (old): int8_check kernel-only times.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${DEADLINE:-400} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
q=$bin/quattn_port
echo "== run vs f64"
for prec in fp8-e4m3-block fp8-e5m2-block fp8-e4m3-head; do
  for shape in "--batch 2 --heads 8 --kv-heads 2 --seq 777 --kv-seq 1500 --head-dim 128 --causal" "--batch 1 --heads 4 --seq 2048 --head-dim 64"; do
    timeout $(lim 40) "$q" run --device cuda --strategy portable --precision $prec $shape --json >> "$out/run_port.jsonl" 2>> "$out/run.log"
  done
done
grep -o '"kernel":"[^"]*"\|"pass":[a-z]*\|"rel_l2":[0-9.e-]*' "$out/run_port.jsonl" | paste - - - | head -8
for r in 1 2; do
  echo "== port bench $r"; timeout $(lim 110) "$q" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e4m3-block,fp8-e5m2-block --seqs 4096,16384 --head-dims 64,128 --causal both --iters 5 --warmup 2 --json >> "$out/bench_port.jsonl" 2>> "$out/run.log"; echo rc $?
done
for b in old new3; do
  echo "== int8_check $b"; timeout $(lim 88) "$bin/int8_$b" --bench-only --wgmma-only > "$out/int8_bench_$b.txt" 2>&1; echo rc $?
  grep -E "int8_block_d(64|128)_tma2" "$out/int8_bench_$b.txt" | cut -c1-160
done
python3 - "$out/bench_port.jsonl" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
best = collections.defaultdict(float)
for r in rows:
    s = r['shape']; key = (s['head_dim'], s['seq'], s['causal'])
    best[key + (r['precision'],)] = max(best[key + (r['precision'],)], r['tflops'] or 0)
for key in sorted({k[:3] for k in best}):
    f16 = best[key + ('f16',)]
    print(key, 'f16 %.1f' % f16, ' '.join('%s %.1f (%.3fx)' % (p, best[key + (p,)], best[key + (p,)] / f16) for p in ['fp8-e4m3-head', 'fp8-e4m3-block', 'fp8-e5m2-block'] if f16))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
