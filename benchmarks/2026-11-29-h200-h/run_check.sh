#!/usr/bin/env bash
# INT8 s8 wgmma (new3: descriptors from bases at hd 128): the check of every wgmma variant.
set -u
out=$1; bin=$2; mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache
cp "$bin/commit.txt" "$out/"
timeout 100 "$bin/int8_new3" --check-only --wgmma-only > "$out/int8_check_new3.txt" 2>&1; echo rc $?
grep -E "FAIL|ALL|SOME" "$out/int8_check_new3.txt" | head -5
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
