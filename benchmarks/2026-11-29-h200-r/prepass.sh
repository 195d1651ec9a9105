#!/usr/bin/env bash
# INT8 prepass: base (ee73ed2) against new (dcee66d) (two launches: stats entry at 4 CTAs per SM, quantize; FMNMX near test, LSE butterfly), alternating; selftest int8-prepass; sanitizer on quattn run with smoothing.
set -u
# bin holds bench_base, bench_new (int8_prepass_bench of two builds) and quattn.
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do
  for b in base new; do
    echo "== $b $r"; QUATTN_CACHE_DIR=/tmp/qc_$b timeout 100 "$bin/bench_$b" --json > "$out/bench_${b}_$r.jsonl" 2> "$out/bench_${b}_$r.err"; echo rc $?
  done
done
echo "== selftest"; QUATTN_CACHE_DIR=/tmp/qc_new timeout 200 "$bin/quattn" selftest --only int8-prepass --json > "$out/selftest_int8_prepass.jsonl" 2> "$out/selftest.err"; echo rc $?
tail -2 "$out/selftest.err" | cut -c1-200
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for prec in int8 int8-block-pvfp8; do for tool in memcheck racecheck; do
  QUATTN_CACHE_DIR=/tmp/qc_new timeout 80 $SAN --tool $tool "$bin/quattn" run --device cuda --precision $prec --batch 1 --heads 4 --kv-heads 2 --seq 300 --kv-seq 517 --head-dim 128 --iters 1 --no-check --json > "$out/sanitizer_${prec}_$tool.txt" 2>&1; echo "$prec $tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer_${prec}_$tool.txt"
done; done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
QUATTN_CACHE_DIR=/tmp/qc_new timeout 100 $NCU --section SpeedOfLight --section Occupancy --section LaunchStats -k regex:int8_prepass --launch-skip 23 --launch-count 2 "$bin/bench_new" > "$out/ncu_2l.txt" 2>&1; echo ncu rc $?
grep -E "int8_prepass|Duration|DRAM Throughput|Registers Per|Achieved Occ" "$out/ncu_2l.txt" | head -12
python3 - "$out" <<'PY'
import json,sys,glob,collections
out=sys.argv[1]; best=collections.defaultdict(dict); same=True
for f in sorted(glob.glob(out+'/bench_*_*.jsonl')):
    b=f.split('bench_')[1].split('_')[0]
    for l in open(f):
        try: d=json.loads(l)
        except: continue
        k=(d['shape'],d['prepass'],d['lag'])
        best[k][b]=min(best[k].get(b,1e9),d['us']); best[k]['min']=d['min_bytes']
        if b=='new' and not d['same_outputs']: same=False
for k,v in best.items():
    m=v['min']/3e12*1e6
    print('%-26s %-20s %-5s base %7.1f new %7.1f  x%.3f  new/min %.3f' % (k[0],k[1],k[2],v.get('base',0),v.get('new',0),v.get('base',1)/max(v.get('new',1e-9),1e-9), v.get('new',0)/m))
print('new same outputs everywhere:', same)
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
