#!/usr/bin/env bash
# Variable-length batches on an NVIDIA GPU, in one device call:
# 1. the native varlen kernels' own GPU test (every sequence against an f64 loop, canary rows);
# 2. `quattn run --varlen` against the f64 reference: native wgmma and HMMA, the portable
#    kernel on CUDA and Vulkan, f16/bf16, causal and not, GQA, empty and one-token sequences;
# 3. compute-sanitizer memcheck of the native varlen kernels;
# 4. `quattn bench`: 32 causal sequences of lengths drawn from 128..8192 (hd 128, f16, 16
#    heads) packed, next to the dense kernel at their mean length (batch 32) in the same call.
#
#   benchmarks/gpu-checks/varlen.sh OUT BIN      (from the repository root)
#
# BIN: folder with the release `quattn` and the `varlen_gpu` native test binary. Every step's
# limit is cut to what is left of DEADLINE seconds (default 200).
#
# Pass: every line of OUT/run.jsonl has "passed":true; varlen_gpu.log ends in "test result: ok";
# memcheck.log reports 0 errors; bench.jsonl holds the packed and the dense rows (TFLOP/s on
# real tokens).
set -u
out=${1:?usage: varlen.sh OUT BIN}
bin=${2:?usage: varlen.sh OUT BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-varlen}
end=$(( $(date +%s) + ${DEADLINE:-200} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1

step "native varlen kernels' GPU test"
if [ -x "$bin/varlen_gpu" ]; then
  timeout "$(lim 90)" "$bin/varlen_gpu" --nocapture > "$out/varlen_gpu.log" 2>&1
  echo "rc $? varlen_gpu"
fi

step "quattn run --varlen against f64"
cases=(
  "--strategy native --native wgmma --precision f16 --heads 16 --kv-heads 4 --head-dim 128 --causal --varlen 1000,1,0,257,64,3000"
  "--strategy native --native wgmma --precision f16 --heads 8 --head-dim 64 --varlen 513,77,2048,5"
  "--strategy native --native hmma --precision bf16 --heads 8 --kv-heads 2 --head-dim 128 --causal --varlen 700,1,129,2500"
  "--strategy native --native hmma --precision f16 --heads 4 --head-dim 64 --varlen 33,0,1025"
  "--strategy auto --precision f16 --heads 16 --kv-heads 8 --head-dim 128 --causal --varlen 4096,128,8000,1"
  "--strategy portable --precision f16 --heads 8 --kv-heads 2 --head-dim 128 --causal --varlen 700,1,0,129,1500"
)
: > "$out/run.jsonl"
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  timeout "$(lim 40)" "$q" run --device cuda $c --iters 3 --json >> "$out/run.jsonl" 2>> "$out/run.log"
  echo "rc $? cuda $c"
done
# shellcheck disable=SC2086
timeout "$(lim 40)" "$q" run --device wgpu --strategy portable --precision f16 --heads 8 --kv-heads 2 --head-dim 64 --causal --varlen 300,1,0,77,640 --iters 3 --json >> "$out/run.jsonl" 2>> "$out/run.log"
echo "rc $? wgpu portable"

step "compute-sanitizer memcheck"
if command -v compute-sanitizer >/dev/null; then
  for s in "native --native wgmma --precision f16 --head-dim 128" "native --native hmma --precision bf16 --head-dim 64"; do
    # shellcheck disable=SC2086
    timeout "$(lim 60)" compute-sanitizer --tool memcheck --error-exitcode 9 "$q" run --device cuda --strategy $s --heads 4 --kv-heads 2 --causal --varlen 300,1,0,190,65 --iters 1 >> "$out/memcheck.log" 2>&1
    echo "rc $? memcheck $s"
  done
fi

step "quattn bench: packed vs dense at the mean length"
lens=$(python3 -c "import random; random.seed(17); print(','.join(str(random.randint(128, 8192)) for _ in range(32)))")
mean=$(python3 -c "l=[int(x) for x in '$lens'.split(',')]; print(round(sum(l)/len(l)))")
echo "$lens" > "$out/lens.txt"
: > "$out/bench.jsonl"
timeout "$(lim 60)" "$q" bench --device cuda --precision f16 --head-dims 128 --width 2048 --causal causal --varlen "$lens" --json >> "$out/bench.jsonl" 2>> "$out/run.log"
echo "rc $? bench varlen"
timeout "$(lim 60)" "$q" bench --device cuda --precision f16 --head-dims 128 --width 2048 --causal causal --seqs "$mean" --tokens $(( mean * 32 )) --json >> "$out/bench.jsonl" 2>> "$out/run.log"
echo "rc $? bench dense mean $mean"
timeout "$(lim 60)" "$q" bench --device cuda --precision f16 --head-dims 128 --width 2048 --causal causal --varlen "$lens" --json >> "$out/bench.jsonl" 2>> "$out/run.log"
echo "rc $? bench varlen again"

step "summary"
{
  echo "run: $(grep -c '"passed":true' "$out/run.jsonl") passed of $(wc -l < "$out/run.jsonl")"
  grep -h "test result" "$out/varlen_gpu.log" 2>/dev/null
  grep -h "ERROR SUMMARY" "$out/memcheck.log" 2>/dev/null
  python3 - "$out/bench.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    s = r["shape"]
    print(r.get("kernel"), "varlen" if s.get("varlen") else f"dense b{s['batch']} s{s['seq']}", r.get("ms"), r.get("tflops"), r.get("skipped") or "")
EOF
} > "$out/summary.txt"
cat "$out/summary.txt"
