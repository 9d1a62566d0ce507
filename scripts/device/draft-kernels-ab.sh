#!/usr/bin/env bash
# Compare kernel sources of specd's CUDA draft-model engine in one session on a GPU
# machine, without rebuilding the binary (measured on an NVIDIA H200 with this script).
# Each DIR holds kernels.cu, gemv.cu, mma.cu and attn_tc.cu, read at model load through
# SPECD_DRAFT_KERNELS. The first DIR runs draft-bench.sh (models, references, the tiny
# checks, BATCH streams); then every DIR, and the first again at the end, runs the
# reference check and the speed at VBATCH streams on each shape.
#
# Usage: draft-kernels-ab.sh DIR...   (env: BATCH=1,32 VBATCH=1 OUT=dir for logs,
#        BIN_GZ=the gzipped specd-bench, default: specd-bench.gz beside this script,
#        SHAPES="qwen2.5-0.5b qwen2.5-1.5b")
# e.g. with the kernels of the previous commit as "before":
#   mkdir -p .device/before .device/after
#   for f in kernels.cu gemv.cu mma.cu attn_tc.cu; do git show HEAD~1:src/draft/model/$f >.device/before/$f
#     cp src/draft/model/$f .device/after/; done
#   bash scripts/device/draft-kernels-ab.sh .device/before .device/after
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-/tmp/specd-draft-bench}"
# shellcheck source=scripts/device/lib.sh
. "$HERE/lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 DIR..."; exit 2; }
dirs=()
for d in "$@"; do dirs+=("$(cd "$d" && pwd)"); done
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
BIN_GZ="${BIN_GZ:-$HERE/specd-bench.gz}"
specd_unpack "$BIN_GZ" || exit 1
SPECD_DRAFT_KERNELS="${dirs[0]}" BATCH="${BATCH:-1,32}" VARIANTS=0 ANCHOR=none \
  bash "$HERE/draft-bench.sh" "$BIN_GZ" >"$OUT/bench-first.log" 2>&1
grep -E '^\| [0-9]|check:|^\$ |FAIL|rror|panick' "$OUT/bench-first.log" | cut -c1-150
specd_cuda_libs || exit 1
for d in "${dirs[@]}" "${dirs[0]}"; do
  for m in ${SHAPES:-qwen2.5-0.5b qwen2.5-1.5b}; do
    echo "-- $d $m"
    SPECD_DRAFT_KERNELS="$d" timeout 120 "$W/specd-bench" draft --model "$W/$m" --device cuda:0 \
      --reference "$W/$m.ref.safetensors" --batch "${VBATCH:-1}" 2>&1 |
      tee -a "$OUT/kernels-ab.log" | grep -E 'check:|^\| [0-9]|FAIL|rror|panick' | cut -c1-150
  done
done
