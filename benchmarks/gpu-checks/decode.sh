#!/usr/bin/env bash
# Split-KV decode on the H100, in one device call: correctness against the f64 reference (the
# native family on its own, then through the facade with Auto and with the family forced), then
# the decode shapes of issue 17 timed next to torch SDPA (flash, cuDNN) and the wgmma kernel
# Auto used to pick, with a summary of TB/s and the targets.
#
#   OUT=/some/dir benchmarks/gpu-checks/decode.sh      (from the repository root)
#
# Expects CUDA 13 at /usr/local/cuda, torch for python3, and in .bin/decode/: `quattn`
# (`cargo build --release -p quattn-demos --features peer-cubek`), `decode_check`
# (`cargo build --release -p quattn-native --example decode_check`) and, when present,
# `torch_sdpa.py` (this tree's demos/peers/torch_sdpa.py, which has --q-len / --kv-heads).
# Every step's limit is cut to what is left of DEADLINE seconds (default 145).
#
# Pass: checks.txt ends with `ALL OK`, every line of run.jsonl has "passed":true (the summary
# counts them), the sanitizer steps print `rc 0`, and summary.txt says which targets hold (lines
# `target ... PASS|FAIL`). Steps run in order of importance: the native checks, the timed
# comparison with the peers, the facade checks, the native sweep, the sanitizer.
set -u
out=${OUT:?set OUT to the output folder}
bin=${BIN:-.bin/decode}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-decode} PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${DEADLINE:-145} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
q=$bin/quattn
torch_py=$bin/torch_sdpa.py; [ -f "$torch_py" ] || torch_py=demos/peers/torch_sdpa.py
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,clocks.max.mem --format=csv > "$out/gpu.csv" 2>&1

step "decode_check: every variant against f64 (1 split, the device's split, many splits)"
timeout "$(lim 45)" "$bin/decode_check" --check-only > "$out/checks.txt" 2>> "$out/run.log"; echo "rc $?"
grep -E "FAIL|ALL OK|SOME FAILED" "$out/checks.txt" | tail -5

step "quattn bench: decode shapes, Auto and the wgmma kernel"
dec="--device cuda --precision f16 --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30 --json"
: > "$out/bench.jsonl"
for strat in "--strategy auto" "--strategy native --native wgmma"; do
  # shellcheck disable=SC2086
  timeout "$(lim 15)" "$q" bench $strat $dec --seqs 8192 --tokens 65536 --q-len 1 >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $?"
  # shellcheck disable=SC2086
  timeout "$(lim 15)" "$q" bench $strat $dec --seqs 32768 --tokens 262144 --q-len 1 >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $?"
  # shellcheck disable=SC2086
  timeout "$(lim 15)" "$q" bench $strat $dec --seqs 32768 --tokens 262144 --q-len 16 >> "$out/bench.jsonl" 2>> "$out/run.log"; echo "rc $?"
done

step "torch SDPA at the same shapes"
tdec="--backends flash,cudnn --head-dims 128 --width 4096 --kv-heads 8 --causal non-causal --iters 30"
: > "$out/torch.jsonl"
# shellcheck disable=SC2086
timeout "$(lim 25)" python3 "$torch_py" $tdec --seqs 8192 --tokens 65536 --q-len 1 >> "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
# shellcheck disable=SC2086
timeout "$(lim 20)" python3 "$torch_py" $tdec --seqs 32768 --tokens 262144 --q-len 1 >> "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
# shellcheck disable=SC2086
timeout "$(lim 20)" python3 "$torch_py" $tdec --seqs 32768 --tokens 262144 --q-len 16 >> "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"

