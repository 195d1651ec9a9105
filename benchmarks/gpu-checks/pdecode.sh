#!/usr/bin/env bash
# The portable split-KV decode kernel (CubeCL, `--portable decode`) on an H100, in one device
# call: `quattn run` against the f64 reference on CUDA and on wgpu (Vulkan), forced and through
# the portable Auto, then `quattn bench` of the portable f16 path at the decode shapes (batch 8,
# 32 q heads over 8 KV heads, q_len 1, kv 8k and 32k, d 128) on both devices, next to the FMA
# kernel forced (the per-head path the decode kernel replaces).
#
#   benchmarks/gpu-checks/pdecode.sh OUT BIN      (from the repository root)
#
# BIN: folder with the release `quattn` (`cargo build --release -p quattn-demos --features
# peer-cubek`). Every step's limit is cut to what is left of DEADLINE seconds (default 170).
#
# Pass: every line of OUT/run.jsonl has "passed":true (summary.txt counts them; expected 13),
# and the bench lines of the decode kernel name `portable_decode` (summary.txt lists kernel,
# ms and K/V TB/s per line).
set -u
out=${1:?usage: pdecode.sh OUT BIN}
bin=${2:?usage: pdecode.sh OUT BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-pdecode}
end=$(( $(date +%s) + ${DEADLINE:-170} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1

step "quattn run: the decode kernel against f64, CUDA and wgpu"
cases=(
  "--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 32768 --head-dim 128 --precision f16"
  "--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128 --precision bf16"
  "--batch 2 --heads 32 --kv-heads 8 --seq 16 --kv-seq 8192 --head-dim 128 --precision f16 --causal"
  "--batch 3 --heads 16 --kv-heads 4 --seq 1 --kv-seq 3001 --head-dim 128 --precision f32 --layout bshd"
  "--batch 2 --heads 8 --kv-heads 1 --seq 8 --kv-seq 5000 --head-dim 64 --precision f16 --causal --layout bshd"
  "--batch 2 --heads 8 --kv-heads 2 --seq 3 --kv-seq 1500 --head-dim 128 --precision f16 --causal --layout bshd"
)
: > "$out/run.jsonl"
for dev in cuda wgpu; do
  for c in "${cases[@]}"; do
    # bf16 has no WGSL type: the wgpu runs skip it.
    if [ "$dev" = wgpu ] && [[ "$c" == *bf16* ]]; then continue; fi
    # shellcheck disable=SC2086
    timeout "$(lim 25)" "$q" run --device $dev --strategy portable --portable decode $c --iters 3 --json >> "$out/run.jsonl" 2>> "$out/run.log"
    echo "rc $? $dev forced $c"
  done
  # The portable Auto must pick it at the decode shape.
  # shellcheck disable=SC2086
  timeout "$(lim 25)" "$q" run --device $dev --strategy portable ${cases[0]} --iters 3 --json >> "$out/run.jsonl" 2>> "$out/run.log"
  echo "rc $? $dev auto ${cases[0]}"
done

step "quattn bench: the portable f16 path at the decode shapes, CUDA and wgpu"
: > "$out/bench.jsonl"
for dev in cuda wgpu; do
  for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
    for strat in "--strategy portable" "--strategy portable --portable fma"; do
      # shellcheck disable=SC2086
      timeout "$(lim 25)" "$q" bench --device $dev $strat --precision f16 $shape --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --json >> "$out/bench.jsonl" 2>> "$out/run.log"
      echo "rc $? $dev $strat $shape"
    done
  done
done

step summary
python3 - "$out" "$(dirname "$0")" > "$out/summary.txt" <<'PY'
import json, sys
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from jsonl import rows as read_rows
def rows(name):
    return read_rows(out, name)
runs = rows("run.jsonl")
ok = sum(1 for r in runs if (r.get("accuracy") or {}).get("passed"))
print(f"run: {ok}/{len(runs)} passed against f64 (expected 13)")
for r in runs:
    print(json.dumps({k: r.get(k) for k in ("device", "kernel", "shape", "accuracy")}))
print("bench:")
for r in rows("bench.jsonl"):
    print(json.dumps(r)[:600])
PY
cat "$out/summary.txt"
