#!/usr/bin/env bash
# Run ad: the final packed-f16 kernel (2-wide f16 accumulators, a*b+c, unrolled
# loops, 64 x 32 tile): selftest on CUDA and Vulkan (every precision, the f16-accumulating
# modes included), quattn bench through WGSL for every f16 mode, the same kernel through CUDA
# (bench_cuda), torch SDPA in the same call.
# BIN: quattn (--features peer-cubek), bench_cuda (quattn-cubecl --features cuda --example bench_cuda).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
step bench-wgsl
for p in f16 f16-2stage-pv16 f16-acc16-pv16 f16-2stage f16-acc16 f16-pv16; do
  timeout 60 "$q" bench --device wgpu --precision $p --seqs 4096 --head-dims 64,128 --causal both --iters 10 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? ($p)"
done
python3 -c "
import json
for l in open('$out/bench_vulkan.jsonl'):
    d=json.loads(l); s=d['shape']; print(d['kernel'], s['head_dim'], s['causal'], round(d['ms'],3), round(d['tflops'],1))
"
step cuda-half; timeout 90 "$bin/bench_cuda" cuda --d 128,64 --filter half_2s_pv16_bq64_bk32_t16x8 --iters 30 > "$out/half_cuda.txt" 2>> "$out/run.log"; echo "rc $?"; cut -c1-150 "$out/half_cuda.txt"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096 --head-dims 64,128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"; cut -c1-200 "$out/torch.jsonl"
step selftest-wgpu; timeout 150 "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_wgpu.jsonl" | head -3 | cut -c1-500
step selftest-cuda; timeout 200 "$q" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_cuda.jsonl" | head -3 | cut -c1-500
step done
