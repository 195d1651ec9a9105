#!/usr/bin/env bash
# Device call 2a: HMMA conditional rescale, INT8 IMMA check + bench, INT8 end to end vs torch.
set -u
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export QUATTN_CACHE_DIR=/tmp/qcache
L=$OUT/log.txt
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a $L; }
step hmma check; timeout 90 .dev/hmma_check --check-only > $OUT/hmma.txt 2>&1; echo "rc $?" >> $L
step hmma bench; QUATTN_SWEEP=128x4x64x32s,64x4x128x32s timeout 60 .dev/hmma_check --bench-only >> $OUT/hmma.txt 2>&1; echo "rc $?" >> $L
step int8 check; timeout 120 .dev/int8_check --check-only > $OUT/int8.txt 2>&1; echo "rc $?" >> $L
step int8 bench; timeout 120 .dev/int8_check --bench-only >> $OUT/int8.txt 2>&1; echo "rc $?" >> $L
step int8 sweep; QUATTN_SWEEP_INT8=128x8x64x16,128x4x64x32s,128x4x64x32p,128x8x128x16,64x4x64x32,64x4x128x32s timeout 120 .dev/int8_check --bench-only >> $OUT/int8.txt 2>&1; echo "rc $?" >> $L
step bench e2e; timeout 150 .dev/quattn bench --device cuda --precision int8,int8-warp,f16 --head-dims 64,128 --seqs 8192,16384 --causal non-causal --json > $OUT/bench.jsonl 2>> $OUT/err.txt; echo "rc $?" >> $L
step torch; timeout 100 python3 demos/peers/torch_sdpa.py --head-dims 64,128 --seqs 8192,16384 --causal non-causal --backends flash,cudnn > $OUT/torch.jsonl 2>> $OUT/err.txt; echo "rc $?" >> $L
step done
