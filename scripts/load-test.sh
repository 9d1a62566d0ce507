#!/usr/bin/env bash
# The long load test: 512 concurrent streams through specd
#   - to the real vLLM (short generations), every stream compared token for token with
#     the same request sent to vLLM directly at temperature 0;
#   - to the stand-in upstream (long generations), every stream compared with its known
#     output, run twice to show that open file descriptors do not grow.
# Prints peak RSS (process_resident_memory_bytes), open fds (process_open_fds), times and
# specd's CPU per token. Takes about ten minutes on two CPU cores.
#
#   scripts/load-test.sh [extra cargo test arguments, e.g. --release]
#
# Environment: SPECD_TEST_UPSTREAM (a running vLLM; default: start or reuse the one of
# scripts/vllm-cpu-upstream.sh), SPECD_LOAD_STREAMS (512), SPECD_LOAD_TOKENS (stand-in
# tokens per stream, 512), SPECD_LOAD_VLLM_TOKENS (vLLM tokens per stream, 12).
set -euo pipefail
cd "$(dirname "$0")/.."
# The test client holds two connections per stream too.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ -z "${SPECD_TEST_UPSTREAM:-}" ]; then
  SPECD_TEST_UPSTREAM=$(bash scripts/vllm-cpu-upstream.sh start | tail -n 1 | sed 's/^UPSTREAM=//')
  export SPECD_TEST_UPSTREAM
fi
export SPECD_LOAD_TOKENS=${SPECD_LOAD_TOKENS:-512}
cargo test "$@" --test load -- --nocapture --test-threads 1 \
  load_512_streams_through_specd_to_vllm many_long_streams_through_the_stand_in 2>&1 |
  grep -E '^(test |LOAD|thread|  left|  right|failures|test result)|panicked'
