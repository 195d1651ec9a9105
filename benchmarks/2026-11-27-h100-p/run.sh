#!/usr/bin/env bash
# Part a: ppaged.sh (portable paged decode and prefill against f64 on CUDA and Vulkan, benches),
# then the native Auto decode with torch SDPA flash/cuDNN, three rounds interleaved.
# Part san: compute-sanitizer memcheck and racecheck on paged_check --sanitize, memcheck on
# decode_check --check-only. Usage: run.sh OUT BIN a|san (BIN: quattn, decode_check, paged_check).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc12 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
if [ "$3" = a ]; then
  DEADLINE=230 bash benchmarks/gpu-checks/ppaged.sh $out/ppaged $b > $out/ppaged.log 2>&1; echo "rc $? ppaged"
  head -1 $out/ppaged/summary.txt; grep -E "rc [1-9]" $out/ppaged.log | head
  python3 - $out/ppaged <<'PY'
import json, sys
out = sys.argv[1]
for name in ("bench.jsonl", "prefill.jsonl"):
    for l in open(f"{out}/{name}"):
        if l.startswith("{"):
            r = json.loads(l); s = r["shape"]
            print(r.get("device", "")[:10], s.get("kv_seq"), s.get("seq"), s.get("page_size"), r["kernel"], round(r["ms"], 4), round(r.get("tflops", 0), 1))
PY
  : > $out/bench.jsonl
  dec="--precision f16 --width 4096 --head-dims 128 --kv-heads 8 --causal non-causal --iters 50 --json"
  for round in 1 2 3; do
    for s in "8192 65536 1" "32768 262144 1" "32768 262144 16"; do
      set -- $s
      timeout 40 $b/quattn bench --device cuda --strategy auto $dec --seqs $1 --tokens $2 --q-len $3 >> $out/bench.jsonl
      timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 50 --seqs $1 --tokens $2 --q-len $3 >> $out/bench.jsonl 2>> $out/run.log
    done
  done
  python3 - $out <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for l in open(f"{out}/bench.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], s.get("seq"), r["kernel"])].append(r["ms"])
for k in sorted(t, key=str):
    print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4))
PY
else
  cs=/usr/local/cuda/bin/compute-sanitizer
  timeout 150 $cs --tool memcheck $b/paged_check --sanitize > $out/memcheck_paged.txt 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY" $out/memcheck_paged.txt
  timeout 150 $cs --tool racecheck $b/paged_check --sanitize > $out/racecheck_paged.txt 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $out/racecheck_paged.txt
  timeout 250 $cs --tool memcheck $b/decode_check --check-only > $out/memcheck_decode.txt 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|ALL OK|SOME FAILED" $out/memcheck_decode.txt
fi
