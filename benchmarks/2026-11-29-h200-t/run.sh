#!/usr/bin/env bash
# INT8 prepass with the one-launch form removed: bench (tickets), selftest int8-prepass, sanitizer on quattn run with smoothing, ncu of the quantize launch (per-block and per-thread smoothed).
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000 QUATTN_CACHE_DIR=/tmp/qc_new
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do echo "== bench $r"; timeout 60 "$bin/bench_new" --json > "$out/bench_$r.jsonl" 2> "$out/bench_$r.err"; echo rc $?; done
echo "== selftest"; timeout 200 "$bin/quattn" selftest --only int8-prepass --json > "$out/selftest_int8_prepass.jsonl" 2> "$out/selftest.err"; echo rc $?
grep -c '"status":"pass"' "$out/selftest_int8_prepass.jsonl"; grep -c '"status":"fail"' "$out/selftest_int8_prepass.jsonl"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for prec in int8 int8-block-pvfp8; do for tool in memcheck racecheck; do
  timeout 80 $SAN --tool $tool "$bin/quattn" run --device cuda --precision $prec --batch 1 --heads 4 --kv-heads 2 --seq 300 --kv-seq 517 --head-dim 128 --iters 1 --no-check --json > "$out/sanitizer_${prec}_$tool.txt" 2>&1; echo "$prec $tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer_${prec}_$tool.txt"
done; done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for sk in 23 46; do
  timeout 100 $NCU --set full -k regex:'^int8_prepass$' --launch-skip $sk --launch-count 1 -o "$out/ncu_q$sk" "$bin/bench_new" > "$out/ncu_q$sk.log" 2>&1; echo ncu rc $?
  $NCU --import "$out/ncu_q$sk.ncu-rep" --page details > "$out/ncu_q$sk.txt" 2>&1
  $NCU --import "$out/ncu_q$sk.ncu-rep" --page source --csv --print-source sass > "$out/ncu_q${sk}_sass.csv" 2>&1; xz -T4 "$out/ncu_q${sk}_sass.csv"
  grep -E "Duration|Executed Instructions  |Issue Slots Busy|Registers Per|Achieved Occ|DRAM Throughput" "$out/ncu_q$sk.txt" | head
done
python3 - "$out" <<'PY'
import json,sys,glob,collections
out=sys.argv[1]; best={}
for f in sorted(glob.glob(out+'/bench_*.jsonl')):
    for l in open(f):
        d=json.loads(l); k=(d['shape'],d['prepass']); best[k]=min(best.get(k,(1e9,0))[0],d['us']),d['min_bytes'],d['tickets_zero']
for k,(us,mb,tz) in best.items(): print('%-26s %-20s %7.1f us  x min %.3f  tickets_zero %s'%(k[0],k[1],us,us/(mb/3e12*1e6),tz))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
