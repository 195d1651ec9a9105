#!/usr/bin/env bash
# The INT8 f16 P.V kernel at 16k: SM clock and power sampled every 20 ms while quattn bench times it end to end and then kernel only (iters 200 so that each phase lasts about 0.6 s), and the e4m3 P.V kernel the same way.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000 QUATTN_CACHE_DIR=/tmp/qc
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,power.limit --format=csv > "$out/gpu.csv" 2>&1
for prec in int8 int8-block-pvfp8; do
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$out/smi_$prec.csv" 2>&1 &
  smi=$!
  sleep 0.5
  date +%s.%N > "$out/t0_$prec.txt"
  timeout 120 "$bin/quattn" bench --device cuda --precision $prec --seqs 16384 --head-dims 128 --causal non-causal --iters 200 --warmup 10 --json > "$out/bench_$prec.jsonl" 2> "$out/bench_$prec.err"; echo "$prec rc $?"
  date +%s.%N > "$out/t1_$prec.txt"
  sleep 0.5; kill $smi
  grep -h tflops "$out/bench_$prec.jsonl" | cut -c1-250
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
