#!/usr/bin/env bash
# ncu of the portable mma kernels: FP8 per head vs per block at hd 128 (seq 4k, non-causal),
# f16 vs FP8 per head at hd 64 causal (seq 4k).
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-400} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn_main
prof() {  # name precision head_dim causal
  timeout $(lim 90) ncu --set full --import-source no -k regex:fwd_mma --launch-count 1 -o "$out/$1" "$q" bench --device cuda --strategy portable --precision $2 --seqs 4096 --head-dims $3 --causal $4 --iters 1 --warmup 0 > "$out/$1.log" 2>&1; echo "$1 rc $?"
  ncu --import "$out/$1.ncu-rep" --page details > "$out/$1.details.txt" 2>&1
  ncu --import "$out/$1.ncu-rep" --page source --csv --print-source sass > "$out/$1.sass.csv" 2>&1
  xz -T4 "$out/$1.sass.csv"
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued|No Eligible|Theoretical Occ" "$out/$1.details.txt" | head -12
}
prof p128_head fp8-e4m3-head 128 non-causal
prof p128_block fp8-e4m3-block 128 non-causal
prof p64c_f16 f16 64 causal
prof p64c_fp8 fp8-e4m3-head 64 causal
rm -f "$out"/*.ncu-rep
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
