#!/usr/bin/env bash
# Run s: the warp-specialized TMA INT8 wgmma kernel (producer warpgroup, TMA K/V
# stages, ping-pong consumers) against the cp.async one: int8_check (kernel only, check + time,
# every variant), quattn selftest (the facade now runs tma2), INT8 end to end with torch in the
# same call, and an ncu profile of both kernels at hd 128 s8k.
# benchmarks/2026-11-22-h100-s/run.sh OUT BIN (BIN: quattn --features peer-cubek, int8_check)
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step int8_check; timeout 240 "$bin/int8_check" --wgmma-only > "$out/int8_check.txt" 2>&1; echo "rc $?"; cat "$out/int8_check.txt"
step selftest; timeout 220 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"; grep -v '"pass"' "$out/selftest.jsonl" | head -5
step int8; timeout 120 "$q" bench --device cuda --precision int8,int8-thread,int8-block-nosmooth --seqs 8192,16384 --head-dims 128 --causal non-causal --json > "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch; timeout 90 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 8192,16384 --head-dims 128 --causal non-causal > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
python3 benchmarks/table.py "$out/torch.jsonl" "$out/bench_int8.jsonl" 2>&1 | tail -5
step ncu
for prec in int8-thread; do
  timeout 150 /usr/local/cuda/bin/ncu --clock-control none -k regex:fwd_wgmma_int8 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SourceCounters "$q" run --device cuda --precision $prec --head-dim 128 --batch 2 --heads 16 --seq 8192 --iters 1 --no-check >> "$out/ncu.txt" 2>&1; echo "rc $? ($prec)"
done
grep -E "Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|Registers Per|Executed Ipc" "$out/ncu.txt" | head -30
step done
