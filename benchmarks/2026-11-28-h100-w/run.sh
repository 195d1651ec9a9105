#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on the HMMA modifier variants
# whose key loop runs masked-above / whole / masked-below tiles (window-only on 32 rows per
# warp, and the softcap+ALiBi superset), and the selftest's modifier group on CUDA.
# BIN holds quattn built at commit.txt.  Usage: run.sh OUT BIN
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
timeout 300 bash benchmarks/gpu-checks/sanitize.sh "$out/sanitize" "$bin/quattn" hmma:bf16:--window=100,20+--sinks \
  hmma:f16:--window=64,0+--causal-align=top-left hmma:bf16:--window=64,0+--softcap=30+--alibi+--causal-align=top-left > "$out/sanitize.txt" 2>&1
echo "sanitize: $(grep -c '^ok' "$out/sanitize/sanitize.txt") ok, $(grep -c '^ERROR' "$out/sanitize/sanitize.txt") errors"; grep '^ERROR' "$out/sanitize/sanitize.txt" | head -5
timeout 150 "$bin/quattn" selftest --devices cuda --only mods --json > "$out/selftest_mods.jsonl" 2> "$out/selftest.log"; echo "selftest rc $?"
grep -h '^selftest' "$out/selftest_mods.jsonl" "$out/selftest.log" | head; grep -c '"status":"pass"' "$out/selftest_mods.jsonl"; grep -h '"status":"fail"' "$out/selftest_mods.jsonl" | cut -c1-300 | head -5
