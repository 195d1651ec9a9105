#!/usr/bin/env bash
# The merged tree on the H100, in one device call, most important first: INT8 Q·Kᵀ with e4m3 P·V
# (benchmarks/gpu-checks/int8fp8.sh); the native FP8 kernel at hd 128 (Vᵀ prepass once at
# upload) next to the f16 wgmma kernel and torch SDPA; the CUDA selftest (14 shards); the
# differential fuzzer and soak (benchmarks/gpu-checks/fuzz.sh); decode at q_len 16 with torch.
#   benchmarks/2026-11-25-h100-h/run.sh OUT BIN   (BIN: quattn, int8_fp8_check, torch_sdpa.py)
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
end=$(( $(date +%s) + ${DEADLINE:-575} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
mkdir -p .bin && ln -sfn "$bin" .bin/int8fp8
step int8fp8; OUT=$out/int8fp8 timeout $(lim 150) bash benchmarks/gpu-checks/int8fp8.sh > "$out/int8fp8.txt" 2>&1; echo "rc $?"; tail -6 "$out/int8fp8.txt"
step "fp8 native vs f16, hd 128"
timeout $(lim 60) "$q" bench --device cuda --precision f16,fp8-e4m3-head-pfp8 --seqs 4096,8192,16384 --head-dims 128 --causal both --iters 20 --json > "$out/bench_fp8.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch
timeout $(lim 45) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,8192,16384 --head-dims 128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step "selftest cuda, 14 shards"
n=14
for i in $(seq 0 $((n-1))); do
  timeout $(lim 150) "$q" selftest --devices cuda --quick --json --shard $i/$n > "$out/st_$i.jsonl" 2>> "$out/selftest_cuda.log" &
done
wait
cat "$out"/st_*.jsonl | grep '^{' > "$out/selftest_cuda.jsonl"; rm -f "$out"/st_*.jsonl
echo "cases $(wc -l < "$out/selftest_cuda.jsonl"): pass $(grep -c '"status":"pass"' "$out/selftest_cuda.jsonl") fail $(grep -c '"status":"fail"' "$out/selftest_cuda.jsonl")"
grep -h '"status":"fail"' "$out/selftest_cuda.jsonl" | cut -c1-300 | head -8
l=$(lim 150); step "fuzz + soak ($l s)"
[ "$l" -gt 60 ] && timeout "$l" bash benchmarks/gpu-checks/fuzz.sh "$out/fuzz" "$q" > "$out/fuzz.txt" 2>&1; echo "rc $?"; tail -8 "$out/fuzz.txt"
step "decode q16"
dec="--device cuda --precision f16 --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30 --json --seqs 32768 --tokens 262144 --q-len 16"
timeout $(lim 30) "$q" bench $dec > "$out/bench_decode_q16.jsonl" 2>> "$out/run.log"; echo "rc $?"
timeout $(lim 30) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30 --seqs 32768 --tokens 262144 --q-len 16 > "$out/torch_decode_q16.jsonl" 2>> "$out/run.log"; echo "rc $?"
tar -czf "$out.tgz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tgz" "$out/h.tgz"
step done
