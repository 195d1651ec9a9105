#!/usr/bin/env bash
# The native INT8 and FP8 quantization prepasses on an H100 or H200 (CUDA 13 at /usr/local/cuda),
# from the repository root, in under four minutes:
#
#   OUT=DIR [BIN=.bin/prepass] [DEADLINE=230] bash benchmarks/gpu-checks/prepass.sh
#
# Binaries in $BIN (default .bin/prepass), release builds of this tree:
#   int8_prepass_bench  cargo build --release -p quattn-native --example int8_prepass_bench
#   fp8_prepass_bench   cargo build --release -p quattn-native --example fp8_prepass_bench
#   quattn              cargo build --release -p quattn-demos --features peer-cubek
# and, if present, $BIN/cache/ (an NVRTC kernel cache of the same sources, copied to a writable
# place; without it every kernel compiles at first use, which the step limits allow for).
# Every step's limit is cut to what is left of DEADLINE seconds.
#
# Steps, in order of importance, and what passing looks like:
#   int8 bench   the INT8 prepass alone at b1 s16384, b4 s4096, b16 s1024 (16 heads, hd 128)
#                and b2 s8192 h32/8 hd 64 BSHD, for the f16 P·V prepasses (per block, per block
#                smoothed, per thread smoothed) and the e4m3 P·V one (V to e4m3 Vᵀ); with stats
#                its two launches (stats, then quantize) together: `us`, and its ratio to min
#                bytes (inputs read once, codes written once) and to moved bytes (plus the stats
#                launch's second read of K / V) at 3 TB/s. Target: ratio_to_min_bytes_at_3tbs
#                <= 1.5. Exit status 0 = every launch left its tickets zero.
#   fp8 bench    the FP8 prepass alone (f16 -> e4m3) at b16 s1024, b4 s4096, b1 s16384 (hd 128),
#                b2 s8192 hd 64 BSHD, a decode row (kv 32768, 8 KV heads) and b1 h8 s2048, per
#                head and per tensor: the amax and quantize passes for slabs of L2/2, the whole
#                call ("one"), L2/4 and L2, and the one-read pass ("onepass", one persistent
#                launch; where every descale group fits the co-resident CTAs, which is where the
#                default path takes it: field "auto"). `x model` = time over its bytes (input
#                read once, codes written once) at 3 TB/s. Target: x model <= 1.5 on the
#                per-head one-read rows. Exit status 0 = every variant gave the codes and
#                descales of the L2/2 slabs and left the scratch counters zero.
#   selftest     `quattn selftest --only int8-prepass` (every granularity, smoothing on and off,
#                s8 wgmma / IMMA / e4m3 P·V: codes, scales, mean, LSE shift and e4m3 Vᵀ against
#                `codec::int8` bit for bit) and `--only fp8` (the FP8 prepass against
#                `codec::fp8_scaled` bit for bit, a multi-MB problem, the device-tensor entry
#                points). Pass: each last line says "0 failed".
#   e2e bench    with time left, `quattn bench` int8 and int8-block-pvfp8 rows (end to end and
#                kernel only: their difference is the prepass inside the facade) at seq 1k, 4k
#                and 16k (batch·seq 16384), hd 128, non-causal.
# summary.txt collects the target lines.
set -u
out=${OUT:?set OUT to the output folder}
bin=${BIN:-.bin/prepass}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} QUATTN_CACHE_DIR=${QUATTN_CACHE_DIR:-/tmp/qcache-prepass}
mkdir -p "$QUATTN_CACHE_DIR" && { [ -d "$bin/cache" ] && cp -r "$bin/cache/." "$QUATTN_CACHE_DIR/" 2>/dev/null; true; }
end=$(( $(date +%s) + ${DEADLINE:-230} ))
lim() { local l=$(( end - $(date +%s) - 5 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
left() { echo $(( end - $(date +%s) )); }
step() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm,clocks.max.mem --format=csv > "$out/gpu.csv" 2>&1
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
: > "$out/summary.txt"

step "int8_prepass_bench"
timeout "$(lim 70)" "$bin/int8_prepass_bench" --json > "$out/int8_prepass.jsonl" 2>> "$out/run.log"; echo "rc $?"
# One line per row: shape, prepass, lag, us, ratios to min and moved bytes.
sed -E 's/.*"shape":"([^"]*)","prepass":"([^"]*)","lag":"([^"]*)".*"us":([^,]*),.*"ratio_to_min_bytes_at_3tbs":([^,]*),"ratio_to_moved_bytes_at_3tbs":([^,]*),.*"same_outputs":([a-z]*).*/\1 | \2 | lag \3 | \4 us | x min \5 | x moved \6 | same \7/' \
  "$out/int8_prepass.jsonl" | tee "$out/int8_prepass.txt"
grep '"lag":"8MB"' "$out/int8_prepass.jsonl" | grep 'd128' | grep -c '"within_1_5x_moved":false' \
  | sed 's/^/int8 prepass: hd 128 default-lag rows over 1.5x moved bytes: /' >> "$out/summary.txt"
grep -c '"same_outputs":false' "$out/int8_prepass.jsonl" | sed 's/^/int8 prepass: rows whose outputs differ across lags: /' >> "$out/summary.txt"

step "fp8_prepass_bench"
timeout "$(lim 70)" "$bin/fp8_prepass_bench" --json > "$out/fp8_prepass.jsonl" 2>> "$out/run.log"; echo "rc $?"
sed -E 's/.*"shape":"([^"]*)","granularity":"([^"]*)","slabs":"([^"]*)",.*"ms":([^,]*),.*"x_model":([^,]*),.*"same_codes":([a-z]*).*/\1 | \2 | slabs \3 | \4 ms | x model \5 | same \6/' \
  "$out/fp8_prepass.jsonl" | tee "$out/fp8_prepass.txt"
python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
one = [r for r in rows if r["granularity"] == "PerHead" and r["slabs"] == "onepass"]
over = [r for r in one if r["x_model"] > 1.5]
print("fp8 prepass: per-head one-read rows over 1.5x model bytes:", len(over), "of", len(one))
two = [r for r in rows if r["granularity"] == "PerHead" and r["slabs"] == "L2/2"]
print("fp8 prepass: per-head two-pass (L2/2 slabs) rows over 1.5x model bytes:", len([r for r in two if r["x_model"] > 1.5]), "of", len(two))
' "$out/fp8_prepass.jsonl" >> "$out/summary.txt"
grep -c '"same_codes":false' "$out/fp8_prepass.jsonl" | sed 's/^/fp8 prepass: rows whose codes differ from the L2\/2 slabs (or left counters nonzero): /' >> "$out/summary.txt"

step "selftest int8-prepass"
timeout "$(lim 70)" "$bin/quattn" selftest --devices cuda --only int8-prepass --json > "$out/selftest_int8.jsonl" 2> "$out/selftest_int8.log"; echo "rc $?"
grep -h '"status":"fail"' "$out/selftest_int8.jsonl" | cut -c1-600 | head -10
tail -1 "$out/selftest_int8.jsonl" | tee -a "$out/summary.txt"

step "selftest fp8"
timeout "$(lim 70)" "$bin/quattn" selftest --devices cuda --only fp8 --json > "$out/selftest_fp8.jsonl" 2> "$out/selftest_fp8.log"; echo "rc $?"
grep -h '"status":"fail"' "$out/selftest_fp8.jsonl" | cut -c1-600 | head -10
tail -1 "$out/selftest_fp8.jsonl" | tee -a "$out/summary.txt"

if [ "$(left)" -gt 30 ]; then
  step "quattn bench int8, int8-block-pvfp8 (end to end and kernel only)"
  timeout "$(lim 40)" "$bin/quattn" bench --device cuda --precision int8,int8-block-pvfp8 --seqs 1024,4096,16384 --tokens 16384 \
    --head-dims 128 --causal non-causal --warmup 3 --iters 20 --json > "$out/bench_e2e.jsonl" 2>> "$out/run.log"; echo "rc $?"
  sed -E 's/.*"kernel":"([^"]*)".*"precision":"([^"]*)".*"seq":([0-9]*).*"ms":([^,]*).*/\2 seq \3 | \4 ms | \1/' "$out/bench_e2e.jsonl"
fi
step "summary"
cat "$out/summary.txt"
