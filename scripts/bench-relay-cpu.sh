#!/usr/bin/env bash
# specd's own CPU per streamed token: a release specd in front of specd-sim (the field's
# latency model), N sequential 400-token streams, CPU time of the specd process divided by
# the tokens: the run time of its threads (schedstat, exact), the ticks charged to it (user +
# system, sampled), the context switches of its threads per token, and the load average at
# the end. Prints one line per mode:
#   passthrough  speculation off: bytes forwarded as they come
#   relay        `auto` with hopeless drafts (every request watched): specd decodes and
#                re-encodes each token, drafts and decides beside it
# With STRACE=1 it also counts the process's system calls (futex per token shows task
# hand-offs). With CALLGRIND=1 specd runs under valgrind's callgrind and the line gives
# instructions per token instead (repeatable where CPU time is not; N=3 is enough);
# CALLGRIND_OUT=dir keeps the profiles there, one dump per mode, for callgrind_annotate.
# SIM_ARGS adds specd-sim options: `--base-ms 1` paces tokens 1 ms apart instead of the
# field's 12 ms, so specd's caches stay warm and what is left is its own work (on a quiet
# machine the 12 ms wake-ups vary by tens of microseconds from run to run). The sim
# reports the vLLM version in SPECD_SIM_VLLM_VERSION (from 0.10.2 on, specd reads sampled
# ids from `return_token_ids` rather than from logprobs).
# Build first: cargo build --release --bin specd --bin specd-sim
set -uo pipefail
cd "$(dirname "$0")/.."
B=${SPECD_RELEASE_DIR:-target/release}
SPECD=${SPECD:-$B/specd}
N=${N:-5}
TOK=${SPECD_TOKENIZER:-${SPECD_CACHE_DIR:-$HOME/.cache/specd}/models/target}
work=$(mktemp -d)
cleanup() {
    kill "${SP:-}" "${SIM:-}" 2>/dev/null
    [ -n "${CALLGRIND_OUT:-}" ] && mkdir -p "$CALLGRIND_OUT" && cp "$work"/cg.* "$CALLGRIND_OUT"/ 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

wait_line() { for _ in $(seq 150); do grep -q "$2" "$1" && return 0; sleep 0.2; done; return 1; }

# shellcheck disable=SC2086 # SIM_ARGS is a list of options
"$B/specd-sim" serve --tokenizer "$TOK" --listen 127.0.0.1:0 ${SIM_ARGS:-} > "$work/sim.out" 2>&1 &
SIM=$!
wait_line "$work/sim.out" "127.0.0.1:[0-9]" || { echo "specd-sim did not start" >&2; exit 1; }
UP=http://$(grep -o "127.0.0.1:[0-9]*" "$work/sim.out" | head -1)
VG=()
[ "${CALLGRIND:-}" = 1 ] && VG=(valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p")
"${VG[@]}" "$SPECD" serve --upstream "$UP" --listen 127.0.0.1:0 --enable-test-drafters --tokenizer "$TOK" \
    --controller-watch-every 1 > "$work/specd.out" 2>&1 &
SP=$!
wait_line "$work/specd.out" "api listening on" || wait_line "$work/specd.out" "api listening on" || { echo "specd did not start" >&2; exit 1; }
URL=$(grep -o "api listening on http://127.0.0.1:[0-9]*" "$work/specd.out" | grep -o "http.*")
until curl -sf "$URL/readyz" >/dev/null; do sleep 0.3; done

# User and system ticks of the process; context switches of all its threads (each one a
# thread that parked and was woken: the hand-offs between threads a token costs).
ticks() { awk '{print $14, $15}' "/proc/$SP/stat"; }
# Run time of all its threads in ns (the scheduler's exact sum, where the ticks above are
# sampled at 100 Hz: a process that runs in bursts of tens of microseconds is charged by
# whether a tick lands in a burst; a thread that exits in between is left out, so the
# ticks stay as a check).
runtime() { cat /proc/"$SP"/task/*/schedstat 2>/dev/null | awk '{n += $1} END {printf "%d", n}'; }
switches() { cat /proc/"$SP"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {print n}'; }
measure() {
    local name=$1 spec=$2
    local body='{"model":"specd-sim","prompt":"hello there","max_tokens":400,"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"speculation":'"$spec"'}'
    for _ in 1 2; do curl -s "$URL/v1/completions" -H 'content-type: application/json' -d "$body" >/dev/null; done
    local st=""
    if [ "${STRACE:-}" = 1 ]; then
        strace -f -c -p "$SP" -o "$work/strace" 2>/dev/null & st=$!
        sleep 1
    fi
    [ ${#VG[@]} -gt 0 ] && callgrind_control -z "$SP" >/dev/null 2>&1
    local t0 t1 c0 c1 r0 r1
    t0=$(ticks); c0=$(switches); r0=$(runtime)
    for _ in $(seq "$N"); do
        curl -s "$URL/v1/completions" -H 'content-type: application/json' -d "$body" > "$work/last.sse"
    done
    t1=$(ticks); c1=$(switches); r1=$(runtime)
    local tokens=$((N * 400)) hz
    hz=$(getconf CLK_TCK)
    local extra=""
    if [ -n "$st" ]; then
        kill -INT "$st"; wait "$st" 2>/dev/null
        extra=$(awk -v n=$tokens '$NF=="futex"{f=$4} $NF=="total"{t=$4} END {printf " syscalls/token %.2f, futex/token %.2f", t/n, f/n}' "$work/strace")
    fi
    if [ ${#VG[@]} -gt 0 ]; then
        callgrind_control -d "$name" "$SP" >/dev/null 2>&1
        sleep 1
        dumps=$((dumps + 1))
        local ir
        ir=$(grep -h '^summary:' "$work"/cg.*."$dumps" | awk '{print $2}')
        extra=$(awk -v i="$ir" -v n=$tokens 'BEGIN {printf " instructions/token %.1f k", i / n / 1000}')
    fi
    local relayed
    relayed=$(grep -o '"relay_tokens":[0-9]*' "$work/last.sse" | tail -1 | cut -d: -f2)
    local u s
    read -r u s <<< "$(paste -d' ' <(echo "$t0") <(echo "$t1") | awk '{print $3 - $1, $4 - $2}')"
    awk -v name="$name" -v u="$u" -v s="$s" -v hz="$hz" -v n=$tokens -v r="${relayed:--}" -v x="$extra" \
        -v cs=$((c1 - c0)) -v rt=$((r1 - r0)) -v load="$(cut -d' ' -f1 /proc/loadavg)" \
        'BEGIN {printf "%-12s %6.1f us/token run time (ticks: %.1f, user %.1f, system %.1f; context switches/token %.2f; load %s; %d tokens, relayed of the last 400: %s)%s\n", name, rt / 1000 / n, (u + s) / hz * 1e6 / n, u / hz * 1e6 / n, s / hz * 1e6 / n, cs / n, load, n, r, x}'
}
dumps=0
measure passthrough '{"mode":"off"}'
measure relay '{"mode":"auto","drafter":"adversarial","oracle_tokens":[5,6,7,8,9,10,11,12]}'
