#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on every native CUDA family at
# ragged GQA causal shapes: q_len < kv_len, and q_len > kv_len (rows that see no key); the
# split-KV decode family at its own shapes (a few query rows per KV head, long ragged KV).
#   benchmarks/gpu-checks/sanitize.sh OUT QUATTN [FAMILY:PRECISION[:FLAGS] ...]
# FLAGS: extra `quattn run` flags joined by '+', e.g. wgmma:f16:--window=100,0+--softcap=30.
# Prints one line per (tool, family, shape): ok, or the sanitizer's error summary; exit 1 on any error.
set -u
out=${1:?OUT}; q=${2:?QUATTN}; shift 2
mkdir -p "$out"
cs=/usr/local/cuda/bin/compute-sanitizer
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(hmma:f16 hmma:bf16 wgmma:f16 int8-imma:int8-block int8-wgmma:int8-block
  int8-wgmma:int8-thread-nosmooth-pvfp8 fp8-wgmma:fp8-e4m3-head-pfp8 fp8-wgmma:fp8-e4m3-pfp8 fp8-mma:fp8-e4m3-head
  decode:f16 decode:bf16 wgmma:f16:--window=100,20+--sinks wgmma:f16:--window=64,0+--softcap=30+--alibi+--causal-align=top-left)
shapes=("--batch 2 --heads 8 --kv-heads 2 --seq 77 --kv-seq 333 --head-dim 128 --causal"
        "--batch 1 --heads 4 --kv-heads 1 --seq 300 --kv-seq 200 --head-dim 64 --causal --layout bshd")
decode_shapes=("--batch 2 --heads 8 --kv-heads 2 --seq 3 --kv-seq 3333 --head-dim 128 --causal"
               "--batch 3 --heads 4 --kv-heads 1 --seq 1 --kv-seq 777 --head-dim 64 --layout bshd")
one() {
  local tool=$1 fam=${2%%:*} rest=${2#*:} si=$3
  local prec=${rest%%:*} flags=""
  [ "$rest" != "$prec" ] && flags=$(echo "${rest#*:}" | tr '+' ' ')
  local log="$out/${tool}_${fam}_${prec}$(echo "$flags" | tr -cd 'a-z0-9')_${si}.log" shape=${shapes[$si]}
  [ "$fam" = decode ] && shape=${decode_shapes[$si]}
  if $cs --tool "$tool" --error-exitcode 9 --print-limit 20 "$q" run --device cuda --strategy native --native "$fam" \
       --precision "$prec" $shape $flags --iters 1 --no-check > "$log" 2>&1; then
    echo "ok    $tool $fam $prec $flags shape$si"
  else
    echo "ERROR $tool $fam $prec $flags shape$si: $(grep -m1 -E 'ERROR SUMMARY|Error|error' "$log")"
  fi
}
export -f one; export out q cs; export shapes_0="${shapes[0]}" shapes_1="${shapes[1]}"
export dshapes_0="${decode_shapes[0]}" dshapes_1="${decode_shapes[1]}"
jobs=()
for tool in memcheck racecheck synccheck initcheck; do
  for c in "${cases[@]}"; do for si in 0 1; do jobs+=("$tool $c $si"); done; done
done
status=0
printf '%s\n' "${jobs[@]}" | xargs -P 8 -L 1 bash -c 'shapes=("$shapes_0" "$shapes_1"); decode_shapes=("$dshapes_0" "$dshapes_1"); one "$@"' _ > "$out/sanitize.txt"
sort "$out/sanitize.txt"
grep -q '^ERROR' "$out/sanitize.txt" && status=1
exit $status
