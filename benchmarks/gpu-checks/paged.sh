#!/usr/bin/env bash
# Paged KV cache on the H100: the native paged decode variants against the f64 reference at
# every page size (ragged lengths, an empty sequence, GQA, causal chunks, f16/bf16), the
# device-tensor path, append_kv against the host append; paged decode timed against the
# contiguous cache at the decode shape (batch 8, 32 q heads over 8 KV heads, q_len 1,
# kv 32k, hd 128, f16; page sizes 16, 64, 256), each checked against f64; `quattn run
# --page-size` through the CLI; compute-sanitizer memcheck on the paged kernels and append_kv.
#
#   benchmarks/gpu-checks/paged.sh OUT BIN      (from the repository root)
#
# BIN holds `quattn` (`cargo build --release -p quattn-demos`) and `paged_check`
# (`cargo build --release --example paged_check`, from target/release/examples/). Expects CUDA
# 13 at /usr/local/cuda. Every step's limit is cut to what is left of DEADLINE seconds
# (default 180).
#
# Pass: check.txt and bench.txt end with `all paged checks passed`, every line of run.txt says
# PASS, and the sanitizer lines say `ERROR SUMMARY: 0 errors`. bench.txt's `% vs contiguous`
# column is the target (within 10%).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-paged}
end=$(( $(date +%s) + ${DEADLINE:-180} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
cs=/usr/local/cuda/bin/compute-sanitizer
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1

step "paged_check --check: every page size against f64, device tensors, append_kv"
timeout "$(lim 45)" "$bin/paged_check" --check > "$out/check.txt" 2>&1; echo "rc $?"
grep -cE "^ok" "$out/check.txt"; grep -E "^FAIL|passed|rror" "$out/check.txt" | head -20

step "paged_check --bench: paged decode (16, 64, 256) vs contiguous, each against f64"
timeout "$(lim 80)" "$bin/paged_check" --bench > "$out/bench.txt" 2>&1; echo "rc $?"
cat "$out/bench.txt"

step "quattn run --page-size: Auto, f16 and bf16, decode and a causal chunk"
: > "$out/run.txt"
for args in "--precision f16 --page-size 16 --batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128" \
            "--precision bf16 --page-size 256 --batch 2 --heads 8 --kv-heads 2 --seq 8 --kv-seq 3001 --head-dim 64 --causal" \
            "--precision f16 --page-size 64 --batch 3 --heads 16 --kv-heads 4 --seq 4 --kv-seq 777 --head-dim 128 --causal --layout bshd"; do
  # shellcheck disable=SC2086
  timeout "$(lim 20)" "$bin/quattn" run --device cuda $args >> "$out/run.txt" 2>&1; echo "rc $? ($args)"
done
grep -E "kernel|accuracy|rror" "$out/run.txt"

step "compute-sanitizer memcheck: paged decode variants and append_kv"
timeout "$(lim 45)" "$cs" --tool memcheck --error-exitcode 9 --print-limit 20 "$bin/paged_check" --sanitize > "$out/memcheck.txt" 2>&1; echo "rc $?"
grep -E "ERROR SUMMARY|^FAIL|passed" "$out/memcheck.txt"
