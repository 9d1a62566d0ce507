#!/usr/bin/env bash
# Build specd with the `cuda` feature on a machine without a GPU or a system CUDA install.
#
# The CUDA 13.0 tool chain comes from PyPI wheels (pinned to match a CUDA 13 driver), the
# driver library `libcuda.so` is replaced at link time by a generated stub (at run time the
# real driver is used). Everything lives under ~/.cache/specd/ and is reused.
#
# Usage: scripts/build-cuda.sh [--bench-bin NAME]   (env: CARGO_TARGET_DIR, CUDA_COMPUTE_CAP)
# Output: $CARGO_TARGET_DIR/release/specd (or release/NAME), stripped, and a .gz
# beside it.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SPECD_CACHE_DIR:-$HOME/.cache/specd}"
VENV="$CACHE/cuda-venv"
WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85)

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
CUDA_HOME="$("$VENV/bin/python" -c 'import os, nvidia; print(os.path.join(nvidia.__path__[0], "cu13"))' 2>/dev/null || true)"
if [ -z "$CUDA_HOME" ] || [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  "$VENV/bin/pip" install -q "${WHEELS[@]}"
  CUDA_HOME="$("$VENV/bin/python" -c 'import os, nvidia; print(os.path.join(nvidia.__path__[0], "cu13"))')"
fi

# Unversioned names for the linker.
for lib in cudart:13 nvrtc:13 curand:10 cublas:13 cublasLt:13; do
  name="${lib%%:*}"; ver="${lib##*:}"
  [ -e "$CUDA_HOME/lib/lib$name.so" ] || ln -s "lib$name.so.$ver" "$CUDA_HOME/lib/lib$name.so"
done

# Driver stub: every cu* function that cudarc's driver bindings declare, as a dummy
# (their sources come with the locked dependencies; a fresh machine fetches them first).
STUB_DIR="$CUDA_HOME/lib/stubs"
if [ ! -e "$STUB_DIR/libcuda.so" ]; then
  (cd "$ROOT" && cargo fetch --locked >/dev/null)
  "$ROOT/scripts/make-libcuda-stub.sh" "$STUB_DIR"
fi

export CUDA_HOME CUDA_PATH="$CUDA_HOME"
export PATH="$CUDA_HOME/bin:$PATH"
export LIBRARY_PATH="$CUDA_HOME/lib:$STUB_DIR${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CUDARC_CUDA_VERSION=13000
export NVCC_CCBIN="${NVCC_CCBIN:-$(command -v g++-12 || command -v g++)}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target-cuda}"

cd "$ROOT"
if [ "${1:-}" = "--bench-bin" ]; then
  cargo build --release -p specd-bench --features cuda --bin "$2"
  BIN="$CARGO_TARGET_DIR/release/$2"
else
  cargo build --release --features cuda --bin specd
  BIN="$CARGO_TARGET_DIR/release/specd"
fi
strip "$BIN"
gzip -c "$BIN" >"$BIN.gz"
ls -l "$BIN" "$BIN.gz"
