#!/usr/bin/env bash
# The native decode family with its splits merged in-kernel and paged prefill in row blocks
# (new) against the separate merge kernel (old): decode_check and paged_check against f64, the
# CUDA tests of score_mods and paged, compute-sanitizer on both checks, then Auto decode of both
# builds alternating with torch SDPA flash/cuDNN in the same call, and paged prefill timed.
# Usage: run.sh OUT BIN [san] (BIN/new: quattn, decode_check, paged_check, score_mods, paged;
# BIN/old: quattn); with `san` only the sanitizers run.
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc11 PYTHONUNBUFFERED=1
cs=/usr/local/cuda/bin/compute-sanitizer
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
if [ "${3:-}" != san ]; then
echo "== decode_check"; timeout 150 $b/new/decode_check --check-only > $out/decode_check.txt 2>&1; echo "rc $?"; grep -cE "^ok" $out/decode_check.txt; grep -E "FAIL|ALL OK|SOME FAILED" $out/decode_check.txt | tail -5
echo "== paged_check"; timeout 120 $b/new/paged_check --check > $out/paged_check.txt 2>&1; echo "rc $?"; grep -E "FAIL|all paged" $out/paged_check.txt | tail -5; grep -c "^ok" $out/paged_check.txt
echo "== score_mods cuda"; timeout 200 $b/new/score_mods cuda --nocapture --test-threads 1 > $out/score_mods_cuda.txt 2>&1; echo "rc $?"; grep -E "test result|panicked" $out/score_mods_cuda.txt | tail -4
echo "== paged tests"; timeout 100 $b/new/paged --nocapture --test-threads 1 > $out/paged_tests.txt 2>&1; echo "rc $?"; grep -E "test result|panicked" $out/paged_tests.txt | tail -4
echo "== benches"
: > $out/bench.jsonl
dec="--precision f16 --width 4096 --head-dims 128 --kv-heads 8 --causal non-causal --iters 50 --json"
for round in 1 2 3; do
  for which in old new; do
    for s in "8192 65536 1" "32768 262144 1" "32768 262144 16"; do
      set -- $s
      QUATTN_CACHE_DIR=/tmp/qc11$which timeout 40 $b/$which/quattn bench --device cuda --strategy auto $dec --seqs $1 --tokens $2 --q-len $3 | sed "s/^{/{\"build\": \"$which\", \"round\": $round, /" >> $out/bench.jsonl
    done
  done
  for s in "8192 65536 1" "32768 262144 1" "32768 262144 16"; do
    set -- $s
    timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 50 --seqs $1 --tokens $2 --q-len $3 | sed "s/^{/{\"build\": \"torch\", \"round\": $round, /" >> $out/bench.jsonl 2>> $out/run.log
  done
done
python3 - $out <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for l in open(f"{out}/bench.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], s.get("q_seq", s.get("seq")), r["build"], r["kernel"])].append(r["ms"])
for k in sorted(t, key=str):
    print(k, [round(x, 4) for x in t[k]], "min", round(min(t[k]), 4))
PY
echo "== decode_check bench (splits sweep)"; timeout 100 $b/new/decode_check --bench-only > $out/decode_bench.txt 2>&1; echo "rc $?"; grep -E "chosen=true" $out/decode_bench.txt | cut -c1-220
echo "== paged prefill against the dense kernels"
: > $out/prefill.jsonl
for v in "" "--page-size 64" "--page-size 16"; do
  timeout 60 $b/new/quattn bench --device cuda --strategy auto --precision f16 --width 2048 --head-dims 128 --kv-heads 4 --causal causal --iters 20 --seqs 4096 --tokens 16384 $v --json >> $out/prefill.jsonl 2>> $out/run.log; echo "rc $? prefill $v"
done
python3 -c "
import json
for l in open('$out/prefill.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); print(r['shape'].get('page_size'), r['kernel'], round(r['ms'],4), round(r.get('tflops',0),1))
"
fi
[ "${3:-}" = san ] || exit 0
echo "== sanitizers"
timeout 150 $cs --tool memcheck $b/new/paged_check --sanitize > $out/memcheck_paged.txt 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY" $out/memcheck_paged.txt
timeout 150 $cs --tool racecheck $b/new/paged_check --sanitize > $out/racecheck_paged.txt 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $out/racecheck_paged.txt
timeout 200 $cs --tool memcheck $b/new/decode_check --check-only > $out/memcheck_decode.txt 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|ALL OK|SOME FAILED" $out/memcheck_decode.txt
