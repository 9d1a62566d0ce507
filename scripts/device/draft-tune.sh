#!/usr/bin/env bash
# Time variants of specd's CUDA draft-model engine on a GPU machine: one line per
# variant with ms per draft token at the given batch sizes. Measured on an NVIDIA H200.
# Needs what draft-bench.sh needs; the models come from a draft-bench.sh run (made here
# when missing). Each variant loads the model again (a few seconds).
#
# Usage: draft-tune.sh [BIN.gz]
# Env:   SHAPES="qwen2.5-0.5b qwen2.5-1.5b"   BATCH=1
#        VARIANTS="name:ENV=V+ENV=V ..."      default: a sweep of SPECD_DRAFT_GEMV shapes
#        (R×S per projection), attention prefetch levels and the previous engine;
#        e.g. "u4:SPECD_DRAFT_KERNELS=/tmp/k+SPECD_DRAFT_TC=1" to try edited kernels.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN_GZ="${1:-$HERE/specd-bench.gz}"
SHAPES="${SHAPES:-qwen2.5-0.5b qwen2.5-1.5b}"
BATCH="${BATCH:-1}"
# shellcheck source=scripts/device/lib.sh
. "$HERE/lib.sh"
DEFAULT_VARIANTS="default:X=1 qkv12:SPECD_DRAFT_GEMV=qkv=1x2 o12:SPECD_DRAFT_GEMV=o=1x2
  o21:SPECD_DRAFT_GEMV=o=2x1 gu21:SPECD_DRAFT_GEMV=gate_up=2x1 gu12:SPECD_DRAFT_GEMV=gate_up=1x2
  down12:SPECD_DRAFT_GEMV=down=1x2 down18:SPECD_DRAFT_GEMV=down=1x8 down24:SPECD_DRAFT_GEMV=down=2x4
  lm21:SPECD_DRAFT_GEMV=lm=2x1 lm81:SPECD_DRAFT_GEMV=lm=8x1 attpf0:SPECD_DRAFT_ATT_PREFETCH=0
  attpf1:SPECD_DRAFT_ATT_PREFETCH=1 previous:SPECD_DRAFT_FUSED=0+SPECD_DRAFT_ATT_PREFETCH=0"
# shellcheck disable=SC2086
specd_models "$BIN_GZ" $SHAPES
specd_cuda_libs && specd_unpack "$BIN_GZ" || exit 1
for s in $SHAPES; do
  for v in ${VARIANTS:-$DEFAULT_VARIANTS}; do
    name="${v%%:*}"; envs="${v#*:}"
    # shellcheck disable=SC2086
    ms=$(env ${envs//+/ } timeout 120 "$W/specd-bench" draft --model "$W/$s" --device cuda:0 \
      --batch "$BATCH" --repeat 3 2>&1 | awk -F'|' '/^\| [0-9]+ \|/ {printf "%s:%s ", $2, $3}')
    echo "$s $name: ${ms:-failed}"
  done
done
