#!/usr/bin/env bash
# One device call (an H100 or H200): the wgmma kernel's score-modifier variant against f64 (the
# score_mods test binary) and timed (sliding window 4096 at seq 32k causal against the full
# causal kernel, per the visible-pair FLOPs); the plain wgmma kernel before and after (binaries
# alternating, bench grid hd 64/128); the CUDA fuzzer (modifiers on 15% of float cases); the
# whole CUDA selftest (14 shards); the portable 4-bit kernel on CUDA (Auto against f64, the
# decode shape next to f16).
#   benchmarks/2026-11-27-h200-b/run.sh OUT BIN   (BIN: quattn, quattn-before, score_mods)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-560} ))
lim() { local l=$(( end - $(date +%s) - 12 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
step "score_mods on CUDA"
timeout $(lim 150) "$bin/score_mods" cuda:: --nocapture > "$out/score_mods.txt" 2>&1; echo "rc $?"; grep -E "test result|panicked|FAILED" "$out/score_mods.txt" | head -5
step "window vs full causal, seq 32k hd 128"
for w in "" "--window 4096,0"; do
  timeout $(lim 60) "$q" bench --device cuda --precision f16 --seqs 32768 --head-dims 128 --causal causal $w --iters 10 --warmup 2 --json >> "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
timeout $(lim 40) "$q" bench --device cuda --precision f16 --seqs 16384 --head-dims 64,128 --causal causal --window 1024,0 --iters 10 --warmup 2 --json >> "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
timeout $(lim 40) "$q" bench --device cuda --precision f16 --seqs 16384 --head-dims 128 --causal causal --softcap 30 --iters 10 --warmup 2 --json >> "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
cut -c1-330 "$out/bench_window.jsonl"
for b in before after before after; do
  qq=$bin/quattn; [ $b = before ] && qq=$bin/quattn-before
  step "wgmma grid ($b)"; timeout $(lim 60) "$qq" bench --device cuda --precision f16 --seqs 4096,16384 --head-dims 64,128 --causal both --iters 20 --json >> "$out/bench_wgmma_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
step "portable 4-bit"
dec="--seqs 32768 --tokens 262144 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal"
timeout $(lim 60) "$q" bench --device cuda --strategy portable --precision f16,nvfp4,nvfp4-v4 $dec --iters 10 --warmup 2 --json > "$out/bench_fp4_decode.jsonl" 2>> "$out/run.log"; echo "rc $?"; cut -c1-300 "$out/bench_fp4_decode.jsonl"
for a in "--seq 1024 --kv-seq 1024" "--seq 1 --kv-seq 8192 --heads 32 --kv-heads 8 --batch 2" "--seq 300 --kv-seq 700 --heads 8 --kv-heads 2 --causal"; do
  for pr in nvfp4 nvfp4-smooth nvfp4-v4; do
  timeout $(lim 30) "$q" run --device cuda --precision $pr --head-dim 128 $a --json >> "$out/run_fp4.jsonl" 2>> "$out/run.log"; echo "rc $? $pr $a"; done; done
step "fuzz cuda"
timeout $(lim 150) "$q" selftest --devices cuda --no-matrix --fuzz 300 --json > "$out/fuzz.jsonl" 2> "$out/fuzz.log"; echo "rc $?"
grep -h '^selftest' "$out/fuzz.jsonl" "$out/fuzz.log"; grep -h "^fuzz on" "$out/fuzz.log"; grep -h '"status":"fail"' "$out/fuzz.jsonl" | cut -c1-400 | head -4
step "selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 160) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"status":"fail"' "$out/selftest_cuda.jsonl" | cut -c1-300 | head -8
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/b.tgz"
step done
