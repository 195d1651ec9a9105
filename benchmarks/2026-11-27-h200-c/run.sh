#!/usr/bin/env bash
# One device call (an H100 or H200): the native modifier variants (wgmma and HMMA) against f64 (the
# score_mods test binary) and the selftest's modifier group on CUDA; the sliding-window timing
# again on this card; compute-sanitizer on the modifier variants and the paged decode kernels;
# the paged KV cache and 64-bit size checks (benchmarks/gpu-checks/{paged,large}.sh).
#   benchmarks/2026-11-27-h200-c/run.sh OUT BIN   (BIN: quattn, score_mods, paged_check, large_tensors)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-570} ))
lim() { local l=$(( end - $(date +%s) - 12 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
step "score_mods on CUDA"
timeout $(lim 150) "$bin/score_mods" cuda:: --nocapture > "$out/score_mods.txt" 2>&1; echo "rc $?"; grep -E "^test |test result|panicked" "$out/score_mods.txt" | head -8
step "checks of the merged work"
step paged; DEADLINE=$(lim 170) timeout $(lim 180) bash benchmarks/gpu-checks/paged.sh "$out/paged" "$bin" > "$out/paged.txt" 2>&1; echo "rc $?"; tail -25 "$out/paged.txt"
step large; timeout $(lim 130) bash benchmarks/gpu-checks/large.sh "$out/large" "$bin/large_tensors" > "$out/large.txt" 2>&1; echo "rc $?"; tail -4 "$out/large.txt"; tail -2 "$out/large/large.jsonl" 2>/dev/null | cut -c1-300
step "sanitizer on the modifier variants"
timeout $(lim 150) bash benchmarks/gpu-checks/sanitize.sh "$out/sanitize" "$q" wgmma:f16:--window=100,20+--sinks \
  wgmma:f16:--window=64,0+--softcap=30+--alibi+--causal-align=top-left hmma:bf16:--window=100,20+--sinks \
  hmma:bf16:--window=64,0+--softcap=30+--alibi+--causal-align=top-left > "$out/sanitize.txt" 2>&1
echo "sanitize: $(grep -c '^ok' "$out/sanitize.txt") ok, $(grep -c '^ERROR' "$out/sanitize.txt") errors"; grep '^ERROR' "$out/sanitize.txt" | head -5
step "selftest --only mods, cuda"
timeout $(lim 120) "$q" selftest --devices cuda --only mods --json > "$out/selftest_mods.jsonl" 2>> "$out/run.log"; echo "rc $?"
grep -h '^selftest' "$out/selftest_mods.jsonl"; grep -h '"status":"fail"' "$out/selftest_mods.jsonl" | cut -c1-300 | head -5
step "window vs full causal, seq 32k hd 128"
for w in "" "--window 4096,0"; do
  timeout $(lim 60) "$q" bench --device cuda --precision f16 --seqs 32768 --head-dims 128 --causal causal $w --iters 10 --warmup 2 --json >> "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
timeout $(lim 60) "$q" bench --device cuda --precision bf16 --seqs 32768 --head-dims 128 --causal causal --window 4096,0 --iters 5 --warmup 1 --json >> "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
timeout $(lim 60) "$q" bench --device cuda --precision bf16 --seqs 32768 --head-dims 128 --causal causal --iters 5 --warmup 1 --json >> "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
cut -c1-300 "$out/bench_window.jsonl"
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/c.tgz"
step done
