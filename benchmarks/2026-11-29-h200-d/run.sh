#!/usr/bin/env bash
# FP8 wgmma, the MAX_SKIP variants (branch fp8-max-skip) against the table variants on one H200:
# the check of each (f64, emulation) and their times, torch fp16 peers.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
end=$(( $(date +%s) + ${DEADLINE:-540} ))
lim() { local l=$(( end - $(date +%s) - 10 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
cp "$bin/commit.txt" "$out/"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv > "$out/gpu.csv" 2>&1
echo "== torch"; timeout $(lim 120) python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 8192,16384 --head-dims 64,128 > "$out/torch.jsonl" 2> "$out/torch.log"; echo rc $?
echo "== fp8 check"; QUATTN_FP8_CHECK_ONLY=_ms,d64_n128_w3_rs_tma2 timeout $(lim 330) "$bin/wgmma_fp8_check" > "$out/fp8_check.txt" 2>&1; echo rc $?
grep -E "FAIL|ALL|SOME" "$out/fp8_check.txt" | head -20
python3 - "$out" <<'PY'
import json, sys
o = sys.argv[1]
for l in open(f"{o}/torch.jsonl"):
    if l.startswith("{"):
        r = json.loads(l); s = r["shape"]
        print("torch", r["kernel"], s["head_dim"], s["seq"], s["causal"], round(r["tflops"], 1))
PY
grep -E "^d(64|128) s(8|16)k|regs" "$out/fp8_check.txt" | cut -c1-220
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
