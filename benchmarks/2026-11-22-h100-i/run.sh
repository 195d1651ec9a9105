#!/usr/bin/env bash
# Device call 4: wgmma prototype check + bench; INT8 end to end with the cheaper prepass; INT8 accuracy with outlier K channels.
set -u
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export QUATTN_CACHE_DIR=/tmp/qcache
L=$OUT/log.txt
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a $L; }
step wgmma check; timeout 120 .dev/wgmma_check --check-only > $OUT/wgmma.txt 2>&1; echo "rc $?" >> $L
step wgmma bench; timeout 120 .dev/wgmma_check --bench-only >> $OUT/wgmma.txt 2>&1; echo "rc $?" >> $L
step int8 e2e; timeout 120 .dev/quattn bench --device cuda --precision int8,int8-block-nosmooth --head-dims 128 --seqs 8192,16384 --causal non-causal --json > $OUT/bench_int8.jsonl 2> $OUT/err.txt; echo "rc $?" >> $L
step accuracy
for p in int8 int8-block-nosmooth int8-warp int8-warp-nosmooth int8-thread int8-thread-nosmooth f16; do for d in 64 128; do
  for s in cuda; do timeout 60 .dev/quattn run --device $s --precision $p --head-dim $d --seq 1024 --heads 8 --batch 2 --k-outlier-channels --json >> $OUT/acc_outlier.jsonl 2>> $OUT/err.txt; done
  timeout 60 .dev/quattn run --device cuda --strategy portable --precision $p --head-dim $d --seq 1024 --heads 8 --batch 2 --k-outlier-channels --json >> $OUT/acc_outlier.jsonl 2>> $OUT/err.txt
done; done
echo "rc $?" >> $L
step done
