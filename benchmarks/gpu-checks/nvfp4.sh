#!/usr/bin/env bash
# The NVFP4 / MXFP4 quantization prepass on the H100, in one device call: every variant (format x
# source type x head dim 64/128) checked byte for byte against its CPU recipe on outlier, tie,
# subnormal/zero-block and all-zero inputs in BHSD and BSHD, then timed on [8, 32, 4096, d]. The
# sm_120a attention kernel cannot run here (compute capability 9.0); it is checked offline.
#
#   OUT=/some/dir benchmarks/gpu-checks/nvfp4.sh      (from the repository root)
#
# Expects CUDA 13 at /usr/local/cuda and in .bin/nvfp4/ (BIN overrides): `nvfp4_check`
# (`cargo build --release -p quattn-native --example nvfp4_check`). Every step's limit is cut to
# what is left of DEADLINE seconds (default 85).
#
# Pass: checks.txt ends with `ALL PASS` (no FAIL line); summary.txt lists the GB/s per variant
# against the H100 SXM's 3.35 TB/s.
set -u
out=${OUT:?set OUT to the output folder}
bin=${BIN:-.bin/nvfp4}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-nvfp4}
end=$(( $(date +%s) + ${DEADLINE:-85} ))
lim() { local l=$(( end - $(date +%s) - 3 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,clocks.max.mem --format=csv > "$out/gpu.csv" 2>&1

step "nvfp4_check: prepass bit-exact with the CPU recipe"
timeout "$(lim 40)" "$bin/nvfp4_check" --check-only > "$out/checks.txt" 2>> "$out/run.log"; echo "rc $?"
grep -cE "^PASS" "$out/checks.txt" | sed 's/^/passing cases: /'
grep -E "^FAIL|first|ALL PASS|SOME FAILED" "$out/checks.txt" | tail -12

step "nvfp4_check: prepass timing"
timeout "$(lim 40)" "$bin/nvfp4_check" --bench-only --json "$out/bench.json" > "$out/bench.txt" 2>> "$out/run.log"; echo "rc $?"
grep -E "^TIME" "$out/bench.txt" | tee "$out/summary.txt"
tail -1 "$out/bench.txt"
