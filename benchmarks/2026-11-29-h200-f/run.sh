#!/usr/bin/env bash
# INT8 s8 wgmma kernels with descriptors from per-loop bases (new) against per-wgmma descriptor
# arithmetic (old) on one H200: the check of every wgmma INT8 variant (new), kernel-only times
# alternating old/new, the product path (quattn run against f64, FP8 selftest) and
# compute-sanitizer on the new build.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${DEADLINE:-560} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
q=$bin/quattn
echo "== int8 check new"; timeout $(lim 120) "$bin/int8_new" --check-only --wgmma-only > "$out/int8_check_new.txt" 2>&1; echo rc $?; grep -cE "PASS|ok" "$out/int8_check_new.txt"; grep -E "FAIL|ALL|SOME" "$out/int8_check_new.txt" | head -5
for r in 1 2; do for b in old new; do
  echo "== int8 bench $b $r"; timeout $(lim 80) "$bin/int8_$b" --bench-only --wgmma-only > "$out/int8_bench_${b}_$r.txt" 2>&1; echo rc $?
done; done
echo "== fp8 selftest"; timeout $(lim 90) "$q" selftest --devices cuda --only fp8 --json > "$out/selftest_fp8.jsonl" 2> "$out/selftest_fp8.log"; echo rc $?; tail -1 "$out/selftest_fp8.jsonl" | cut -c1-300
echo "== run vs f64"
for prec in int8-block-pvfp8 int8-thread-pvfp8 int8 fp8-e4m3-head-pfp8; do
  for shape in "--batch 2 --heads 8 --kv-heads 2 --seq 777 --kv-seq 1500 --head-dim 128 --causal" "--batch 1 --heads 4 --seq 4096 --head-dim 64"; do
    timeout $(lim 60) "$q" run --device cuda --precision $prec $shape --json >> "$out/run.jsonl" 2>> "$out/run.log"
  done
done
grep -o '"kernel":"[^"]*"\|"pass":[a-z]*\|"rel_l2":[0-9.e-]*' "$out/run.jsonl" | paste - - - | head -12
echo "== sanitizer"
for prec in int8-block-pvfp8 int8; do for tool in memcheck racecheck; do
  timeout $(lim 80) compute-sanitizer --tool $tool "$q" run --device cuda --precision $prec --batch 1 --heads 4 --kv-heads 2 --seq 300 --kv-seq 517 --head-dim 128 --causal --iters 1 --no-check --json > "$out/sanitizer_${prec}_$tool.txt" 2>&1
  echo "$prec $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_${prec}_$tool.txt" | head -1) $(grep -o '"kernel":"[^"]*"' "$out/sanitizer_${prec}_$tool.txt" | head -1)"
done; done
echo "== bench"; timeout $(lim 100) "$q" bench --device cuda --precision int8,int8-block-pvfp8 --seqs 8192,16384 --head-dims 128 --causal both --iters 20 --json > "$out/bench_int8.jsonl" 2>> "$out/run.log"; echo rc $?
python3 - "$out" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/bench_int8.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]
        print(r["kernel"], r.get("precision"), s["head_dim"], s["seq"], s["causal"], round(r["tflops"], 1))
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
