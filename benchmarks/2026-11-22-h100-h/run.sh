#!/usr/bin/env bash
# Device call 3: selftest (cuda: Auto/native, Portable, emulation; INT8 everywhere), INT8 end to end vs torch, ncu of the portable cmma kernel.
set -u
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export QUATTN_CACHE_DIR=/tmp/qcache
L=$OUT/log.txt
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a $L; }
step int8 e2e; timeout 120 .dev/quattn bench --device cuda --precision int8,int8-warp,int8-thread,int8-block-nosmooth --head-dims 128 --seqs 8192,16384 --causal non-causal --json > $OUT/bench_int8.jsonl 2> $OUT/err.txt; echo "rc $?" >> $L
step int8 portable; timeout 100 .dev/quattn bench --device cuda --strategy portable --precision int8 --head-dims 128 --seqs 8192 --causal non-causal --iters 5 --json >> $OUT/bench_int8.jsonl 2>> $OUT/err.txt; echo "rc $?" >> $L
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --head-dims 128 --seqs 8192,16384 --causal non-causal --backends flash,cudnn > $OUT/torch.jsonl 2>> $OUT/err.txt; echo "rc $?" >> $L
step selftest; timeout 330 .dev/quattn selftest --devices cuda,wgpu --json > $OUT/selftest.jsonl 2>> $OUT/err.txt; echo "rc $?" >> $L; tail -1 $OUT/selftest.jsonl >> $L
step ncu cmma; timeout 100 /usr/local/cuda/bin/ncu --clock-control none --launch-skip 2 --launch-count 1 --set full .dev/quattn bench --device cuda --strategy portable --precision f16 --head-dims 128 --seqs 4096 --causal non-causal --warmup 2 --iters 3 > $OUT/cmma_ncu.txt 2>&1; echo "rc $?" >> $L
step done
