#!/usr/bin/env bash
# Run t: the TMA INT8 kernel's accuracy with outlier K channels (issue #5's case) and
# compute-sanitizer on it; the SPIR-V timing discrepancy of run r (CubeCL wgpu timestamps vs the
# host clock) looked at with nsys's Vulkan GPU trace.
# BIN: quattn (--features peer-cubek), quattn-spirv (--features spirv), bench_spirv
# (`cargo build --release -p quattn-cubecl --features cuda,spirv --example bench_cuda`).
set -u
out=${1:?OUT}; bin=${2:?BIN}; q=$bin/quattn
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=/usr/local/cuda XDG_RUNTIME_DIR=/tmp QUATTN_CACHE_DIR=/tmp/qcache PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/gpu.csv" 2>&1
step accuracy
for p in int8 int8-block-nosmooth int8-warp int8-warp-nosmooth int8-thread int8-thread-nosmooth f16; do for d in 64 128; do
  timeout 60 "$q" run --device cuda --precision $p --head-dim $d --seq 1024 --heads 8 --batch 2 --k-outlier-channels --json >> "$out/acc_outlier.jsonl" 2>> "$out/run.log"
done; done
echo "rc $? lines $(wc -l < "$out/acc_outlier.jsonl")"
step sanitize; san=/usr/local/cuda/bin/compute-sanitizer
small="--batch 1 --heads 4 --kv-heads 2 --seq 200 --kv-seq 300 --causal --iters 1"
for spec in "memcheck int8 64" "memcheck int8-thread 128" "racecheck int8-thread 128" "racecheck int8 64" "synccheck int8-warp 128" "memcheck int8-warp-nosmooth 128"; do
  set -- $spec
  echo "-- $spec" >> "$out/sanitizer.txt"
  timeout 90 $san --tool $1 --error-exitcode 9 "$q" run --device cuda --precision $2 --head-dim $3 $small >> "$out/sanitizer.txt" 2>&1
  echo "rc $? ($spec)" | tee -a "$out/sanitizer.txt"
done
step spirv-timing
for f in .gl/*.deb; do dpkg -x $f / 2>/dev/null; done; ldconfig
s=$out/spirv_timing.txt
echo "-- quattn-spirv bench (CubeCL timestamps)" >> $s
timeout 120 "$bin/quattn-spirv" bench --device wgpu-spirv --precision f16 --seqs 4096 --head-dims 128 --causal non-causal >> $s 2>&1; echo "rc $?"
for it in 1 5 20; do
  echo "-- bench_spirv wgpu --iters $it (host clock)" >> $s
  timeout 120 "$bin/bench_spirv" wgpu --filter cmma --d 128 --iters $it >> $s 2>&1; echo "rc $? (iters $it)"
done
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${nsys:-none}" | tee -a $s
if [ -n "$nsys" ]; then
  timeout 180 $nsys profile -t vulkan --vulkan-gpu-workload=individual -o /tmp/sp -f true "$bin/bench_spirv" wgpu --filter cmma --d 128 --iters 10 >> $s 2>&1; echo "rc $? (nsys bench_spirv)"
  timeout 120 $nsys profile -t vulkan --vulkan-gpu-workload=individual -o /tmp/sq -f true "$bin/quattn-spirv" bench --device wgpu-spirv --precision f16 --seqs 4096 --head-dims 128 --causal non-causal >> $s 2>&1; echo "rc $? (nsys quattn-spirv)"
  for t in sp sq; do
    $nsys export --type sqlite -o /tmp/$t.sqlite -f true /tmp/$t.nsys-rep >> $s 2>&1
    echo "== $t" >> "$out/nsys_vulkan.txt"; python3 benchmarks/2026-11-22-h100-t/nsys_vulkan.py /tmp/$t.sqlite >> "$out/nsys_vulkan.txt" 2>&1
  done
  grep -E "durations|largest|rows" "$out/nsys_vulkan.txt" | cut -c1-400 | head -20
fi
grep -E "cmma|TFLOP|fwd_portable" $s | head -20
step done
