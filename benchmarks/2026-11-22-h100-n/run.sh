#!/usr/bin/env bash
# Run n: native INT8 prepass with batched loads in the mean pass; INT8 end to end
# and kernel only, torch in the same call; ncu durations of the prepass passes; selftest.
# benchmarks/2026-11-22-h100-n/run.sh OUT BIN (BIN: stripped quattn built --features peer-cubek)
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step int8; timeout 120 "$q" bench --device cuda --precision int8,int8-thread,int8-block-nosmooth --seqs 8192,16384 --head-dims 128 --causal non-causal --json > "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch; timeout 90 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 8192,16384 --head-dims 128 --causal non-causal > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step ncu
for prec in int8-thread int8-block-nosmooth; do
  timeout 120 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum "$q" run --device cuda --precision $prec --head-dim 128 --batch 2 --heads 16 --seq 8192 --iters 1 --no-check >> "$out/ncu_prepass.txt" 2>&1; echo "rc $? ($prec)"
done
grep -E "int8_prepass|fwd_wgmma_int8|gpu__time_duration" "$out/ncu_prepass.txt" | head -40
step selftest; timeout 220 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"; grep '"prepass-' "$out/selftest.jsonl" | grep -c '"pass"'
step done
