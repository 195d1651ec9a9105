#!/usr/bin/env bash
# Two device calls on one H200 (sm_90): the variable-length batches (tests/varlen.rs on the
# device, then benchmarks/gpu-checks/varlen.sh) and the portable split-KV decode
# (benchmarks/gpu-checks/pdecode.sh); then an Nsight Compute profile of the portable decode
# kernel at kv 32k and its Vulkan timings (the pdecode script's Vulkan rows ran out of time).
#   benchmarks/2026-11-27-h200-d/run.sh OUT BIN   (BIN: quattn, varlen_gpu, varlen_test)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out/pdecode-profile"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# call 1
timeout 100 "$bin/varlen_test" --nocapture > "$out/varlen/varlen_test.log" 2>&1
DEADLINE=230 bash benchmarks/gpu-checks/varlen.sh "$out/varlen" "$bin"
DEADLINE=150 bash benchmarks/gpu-checks/pdecode.sh "$out/pdecode" "$bin"
# call 2
S="--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 32768 --head-dim 128 --precision f16"
timeout 150 ncu --launch-count 4 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SourceCounters "$bin/quattn" run --device cuda --strategy portable --portable decode $S --iters 1 --no-check > "$out/pdecode-profile/ncu.txt" 2>&1
for kv in 32768 8192; do for st in "--strategy portable" "--strategy portable --portable fma"; do
  # shellcheck disable=SC2086
  timeout 60 "$bin/quattn" bench --device wgpu $st --precision f16 --seqs $kv --tokens $((kv*8)) --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 10 --json >> "$out/pdecode-profile/wgpu_bench.jsonl" 2>>"$out/pdecode-profile/wgpu.log"
done; done
# call 3 (the selftest's varlen group and device-tensor cases)
"$bin/quattn" selftest --devices cuda,wgpu --only varlen --json > "$out/selftest/selftest_varlen.jsonl" 2> "$out/selftest/selftest_varlen.log"
"$bin/quattn" selftest --devices cuda,wgpu --only device-tensors --json > "$out/selftest/selftest_dt.jsonl" 2> "$out/selftest/selftest_dt.log"
