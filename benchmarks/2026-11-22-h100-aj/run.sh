#!/usr/bin/env bash
# Run aj: the final tree of the session. Part 1: quattn bench through WGSL for
# every f16 mode (table tiles, prefetched K/V, split stages where they fit) and torch SDPA in
# the same call, then the wgpu selftest. Part 2: the CUDA selftest.
# BIN: quattn (--features peer-cubek).
set -u
out=${1:?OUT}; bin=${2:?BIN}; part=${3:-1}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
if [ "$part" = 1 ]; then
step bench-wgsl
for p in f16-acc16-pv16 f16-2stage-pv16 f16 f16-2stage f16-acc16 f16-pv16; do
  timeout 60 "$q" bench --device wgpu --precision $p --seqs 4096 --head-dims 64,128 --causal both --iters 10 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? ($p)"
done
python3 -c "
import json
for l in open('$out/bench_vulkan.jsonl'):
    d=json.loads(l); s=d['shape']; print(d.get('precision',''), d['kernel'], s['head_dim'], s['causal'], round(d['ms'],3), round(d['tflops'],1))
"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096 --head-dims 64,128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"
python3 -c "
import json
for l in open('$out/torch.jsonl'):
    d=json.loads(l); s=d['shape']; print(d['kernel'], s['head_dim'], s.get('causal'), round(d['tflops'],1))
"
step selftest-wgpu; timeout 200 "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_wgpu.jsonl" | head -3 | cut -c1-500
fi
if [ "$part" = 2 ]; then
step selftest-cuda; timeout 560 "$q" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_cuda.jsonl" | head -3 | cut -c1-500
fi
step done
