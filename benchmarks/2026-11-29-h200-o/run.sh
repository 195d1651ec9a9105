#!/usr/bin/env bash
# INT8 s8 wgmma kernels with the s32 -> f32 score conversion as one I2FP.F32.S32 (new) against
# main (base: IADD of the bias and, with e4m3 P·V outside small score scales, one FADD more):
# alternating bench rounds, then int8_fp8_check (e4m3 P·V variants against f64 and the
# emulation, and their times) of both and int8_check (f16 P·V variants) of the new build.
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
    QUATTN_CACHE_DIR=/tmp/qc_$b timeout $(lim 80) "$bin/quattn_$b" bench --device cuda --precision int8,int8-block-pvfp8 --seqs 8192,16384 --head-dims 64,128 --causal both --iters 20 --warmup 3 --json | sed "s/^{/{\"build\":\"$b\",\"round\":$r,/" >> "$out/bench.jsonl" 2>> "$out/run.log"; echo rc $?
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
for b in base new; do
  echo "== int8_fp8_check $b"; QUATTN_CACHE_DIR=/tmp/qc_$b timeout $(lim 80) "$bin/i8f8_$b" > "$out/i8f8_$b.jsonl" 2> "$out/i8f8_$b.log"; echo rc $?; tail -3 "$out/i8f8_$b.log" | cut -c1-300
done
echo "== int8_check new"; QUATTN_CACHE_DIR=/tmp/qc_new timeout $(lim 100) "$bin/int8_new" --wgmma-only > "$out/int8_check_new.txt" 2>&1; echo rc $?; tail -5 "$out/int8_check_new.txt" | cut -c1-300
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
