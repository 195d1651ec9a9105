#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/q2 /tmp/pp && # /tmp/q2: release quattn and the decode_portable, fp8_portable test binaries; /tmp/pp: prepass.sh and its binaries
R=$OUT/r; mkdir -p $R; git rev-parse HEAD > $R/commit.txt
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $R/gpu.csv 2>&1
q=/tmp/q2/quattn
echo "== prepass $(date +%T)"
OUT=$R/prepass BIN=/tmp/pp/prepass DEADLINE=200 timeout 210 bash /tmp/pp/prepass.sh > $R/prepass.log 2>&1; echo "prepass rc $?"
echo "== decode bench $(date +%T)"
: > $R/bench_decode.jsonl
for dev in cuda wgpu; do for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
  timeout 40 $q bench --device $dev --strategy portable --precision f16,fp8-e4m3-head $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 20 --json >> $R/bench_decode.jsonl 2>> $R/bench.log; echo "rc $? $dev $shape"
done; done
echo "== fp8 decode runs $(date +%T)"
: > $R/run_fp8.jsonl
for dev in cuda wgpu; do for c in "--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 32768 --head-dim 128 --precision fp8-e4m3-head" "--batch 2 --heads 16 --kv-heads 4 --seq 2 --kv-seq 3001 --head-dim 64 --precision fp8-e5m2-block --causal --layout bshd" "--batch 2 --heads 8 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision fp8-e4m3-tensor"; do
  timeout 30 $q run --device $dev --strategy portable $c --iters 2 --json >> $R/run_fp8.jsonl 2>> $R/run.log; echo "rc $? $dev $c"
done; done
echo "== tests $(date +%T)"
timeout 110 /tmp/q2/decode_portable --test-threads 2 > $R/test_decode_portable.txt 2>&1; echo "decode_portable rc $?"
timeout 70 /tmp/q2/fp8_portable decode --test-threads 2 > $R/test_fp8_portable.txt 2>&1; echo "fp8_portable rc $?"
echo "== memcheck $(date +%T)"
timeout 45 compute-sanitizer --tool memcheck $q run --device cuda --strategy portable --batch 2 --heads 8 --kv-heads 2 --seq 1 --kv-seq 3001 --head-dim 128 --precision fp8-e4m3-block --iters 1 > $R/memcheck_fp8.txt 2>&1; echo "memcheck rc $?"; tail -2 $R/memcheck_fp8.txt
tar cJf $OUT/r.tar.xz -C $OUT r
cat $R/prepass/summary.txt 2>/dev/null | head -30
python3 - $R <<'PY'
import json,sys
R=sys.argv[1]
for l in open(R+'/bench_decode.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); s=r['shape']; b=s['batch']*s['kv_heads']*s['kv_seq']*s['head_dim']*2*2*(0.5 if 'fp8' in r['precision'] else 1)
        print(r['device'], r['kernel'], s['kv_seq'], r['ms'], 'TB/s-of-its-bytes', round(b/r['ms']/1e9,3) if r['ms'] else None)
for l in open(R+'/run_fp8.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); print(r['device'], r['kernel'], r['accuracy'].get('passed'), r['accuracy'].get('rel_l2'))
PY
grep -E "test result|FAILED|panicked" $R/test_*.txt | head
