#!/usr/bin/env bash
# Nsight Compute on the native decode at kv 8k and 32k (the split kernel and its merge).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc9
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for s in "8192 65536" "32768 262144"; do
  set -- $s
  timeout 150 $ncu --kernel-name regex:"decode" --launch-skip 6 --launch-count 4 --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    $b/quattn bench --device cuda --strategy auto --precision f16 --seqs $1 --tokens $2 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 3 --warmup 1 > $out/ncu_kv$1.txt 2>&1
  echo "rc $? kv $1"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Grid Size|Registers Per|Achieved Occupancy|Waves Per SM" $out/ncu_kv$1.txt | head -40
done