step "quattn run: Auto and --native decode against f64"
# Each line: one problem, checked against the f64 reference by `quattn run` (exit 1 on FAIL).
cases=(
  "--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128"
  "--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 32768 --head-dim 128"
  "--batch 2 --heads 32 --kv-heads 8 --seq 16 --kv-seq 8192 --head-dim 128"
  "--batch 3 --heads 16 --kv-heads 4 --seq 1 --kv-seq 3001 --head-dim 128 --layout bshd"
  "--batch 2 --heads 8 --kv-heads 2 --seq 7 --kv-seq 1000 --head-dim 128 --causal"
  "--batch 2 --heads 8 --kv-heads 1 --seq 8 --kv-seq 5000 --head-dim 64 --causal --layout bshd"
  "--batch 1 --heads 4 --kv-heads 1 --seq 12 --kv-seq 5 --head-dim 128 --causal"
  "--batch 4 --heads 8 --kv-heads 8 --seq 1 --kv-seq 2049 --head-dim 64"
  "--batch 8 --heads 32 --kv-heads 8 --seq 1 --kv-seq 8192 --head-dim 128 --precision bf16"
  "--batch 2 --heads 16 --kv-heads 2 --seq 4 --kv-seq 777 --head-dim 64 --precision bf16 --causal"
)
: > "$out/run.jsonl"
# Auto on every case (the summary shows it picked fwd_decode_*), the family forced on two.
for run in "auto|${cases[0]}" "auto|${cases[1]}" "auto|${cases[2]}" "auto|${cases[3]}" "auto|${cases[4]}" \
           "auto|${cases[5]}" "auto|${cases[6]}" "auto|${cases[7]}" "auto|${cases[8]}" "auto|${cases[9]}" \
           "native --native decode|${cases[1]}" "native --native decode|${cases[4]}"; do
  s=${run%%|*}; c=${run#*|}
  # shellcheck disable=SC2086
  timeout "$(lim 20)" "$q" run --device cuda --strategy $s $c --iters 3 --json >> "$out/run.jsonl" 2>> "$out/run.log"
  echo "rc $? --strategy $s $c"
done

step "decode_check: the native family at the decode shapes, split counts and pipelines"
QUATTN_DECODE_SWEEP=${SWEEP:-64x4,64x2,128x2} timeout "$(lim 30)" "$bin/decode_check" --bench-only > "$out/native_bench.txt" 2>> "$out/run.log"; echo "rc $?"
grep "chosen=true" "$out/native_bench.txt"

step "compute-sanitizer: memcheck and racecheck on a split decode (ragged, causal, BSHD) and the merge"
san=/usr/local/cuda/bin/compute-sanitizer
small="--batch 1 --heads 8 --kv-heads 2 --seq 3 --kv-seq 1500 --head-dim 128 --causal --layout bshd --iters 1"
: > "$out/sanitizer.txt"
for tool in memcheck racecheck; do
  echo "-- $tool" >> "$out/sanitizer.txt"
  # shellcheck disable=SC2086
  timeout "$(lim 30)" $san --tool $tool --error-exitcode 9 "$q" run --device cuda --strategy native --native decode $small >> "$out/sanitizer.txt" 2>&1
  echo "rc $? ($tool)" | tee -a "$out/sanitizer.txt"
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
print(f"run: {ok}/{len(runs)} passed against f64 (expected 12: 10 Auto, 2 forced)")
for r in runs:
    a = r.get("accuracy") or {}
    s = r["shape"]
    print(f"  {'PASS' if a.get('passed') else 'FAIL'} {r['kernel']:36} {r['strategy']:14} {r['precision']:5} b{s['batch']} h{s['heads']}/{s['kv_heads']} q{s['seq']} kv{s['kv_seq']} d{s['head_dim']}{' causal' if s['causal'] else ''} {s['layout']} rel_l2 {a.get('rel_l2', float('nan')):.2e} lse {a.get('lse_max_abs')}")
def tbs(r):
    s = r["shape"]
    return 2 * 2 * s["batch"] * s["kv_heads"] * s["kv_seq"] * s["head_dim"] / (r["ms"] * 1e-3) / 1e12
table = {}
for r in rows("bench.jsonl") + rows("torch.jsonl"):
    if r.get("ms") is None:
        continue
    s = r["shape"]
    key = (s["seq"], s["kv_seq"])
    name = r["kernel"]
    if name.startswith("fwd_decode"):
        name = "quattn-decode"
    elif name.startswith("fwd_wgmma"):
        name = "quattn-wgmma"
    prev = table.setdefault(key, {}).get(name)
    if prev is None or r["ms"] < prev[0]:
        table[key][name] = (r["ms"], tbs(r), r["kernel"])
print("\nshape (q_len, kv_len) | kernel | ms | TB/s of K+V")
for key in sorted(table):
    for name, (ms, t, k) in sorted(table[key].items(), key=lambda x: x[1][0]):
        print(f"  {key} {name:18} {ms:8.4f} ms {t:6.3f} TB/s  ({k})")
print()
def target(key, what, need):
    t = table.get(key, {})
    d = t.get("quattn-decode")
    peers = {k: v for k, v in t.items() if k.startswith("torch")}
    if d is None or not peers:
        print(f"target {key} {what}: MISSING (decode {d is not None}, peers {sorted(peers)})")
        return
    if what == "cudnn":
        ref = peers.get("torch-sdpa-cudnn")
        if ref is None:
            print(f"target {key} vs cudnn: MISSING")
            return
        ratio = ref[0] / d[0]
        print(f"target {key} >= {need}x cuDNN: {ratio:.3f}x -> {'PASS' if ratio >= need else 'FAIL'}")
        return
    best = min(peers.values())
    ratio = best[0] / d[0]
    print(f"target {key} >= {need}x faster peer ({best[2]}): {ratio:.3f}x, {d[1]:.3f} TB/s -> {'PASS' if ratio >= need else 'FAIL'}")
target((1, 32768), "peer", 1.05)
d = table.get((1, 32768), {}).get("quattn-decode")
if d:
    print(f"target (1, 32768) >= 2.8 TB/s: {d[1]:.3f} -> {'PASS' if d[1] >= 2.8 else 'FAIL'}")
target((1, 8192), "peer", 1.0)
target((16, 32768), "cudnn", 1.2)
PY
cat "$out/summary.txt"
step done
