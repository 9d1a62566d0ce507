#!/usr/bin/env bash
# Python tests: the official openai client against specd in front of the real vLLM, and
# the dashboard/monitoring tooling. Uses the cached vLLM venv (it has openai and pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SPECD_PYTHON:-$HOME/.cache/specd/vllm-venv/bin/python}
[ -x target/release/specd ] || cargo build --release --bins
"$PY" -m pytest -q -p no:cacheprovider tests/python
