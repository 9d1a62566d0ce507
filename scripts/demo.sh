#!/usr/bin/env bash
# The demo stack on this machine: a real vLLM on the CPU serving specd's own small model
# (venv and the trained model pair built and cached on first use), specd in front of it
# with the pair's draft model loaded for `"drafter": "model"`, and Prometheus scraping
# specd. Prints the URL to send requests to. Stop it with: scripts/demo.sh stop
#
#   scripts/demo.sh [deploy/local/up.sh arguments]
#
# SPECD_VLLM_MODEL picks the served model: target-trained (default; trained by
# scripts/train_models.py, ~10 min on 2 cores the first time) or target (random weights).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = stop ]; then
  exec deploy/local/down.sh
fi
[ -x target/release/specd ] || cargo build --release --bins
export SPECD_VLLM_EXTRA_ARGS=${SPECD_VLLM_EXTRA_ARGS:---dtype float32}
export SPECD_VLLM_MODEL=${SPECD_VLLM_MODEL:-target-trained}
args=("$@")
# The draft model of the served target's pair (target → draft, target-trained →
# draft-trained), unless the caller brings an upstream or their own specd arguments.
if [[ " $* " != *" -- "* && " $* " != *" --upstream "* ]]; then
  models=${SPECD_MODELS_DIR:-${SPECD_CACHE_DIR:-$HOME/.cache/specd}/models}
  args+=(-- --draft-model "$models/draft${SPECD_VLLM_MODEL#target}")
fi
exec deploy/local/up.sh "${args[@]}"
