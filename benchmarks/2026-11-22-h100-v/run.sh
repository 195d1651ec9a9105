#!/usr/bin/env bash
# Run v: selftest after hd 64's f16 table tile became TMA; the portable mma kernel
# against cubek-attention and torch at issue #3's target shape (hd 128, seq 4k, non-causal) in
# one call; the mma tilings at hd 128; an ncu profile of the portable FMA kernel (the one WGSL
# runs) through its CUDA lowering, to see what bounds it.
# BIN: quattn (--features peer-cubek), bench_cubecl (quattn-cubecl --features cuda,spirv).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step selftest; timeout 170 "$q" selftest --devices cuda --quick --json > "$out/selftest.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest.jsonl" | head -5 | cut -c1-600
step bench
timeout 60 "$q" bench --device cuda --precision f16 --seqs 4096,16384 --head-dims 64,128 --causal both --json > "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $? (f16 auto)"
timeout 150 "$q" bench --device cuda --strategy portable --precision f16 --seqs 4096 --head-dims 128 --causal non-causal --iters 10 --peers --json >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $? (portable mma + cubek)"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,16384 --head-dims 64,128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
python3 benchmarks/table.py "$out/torch.jsonl" "$out/bench.jsonl" 2>&1 | tail -12
step mma-sweep; timeout 110 "$bin/bench_cubecl" cuda --d 128 --filter mma_ --iters 10 > "$out/mma_sweep_d128.txt" 2>&1; echo "rc $?"; grep -v "host:" "$out/mma_sweep_d128.txt" | cut -c1-220
step fma-ncu
timeout 150 /usr/local/cuda/bin/ncu --clock-control none -k regex:fma_vec --launch-skip 2 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters "$bin/bench_cubecl" cuda --d 128 --filter fma_vec_bq64_bk32_t16x8_sin --iters 1 > "$out/fma_ncu.txt" 2>&1; echo "rc $?"
grep -E "fma_vec|Duration|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Theoretical Occ|Compute \(SM\) Thr|L1/TEX Cache Thr|Shared|Stall|stall" "$out/fma_ncu.txt" | head -40 | cut -c1-200
step done
