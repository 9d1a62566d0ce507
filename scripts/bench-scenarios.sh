#!/usr/bin/env bash
# The controller benchmark: plain decoding, static K and `auto`, side by side.
#
#   scripts/bench-scenarios.sh [sim|vllm|agent-sim|agent-vllm|suffix|all]   (default: sim)
#
# sim     the field scenarios (accepted length 1.5, 2.0, 3.4 and a mixed stream) against
#         specd-sim, the latency-model upstream (decode 12.1 ms, verify ≈ 30 ms), at 1 and
#         16 concurrent streams.
# vllm    repetitive and open-ended text against the real vLLM on the CPU
#         (scripts/vllm-cpu-upstream.sh; reused when already running).
# agent-sim   tool-calling agent loops (`--only agent`) through specd with
#         `--enable-auto-tool-choice --tool-call-parser hermes`, against specd-sim serving
#         chat whose answers quote the context (`--quote`, default 0.85), with the
#         agent-tools tokenizer; drafter $SPECD_BENCH_DRAFTER (suffix).
# agent-vllm  the same loops against a real vLLM on the CPU serving `agent-tools` with
#         `--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser
#         deepseek_r1` (its own server, `specd-bench-agent-tools`; stopped afterwards
#         unless SPECD_BENCH_KEEP=1), specd with the same parser flags; 1 and 4 streams
#         (SPECD_BENCH_CONCURRENCY).
# suffix  time per proposal and memory of the suffix drafter.
#
# Extra arguments after the suite go to `specd-bench scenarios` (e.g. --static-k 4 --with-watched;
# for `vllm`, tokens per stream and repeats come from SPECD_BENCH_TOKENS (256) and
# SPECD_BENCH_REPEATS (6)).
# SPECD_BENCH_VERBOSE=1 prints each request's time and `usage.speculation`, and specd's
# log lines (with e.g. SPECD_LOG=specd::speculation=debug for the controller's decisions).
# Results are printed as markdown tables; JSON copies go to $SPECD_BENCH_OUT
# (default: target/bench-results).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-sim}
shift || true
out=${SPECD_BENCH_OUT:-target/bench-results}
mkdir -p "$out"

cargo build --release --workspace --bins >&2
bin=${CARGO_TARGET_DIR:-target}/release

run_sim() {
    "$bin/specd-bench" scenarios --json "$out/sim.json" "$@"
}

run_vllm() {
    local up
    up=$(bash scripts/vllm-cpu-upstream.sh start | tail -n 1 | sed 's/^UPSTREAM=//')
    "$bin/specd-bench" scenarios --upstream "$up" --drafter "${SPECD_BENCH_DRAFTER:-suffix}" \
        --tokens "${SPECD_BENCH_TOKENS:-256}" --repeats "${SPECD_BENCH_REPEATS:-6}" \
        --json "$out/vllm.json" "$@"
}

run_agent_sim() {
    "$bin/specd-bench" scenarios --only agent --drafter "${SPECD_BENCH_DRAFTER:-suffix}" \
        --json "$out/agent-sim.json" "$@"
}

run_agent_vllm() {
    local up args="--dtype float32 --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser deepseek_r1"
    export SPECD_VLLM_MODEL=agent-tools SPECD_VLLM_SERVED_NAME=specd-bench-agent-tools \
        SPECD_VLLM_EXTRA_ARGS=$args
    up=$(bash scripts/vllm-cpu-upstream.sh start | tail -n 1 | sed 's/^UPSTREAM=//')
    [[ ${SPECD_BENCH_KEEP:-0} == 1 ]] || trap 'bash scripts/vllm-cpu-upstream.sh stop' EXIT
    "$bin/specd-bench" scenarios --upstream "$up" --only agent \
        --drafter "${SPECD_BENCH_DRAFTER:-suffix}" --reasoning-parser deepseek_r1 \
        --tokens "${SPECD_BENCH_TOKENS:-128}" --repeats "${SPECD_BENCH_REPEATS:-6}" \
        --concurrency "${SPECD_BENCH_CONCURRENCY:-1,4}" --json "$out/agent-vllm.json" "$@"
}

run_suffix() {
    "$bin/specd-bench" suffix "$@"
}

case $suite in
    sim) run_sim "$@" ;;
    vllm) run_vllm "$@" ;;
    agent-sim) run_agent_sim "$@" ;;
    agent-vllm) run_agent_vllm "$@" ;;
    suffix) run_suffix "$@" ;;
    all) run_sim; run_vllm; run_suffix ;;
    *) echo "usage: $0 [sim|vllm|agent-sim|agent-vllm|suffix|all] [bench args...]" >&2; exit 2 ;;
esac
