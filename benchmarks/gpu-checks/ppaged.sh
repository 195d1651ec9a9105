#!/usr/bin/env bash
# The portable decode family on a paged KV cache, on an H100, in one device call: `quattn run
# --page-size` against the f64 reference on CUDA and on wgpu (Vulkan), decode and prefill shapes
# (more than 64 packed rows per KV head: row blocks), then `quattn bench` of the
# portable f16 decode at the issue's decode shape (batch 8, 32 q heads over 8 KV heads, q_len 1,
# hd 128; kv 32k and 8k) on the contiguous cache and on pages of 16, 64 and 256 keys. Then the
# device's read ceiling (torch: a sum over 4 GiB, read once) next to the native decode kernel and
# torch SDPA flash/cuDNN at kv 32k, for the native decode's ratio to its peers.
#
#   benchmarks/gpu-checks/ppaged.sh OUT BIN      (from the repository root)
#
# BIN: folder with the release `quattn` (`cargo build --release -p quattn-demos --features
# peer-cubek`). Every step's limit is cut to what is left of DEADLINE seconds (default 200).
#
# Pass: every line of OUT/run.jsonl has "passed":true (summary.txt counts them), the paged bench
# lines name `portable_decode`; summary.txt lists ms and K/V TB/s per line and each paged time
# against the contiguous one (target: within 10%).
set -u
out=${1:?usage: ppaged.sh OUT BIN}
bin=${2:?usage: ppaged.sh OUT BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-ppaged} PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${DEADLINE:-200} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
q=$bin/quattn
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,clocks.max.mem --format=csv > "$out/gpu.csv" 2>&1

step "quattn run --page-size: the portable decode family against f64, CUDA and wgpu"
cases=(
  "--page-size 16 --batch 4 --heads 32 --kv-heads 8 --seq 1 --kv-seq 5000 --head-dim 128 --precision f16"
  "--page-size 256 --batch 2 --heads 8 --kv-heads 2 --seq 8 --kv-seq 3001 --head-dim 64 --precision f16 --causal"
  "--page-size 64 --batch 3 --heads 16 --kv-heads 4 --seq 2 --kv-seq 777 --head-dim 128 --precision f32 --causal --layout bshd"
  "--page-size 32 --batch 2 --heads 32 --kv-heads 8 --seq 1 --kv-seq 40000 --head-dim 128 --precision bf16"
  "--page-size 64 --batch 2 --heads 8 --kv-heads 2 --seq 300 --kv-seq 1000 --head-dim 128 --precision f16 --causal"
  "--page-size 16 --batch 2 --heads 4 --kv-heads 1 --seq 100 --kv-seq 130 --head-dim 64 --precision f32"
)
: > "$out/run.jsonl"
for dev in cuda wgpu; do
  for c in "${cases[@]}"; do
    # bf16 has no WGSL type: the wgpu runs skip it.
    if [ "$dev" = wgpu ] && [[ "$c" == *bf16* ]]; then continue; fi
    # shellcheck disable=SC2086
    timeout "$(lim 25)" "$q" run --device $dev --strategy portable $c --iters 3 --json >> "$out/run.jsonl" 2>> "$out/run.log"
    echo "rc $? $dev $c"
  done
done

step "quattn bench: portable f16 decode, contiguous and paged, CUDA and wgpu"
: > "$out/bench.jsonl"
for dev in cuda wgpu; do
  for shape in "--seqs 32768 --tokens 262144" "--seqs 8192 --tokens 65536"; do
    for pages in "" "--page-size 16" "--page-size 64" "--page-size 256"; do
      # shellcheck disable=SC2086
      timeout "$(lim 30)" "$q" bench --device $dev --strategy portable --precision f16 $shape $pages --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> "$out/bench.jsonl" 2>> "$out/run.log"
      echo "rc $? $dev $shape $pages"
    done
  done
done

step "paged prefill (4 x 4096 positions, 16 q heads over 4 KV heads, causal): portable and native on pages of 64, the dense kernel"
for v in "--strategy portable --page-size 64" "--strategy auto --page-size 64" "--strategy auto"; do
  # shellcheck disable=SC2086
  timeout "$(lim 40)" "$q" bench --device cuda $v --precision f16 --seqs 4096 --tokens 16384 --width 2048 --head-dims 128 --kv-heads 4 --causal causal --iters 10 --json >> "$out/prefill.jsonl" 2>> "$out/run.log"
  echo "rc $? prefill $v"
done

step "the read ceiling, the native decode and torch SDPA at kv 32k (CUDA)"
# shellcheck disable=SC2086
timeout "$(lim 20)" "$q" bench --device cuda --strategy auto --precision f16 --seqs 32768 --tokens 262144 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 30 --json >> "$out/native.jsonl" 2>> "$out/run.log"; echo "rc $?"
# shellcheck disable=SC2086
timeout "$(lim 30)" python3 demos/peers/torch_sdpa.py --backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30 --seqs 32768 --tokens 262144 --q-len 1 >> "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
timeout "$(lim 30)" python3 - > "$out/read_ceiling.txt" 2>> "$out/run.log" <<'PY'
import torch
# 4 GiB of f16 read once per sum (the result is one number): bytes / time is the read rate.
x = torch.randn(1 << 31, dtype=torch.float16, device="cuda")
for _ in range(3):
    x.sum()
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(20):
    s.record(); x.sum(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort()
ms = ts[len(ts) // 2]
print(f"torch sum over {x.numel() * 2 / 2**30:.0f} GiB f16: median {ms:.3f} ms = {x.numel() * 2 / ms / 1e9:.3f} TB/s read")
PY
echo "rc $?"; cat "$out/read_ceiling.txt"

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
print(f"run: {ok}/{len(runs)} passed against f64 (expected 11)")
for r in runs:
    print(json.dumps({k: r.get(k) for k in ("device", "kernel", "shape", "accuracy")})[:400])
print("bench:")
for r in rows("bench.jsonl") + rows("prefill.jsonl") + rows("native.jsonl") + rows("torch.jsonl"):
    print(json.dumps(r)[:700])
PY
cat "$out/summary.txt"
