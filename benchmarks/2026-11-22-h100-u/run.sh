#!/usr/bin/env bash
# Run u: first run of the portable mma kernel (CubeCL manual MMA, register softmax)
# and of the TMA f16 wgmma kernel. selftest; f16 Auto (native) and portable (mma, cmma) against
# torch and cubek-attention in the same call; wgmma_check (f16 variants checked + timed); the
# mma tiling sweep (bench_cubecl cuda, each tiling checked first); SPIR-V cmma enqueue vs total
# host time per launch (the timestamps-vs-host-clock question of runs r and t).
# BIN: quattn (--features peer-cubek), wgmma_check (quattn-native --features cuda),
# bench_cubecl (`cargo build --release -p quattn-cubecl --features cuda,spirv --example bench_cuda`).
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
timeout 90 "$q" bench --device cuda --strategy portable --precision f16 --seqs 4096,16384 --head-dims 64,128 --causal both --iters 10 --peers --json >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $? (portable mma + peers)"
timeout 40 "$q" bench --device cuda --strategy portable --portable cmma --precision f16 --seqs 4096 --head-dims 64,128 --causal non-causal --iters 10 --json >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $? (portable cmma)"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,16384 --head-dims 64,128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
python3 benchmarks/table.py "$out/torch.jsonl" "$out/bench.jsonl" 2>&1 | tail -12
step wgmma_check; timeout 100 "$bin/wgmma_check" > "$out/wgmma_check.txt" 2>&1; echo "rc $?"; cat "$out/wgmma_check.txt" | cut -c1-250
step mma-sweep; timeout 100 "$bin/bench_cubecl" cuda --d 64,128 --filter mma_ --iters 10 > "$out/mma_sweep.txt" 2>&1; echo "rc $?"; grep -v "host:" "$out/mma_sweep.txt" | cut -c1-220
step spirv; for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
timeout 60 "$bin/bench_cubecl" wgpu --d 128 --filter cmma_bq64_bk32_w4 --iters 20 > "$out/spirv_enqueue.txt" 2>&1; echo "rc $?"; cat "$out/spirv_enqueue.txt" | cut -c1-220
step done
