#!/usr/bin/env bash
# Run ah: the K/V staging (KvLoads) on the packed-f16 and the f32-accumulating
# vector FMA kernels, the new hd-128 table tile (64 x 64 on 16 x 16 units), through WGSL and
# CUDA (bench_cuda, best of 3 loops); then quattn bench through WGSL for every f16 mode and
# torch SDPA in the same call; the wgpu selftest.
# BIN: quattn (--features peer-cubek), bench_cuda (quattn-cubecl --features cuda --example).
# Three calls: `run.sh OUT BIN 1` (WGSL bench, torch, WGSL sweeps), `run.sh OUT BIN 2` (CUDA
# sweep, wgpu selftest), `run.sh OUT BIN 3` (CUDA selftest).
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
for p in f16-2stage-pv16 f16-acc16-pv16 f16 f16-2stage f16-acc16 f16-pv16; do
  timeout 60 "$q" bench --device wgpu --precision $p --seqs 4096 --head-dims 64,128 --causal both --iters 10 --warmup 2 --json >> "$out/bench_vulkan.jsonl" 2>> "$out/run.log"; echo "rc $? ($p)"
done
python3 -c "
import json
for l in open('$out/bench_vulkan.jsonl'):
    d=json.loads(l); s=d['shape']; print(d['precision'] if 'precision' in d else '', d['kernel'], s['head_dim'], s['causal'], round(d['ms'],3), round(d['tflops'],1))
"
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096 --head-dims 64,128 > "$out/torch.jsonl" 2>> "$out/run.log"; echo "rc $?"; cut -c1-200 "$out/torch.jsonl"
F128=half_2s_pv16_bq64_bk64_t16x16,half_2s_pv16_bq64_bk32_t16x8,half_2s_pv16_bq32_bk64_t8x16,half_2s_pv16_bq16_bk64_t4x16,fma_vec_bq64_bk32_t16x8_sin
step sweep-wgsl-d128; timeout 200 "$bin/bench_cuda" wgpu --d 128 --filter $F128 --iters 10 2>/dev/null | cut -c1-175 | tee "$out/sweep_wgsl_d128.txt"
step sweep-wgsl-d64; timeout 100 "$bin/bench_cuda" wgpu --d 64 --filter half_2s_pv16_bq64_bk64_t16x16,half_2s_pv16_bq64_bk32_t16x8,fma_vec_bq64_bk32_t16x8_s --iters 10 2>/dev/null | cut -c1-175 | tee "$out/sweep_wgsl_d64.txt"
fi
if [ "$part" = 2 ]; then
step sweep-cuda; timeout 300 "$bin/bench_cuda" cuda --d 128 --filter half_2s_pv16_bq64_bk64_t16x16,half_2s_pv16_bq64_bk32_t16x8 --iters 20 2>/dev/null | cut -c1-175 | tee "$out/sweep_cuda.txt"
step selftest-wgpu; timeout 150 "$q" selftest --devices wgpu --quick --json > "$out/selftest_wgpu.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_wgpu.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_wgpu.jsonl" | head -3 | cut -c1-500
fi
if [ "$part" = 3 ]; then
step selftest-cuda; timeout 540 "$q" selftest --devices cuda --quick --json > "$out/selftest_cuda.jsonl" 2>> "$out/run.log"; echo "rc $?"; tail -1 "$out/selftest_cuda.jsonl"; grep -v '"pass"\|"skip"' "$out/selftest_cuda.jsonl" | head -3 | cut -c1-500
fi
step done
