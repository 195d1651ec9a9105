#!/usr/bin/env bash
# Run m: the native INT8 prepass (one stream, no host wait) and the 3-stage s8
# wgmma pipeline as an A/B (QUATTN_WGMMA_INT8_STAGES=3), torch in the same call.
# benchmarks/2026-11-22-h100-m/run.sh OUT BIN (BIN: stripped quattn --features peer-cubek, int8_check)
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
step checks; timeout 90 "$bin/int8_check" --check-only > "$out/checks.txt" 2>&1; echo "rc $?"; grep -E "ALL|FAIL" "$out/checks.txt" | tail -3
step checks3; QUATTN_WGMMA_INT8_STAGES=3 timeout 60 "$bin/int8_check" --check-only --wgmma-only > "$out/checks_stages3.txt" 2>&1; echo "rc $?"; grep -E "ALL|FAIL" "$out/checks_stages3.txt" | tail -3
step selftest; timeout 200 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"; grep -c '"prepass-' "$out/selftest.jsonl"; grep '"prepass-' "$out/selftest.jsonl" | grep -v '"pass"' | head -3
step int8; timeout 120 "$q" bench --device cuda --precision int8,int8-thread,int8-block-nosmooth --seqs 8192,16384 --head-dims 128 --causal non-causal --json > "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo "rc $?"
step int8s3; QUATTN_WGMMA_INT8_STAGES=3 timeout 120 "$q" bench --device cuda --precision int8,int8-thread,int8-block-nosmooth --seqs 8192,16384 --head-dims 128 --causal non-causal --json > "$out/bench_int8_stages3.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch; timeout 90 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 8192,16384 --head-dims 128 --causal non-causal > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step kbench; timeout 60 "$bin/int8_check" --wgmma-only --bench-only > "$out/int8_wgmma_bench.txt" 2>&1; echo "rc $?"
QUATTN_WGMMA_INT8_STAGES=3 timeout 60 "$bin/int8_check" --wgmma-only --bench-only > "$out/int8_wgmma_bench_stages3.txt" 2>&1; echo "rc $?"
step sanitize; san=/usr/local/cuda/bin/compute-sanitizer
small="--batch 1 --heads 4 --kv-heads 2 --seq 200 --kv-seq 300 --causal --iters 1"
for spec in "memcheck int8 64 2" "memcheck int8-thread 128 2" "racecheck int8-thread 128 2" "racecheck int8 128 3" "memcheck int8-warp-nosmooth 128 3"; do
  set -- $spec
  echo "-- $spec" >> "$out/sanitizer.txt"
  QUATTN_WGMMA_INT8_STAGES=$4 timeout 60 $san --tool $1 --error-exitcode 9 "$q" run --device cuda --precision $2 --head-dim $3 $small >> "$out/sanitizer.txt" 2>&1
  echo "rc $? ($spec)" | tee -a "$out/sanitizer.txt"
done
step done
