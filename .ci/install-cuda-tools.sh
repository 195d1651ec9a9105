#!/usr/bin/env bash
# Installs the GPU-less CUDA tools quattn-native needs for its NVRTC compile + SASS tests:
# NVRTC 13.0 (libnvrtc.so.13 + builtins), the CUDA headers, and the cuobjdump / nvdisasm disassemblers, all from
# PyPI wheels (no toolkit, no GPU). Their files land in <site-packages>/nvidia/cu13/{lib,bin}.
#
#   source .ci/install-cuda-tools.sh            # installs and exports the variables below
#   bash .ci/install-cuda-tools.sh [ENV_FILE]   # installs, prints them, appends them to ENV_FILE
#
# Exported: QUATTN_NVRTC_LIB (folder of libnvrtc.so.13), QUATTN_CUOBJDUMP, QUATTN_NVDISASM,
# LD_LIBRARY_PATH (prepended with that folder). Also appended to $GITHUB_ENV when set.
# The Rust side finds the wheels by itself too (python site-packages lookup); the variables
# make the choice explicit and cheap. No cuobjdump/nvdisasm wheel exists for 13.0: 13.2 reads
# 13.0 cubins.

_quattn_install_cuda_tools() {
  local py="${QUATTN_PYTHON:-python3}"
  # nvidia-cuda-runtime / nvidia-cuda-crt: the CUDA headers (cuda_fp16.h, ...) that CubeCL's
  # generated CUDA sources include; quattn-cubecl's offline NVRTC test of the mma kernel needs them.
  local pkgs=("nvidia-cuda-nvrtc==13.0.88" "nvidia-cuda-cuobjdump==13.2.51" "nvidia-cuda-nvdisasm==13.2.51"
              "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-crt==13.0.88")
  if ! "$py" -m pip --version >/dev/null 2>&1; then
    "$py" -m ensurepip --upgrade >/dev/null 2>&1 || { echo "install-cuda-tools: no pip for $py" >&2; return 1; }
  fi
  echo "install-cuda-tools: $py -m pip install ${pkgs[*]}"
  "$py" -m pip install --quiet --disable-pip-version-check "${pkgs[@]}" || return 1

  local cu13
  cu13="$("$py" - <<'PY'
import os, site, sys
paths = list(sys.path)
try:
    paths += site.getsitepackages()
except Exception:
    pass
try:
    paths.append(site.getusersitepackages())
except Exception:
    pass
for p in paths:
    d = os.path.join(p, "nvidia", "cu13")
    if os.path.isfile(os.path.join(d, "lib", "libnvrtc.so.13")):
        print(d)
        break
PY
)"
  if [ -z "$cu13" ]; then
    echo "install-cuda-tools: libnvrtc.so.13 not found after pip install" >&2
    return 1
  fi
  export QUATTN_NVRTC_LIB="$cu13/lib"
  export QUATTN_CUOBJDUMP="$cu13/bin/cuobjdump"
  export QUATTN_NVDISASM="$cu13/bin/nvdisasm"
  export LD_LIBRARY_PATH="$QUATTN_NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$QUATTN_CUOBJDUMP" --version | tail -n 1

  local vars=(QUATTN_NVRTC_LIB QUATTN_CUOBJDUMP QUATTN_NVDISASM LD_LIBRARY_PATH)
  local v
  for v in "${vars[@]}"; do
    echo "export $v=${!v}"
    if [ -n "${GITHUB_ENV:-}" ]; then echo "$v=${!v}" >>"$GITHUB_ENV"; fi
    if [ -n "${1:-}" ]; then echo "export $v=${!v}" >>"$1"; fi
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  _quattn_install_cuda_tools "$@"
else
  # Sourced (e.g. by .ci/run under set -e): a failure must fail the caller.
  _quattn_install_cuda_tools "$@" || return 1
fi
unset -f _quattn_install_cuda_tools
