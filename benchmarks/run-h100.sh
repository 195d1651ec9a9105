#!/usr/bin/env bash
# The measurements behind BENCHMARKS.md and ACCURACY.md, in one go on a CUDA machine with
# python3 + torch: correctness matrix, our kernels, and the peers (torch SDPA backends,
# cubek-attention) on the same device in the same run.
#
#   benchmarks/run-h100.sh OUT_DIR [BIN_DIR]
#
# BIN_DIR holds `quattn` built with `cargo build --release -p quattn-demos --features peer-cubek`
# (default: target/release). For Vulkan, the loader must be installed (on the lent GPU machine:
# unpack the libvulkan1 deb, see the device README) and VK_DRIVER_FILES point at the NVIDIA ICD.
set -u
out=${1:?usage: run-h100.sh OUT_DIR [BIN_DIR]}
bin=${2:-target/release}
q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }

# Seven files: the GPU, one log of everything printed to stderr, five JSON-lines results.
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step selftest;  timeout 200 "$q" selftest --devices cuda,wgpu --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"
step native;    timeout 200 "$q" bench --device cuda --precision f16,f16-acc16,f16-2stage,bf16 --json > "$out/bench_native.jsonl" 2>> "$out/run.log"; echo "rc $?"
step portable;  timeout 150 "$q" bench --device cuda --strategy portable --precision f16 --iters 10 --peers --json > "$out/bench_portable.jsonl" 2>> "$out/run.log"; echo "rc $?"
step wgpu;      timeout 120 "$q" bench --device wgpu --precision f16 --seqs 1024,4096 --iters 10 --warmup 2 --json > "$out/bench_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch;     timeout 120 python3 demos/peers/torch_sdpa.py --backends flash,cudnn > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step accuracy;  timeout 60 python3 demos/peers/torch_sdpa.py --accuracy --batch 1 --heads 4 --seq 1024 --head-dim 128 > "$out/torch_acc.jsonl" 2>> "$out/run.log"; echo "rc $?"
step done
