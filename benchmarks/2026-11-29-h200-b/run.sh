#!/usr/bin/env bash
# One H200: (1) FP8 wgmma table kernels (quattn-main) against torch fp16 flash/cuDNN at hd 64/128,
# seq 4k-16k, compute-sanitizer on the hd 64 FP8 table variant; (2) the 4-bit MMA decode kernel's
# shared-memory stage (quattn, decode build): its CUDA test, compute-sanitizer, runs against f64,
# and the decode shape (q_len 1, GQA 32/8, hd 128, batch 8) at kv 32k / 8k in both prefetch forms
# and cube counts (QUATTN_EXP_FP4_STAGE / QUATTN_EXP_FP4_CUBES), f16 and FP8 alongside.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${DEADLINE:-570} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin"/commit*.txt "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
qm=$bin/quattn-main; q=$bin/quattn
mkdir -p "$out/fp8" "$out/decode"
echo "== fp8: torch"; timeout $(lim 120) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,8192,16384 --head-dims 64,128 > "$out/fp8/torch.jsonl" 2> "$out/fp8/torch.log"; echo rc $?
echo "== fp8: bench"; timeout $(lim 120) "$qm" bench --device cuda --precision f16,fp8-e4m3-head-pfp8 --seqs 4096,8192,16384 --head-dims 64,128 --causal both --iters 20 --json > "$out/fp8/bench_fp8.jsonl" 2>> "$out/fp8/run.log"; echo rc $?
for tool in memcheck racecheck; do
  timeout $(lim 60) compute-sanitizer --tool $tool "$qm" run --device cuda --precision fp8-e4m3-head-pfp8 --batch 1 --heads 4 --kv-heads 2 --seq 300 --kv-seq 517 --head-dim 64 --causal --iters 1 --no-check --json > "$out/fp8/sanitizer_$tool.txt" 2>&1
  echo "fp8 $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/fp8/sanitizer_$tool.txt" | head -1) $(grep -o '"kernel":"[^"]*"' "$out/fp8/sanitizer_$tool.txt" | head -1)"
done
echo "== decode: test"
timeout $(lim 120) "$bin/nvfp4_portable" cuda_ --test-threads 1 --nocapture > "$out/decode/test_nvfp4_portable.txt" 2>&1; echo "rc $?"
grep -E "^test |test result|panicked" "$out/decode/test_nvfp4_portable.txt" | cut -c1-300 | head -8
for prec in nvfp4-v4p16 nvfp4-v4; do for tool in memcheck racecheck; do
  timeout $(lim 60) compute-sanitizer --tool $tool "$q" run --device cuda --strategy portable --precision $prec --batch 2 --heads 8 --kv-heads 2 --seq 2 --kv-seq 3333 --head-dim 128 --causal --iters 1 --no-check --json > "$out/decode/sanitizer_${prec}_$tool.txt" 2>&1
  echo "$prec $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/decode/sanitizer_${prec}_$tool.txt" | head -1) $(grep -o '"kernel":"[^"]*"' "$out/decode/sanitizer_${prec}_$tool.txt" | head -1)"
done; done
for prec in nvfp4-v4p16 nvfp4-v4; do
  for shape in "--batch 2 --heads 8 --kv-heads 2 --seq 1 --kv-seq 3333 --head-dim 128" "--batch 2 --heads 8 --kv-heads 2 --seq 2 --kv-seq 1500 --head-dim 128 --causal" "--batch 1 --heads 32 --kv-heads 8 --seq 1 --kv-seq 32768 --head-dim 128"; do
    timeout $(lim 60) "$q" run --device cuda --strategy portable --precision $prec $shape --json >> "$out/decode/run.jsonl" 2>> "$out/decode/run.log"
  done
done
grep -o '"kernel":"[^"]*"\|"passed":[a-z]*' "$out/decode/run.jsonl" | paste - - | sort | uniq -c
echo "== decode: bench"
bench() { # label env... -- precision seqs tokens
  local label=$1; shift
  env "$@" timeout $(lim 60) "$q" bench --device cuda --strategy portable --precision $P --seqs $S --tokens $T --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json 2>> "$out/decode/run.log" | sed "s/^{/{\"form\":\"$label\",/" >> "$out/decode/bench_decode.jsonl"
}
for r in 1 2; do
  for ST in "32768 262144" "8192 65536"; do
    set -- $ST; S=$1; T=$2
    P=f16 bench base X=1; P=fp8-e4m3-head bench base X=1
    for P in nvfp4-v4p16 nvfp4-v4; do
      bench regs QUATTN_EXP_FP4_STAGE=regs
      bench smem3 QUATTN_EXP_FP4_STAGE=smem QUATTN_EXP_FP4_CUBES=3
      bench smem4 QUATTN_EXP_FP4_STAGE=smem QUATTN_EXP_FP4_CUBES=4
    done
  done
done
python3 - "$out/decode/bench_decode.jsonl" <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); t[(r["shape"]["kv_seq"], r["precision"], r["form"])].append(r["ms"])
for kv in sorted({k[0] for k in t}):
    f16 = min(t.get((kv, "f16", "base"), [float("nan")]))
    for k in sorted(k for k in t if k[0] == kv):
        m = min(t[k]); print(f"kv {kv} {k[1]:14} {k[2]:6} {[round(x,4) for x in t[k]]} min {m:.4f} ms  {f16/m:.2f}x f16")
PY
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
