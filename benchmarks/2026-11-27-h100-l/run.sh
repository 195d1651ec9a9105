#!/usr/bin/env bash
# compute-sanitizer memcheck on the new kernels: the native decode modifier variants (dense and
# paged), the native varlen modifier variants (wgmma and HMMA), the portable paged decode.
# Usage: run.sh OUT BIN (BIN: score_mods, varlen, quattn of commit.txt).
set -u
out=$1; b=$2
mkdir -p $out
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qc8
cs="/usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > $out/gpu.csv
for t in cuda_decode::narrow_windows_and_rows_that_see_nothing cuda_decode::paged_decode_kernel_matches_the_reference_for_every_modifier; do
  timeout 200 $cs $b/score_mods $t --exact --nocapture --test-threads 1 > $out/memcheck_$t.txt 2>&1; echo "rc $? $t"; grep -E "ERROR SUMMARY|test result" $out/memcheck_$t.txt
done
t=cuda::native_varlen_modifiers_equal_each_sequence_alone
timeout 150 $cs $b/varlen $t --exact --nocapture --test-threads 1 > $out/memcheck_varlen.txt 2>&1; echo "rc $? $t"; grep -E "ERROR SUMMARY|test result" $out/memcheck_varlen.txt
i=0
for c in "--page-size 16 --batch 3 --heads 32 --kv-heads 8 --seq 1 --kv-seq 3000 --head-dim 128 --precision f16" "--page-size 16 --batch 2 --heads 16 --kv-heads 2 --seq 2 --kv-seq 1500 --head-dim 64 --precision f16 --causal"; do
  i=$((i+1))
  timeout 60 $cs $b/quattn run --device cuda --strategy portable $c --iters 1 > $out/memcheck_portable_paged_$i.txt 2>&1; echo "rc $? $c"; grep -E "ERROR SUMMARY|PASS|FAIL" $out/memcheck_portable_paged_$i.txt | head -3
done
