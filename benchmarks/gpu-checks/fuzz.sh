#!/usr/bin/env bash
# The reliability checks of issue 18 on a CUDA machine (an H100), in about 140 s:
# 1. `quattn selftest --fuzz`: differential-fuzzing cases (a fixed seed and one that changes
#    every run), the NaN-policy, overflow and determinism checks on every kernel family, on
#    CUDA and Vulkan; four shards in parallel, since compiling kernels dominates.
# 2. The soak: 10,000 calls of 64 mixed cases round-robin in one process, on CUDA then on
#    Vulkan, host RSS and device memory after 1,000 calls and at the end; nvidia-smi samples the
#    device's and each process's memory once a second beside them.
#
#   benchmarks/gpu-checks/fuzz.sh [OUT_DIR] [BIN]
#
# Run from the repository root. BIN: `quattn` built with
# `cargo build --release -p quattn-demos --features peer-cubek` (default .bin/fuzz/quattn).
# OUT_DIR defaults to $OUT. Vulkan needs the loader: where `ldconfig -p` has no libvulkan, the
# debs in .gl/ (libvulkan1, see the device README) are unpacked first. Exit status: the number
# of steps that failed. A fuzz failure prints its seed in run.log: replay it with
# `quattn selftest --no-matrix --fuzz N --fuzz-seed SEED --devices cuda`.
set -u
out=${1:-${OUT:?usage: fuzz.sh OUT_DIR [BIN]}}
q=${2:-.bin/fuzz/quattn}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
if ! ldconfig -p | grep -q libvulkan.so.1 && ls .gl/*.deb >/dev/null 2>&1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
fi
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
step() { echo "== $(date -u +%H:%M:%S) $*"; }
failed=0
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv > "$out/gpu.csv" 2>&1
git rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null
# Device memory once a second (MiB): the whole device, and each compute process.
( while :; do
    t=$(date -u +%H:%M:%S)
    echo "$t device $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | sed "s/^/$t pid /"
    sleep 1
  done ) > "$out/nvidia_smi_memory.txt" 2>/dev/null &
smi=$!

step selftest-fuzz
pids=()
for i in 0 1 2 3; do
  timeout 75 "$q" selftest --devices cuda,wgpu --no-matrix --fuzz 100 --shard "$i/4" --json \
    > "$out/selftest_fuzz_$i.jsonl" 2> "$out/selftest_fuzz_$i.log" &
  pids+=($!)
done
for i in 0 1 2 3; do
  wait "${pids[$i]}"; rc=$?; echo "rc $rc (shard $i/4)"; [ $rc -eq 0 ] || failed=$((failed + 1))
done
cat "$out"/selftest_fuzz_*.jsonl > "$out/selftest_fuzz.jsonl" && rm -f "$out"/selftest_fuzz_?.jsonl
cat "$out"/selftest_fuzz_?.log > "$out/selftest_fuzz.log" && rm -f "$out"/selftest_fuzz_?.log
grep -h "^fuzz on\|seeds" "$out/selftest_fuzz.log"
grep -h '"status":"fail"' "$out/selftest_fuzz.jsonl" | head -n 20
grep -h "^selftest:" "$out/selftest_fuzz.jsonl"

for dev in cuda wgpu; do
  step "soak-$dev"
  timeout 30 "$q" soak --device "$dev" --calls 10000 --kernels 8 --max-work 4e6 --json > "$out/soak_$dev.jsonl" 2>> "$out/soak.log"
  rc=$?; echo "rc $rc (soak $dev)"; [ $rc -eq 0 ] || failed=$((failed + 1))
  grep -h "^soak:" "$out/soak_$dev.jsonl"
done

kill "$smi" 2>/dev/null
step done
echo "failed steps: $failed"
exit $failed
