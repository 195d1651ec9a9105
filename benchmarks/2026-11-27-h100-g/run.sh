#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp
# /tmp/q4: release quattn and the fp8_portable, nvfp4_portable test binaries
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $R/gpu.csv 2>&1
for i in 1 2; do
  timeout 60 /tmp/q4/fp8_portable decode --test-threads 1 > $R/test_fp8_portable_t1_$i.txt 2>&1; echo "fp8_portable t1 #$i rc $?"
done
timeout 60 /tmp/q4/fp8_portable --test-threads 2 > $R/test_fp8_portable_t2.txt 2>&1; echo "fp8_portable t2 rc $?"
timeout 90 /tmp/q4/nvfp4_portable --test-threads 2 > $R/test_nvfp4_portable.txt 2>&1; echo "nvfp4_portable rc $?"
timeout 100 /tmp/q4/quattn bench --device wgpu --strategy portable --precision f16,fp8-e4m3-head --seqs 32768 --tokens 262144 --width 4096 --head-dims 128 --q-len 1 --kv-heads 8 --causal non-causal --iters 20 --json > $R/bench_decode_wgpu32k.jsonl 2>> $R/bench.log; echo "rc $? wgpu 32k"
tar cJf $OUT/r.tar.xz -C $OUT r
grep -hE "test result|panicked|corrupted|^test .*FAILED" $R/test_*.txt | head -20
cut -c1-300 $R/bench_decode_wgpu32k.jsonl
