#!/usr/bin/env bash
# FP8 wgmma on one H200 with the persistent hd 64 table variant (work items published under named barriers): the check of the table and
# other-scheme variants (f64, emulation, Vᵀ; persistent also on 2 CTAs) and their interleaved
# times, torch fp16 peers and the f16 / FP8 table kernels through quattn bench, the FP8 selftest,
# quattn run against f64, compute-sanitizer on the hd 64 table variant at a shape of 176 work
# items (more than one per CTA on 132 SMs).
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1 CUDARC_CUDA_VERSION=13000
end=$(( $(date +%s) + ${DEADLINE:-560} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
q=$bin/quattn
echo "== fp8 check"; QUATTN_FP8_CHECK_ONLY=n192_tma2_ps,w3_rs_tma3 timeout $(lim 150) "$bin/wgmma_fp8_check" > "$out/fp8_check.txt" 2>&1; echo rc $?
grep -E "FAIL|ALL|SOME" "$out/fp8_check.txt" | head -20
echo "== torch"; timeout $(lim 150) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,8192,16384 --head-dims 64,128 > "$out/torch.jsonl" 2> "$out/torch.log"; echo rc $?
echo "== bench"; timeout $(lim 150) "$q" bench --device cuda --precision f16,fp8-e4m3-head-pfp8 --seqs 4096,8192,16384 --head-dims 64,128 --causal both --iters 20 --json > "$out/bench_fp8.jsonl" 2>> "$out/run.log"; echo rc $?
echo "== selftest fp8"; timeout $(lim 90) "$q" selftest --devices cuda --only fp8 --json > "$out/selftest_fp8.jsonl" 2> "$out/selftest_fp8.log"; echo rc $?; tail -1 "$out/selftest_fp8.jsonl"; grep '"status":"fail"' "$out/selftest_fp8.jsonl" | cut -c1-400 | head -5
echo "== run vs f64"
for shape in "--batch 2 --heads 8 --seq 1000 --head-dim 64" "--batch 2 --heads 8 --kv-heads 2 --seq 777 --kv-seq 1500 --head-dim 64 --causal" "--batch 2 --heads 8 --kv-heads 2 --seq 2000 --kv-seq 2100 --head-dim 64 --causal" "--batch 1 --heads 8 --seq 1000 --head-dim 128 --causal"; do
  timeout $(lim 60) "$q" run --device cuda --precision fp8-e4m3-head-pfp8 $shape --json >> "$out/run.jsonl" 2>> "$out/run.log"
done
grep -o '"kernel":"[^"]*"\|"pass":[a-z]*\|"rel_l2":[0-9.e-]*\|"lse_max_abs":[0-9.e-]*' "$out/run.jsonl" | paste - - - - | head
echo "== sanitizer"
for tool in memcheck racecheck synccheck; do
  timeout $(lim 100) compute-sanitizer --tool $tool "$q" run --device cuda --precision fp8-e4m3-head-pfp8 --batch 2 --heads 8 --kv-heads 2 --seq 2000 --kv-seq 2100 --head-dim 64 --causal --iters 1 --no-check --json > "$out/sanitizer_$tool.txt" 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$out/sanitizer_$tool.txt" | head -2 | tr '\n' ' ') $(grep -o '"kernel":"[^"]*"' "$out/sanitizer_$tool.txt" | head -1)"
done
python3 - "$out" <<'PY'
import json, sys
o = sys.argv[1]
for f in ["torch.jsonl", "bench_fp8.jsonl"]:
    for l in open(f"{o}/{f}"):
        if l.startswith("{"):
            r = json.loads(l); s = r["shape"]
            print(f[:5], r["kernel"], s["head_dim"], s["seq"], s["causal"], round(r["tflops"], 1))
PY
grep -E "^d(64|128) s16k" "$out/fp8_check.txt" | cut -c1-200
echo "== bench round 2"; QUATTN_FP8_CHECK_ONLY=n192_tma2_ps,w3_rs_tma3 timeout $(lim 120) "$bin/wgmma_fp8_check" --bench-only > "$out/fp8_bench2.txt" 2>&1; echo rc $?
grep -E "^d(64|128) s" "$out/fp8_check.txt" | cut -c1-250
echo "-- round 2"; grep -E "^d(64|128) s" "$out/fp8_bench2.txt" | cut -c1-250
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
