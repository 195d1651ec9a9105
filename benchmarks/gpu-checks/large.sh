#!/usr/bin/env bash
# Tensors above 2^31 elements on an H100 (CUDA 13 at /usr/local/cuda), run from the repository
# root in under two minutes:
#
#   bash benchmarks/gpu-checks/large.sh OUT BIN
#
# OUT: the output folder. BIN: the example binary (cargo build --release --example
# large_tensors; target/release/examples/large_tensors).
#
# examples/large_tensors.rs runs two problems through Session::run_cuda on device tensors,
# filled on the device, on the forced native wgmma f16, HMMA f16 and HMMA bf16 kernels:
#   q-long   1 x 32 heads (8 KV) x 600k query rows x 500 keys, hd 128, BHSD: Q and O 2.46e9
#            elements each
#   kv-long  2 x 32 heads (8 KV) x 256 query rows x 2.2M keys, hd 64, BSHD, causal: K and V
#            2.25e9 elements each
# and checks sampled rows (the last ones among them, past 2^31 elements) against f64 from the
# same inputs copied back. It also plans each case with Auto (must pick wgmma or HMMA) and with
# the portable FMA family forced (must be refused with TooLarge).
#
# Pass: large.jsonl has six lines with "passed":true, two with "auto_64bit_family":true, two
# with "refused_too_large":true, and ends with {"verdict":"PASS",...}; the script exits with
# the example's status. Each line gives the shape, the elements of every tensor, the largest
# sampled offsets, max |O - ref| (absolute and over max |ref|), max |LSE - ref|, and the time
# of one run (ms, TFLOP/s).
set -u
out=${1:-${OUT:?usage: large.sh OUT BIN}}
bin=${2:-${BIN:-target/release/examples/large_tensors}}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-large}
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv > "$out/gpu.csv" 2>&1
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
timeout 300 "$bin" > "$out/large.jsonl" 2> "$out/large.log"
rc=$?
cat "$out/large.jsonl"
echo "rc $rc"
exit $rc
