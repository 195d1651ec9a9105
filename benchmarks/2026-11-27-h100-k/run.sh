#!/usr/bin/env bash
# Native decode and varlen score-modifier variants (CUDA tests of score_mods and varlen against
# f64), then the decode benches: the portable decode on the contiguous cache in BHSD and BSHD and
# on pages of 16/64/256 keys, the native decode plain and with a 4096-key window, torch SDPA.
# Usage: run.sh OUT BIN (BIN: score_mods, varlen, quattn test/release binaries of commit.txt).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc7 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
echo "== score_mods cuda"; timeout 240 $b/score_mods cuda --nocapture --test-threads 1 > $out/score_mods_cuda.txt 2>&1; echo "rc $?"; grep -E "^test |result|panicked|SKIPPED" $out/score_mods_cuda.txt | tail -16
echo "== varlen cuda"; timeout 150 $b/varlen cuda --nocapture --test-threads 1 > $out/varlen_cuda.txt 2>&1; echo "rc $?"; grep -E "^test |result|panicked" $out/varlen_cuda.txt | tail -8
echo "== benches"
: > $out/bench.jsonl
dec="--precision f16 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json"
for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
  for v in "--layout bhsd" "--layout bshd" "--page-size 16" "--page-size 64" "--page-size 256"; do
    timeout 30 $b/quattn bench --device cuda --strategy portable $dec $shape $v >> $out/bench.jsonl 2>> $out/run.log; echo "rc $? portable $shape $v"
  done
  for v in "" "--window 4096,0" "--page-size 64"; do
    timeout 30 $b/quattn bench --device cuda --strategy auto $dec $shape $v >> $out/bench.jsonl 2>> $out/run.log; echo "rc $? auto $shape $v"
  done
done
timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30 --seqs 32768 --tokens 262144 --q-len 1 >> $out/torch.jsonl 2>> $out/run.log; echo "rc $? torch 32k"
timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30 --seqs 8192 --tokens 65536 --q-len 1 >> $out/torch.jsonl 2>> $out/run.log; echo "rc $? torch 8k"
python3 - $out <<'PY'
import json, sys
out = sys.argv[1]
for name in ("bench.jsonl", "torch.jsonl"):
    for l in open(f"{out}/{name}"):
        if l.startswith("{"):
            r = json.loads(l); s = r["shape"]
            print(s.get("kv_seq"), s.get("layout"), s.get("page_size"), s.get("window"), r["kernel"], round(r["ms"], 4))
PY
echo "== run checks: native decode with modifiers through the CLI"
for c in "--window 100,0 --batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision f16" "--softcap 30 --sinks --alibi --batch 2 --heads 8 --kv-heads 2 --seq 3 --kv-seq 3001 --head-dim 128 --precision bf16 --causal --page-size 64"; do
  timeout 30 $b/quattn run --device cuda $c --iters 2 --json >> $out/run.jsonl 2>> $out/run.log; echo "rc $? $c"
done
python3 -c "
import json
for l in open('$out/run.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); print(r['kernel'], r['accuracy'].get('passed'), r['accuracy'].get('rel_l2'))
"
