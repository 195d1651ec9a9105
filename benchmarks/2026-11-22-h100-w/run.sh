#!/usr/bin/env bash
# Run w: the final state of the session. selftest; f16 Auto (TMA wgmma) and the
# portable mma kernel (hd 128 now on 8 planes x 64 keys) over the grid, cubek-attention at #3's
# target shape, torch in the same call; Vulkan through WGSL and SPIR-V, both now timed by
# quattn bench on the host clock.
# BIN: quattn (--features peer-cubek), quattn-spirv (--features spirv).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step selftest; timeout 170 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest.jsonl" | head -5 | cut -c1-600
step bench
timeout 60 "$q" bench --device cuda --precision f16 --seqs 4096,16384 --head-dims 64,128 --causal both --json > "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $? (f16 auto)"
timeout 60 "$q" bench --device cuda --strategy portable --precision f16 --seqs 4096,16384 --head-dims 64,128 --causal both --iters 10 --json >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $? (portable mma)"
timeout 90 "$q" bench --device cuda --strategy portable --precision f16 --seqs 4096 --head-dims 128 --causal non-causal --iters 10 --peers --json 2>> "$out/run.log" | grep cubek >> "$out/bench.jsonl"; echo "rc $? (cubek)"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,16384 --head-dims 64,128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
python3 benchmarks/table.py "$out/torch.jsonl" "$out/bench.jsonl" 2>&1 | tail -12
step vulkan; for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
timeout 90 "$q" bench --device wgpu --precision f16 --seqs 4096 --head-dims 64,128 --causal non-causal --iters 10 --warmup 2 --json > "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? (wgsl)"
timeout 90 "$bin/quattn-spirv" bench --device wgpu-spirv --precision f16 --seqs 4096 --head-dims 64,128 --causal non-causal --iters 10 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? (spirv)"
cut -c1-300 "$out/bench_vulkan.jsonl"
step done
