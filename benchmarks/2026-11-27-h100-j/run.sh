#!/usr/bin/env bash
# varlen+mods and score_mods CUDA tests (test binaries of the commit in commit.txt), then the
# portable paged decode bench (CUDA). Usage: run.sh OUT BIN (BIN: varlen, score_mods, quattn).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc6
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
echo "== varlen cuda"; timeout 200 $b/varlen cuda --nocapture --test-threads 1 > $out/varlen_cuda.txt 2>&1; echo "rc $?"; grep -E "^test |result|panicked" $out/varlen_cuda.txt | tail -8
echo "== score_mods cuda"; timeout 150 $b/score_mods cuda --nocapture --test-threads 1 > $out/score_mods_cuda.txt 2>&1; echo "rc $?"; grep -E "^test |result|panicked" $out/score_mods_cuda.txt | tail -12
echo "== paged bench (CUDA)"
: > $out/bench.jsonl
for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
  for pages in "" "--page-size 16" "--page-size 64" "--page-size 256"; do
    timeout 30 $b/quattn bench --device cuda --strategy portable --precision f16 $shape $pages --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> $out/bench.jsonl 2>> $out/run.log; echo "rc $? $shape $pages"
  done
done
python3 -c "
import json
for l in open('$out/bench.jsonl'):
    if l.startswith('{'):
        r=json.loads(l); print(r['shape'].get('kv_seq'), r['shape'].get('page_size'), r['kernel'], round(r['ms'],4))
"
echo "== paged run checks"
for c in "--page-size 16 --batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision f16" "--page-size 16 --batch 2 --heads 8 --kv-heads 1 --seq 1 --kv-seq 3001 --head-dim 256 --precision f32"; do
  timeout 30 $b/quattn run --device cuda --strategy portable $c --iters 2 --json >> $out/run.jsonl 2>> $out/run.log; echo "rc $? $c"
done
grep -o '"passed":[a-z]*' $out/run.jsonl
