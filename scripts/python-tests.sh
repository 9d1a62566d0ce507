#!/usr/bin/env bash
# Python tests: the official openai client against specd in front of the real vLLM, and
# the dashboard/monitoring tooling. Uses the cached vLLM venv (it has openai and pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SPECD_PYTHON:-${SPECD_CACHE_DIR:-$HOME/.cache/specd}/vllm-venv/bin/python}
if [ -z "${SPECD_BIN:-}" ]; then
  [ -x target/release/specd ] || cargo build --release --bins
  export SPECD_BIN="$PWD/target/release/specd"
fi
"$PY" -m pytest -q -p no:cacheprovider tests/python
