#!/usr/bin/env bash
# FP8 e4m3 (wgmma, hd 128 and 64, seq 16k) and f16 (wgmma, hd 128): SM clock and power sampled every 20 ms while quattn bench times each with 20 and then 300 iterations.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000 QUATTN_CACHE_DIR=/tmp/qc
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,power.limit --format=csv > "$out/gpu.csv" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$out/smi.csv" 2>&1 &
smi=$!
sleep 0.5
for it in 20 300; do
  for spec in "fp8-e4m3-head-pfp8 128" "fp8-e4m3-head-pfp8 64" "f16 128"; do
    set -- $spec
    echo "$(date +%H:%M:%S.%N) start $1 hd$2 iters $it" >> "$out/marks.txt"
    timeout 120 "$bin/quattn" bench --device cuda --precision $1 --seqs 16384 --head-dims $2 --causal non-causal --iters $it --warmup 5 --json > "$out/bench_$1_d$2_i$it.jsonl" 2> "$out/bench_$1_d$2_i$it.err"
    echo "$(date +%H:%M:%S.%N) end $1 hd$2 iters $it rc $?" >> "$out/marks.txt"
    grep -h tflops "$out/bench_$1_d$2_i$it.jsonl" | python3 -c "import sys,json; [print('$1 hd$2 iters $it', json.loads(l)['kernel'], round(json.loads(l)['tflops'],1)) for l in sys.stdin if l.startswith('{')]"
    sleep 2
  done
done
sleep 0.5; kill $smi
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
