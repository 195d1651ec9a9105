#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
# /tmp/q3: release quattn (cargo build --release -p quattn-demos --features peer-cubek) and the decode_portable, fp8_portable test binaries
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $R/gpu.csv 2>&1
q=/tmp/q3/quattn
echo "== decode bench $(date +%T)"
: > $R/bench_decode.jsonl
for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
  timeout 100 $q bench --device cuda --strategy portable --precision f16,fp8-e4m3-head $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 20 --json >> $R/bench_decode.jsonl 2>> $R/bench.log; echo "rc $? cuda $shape"
done
timeout 90 $q bench --device wgpu --strategy portable --precision f16,fp8-e4m3-head --seqs 8192 --tokens 65536 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 20 --json >> $R/bench_decode.jsonl 2>> $R/bench.log; echo "rc $? wgpu 8k"
echo "== tests $(date +%T)"
timeout 130 /tmp/q3/decode_portable --test-threads 4 > $R/test_decode_portable.txt 2>&1; echo "decode_portable rc $?"
timeout 60 /tmp/q3/fp8_portable decode --test-threads 2 > $R/test_fp8_portable.txt 2>&1; echo "fp8_portable rc $?"
echo "== fp8 runs $(date +%T)"
: > $R/run_fp8.jsonl
for dev in cuda wgpu; do for c in "--batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128 --precision fp8-e4m3-head" "--batch 2 --heads 16 --kv-heads 4 --seq 2 --kv-seq 3001 --head-dim 64 --precision fp8-e5m2-block --causal --layout bshd" "--batch 2 --heads 8 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision fp8-e4m3"; do
  timeout 30 $q run --device $dev --strategy portable $c --iters 2 --json >> $R/run_fp8.jsonl 2>> $R/run.log; echo "rc $? $dev $c"
done; done
echo "== memcheck $(date +%T)"
timeout 40 compute-sanitizer --tool memcheck $q run --device cuda --strategy portable --batch 2 --heads 8 --kv-heads 2 --seq 1 --kv-seq 3001 --head-dim 128 --precision fp8-e4m3-block --iters 1 > $R/memcheck_fp8.txt 2>&1; echo "memcheck fp8 rc $?"
timeout 40 compute-sanitizer --tool memcheck $q run --device cuda --strategy portable --batch 2 --heads 16 --kv-heads 2 --seq 1 --kv-seq 3001 --head-dim 64 --precision f16 --causal --iters 1 > $R/memcheck_f16.txt 2>&1; echo "memcheck f16 rc $?"
echo "== ncu $(date +%T)"
timeout 60 ncu --kernel-name regex:decode_rows -c 2 --section SpeedOfLight --section Occupancy --section ComputeWorkloadAnalysis --section WarpStateStats $q run --device cuda --strategy portable --batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128 --precision fp8-e4m3-head --iters 1 > $R/ncu_fp8.txt 2>&1
echo "== done $(date +%T)"
tar cJf $OUT/r.tar.xz -C $OUT r
python3 - $R <<'PY'
import json,sys
R=sys.argv[1]
for l in open(R+'/bench_decode.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); s=r['shape']; b=s['batch']*s['kv_heads']*s['kv_seq']*s['head_dim']*2*2
        print(r['device'], r['kernel'], s['kv_seq'], r['ms'], 'f16-equiv TB/s', round(b/r['ms']/1e9,3) if r['ms'] else None)
for l in open(R+'/run_fp8.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); print(r['device'], r['kernel'], r['accuracy'].get('passed'), r['accuracy'].get('rel_l2'))
PY
grep -E "test result|FAILED|panicked" $R/test_*.txt | head
grep -h "ERROR SUMMARY" $R/memcheck_*.txt
grep -E "Registers|Achieved Occ|DRAM Through|Duration|Issue Slots Busy|Executed Ipc A|No Eligible" $R/ncu_fp8.txt | head -20
