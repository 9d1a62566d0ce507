#!/usr/bin/env bash
# Cross-vocabulary drafting on a GPU: the draft models run on the CUDA engine, the target
# (for the greedy continuations a verify accepts) on the CPU. Reports tokens per round
# and the wall time of a proposal per drafted token, translation included, for the
# same-vocabulary draft, that draft forced through text, and the other-vocabulary draft.
# Measured on an NVIDIA H200.
#
# Usage: xvocab-bench.sh MODELS_DIR [BIN.gz]   (MODELS_DIR holds target-trained,
#        draft-trained, draft-xtok; default BIN.gz: specd-bench.gz beside this script)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# Run from the repository root (the prompts are its scripts).
ROOT="${ROOT:-$(pwd)}"
M="$1"
BIN_GZ="${2:-$HERE/specd-bench.gz}"
# shellcheck source=scripts/device/lib.sh
. "$HERE/lib.sh"
specd_cuda_libs && specd_unpack "$BIN_GZ" || exit 1
prompts=$(printf '%s,' "$ROOT"/scripts/{make_models,dashboard_metrics,draft_model_reference,train_models}.py)
for dev in cuda:0 cpu; do
  echo "== drafts on $dev"
  SPECD_LOG=warn "$W/specd-bench" xvocab --target "$M/target-trained" \
    --drafts "$M/draft-trained,$M/draft-xtok" --force-translation --chat \
    --device "$dev" --prompts "${prompts%,}"
done
