#!/usr/bin/env bash
# INT8 prepass: prev (one-launch form removed) against new (conflict-free mean layout, per-thread pair max before the row shuffles), alternating; selftest int8-prepass on new.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do for b in prev new; do
  echo "== $b $r"; QUATTN_CACHE_DIR=/tmp/qc_$b timeout 60 "$bin/bench_$b" --json > "$out/bench_${b}_$r.jsonl" 2> "$out/bench_${b}_$r.err"; echo rc $?
done; done
echo "== selftest"; QUATTN_CACHE_DIR=/tmp/qc_new timeout 200 "$bin/quattn" selftest --only int8-prepass --json > "$out/selftest_int8_prepass.jsonl" 2> "$out/selftest.err"; echo rc $?
grep -c '"status":"pass"' "$out/selftest_int8_prepass.jsonl"; grep -c '"status":"fail"' "$out/selftest_int8_prepass.jsonl"
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
    print('%-26s %-20s prev %7.1f new %7.1f  x%.3f  new/min %.3f tickets_zero %s'%(k[0],k[1],v['prev'],v['new'],v['prev']/v['new'],v['new']/m,v['tz']))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
