#!/usr/bin/env bash
# Stop what deploy/local/up.sh started: Grafana, Prometheus, specd, and the CPU vLLM
# server when up.sh started it. Logs stay in the state dir.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOG_PREFIX=local-down
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"

STATE=${SPECD_LOCAL_STATE:-$HOME/.cache/specd/run/local}
if [[ ! -f $STATE/env ]]; then
    log "nothing recorded in $STATE"
    exit 0
fi

declare -A ENV=()
while IFS='=' read -r key value; do
    [[ -n $key ]] && ENV[$key]=$value
done <"$STATE/env"

# Stop a recorded pid only if it still runs the program we started (pids get reused).
stop_recorded() {
    local pid=${ENV[$1]:-} pattern=$2
    [[ -n $pid ]] || return 0
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern"; then
        stop_pid "$pid" "$pattern"
    fi
}
stop_recorded GRAFANA_PID grafana
stop_recorded PROMETHEUS_PID prometheus
stop_recorded SPECD_PID specd
if [[ ${ENV[STARTED_VLLM]:-0} == 1 ]]; then
    # The server up.sh started, whichever model it serves (not the caller's default).
    model=${ENV[VLLM_MODEL]:-${SPECD_VLLM_MODEL:-target}}
    SPECD_VLLM_MODEL=$model SPECD_VLLM_SERVED_NAME=${ENV[VLLM_SERVED_NAME]:-specd-$model} \
        "$ROOT/scripts/vllm-cpu-upstream.sh" stop
fi
rm -f "$STATE/env"
log "stopped (logs kept in $STATE)"
