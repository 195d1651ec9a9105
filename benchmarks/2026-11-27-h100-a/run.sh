#!/usr/bin/env bash
# The H100, one device call: the INT8+FP8 P·V kernel with its large-scale exp2 fallback decided
# once per tile (accuracy and speed next to the f16 P·V form, the fuzz seed that found the LSE
# error); compute-sanitizer over every native family (benchmarks/gpu-checks/sanitize.sh); the
# whole CUDA selftest (14 shards) and the Vulkan selftest; the portable 4-bit kernel on CUDA and
# Vulkan (Auto against f64, decode shape next to f16); the portable score-modifier kernel on CUDA.
#   benchmarks/2026-11-27-h100-a/run.sh OUT BIN   (BIN: quattn, int8_fp8_check)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-580} ))
lim() { local l=$(( end - $(date +%s) - 12 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step "int8+fp8 check"
timeout $(lim 60) "$bin/int8_fp8_check" > "$out/int8_fp8_check.jsonl" 2> "$out/int8_fp8_check.log"; echo "rc $?"
tail -1 "$out/int8_fp8_check.jsonl" | cut -c1-600
step "portable 4-bit and modifiers on CUDA"
dec="--seqs 32768 --tokens 262144 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal"
timeout $(lim 60) "$q" bench --device cuda --strategy portable --precision f16,nvfp4 $dec --iters 10 --warmup 2 --json > "$out/bench_fp4_decode.jsonl" 2>> "$out/run.log"; echo "rc $?"
for d in cuda wgpu; do for a in "--seq 1024 --kv-seq 1024" "--seq 1 --kv-seq 8192 --heads 32 --kv-heads 8 --batch 2"; do
  timeout $(lim 30) "$q" run --device $d --precision nvfp4 --head-dim 128 $a --json >> "$out/run_fp4.jsonl" 2>> "$out/run.log"; echo "rc $?"; done; done
timeout $(lim 60) "$q" bench --device cuda --strategy portable --precision f16 --seqs 16384 --head-dims 128 --causal causal --iters 5 --warmup 1 --json > "$out/bench_window_full.jsonl" 2>> "$out/run.log"; echo "rc $?"
timeout $(lim 60) "$q" bench --device cuda --strategy portable --precision f16 --seqs 16384 --head-dims 128 --causal causal --window 4096,0 --iters 5 --warmup 1 --json > "$out/bench_window.jsonl" 2>> "$out/run.log"; echo "rc $?"
for m in "--window 300,40 --causal-align top-left" "--softcap 30 --causal" "--sinks --alibi --causal" "--window 64,64"; do
  timeout $(lim 30) "$q" run --device cuda --precision f16 --seq 777 --kv-seq 1000 --heads 8 --kv-heads 2 --head-dim 128 $m --json >> "$out/run_mods.jsonl" 2>> "$out/run.log"; echo "rc $? $m"; done
step "fuzz seed, sanitizer, Vulkan selftest"
timeout $(lim 140) "$q" selftest --devices cuda --no-matrix --fuzz 45 --fuzz-seed 0x58445c3665bc4b95 --json > "$out/fuzz.jsonl" 2> "$out/fuzz.log" &
timeout $(lim 200) bash benchmarks/gpu-checks/sanitize.sh "$out/sanitize" "$q" > "$out/sanitize.txt" 2>&1 &
timeout $(lim 200) "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log" &
wait
grep -h '^selftest' "$out/fuzz.jsonl" "$out/fuzz.log"; grep -h '"status":"fail"' "$out/fuzz.jsonl" | cut -c1-400 | head -3
echo "sanitize: $(grep -c '^ok' "$out/sanitize.txt") ok, $(grep -c '^ERROR' "$out/sanitize.txt") errors"; grep '^ERROR' "$out/sanitize.txt" | head -10
tail -1 "$out/selftest_wgpu.jsonl"; grep -h '"status":"fail"' "$out/selftest_wgpu.jsonl" | cut -c1-300 | head -5
step "selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 160) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"status":"fail"' "$out/selftest_cuda.jsonl" | cut -c1-300 | head -8
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/a.tgz"
step done
