#!/usr/bin/env bash
# The kernel registry and device-tensor API on the H100: the selftest on CUDA and Vulkan
# (every registry family forced, device-tensor cases), the CUDA device-tensor example, the
# device-tensor path's host cost at a decode shape.
#   benchmarks/2026-11-24-h100-b/run.sh OUT BIN     (BIN: quattn, cuda_tensors)
# The results are packed into OUT/b.tar.gz (one file to bring back).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step cuda_tensors; timeout 60 "$bin/cuda_tensors" 2>&1 | tee "$out/cuda_tensors.txt"; echo "rc ${PIPESTATUS[0]}"
step api-overhead; timeout 60 "$bin/quattn" bench --api-overhead --iters 20 > "$out/api_overhead.json" 2>> "$out/run.log"; echo "rc $?"; cat "$out/api_overhead.json"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step selftest-wgpu; timeout 150 "$bin/quattn" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"
step selftest-cuda; timeout 330 "$bin/quattn" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"
grep '"fail"' "$out"/selftest_*.jsonl | head -5 | cut -c1-600
tar -czf "$out.tar.gz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tar.gz" "$out/b.tar.gz"
step done
