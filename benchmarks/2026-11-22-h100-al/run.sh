#!/usr/bin/env bash
# Run al: the tree of commit cb865cc (Q and direct K/V loads now the guarded gather
# plus the scatter): quattn bench through WGSL for the two f16-P·V modes and the f32-accumulating
# default at hd 128 / 64, and the wgpu selftest.
# BIN: quattn (--features peer-cubek).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step bench-wgsl
for p in f16-acc16-pv16 f16-2stage-pv16 f16; do
  timeout 60 "$q" bench --device wgpu --precision $p --seqs 4096 --head-dims 64,128 --causal both --iters 10 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? ($p)"
done
python3 -c "
import json
for l in open('$out/bench_vulkan.jsonl'):
    d=json.loads(l); s=d['shape']; print(d.get('precision',''), d['kernel'], s['head_dim'], s['causal'], round(d['ms'],3), round(d['tflops'],1))
"
step selftest-wgpu; timeout 200 "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_wgpu.jsonl" | head -3 | cut -c1-500
step done
