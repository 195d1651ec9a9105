#!/usr/bin/env bash
# Run l: after the review commits (shared kernel loader, V/O/LSE addresses cached at upload), one device call.
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
timeout 250 .dev/quattn selftest --devices cuda --quick > $OUT/selftest_quick.txt 2>&1
timeout 120 .dev/quattn bench --device cuda --precision int8,f16 --head-dims 128 --seqs 8192 --causal non-causal
