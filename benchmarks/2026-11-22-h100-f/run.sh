#!/usr/bin/env bash
# Device call 1: confirm the last commit, profile the hd128 HMMA kernel and the portable cmma kernel.
set -u
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
export QUATTN_CACHE_DIR=/tmp/qcache
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
L=$OUT/log.txt
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a $L; }
step gpu; nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv >> $L
step selftest
timeout 240 .dev/quattn selftest --devices cuda,wgpu > $OUT/selftest.txt 2>&1; echo "rc $?" >> $L; tail -3 $OUT/selftest.txt >> $L
step hmma_check
timeout 120 .dev/hmma_check --check-only > $OUT/hmma.txt 2>&1; echo "rc $?" >> $L
for i in 1 2; do QUATTN_SWEEP=128x4x64x32s,64x4x128x32s timeout 60 .dev/hmma_check --bench-only >> $OUT/hmma.txt 2>&1; done
step ncu hmma $NCU
QUATTN_SWEEP=128x4x64x32s timeout 200 $NCU --clock-control none -k regex:fwd_hmma --launch-skip 4 --launch-count 1 --set full --import-source no -o $OUT/hd128 .dev/hmma_check --bench-only > $OUT/ncu_run.txt 2>&1; echo "rc $?" >> $L
$NCU -i $OUT/hd128.ncu-rep --page details > $OUT/hd128_details.txt 2>&1
$NCU -i $OUT/hd128.ncu-rep --page source --print-source sass --csv > $OUT/hd128_sass.csv 2>&1
step ncu cmma
timeout 150 $NCU --clock-control none --launch-skip 6 --launch-count 1 --set full .dev/quattn bench --device cuda --strategy portable --precision f16 --head-dims 128 --seqs 4096 --causal non-causal --warmup 2 --iters 3 > $OUT/cmma_ncu.txt 2>&1; echo "rc $?" >> $L
step done
ls -la $OUT >> $L
