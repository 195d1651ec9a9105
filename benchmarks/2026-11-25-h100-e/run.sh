#!/usr/bin/env bash
# The selftest on the H100 through CUDA (the quick matrix in 14 parallel shards) and Vulkan, the
# FP8 wgmma variants timed side by side, and an Nsight Compute profile of the FP8 wgmma table
# kernel at hd 128, seq 16k, non-causal.
#   benchmarks/2026-11-25-h100-e/run.sh OUT BIN     (BIN holds quattn and wgmma_fp8_check)
# Every step's limit is cut to what is left of DEADLINE seconds (default 570).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-570} ))
lim() { local l=$(( end - $(date +%s) - 15 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step "selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 330) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/selftest_cuda_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/selftest_cuda_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/selftest_cuda_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl") skip $(grep -c '"status":"skip"' "$out/selftest_cuda.jsonl")"
step "selftest wgpu (Vulkan)"
timeout $(lim 120) "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"
step "fp8 wgmma variants"
timeout $(lim 90) "$bin/wgmma_fp8_check" --bench-only > "$out/fp8_variants.txt" 2>&1; echo "rc $?"
step "ncu fp8 wgmma 16k"
timeout $(lim 120) /usr/local/cuda/bin/ncu --kernel-name fwd_wgmma_fp8 --launch-skip 2 --launch-count 1 --set full --import-source no \
  -o "$out/fp8_16k" "$q" run --device cuda --precision fp8-e4m3-pfp8 --batch 1 --heads 16 --seq 16384 --head-dim 128 --iters 3 --no-check > "$out/ncu.log" 2>&1; echo "rc $?"
if [ -f "$out/fp8_16k.ncu-rep" ]; then
  /usr/local/cuda/bin/ncu --import "$out/fp8_16k.ncu-rep" --page details > "$out/ncu_details.txt" 2>&1
  timeout $(lim 60) /usr/local/cuda/bin/ncu --import "$out/fp8_16k.ncu-rep" --page source --print-source sass --csv > "$out/ncu_sass.csv" 2>&1
  xz -9 "$out/ncu_sass.csv"; rm -f "$out/fp8_16k.ncu-rep"
fi
grep -h '"fail"' "$out"/selftest_*.jsonl | head -20
step done
