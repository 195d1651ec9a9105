#!/usr/bin/env bash
# Before/after the kernel registry and device-tensor API, in one device call: the same bench
# grid with the previous binary (quattn-before, commit 8a4002b) and this tree's (quattn), in
# alternating order, next to torch SDPA (flash, cuDNN) and cubek-attention.
#   benchmarks/2026-11-25-h100-a/run.sh OUT BIN     (BIN holds quattn-before and quattn, both
#   built with --features peer-cubek)
# Also the device-tensor path's host cost (`quattn bench --api-overhead`). The results are
# packed into OUT/a.tar.gz (one file to bring back).
set -u
out=${1:?OUT}; bin=${2:?BIN}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%H:%M:%S) $*"; }
# Every step's limit is cut to what is left of DEADLINE seconds (default 540), so the results
# are always packed before the device call's own limit.
end=$(( $(date +%s) + ${DEADLINE:-540} ))
lim() { local l=$(( end - $(date +%s) - 15 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
git log -1 --format=%H > "$out/commit.txt" 2>/dev/null || true
for b in before after after before; do
  q=$bin/quattn; [ $b = before ] && q=$bin/quattn-before
  step "native f16/bf16 ($b)"
  timeout $(lim 100) "$q" bench --device cuda --precision f16,bf16 --iters 20 --json >> "$out/bench_native_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
for b in before after; do
  q=$bin/quattn; [ $b = before ] && q=$bin/quattn-before
  step "int8 ($b)"
  timeout $(lim 80) "$q" bench --device cuda --precision int8 --seqs 8192,16384 --head-dims 128 --causal non-causal --iters 20 --json >> "$out/bench_int8_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
  step "portable ($b)"
  timeout $(lim 120) "$q" bench --device cuda --strategy portable --precision f16 --iters 10 --json >> "$out/bench_portable_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
for b in before after; do
  q=$bin/quattn; [ $b = before ] && q=$bin/quattn-before
  step "wgsl ($b)"; timeout $(lim 60) "$q" bench --device wgpu --precision f16,f16-acc16-pv16 --seqs 4096 --head-dims 128 --causal non-causal --iters 10 --warmup 2 --json >> "$out/bench_vulkan_$b.jsonl" 2>> "$out/run.log"; echo "rc $?"
done
step "cubek peer"
timeout $(lim 100) "$bin/quattn" bench --device cuda --strategy portable --precision f16 --seqs 4096 --iters 10 --peers --json > "$out/bench_peers.jsonl" 2>> "$out/run.log"; echo "rc $?"
step torch
timeout $(lim 100) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 1024,4096,16384 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
step api-overhead; timeout $(lim 60) "$bin/quattn" bench --api-overhead --iters 20 > "$out/api_overhead.json" 2>> "$out/run.log"; echo "rc $?"; cat "$out/api_overhead.json"
python3 - "$out" <<'PY'
import json, sys, glob, statistics
out = sys.argv[1]
def load(p):
    rows = {}
    for f in glob.glob(p):
        for l in open(f):
            d = json.loads(l)
            if d.get("ms") is None: continue
            s = d["shape"]
            k = (d["precision"], d["kernel"].endswith("(kernel only)"), s["head_dim"], s["seq"], s["causal"])
            rows.setdefault(k, []).append(d["ms"])
    return rows
for fam in ["native", "int8", "portable", "vulkan"]:
    b, a = load(f"{out}/bench_{fam}_before.jsonl"), load(f"{out}/bench_{fam}_after.jsonl")
    worst = 0
    for k in sorted(set(a) & set(b)):
        r = min(a[k]) / min(b[k])
        worst = max(worst, r)
        print(fam, k, "before %.4f after %.4f ratio %.3f" % (min(b[k]), min(a[k]), r))
    print(fam, "worst after/before time ratio %.3f over %d rows" % (worst, len(set(a) & set(b))))
PY
tar -czf "$out.tar.gz" -C "$out" . && rm -rf "$out" && mkdir -p "$out" && mv "$out.tar.gz" "$out/a.tar.gz"
step done
