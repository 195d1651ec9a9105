#!/usr/bin/env bash
# FP8 portable decode (device conversion) against f16, FP8 decode tests on CUDA, portable decode
# modifiers (tests on Vulkan, quattn run on CUDA and wgpu), and the prepass check.
# Usage: run.sh OUT BIN
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc14 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
cp $b/commit.txt $out/
end=$(( $(date +%s) + 560 ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "fp8 decode bench"
: > $out/fp8dec.jsonl
for round in 1 2 3; do
  for s in "32768 262144" "8192 65536"; do
    set -- $s
    for prec in f16 fp8-e4m3-head; do
      timeout $(lim 40) $b/quattn bench --device cuda --strategy portable --precision $prec --seqs $1 --tokens $2 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> $out/fp8dec.jsonl 2>> $out/run.log
    done
  done
done
python3 - $out/fp8dec.jsonl <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); t[(r["shape"]["kv_seq"], r["precision"], r["kernel"])].append(r["ms"])
for k in sorted(t): print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4))
PY

step "fp8_portable cuda tests"
timeout $(lim 90) $b/fp8_portable cuda_ --test-threads 1 > $out/fp8_portable_cuda.txt 2>&1; echo "rc $?"; grep -E "test result|panicked|FAILED" $out/fp8_portable_cuda.txt | head -5

step "quattn run: portable decode with modifiers, CUDA and wgpu"
cases=(
  "--batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision f16 --window 1000,0 --causal"
  "--batch 2 --heads 32 --kv-heads 8 --seq 1 --kv-seq 9000 --head-dim 128 --precision f16 --softcap 30 --sinks"
  "--batch 2 --heads 16 --kv-heads 4 --seq 4 --kv-seq 3000 --head-dim 128 --precision f16 --alibi --causal"
  "--page-size 16 --batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision f16 --window 700,0 --causal --softcap 20"
  "--page-size 64 --batch 2 --heads 8 --kv-heads 2 --seq 200 --kv-seq 1000 --head-dim 128 --precision f16 --causal --sinks --alibi"
  "--page-size 256 --batch 2 --heads 8 --kv-heads 2 --seq 8 --kv-seq 3001 --head-dim 64 --precision f32 --window 300,10"
)
: > $out/mods_run.jsonl
for dev in cuda wgpu; do
  for c in "${cases[@]}"; do
    timeout $(lim 25) $b/quattn run --device $dev --strategy portable $c --iters 2 --json >> $out/mods_run.jsonl 2>> $out/run.log
    echo "rc $? $dev $c"
  done
done
python3 - $out/mods_run.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        a = r.get("accuracy", {})
        print(r.get("device"), r.get("kernel"), "passed" if a.get("passed") else "FAILED", a.get("rel_l2"), a.get("failure"), r.get("ms"))
PY

step "score_mods portable decode tests on Vulkan"
timeout $(lim 100) $b/score_mods portable_decode --test-threads 1 > $out/score_mods_vk.txt 2>&1; echo "rc $?"; grep -E "test result|panicked" $out/score_mods_vk.txt | head -5

step "prepass"
OUT=$out/prepass BIN=$b/prepass DEADLINE=$(( end - $(date +%s) - 5 )) bash benchmarks/gpu-checks/prepass.sh > $out/prepass.log 2>&1; echo "rc $?"
cat $out/prepass/summary.txt; grep onepass $out/prepass/fp8_prepass.txt | head -20
step done
