#!/usr/bin/env bash
# Run k: s8 wgmma INT8 family check + bench; faster prepass end to end; selftest on CUDA; sanitizer on INT8 wgmma.
set -u
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
export QUATTN_CACHE_DIR=/tmp/qcache
L=$OUT/log.txt
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a $L; }
step int8 check; timeout 150 .dev/int8_check --check-only > $OUT/int8_check.txt 2>&1; echo "rc $?" | tee -a $L; grep -E "FAIL|ALL" $OUT/int8_check.txt | head -5
step int8 bench; timeout 120 .dev/int8_check --wgmma-only --bench-only > $OUT/int8_wgmma_bench.txt 2>&1; echo "rc $?" | tee -a $L
step e2e; timeout 150 .dev/quattn bench --device cuda --precision int8,int8-block-nosmooth,int8-thread --seqs 4096,8192,16384 --causal non-causal --json > $OUT/bench_int8.jsonl 2>> $OUT/err.txt; echo "rc $?" | tee -a $L
timeout 90 .dev/quattn bench --device cuda --strategy native --native int8-imma --precision int8 --seqs 8192,16384 --head-dims 128 --causal non-causal --json >> $OUT/bench_int8.jsonl 2>> $OUT/err.txt; echo "rc $?" | tee -a $L
step torch; timeout 60 python3 demos/peers/torch_sdpa.py --backends flash,cudnn --seqs 4096,8192,16384 --causal non-causal > $OUT/torch.jsonl 2>> $OUT/err.txt; echo "rc $?" | tee -a $L
step selftest; timeout 200 .dev/quattn selftest --devices cuda --json > $OUT/selftest.jsonl 2>> $OUT/err.txt; echo "rc $?" | tee -a $L; tail -1 $OUT/selftest.jsonl | tee -a $L
step sanitize
for tool in memcheck racecheck; do for cfg in "int8 64" "int8-thread 128" "int8-warp-nosmooth 128"; do set -- $cfg
  timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 .dev/quattn run --device cuda --precision $1 --head-dim $2 --batch 1 --heads 4 --kv-heads 2 --seq 200 --kv-seq 300 --causal --iters 1 >> $OUT/sanitizer.txt 2>&1; echo "rc $? ($tool $cfg)" | tee -a $OUT/sanitizer.txt $L
done; done
step done
