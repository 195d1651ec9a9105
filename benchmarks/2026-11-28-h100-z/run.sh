#!/usr/bin/env bash
# The portable decode family's MMA kernel (kernel/decode_mma.rs) on CUDA: its CUDA tests
# (decode_portable, fp8_portable), `quattn run` of decode shapes against f64, and the decode
# shape (q_len 1, 32 q heads over 8 KV heads, hd 128, batch 8) against the row kernel it
# replaces there (BIN/quattn_before: the row kernel), three interleaved rounds at kv 32k and 8k.
# BIN holds quattn (commit.txt), quattn_before and the test binaries.  Usage: run.sh OUT BIN
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
end=$(( $(date +%s) + ${DEADLINE:-560} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
q=$bin/quattn
echo "== run against f64"
for prec in f16 bf16 fp8-e4m3-head fp8-e5m2; do
  for shape in "--batch 2 --heads 8 --kv-heads 2 --seq 1 --kv-seq 3333 --head-dim 128" \
               "--batch 2 --heads 8 --kv-heads 2 --seq 2 --kv-seq 1500 --head-dim 128 --causal" \
               "--batch 3 --heads 16 --kv-heads 2 --seq 1 --kv-seq 777 --head-dim 64 --layout bshd"; do
    timeout $(lim 60) "$q" run --device cuda --strategy portable --precision $prec $shape --json >> "$out/run.jsonl" 2>> "$out/run.log"
  done
done
grep -o '"kernel":"[^"]*"\|"pass":[a-z]*' "$out/run.jsonl" | paste - - | sort | uniq -c
echo "== bench rounds"
for r in 1 2 3; do
  for b in quattn_before quattn; do
    for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
      timeout $(lim 60) "$bin/$b" bench --device cuda --strategy portable --precision f16,fp8-e4m3-head $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json \
        | sed "s/^{/{\"bin\":\"$b\",/" >> "$out/bench_decode.jsonl" 2>> "$out/run.log"
    done
  done
done
python3 - "$out/bench_decode.jsonl" <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], r["precision"], r["bin"])].append((r["ms"], r["kernel"]))
for k in sorted(t):
    print(k, [round(x[0], 4) for x in t[k]], "min", round(min(x[0] for x in t[k]), 4), t[k][0][1])
for kv in sorted({k[0] for k in t}):
    f16 = min(x[0] for x in t[(kv, "f16", "quattn")]); f16b = min(x[0] for x in t[(kv, "f16", "quattn_before")])
    fp8 = min(x[0] for x in t[(kv, "fp8-e4m3-head", "quattn")]); fp8b = min(x[0] for x in t[(kv, "fp8-e4m3-head", "quattn_before")])
    print(f"kv {kv}: f16 {f16:.4f} (row kernel {f16b:.4f}, {f16b/f16:.2f}x), fp8 {fp8:.4f} (row kernel {fp8b:.4f}); fp8 vs mma f16 {f16/fp8:.2f}x, vs row f16 {f16b/fp8:.2f}x")
PY
echo "== tests"
for t in "decode_portable cuda::" "fp8_portable cuda_"; do
  set -- $t
  timeout $(lim 150) "$bin/$1" "$2" --test-threads 1 > "$out/test_$1.txt" 2>&1; echo "$1 rc $?"
  grep -E "^test |test result|panicked" "$out/test_$1.txt" | head -12
done
