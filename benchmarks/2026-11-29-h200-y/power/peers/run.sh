#!/usr/bin/env bash
# Sustained against short runs, the same call: torch SDPA cuDNN fp16 and quattn's FP8 and f16 wgmma kernels at seq 16k hd 128 non-causal, 20 then 300 calls each, nvidia-smi sampled every 20 ms.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000 QUATTN_CACHE_DIR=/tmp/qc
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,power.limit --format=csv > "$out/gpu.csv" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$out/smi.csv" 2>&1 &
smi=$!
sleep 0.5
mark() { echo "$(date +%H:%M:%S.%N) $*" >> "$out/marks.txt"; }
for it in 20 300; do
  mark start torch-cudnn $it
  timeout 120 python3 "$bin/torch_sdpa.py" --backends cudnn,flash --seqs 16384 --head-dims 128 --causal non-causal --warmup 5 --iters $it > "$out/torch_i$it.jsonl" 2> "$out/torch_i$it.err"
  mark end torch-cudnn $it; sleep 2
  for prec in fp8-e4m3-head-pfp8 f16; do
    mark start $prec $it
    timeout 120 "$bin/quattn" bench --device cuda --precision $prec --seqs 16384 --head-dims 128 --causal non-causal --iters $it --warmup 5 --json > "$out/bench_${prec}_i$it.jsonl" 2> "$out/bench_${prec}_i$it.err"
    mark end $prec $it; sleep 2
  done
done
sleep 0.5; kill $smi
python3 - "$out" <<'PY'
import json,glob,sys,os
out=sys.argv[1]
for f in sorted(glob.glob(out+'/*.jsonl')):
    for l in open(f):
        if l.startswith('{'):
            d=json.loads(l)
            if d.get('tflops'): print(os.path.basename(f), d.get('kernel'), round(d['tflops'],1))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
