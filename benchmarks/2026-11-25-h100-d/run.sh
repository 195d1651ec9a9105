#!/usr/bin/env bash
# FP8 and the registry on the H100, in one device call: the native FP8 kernels at hd 128 next
# to the f16 wgmma kernel and torch SDPA (flash, cuDNN); the portable FP8 kernel against the
# portable f16 kernel on compute-bound shapes and on a decode shape (batch 8, 32 q heads over
# 8 KV heads, q_len 1, kv 32k, hd 128); the portable f16 rows of the before/after comparison
# again, alternating binaries; the selftest on CUDA and on Vulkan.
#   benchmarks/2026-11-25-h100-d/run.sh OUT BIN     (BIN holds quattn and quattn-before)
# Every step's limit is cut to what is left of DEADLINE seconds (default 570); the results are
# packed into OUT/d.tar.gz.
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-570} ))
lim() { local l=$(( end - $(date +%s) - 15 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step "native fp8 vs f16, hd 128"
timeout $(lim 90) "$q" bench --device cuda --precision f16,fp8-e4m3-head-pfp8,fp8-e4m3-pfp8 --seqs 4096,8192,16384 --head-dims 128 --causal both --iters 20 --json > "$out/bench_native.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch
timeout $(lim 60) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,8192,16384 --head-dims 128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step "selftest cuda"; timeout $(lim 250) "$q" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"
dec="--seqs 32768 --tokens 262144 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal"
step "decode: portable f16 vs fp8"
timeout $(lim 75) "$q" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head $dec --iters 10 --warmup 2 --json > "$out/bench_decode.jsonl" 2>> "$out/run.log"; echo "rc $?"
step "compute: portable f16 vs fp8"
timeout $(lim 60) "$q" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head --seqs 4096,16384 --head-dims 128 --causal non-causal --iters 5 --warmup 2 --json > "$out/bench_compute.jsonl" 2>> "$out/run.log"; echo "rc $?"
for b in before after before after; do
  qq=$bin/quattn; [ $b = before ] && qq=$bin/quattn-before
  step "portable d64 4k ($b)"; timeout $(lim 20) "$qq" bench --device cuda --strategy portable --precision f16 --seqs 4096 --head-dims 64 --causal non-causal --iters 20 --json >> "$out/bench_portable_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
step "selftest wgpu"; timeout $(lim 120) "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"
grep -h '"fail"' "$out"/selftest_*.jsonl | head -20
tar -czf "$out.tar.gz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tar.gz" "$out/d.tar.gz"
step done
