#!/usr/bin/env bash
# The demo stack on this machine: a real vLLM on the CPU serving specd's own small model
# (venv and model built and cached on first use), specd in front of it, and Prometheus
# scraping specd. Prints the URL to send requests to. Stop it with: scripts/demo.sh stop
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = stop ]; then
  exec deploy/local/down.sh
fi
[ -x target/release/specd ] || cargo build --release --bins
export SPECD_VLLM_EXTRA_ARGS=${SPECD_VLLM_EXTRA_ARGS:---dtype float32}
exec deploy/local/up.sh "$@"
