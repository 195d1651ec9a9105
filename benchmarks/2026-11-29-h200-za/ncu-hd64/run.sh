#!/usr/bin/env bash
# Nsight Compute on the FP8 wgmma table kernel at hd 64, seq 16k, 32 heads (width 2048), causal and non-causal: where the causal kernel's time goes.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-400} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
q=$bin/quattn
ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$q" run --device cuda --precision fp8-e4m3-head-pfp8 --batch 1 --heads 32 --seq 2048 --head-dim 64 --iters 1 --no-check --json > /dev/null 2>&1
for c in causal non-causal; do
  flag=""; [ "$c" = causal ] && flag="--causal"
  timeout $(lim 150) "$ncu_bin" --kernel-name regex:fwd_wgmma_fp8 --launch-skip 1 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --print-details all \
    "$q" run --device cuda --precision fp8-e4m3-head-pfp8 --batch 1 --heads 32 --seq 16384 --head-dim 64 $flag --iters 2 --no-check --json > "$out/ncu_$c.txt" 2>&1
  echo "$c rc $?"
  grep -E "Duration|Executed Instructions |Issue Slots Busy|Compute \(SM\) Throughput|No Eligible|Active Warps Per|Eligible Warps|Issued Warp|Stall|Warp Cycles Per Issued" "$out/ncu_$c.txt" | head -24
done
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
