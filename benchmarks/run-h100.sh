#!/usr/bin/env bash
# The measurements behind BENCHMARKS.md and ACCURACY.md, in one go on a CUDA machine with
# python3 + torch: correctness matrix, our kernels, and the peers (torch SDPA backends,
# cubek-attention) on the same device in the same run.
#
#   benchmarks/run-h100.sh OUT_DIR [BIN_DIR]
#
# BIN_DIR holds `quattn` built with `cargo build --release -p quattn-demos --features peer-cubek`
# and the `hmma_check` / `int8_check` / `wgmma_check` examples of quattn-native (default:
# target/release); for the wgpu-spirv step (not in the default STEPS) also `quattn-spirv`, built
# with `--features spirv`. For Vulkan, the loader must be installed (on the lent GPU machine:
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

# Files: the GPU, one log of everything printed to stderr, JSON-lines results per step.
# STEPS selects steps (default: all, in this order); a device call is limited to 10 minutes, so
# the full set runs as two calls, e.g. STEPS="checks selftest int8 torch" then
# STEPS="native portable wgpu torch accuracy" (torch in both: ratios are taken within a call).
steps=${STEPS:-"checks selftest native int8 portable wgpu torch accuracy sanitize"}
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
if has checks; then
  step checks; timeout 100 "$bin/hmma_check" --check-only > "$out/checks.txt" 2>&1; echo "rc $?"
  timeout 100 "$bin/int8_check" --check-only >> "$out/checks.txt" 2>&1; echo "rc $?"
  timeout 100 "$bin/wgmma_check" --check-only >> "$out/checks.txt" 2>&1; echo "rc $?"; grep -E "ALL|FAIL" "$out/checks.txt"
fi
if has selftest; then
  step selftest;  timeout 330 "$q" selftest --devices cuda,wgpu --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"
fi
if has native; then
  # Auto: wgmma for f16 (sm_90a), HMMA for the other modes; then the HMMA f16 kernel forced.
  step native;    timeout 200 "$q" bench --device cuda --precision f16,f16-acc16,f16-2stage,bf16 --json > "$out/bench_native.jsonl" 2>> "$out/run.log"; echo "rc $?"
  timeout 120 "$q" bench --device cuda --strategy native --native hmma --precision f16 --json >> "$out/bench_native.jsonl" 2>> "$out/run.log"; echo "rc $?"
fi
if has int8; then
  # End to end (CubeCL prepass + native kernel) and kernel-only rows; seq 8k and 16k are the
  # INT8 target shapes.
  step int8;      timeout 200 "$q" bench --device cuda --precision int8,int8-warp,int8-thread,int8-block-nosmooth --seqs 4096,8192,16384 --causal non-causal --json > "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo "rc $?"
  timeout 100 "$q" bench --device cuda --strategy portable --precision int8 --seqs 4096 --head-dims 128 --causal non-causal --iters 5 --json >> "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo "rc $?"
fi
if has portable; then
  step portable;  timeout 150 "$q" bench --device cuda --strategy portable --precision f16 --iters 10 --peers --json > "$out/bench_portable.jsonl" 2>> "$out/run.log"; echo "rc $?"
fi
if has wgpu; then
  step wgpu;      timeout 120 "$q" bench --device wgpu --precision f16 --seqs 1024,4096 --iters 10 --warmup 2 --json > "$out/bench_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"
fi
if has wgpu-spirv; then
  # The same Vulkan adapter through CubeCL's SPIR-V compiler: a second binary, built with
  # `cargo build --release -p quattn-demos --features spirv` and copied to $bin/quattn-spirv
  # (CubeCL picks the compiler per build). spirv.log has the driver's cooperative-matrix shapes
  # and why a plan took or left the cmma kernel.
  qs=$bin/quattn-spirv
  step wgpu-spirv
  RUST_LOG=cubecl_wgpu::backend::vulkan=debug,quattn=debug timeout 60 "$qs" run --device wgpu-spirv --precision f16 --head-dim 128 --seq 1024 --causal --json > "$out/run_wgpu_spirv.jsonl" 2>> "$out/spirv.log"; echo "rc $?"
  timeout 60 "$qs" run --device wgpu-spirv --precision f16 --head-dim 64 --seq 1024 --json >> "$out/run_wgpu_spirv.jsonl" 2>> "$out/spirv.log"; echo "rc $?"
  timeout 150 "$qs" bench --device wgpu-spirv --precision f16 --seqs 1024,4096 --iters 10 --warmup 2 --json > "$out/bench_wgpu_spirv.jsonl" 2>> "$out/spirv.log"; echo "rc $?"
  timeout 200 "$qs" selftest --devices wgpu-spirv --quick --json > "$out/selftest_wgpu_spirv.jsonl" 2>> "$out/spirv.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu_spirv.jsonl"
fi
if has torch; then
  step torch;     timeout 120 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 1024,4096,8192,16384 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
fi
if has accuracy; then
  step accuracy;  timeout 60 python3 demos/peers/torch_sdpa.py --accuracy --batch 1 --heads 4 --seq 1024 --head-dim 128 > "$out/torch_acc.jsonl" 2>> "$out/run.log"; echo "rc $?"
fi
if has sanitize; then
  # memcheck and racecheck on small ragged GQA causal shapes, one run per native family / mode.
  step sanitize
  san=/usr/local/cuda/bin/compute-sanitizer
  small="--batch 1 --heads 4 --kv-heads 2 --seq 200 --kv-seq 300 --causal --iters 1"
  for tool in memcheck racecheck; do
    for cfg in "auto f16 64" "auto f16 128" "native-hmma f16 128" "native-hmma f16-acc16-pv16 64" "auto int8 64" "auto int8-thread 128" "auto int8-warp-nosmooth 128"; do
      set -- $cfg
      strat="--strategy auto"; [ "$1" = native-hmma ] && strat="--strategy native --native hmma"
      echo "-- $tool $cfg" >> "$out/sanitizer.txt"
      timeout 120 $san --tool $tool --error-exitcode 9 "$q" run --device cuda $strat --precision $2 --head-dim $3 $small >> "$out/sanitizer.txt" 2>&1
      echo "rc $? ($tool $cfg)" | tee -a "$out/sanitizer.txt"
    done
  done
fi
step done
