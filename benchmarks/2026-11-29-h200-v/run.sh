#!/usr/bin/env bash
# INT8 prepass: base (exact path inlined in every unrolled row) against new (hd 128: one rolled fixup loop over the rare rows; hd 64 unchanged), alternating; selftest int8-prepass (with the tie inputs) on new, memcheck of it, racecheck of quattn run per-thread smoothed, ncu of the per-thread quantize launch.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2 3; do for b in base new; do
  echo "== $b $r"; QUATTN_CACHE_DIR=/tmp/qc_$b timeout 60 "$bin/bench_$b" --json > "$out/bench_${b}_$r.jsonl" 2> "$out/bench_${b}_$r.err"; echo rc $?
done; done
python3 - "$out" <<'PY'
import json,sys,glob,collections
out=sys.argv[1]; best=collections.defaultdict(dict)
for f in sorted(glob.glob(out+'/bench_*_*.jsonl')):
    b=f.split('bench_')[1].split('_')[0]
    for l in open(f):
        d=json.loads(l); k=(d['shape'],d['prepass'])
        best[k][b]=min(best[k].get(b,1e9),d['us']); best[k]['min']=d['min_bytes']; best[k]['tz']=best[k].get('tz',True) and d['tickets_zero']
for k,v in best.items():
    m=v['min']/3e12*1e6
    print('%-26s %-20s base %7.1f new %7.1f  x%.3f  new/min %.3f tickets_zero %s'%(k[0],k[1],v['base'],v['new'],v['base']/v['new'],v['new']/m,v['tz']))
PY
export QUATTN_CACHE_DIR=/tmp/qc_new
echo "== selftest"; timeout 200 "$bin/quattn" selftest --only int8-prepass --json > "$out/selftest_int8_prepass.jsonl" 2> "$out/selftest.err"; echo rc $?
grep -c '"status":"pass"' "$out/selftest_int8_prepass.jsonl"; grep -c '"status":"fail"' "$out/selftest_int8_prepass.jsonl"; grep -c 'ties' "$out/selftest_int8_prepass.jsonl"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $SAN --tool memcheck "$bin/quattn" selftest --only int8-prepass --json > "$out/sanitizer_selftest_memcheck.txt" 2>&1; echo "selftest memcheck rc $?"; grep -E "ERROR SUMMARY" "$out/sanitizer_selftest_memcheck.txt"; grep -c '"status":"pass"' "$out/sanitizer_selftest_memcheck.txt"
for prec in int8-thread int8-block; do
  timeout 80 $SAN --tool racecheck "$bin/quattn" run --device cuda --precision $prec --batch 1 --heads 4 --kv-heads 2 --seq 300 --kv-seq 517 --head-dim 128 --iters 1 --no-check --json > "$out/sanitizer_${prec}_racecheck.txt" 2>&1; echo "$prec racecheck rc $?"; grep -E "RACECHECK SUMMARY" "$out/sanitizer_${prec}_racecheck.txt"
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for sk in 23 46; do
  timeout 100 $NCU --set full -k regex:'^int8_prepass$' --launch-skip $sk --launch-count 1 -o "$out/ncu_q$sk" "$bin/bench_new" > "$out/ncu_q$sk.log" 2>&1; echo ncu rc $?
  $NCU --import "$out/ncu_q$sk.ncu-rep" --page details > "$out/ncu_q$sk.txt" 2>&1
  $NCU --import "$out/ncu_q$sk.ncu-rep" --page source --csv --print-source sass > "$out/ncu_q${sk}_sass.csv" 2>&1; xz -T4 "$out/ncu_q${sk}_sass.csv"; rm -f "$out/ncu_q$sk.ncu-rep"
  grep -E "Duration|Executed Instructions  |Issue Slots Busy|Registers Per|Achieved Occ|DRAM Throughput" "$out/ncu_q$sk.txt" | head
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
