#!/usr/bin/env bash
# INT8 against f16 in one run: the f16 wgmma kernel, INT8 Q/K with f16 P·V and with e4m3 P·V
# (end to end and kernel only), hd 128, seq 8k; two rounds, best of two.
set -u
out=$1; bin=$2; q=$bin/quattn; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
for r in 1 2; do
  echo "== bench $r"; timeout 80 "$q" bench --device cuda --precision f16,int8,int8-block-pvfp8 --seqs 8192 --head-dims 128 --causal non-causal --warmup 3 --iters 20 --json >> "$out/bench.jsonl" 2>> "$out/run.log"; echo rc $?
done
cut -c1-260 "$out/bench.jsonl"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
