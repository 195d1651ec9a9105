#!/usr/bin/env bash
# FP8 on the H100, in one device call: `quattn run --precision fp8` with Auto on CUDA and on
# Vulkan (WGSL), the portable FP8 kernel against the portable f16 kernel on compute-bound
# shapes and on a decode shape (batch 8, 32 q heads over 8 KV heads, q_len 1, kv 32k, hd 128),
# the native FP8 wgmma kernel next to the f16 one and torch SDPA, and the selftest on CUDA and
# Vulkan (every family of the registry, FP8 included).
#   benchmarks/2026-11-25-h100-c/run.sh OUT BIN     (BIN holds quattn)
# Every step's limit is cut to what is left of DEADLINE seconds (default 540); the results are
# packed into OUT/c.tar.gz.
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-540} ))
lim() { local l=$(( end - $(date +%s) - 15 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
git log -1 --format=%H > "$out/commit.txt" 2>/dev/null || true
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
for d in cuda wgpu; do
  for p in fp8 fp8-e4m3-head fp8-e5m2-block; do
    step "run $d $p"; timeout $(lim 60) "$q" run --device $d --precision $p --batch 2 --heads 8 --kv-heads 2 --seq 1000 --head-dim 128 --causal > "$out/run_${d}_$p.txt" 2>&1; echo "rc $?"; tail -3 "$out/run_${d}_$p.txt"
  done
done
dec="--seqs 32768 --tokens 262144 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal"
step "decode: portable f16 vs fp8"
timeout $(lim 90) "$q" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head,fp8-e4m3 $dec --iters 20 --json > "$out/bench_decode.jsonl" 2>> "$out/run.log"; echo "rc $?"
step "compute: portable f16 vs fp8"
timeout $(lim 120) "$q" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head --seqs 4096,16384 --head-dims 64,128 --causal both --iters 10 --json > "$out/bench_compute.jsonl" 2>> "$out/run.log"; echo "rc $?"
step "native fp8 vs f16"
timeout $(lim 120) "$q" bench --device cuda --precision f16,fp8-e4m3-head-pfp8,fp8-e4m3-pfp8,fp8-e4m3-head --seqs 4096,8192,16384 --head-dims 64,128 --causal both --iters 20 --json > "$out/bench_native.jsonl" 2>> "$out/run.log"; echo "rc $?"
step "vulkan: portable f16 vs fp8"
timeout $(lim 60) "$q" bench --device wgpu --precision f16,fp8-e4m3-head --seqs 4096 --head-dims 128 --causal non-causal --iters 5 --warmup 2 --json > "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch
timeout $(lim 60) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,8192,16384 --head-dims 128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
for d in cuda wgpu; do
  step "selftest $d"; timeout $(lim 150) "$q" selftest --devices $d --quick --json > "$out/selftest_$d.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_$d.jsonl"
done
grep -h '"fail"' "$out"/selftest_*.jsonl | head -20
tar -czf "$out.tar.gz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tar.gz" "$out/c.tar.gz"
step done
