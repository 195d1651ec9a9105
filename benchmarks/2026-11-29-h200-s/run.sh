#!/usr/bin/env bash
# INT8 Q/K on the s8 wgmma kernels with the two-launch INT8 prepass: end to end and kernel only
# with torch SDPA in the same call (two bench rounds, best of two), INT8 against f16 in the same
# runs, and `quattn run` against f64 for the INT8 modes at hd 128 and 64.
set -u
out=$1; bin=$2; q=$bin/quattn; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-420} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== torch"; timeout $(lim 60) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 8192,16384 --head-dims 128 --causal non-causal > "$out/torch.jsonl" 2>> "$out/run.log"; echo rc $?
for r in 1 2; do
  echo "== int8 $r"; timeout $(lim 100) "$q" bench --device cuda --precision f16,int8,int8-thread,int8-block-nosmooth,int8-block-pvfp8 --seqs 8192,16384 --head-dims 128 --causal non-causal --warmup 3 --iters 20 --json >> "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo rc $?
done
for p in int8 int8-thread int8-block-pvfp8 int8-thread-pvfp8; do for d in 64 128; do
  timeout $(lim 30) "$q" run --device cuda --precision $p --head-dim $d --batch 2 --heads 8 --seq 2048 --json >> "$out/run.jsonl" 2>> "$out/run.log"; echo "run $p hd$d rc $?"
done; done
grep -c '"pass":true\|"status":"pass"' "$out/run.jsonl"
python3 - "$out" <<'PY'
import json,sys,collections
out=sys.argv[1]; best={}
for l in open(out+'/bench_int8.jsonl'):
    try: d=json.loads(l)
    except: continue
    k=(d.get('kernel'),d.get('precision'),d['shape']['seq'])
    t=d.get('tflops') or d.get('tflops_per_s') or 0
    best[k]=max(best.get(k,0),t)
for k,v in sorted(best.items(), key=lambda x:str(x)): print(k, round(v,1))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
