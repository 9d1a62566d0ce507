# shellcheck shell=bash
# Set-up shared by the scripts in scripts/device (sourced by them, not run alone).
# W is where the unpacked binary, the models and their references live on the GPU machine.
W=/tmp/specd-draft-work
SPECD_DEVICE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$W"

# The CUDA 13 runtime libraries come from the nvidia wheels of the machine's PyTorch.
specd_cuda_libs() {
  local cu13
  cu13="$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))')" ||
    { echo "no nvidia CUDA 13 wheels in this python3" >&2; return 1; }
  export LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# Unpack BIN.gz to $W/specd-bench, every time: a binary left by an earlier call on the same
# machine may be older than the one carried now. A missing or broken BIN.gz fails and
# leaves the binary there as it was.
specd_unpack() {
  [ -f "$1" ] || { echo "no $1: build it with scripts/build-cuda.sh --bench-bin specd-bench" >&2; return 1; }
  gunzip -c "$1" >"$W/specd-bench.new" && chmod +x "$W/specd-bench.new" &&
    mv "$W/specd-bench.new" "$W/specd-bench"
}

# Make the models of SHAPE... that are missing (random init, transformers references and
# the tiny checks) through draft-bench.sh; prints its check and speed lines.
specd_models() {
  local gz="$1" s missing=()
  shift
  for s in "$@"; do [ -f "$W/$s/config.json" ] || missing+=("$s"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  VARIANTS=0 ANCHOR=none BATCH=1 SHAPES="${missing[*]}" bash "$SPECD_DEVICE_DIR/draft-bench.sh" "$gz" |
    grep -E 'check:|^\| [0-9]|FAIL|rror|panick'
}
