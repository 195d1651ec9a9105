#!/usr/bin/env bash
# On one H200: the 4-bit MMA decode kernel in its Sᵀ = K·Qᵀ layout (kernel/decode_mma_fp4.rs),
# with P quantized to NVFP4 (nvfp4-v4) and P rounded to f16 (nvfp4-v4p16). The CUDA tests
# (nvfp4_portable, decode_portable, fp8_portable), compute-sanitizer memcheck and racecheck on
# the 4-bit MMA decode kernel in both modes, `quattn run` of NVFP4 decode shapes against f64,
# then the decode shape (q_len 1, 32 q heads over 8 KV heads, hd 128, batch 8) at kv 32k and
# 8k: the portable decode family on f16, FP8 e4m3 and NVFP4 K/V, ROUNDS interleaved rounds.
# BIN holds quattn (commit.txt) and the test binaries.  Usage: run.sh OUT BIN (TEST_LIST,
# SAN_PRECS, RUN_PRECS, BENCH_PRECS, ROUNDS, TESTS=0 narrow a call).
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
end=$(( $(date +%s) + ${DEADLINE:-560} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
q=$bin/quattn
if [ "${TESTS:-1}" = 1 ]; then
  echo "== tests"
  for t in ${TEST_LIST:-"nvfp4_portable:cuda_" "decode_portable:cuda::" "fp8_portable:cuda_"}; do
    t=${t/:/ }
    set -- $t
    timeout $(lim 150) "$bin/$1" "$2" --test-threads 1 --nocapture > "$out/test_$1.txt" 2>&1; echo "$1 rc $?"
    grep -E "^test |test result|panicked|kernel vs" "$out/test_$1.txt" | cut -c1-400 | head -16
  done
  echo "== compute-sanitizer"
  for prec in ${SAN_PRECS:-nvfp4-v4 nvfp4-v4p16}; do
    for tool in memcheck racecheck; do
      timeout $(lim 120) compute-sanitizer --tool $tool "$q" run --device cuda --strategy portable --precision $prec --batch 2 --heads 8 --kv-heads 2 --seq 2 --kv-seq 3333 --head-dim 128 --causal --iters 1 --no-check --json > "$out/sanitizer_${prec}_$tool.txt" 2>&1
      echo "$prec $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_${prec}_$tool.txt" | head -2 | tr '\n' ' ') $(grep -o '"kernel":"[^"]*"' "$out/sanitizer_${prec}_$tool.txt" | head -1)"
    done
  done
  echo "== run against f64"
  for prec in ${RUN_PRECS:-nvfp4-v4p16 nvfp4-v4 nvfp4-v4p16-smooth}; do
    for shape in "--batch 2 --heads 8 --kv-heads 2 --seq 1 --kv-seq 3333 --head-dim 128" \
                 "--batch 2 --heads 8 --kv-heads 2 --seq 2 --kv-seq 1500 --head-dim 128 --causal" \
                 "--batch 1 --heads 32 --kv-heads 8 --seq 1 --kv-seq 32768 --head-dim 128"; do
      timeout $(lim 90) "$q" run --device cuda --strategy portable --precision $prec $shape --json >> "$out/run.jsonl" 2>> "$out/run.log"
    done
  done
  grep -o '"kernel":"[^"]*"\|"pass":[a-z]*\|"rel_l2":[0-9.e-]*' "$out/run.jsonl" | paste - - - | sort | uniq -c
fi
echo "== bench rounds"
for r in $(seq 1 ${ROUNDS:-1}); do
  for prec in ${BENCH_PRECS:-f16 fp8-e4m3-head nvfp4-v4 nvfp4-v4p16}; do
    for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
      timeout $(lim 120) "$q" bench --device cuda --strategy portable --precision $prec $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json \
        >> "$out/bench_decode.jsonl" 2>> "$out/run.log"
    done
  done
done
python3 - "$out/bench_decode.jsonl" <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]; t[(s["kv_seq"], r["precision"])].append((r["ms"], r["kernel"]))
for k in sorted(t):
    print(k, [round(x[0], 4) for x in t[k]], "min", round(min(x[0] for x in t[k]), 4), t[k][0][1])
for kv in sorted({k[0] for k in t}):
    f16 = min(x[0] for x in t.get((kv, "f16"), [(float("nan"),)]))
    for p in ("fp8-e4m3-head", "nvfp4-v4", "nvfp4-v4p16"):
        if (kv, p) in t:
            m = min(x[0] for x in t[(kv, p)]); print(f"kv {kv}: {p} {m:.4f} ms, f16 {f16:.4f} ms: {f16/m:.2f}x")
PY
tail -5 "$out/run.log"
# One archive: the device returns a limited number of files.
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
