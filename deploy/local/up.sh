#!/usr/bin/env bash
# Start the monitoring stack on this machine without Docker: a real vLLM server on the
# CPU (scripts/vllm-cpu-upstream.sh), specd in front of it, and Prometheus scraping
# specd; Grafana too when a grafana-server binary is installed. Everything listens on
# 127.0.0.1. Stop it all with deploy/local/down.sh.
#
#   deploy/local/up.sh [--upstream URL] [--no-prometheus] [-- SPECD_SERVE_ARGS...]
#
#   --upstream URL    use a running OpenAI-compatible server instead of starting vLLM
#   --no-prometheus   start only the upstream and specd (and no Grafana)
#   after --          extra arguments for `specd serve` (e.g. --drafter suffix)
#
# The URLs are also written to STATE/env (UPSTREAM_URL, SPECD_URL, METRICS_URL,
# PROMETHEUS_URL, GRAFANA_URL lines), for scripts:
#   SPECD_URL=$(sed -n 's/^SPECD_URL=//p' ~/.cache/specd/run/local/env)
#
# Environment: SPECD_LOCAL_STATE (state dir, default ~/.cache/specd/run/local),
# SPECD_BIN (specd binary; default target/release/specd, built when missing),
# SPECD_SCRAPE_INTERVAL (default 2s), and scripts/vllm-cpu-upstream.sh's SPECD_VLLM_*.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOG_PREFIX=local-up
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"

STATE=${SPECD_LOCAL_STATE:-$HOME/.cache/specd/run/local}
UPSTREAM=${SPECD_UPSTREAM:-}
SCRAPE=${SPECD_SCRAPE_INTERVAL:-2s}
EXTRA=()
WITH_PROMETHEUS=1
while (($#)); do
    case $1 in
    --upstream) UPSTREAM=$2; shift 2 ;;
    --no-prometheus) WITH_PROMETHEUS=0; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (specd arguments go after --)" ;;
    esac
done

if [[ -f $STATE/env ]]; then
    die "a local stack is already recorded in $STATE (run deploy/local/down.sh first)"
fi
mkdir -p "$STATE"
: >"$STATE/env"

# Undo a half-started stack.
UP_OK=0
on_exit() {
    local rc=$?
    if ((rc != 0 && UP_OK == 0)); then
        log "start-up failed; stopping what was started"
        "$ROOT/deploy/local/down.sh" >&2 || true
    fi
}
trap on_exit EXIT

record() { echo "$1=$2" >>"$STATE/env"; }

# 1. upstream
if [[ -z $UPSTREAM ]]; then
    if "$ROOT/scripts/vllm-cpu-upstream.sh" status >/dev/null 2>&1; then
        log "a CPU vLLM server is already running; using it (down.sh will leave it running)"
    else
        record STARTED_VLLM 1
        # down.sh stops this very server: the one of this model and served name.
        record VLLM_MODEL "${SPECD_VLLM_MODEL:-target}"
        record VLLM_SERVED_NAME "${SPECD_VLLM_SERVED_NAME:-specd-${SPECD_VLLM_MODEL:-target}}"
    fi
    log "starting vLLM on the CPU (first start installs it and takes minutes)"
    UPSTREAM=$("$ROOT/scripts/vllm-cpu-upstream.sh" start | tail -n1)
    UPSTREAM=${UPSTREAM#UPSTREAM=}
fi
[[ $UPSTREAM == http*://* ]] || die "no upstream URL (got '$UPSTREAM')"
record UPSTREAM_URL "$UPSTREAM"

# 2. specd
BIN=${SPECD_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/specd}
if [[ ! -x $BIN ]]; then
    log "building specd (cargo build --release)"
    (cd "$ROOT" && cargo build --release --locked --bin specd) >&2
fi
log "starting specd in front of $UPSTREAM"
# Created here, not by the background job, so the loop below never reads a missing file.
: >"$STATE/specd.log"
"$BIN" serve --upstream "$UPSTREAM" --listen 127.0.0.1:0 "${EXTRA[@]}" \
    </dev/null >"$STATE/specd.log" 2>&1 &
SPECD_PID=$!
record SPECD_PID "$SPECD_PID"
deadline=$((SECONDS + 60))
SPECD_URL=""
while ((SECONDS < deadline)); do
    kill -0 "$SPECD_PID" 2>/dev/null || { tail -n 20 "$STATE/specd.log" >&2; die "specd exited"; }
    # "specd api listening on http://ADDR" (an admin listener, if any, prints "admin")
    SPECD_URL=$(sed -n 's/.*specd \(api \)\{0,1\}listening on \(http:\/\/[0-9.:]*\).*/\2/p' "$STATE/specd.log" | head -n1)
    [[ -n $SPECD_URL ]] && break
    sleep 0.1
done
[[ -n $SPECD_URL ]] || die "specd did not report its address (log: $STATE/specd.log)"
record SPECD_URL "$SPECD_URL"
deadline=$((SECONDS + 120))
until curl -sf -o /dev/null --max-time 5 "$SPECD_URL/readyz"; do
    kill -0 "$SPECD_PID" 2>/dev/null || { tail -n 20 "$STATE/specd.log" >&2; die "specd exited"; }
    ((SECONDS < deadline)) || die "specd at $SPECD_URL did not become ready"
    sleep 0.2
done
log "specd ready at $SPECD_URL"
# With --metrics-listen, /metrics is served by the admin listener.
METRICS_URL=$(sed -n 's/.*specd admin listening on \(http:\/\/[0-9.:]*\).*/\1/p' "$STATE/specd.log" | head -n1)
METRICS_URL=${METRICS_URL:-$SPECD_URL}
record METRICS_URL "$METRICS_URL"

# 3. Prometheus
if ((WITH_PROMETHEUS)); then
    ensure_prometheus
    start_prometheus "$STATE/prometheus" "$(url_hostport "$METRICS_URL")" "$SCRAPE" /metrics specd
    record PROMETHEUS_PID "$PROM_PID"
    record PROMETHEUS_URL "$PROM_URL"
    wait_for_scrape "$PROM_URL" 0 60 || die "Prometheus cannot scrape specd"
    log "Prometheus at $PROM_URL scrapes specd every $SCRAPE"
fi

# 4. Grafana, only where it is installed (it is not packaged by Debian).
GRAFANA_BIN=$(command -v grafana-server || command -v grafana || true)
if ((WITH_PROMETHEUS)) && [[ -n $GRAFANA_BIN ]]; then
    g=$STATE/grafana
    mkdir -p "$g/provisioning/datasources" "$g/provisioning/dashboards" "$g/data" "$g/logs" \
        "$g/provisioning/plugins" "$g/provisioning/alerting"
    sed -e "s#http://prometheus:9090#$PROM_URL#" -e "s#timeInterval: .*#timeInterval: $SCRAPE#" "$ROOT/deploy/grafana/provisioning/datasources/prometheus.yml" \
        >"$g/provisioning/datasources/prometheus.yml"
    sed "s#/etc/grafana/dashboards#$ROOT/dashboards#" \
        "$ROOT/deploy/grafana/provisioning/dashboards/specd.yml" >"$g/provisioning/dashboards/specd.yml"
    GRAFANA_PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    home=$(dirname "$(dirname "$(readlink -f "$GRAFANA_BIN")")")
    [[ -d $home/share/grafana ]] && home=$home/share/grafana
    sub=()
    [[ $(basename "$GRAFANA_BIN") == grafana ]] && sub=(server)
    GF_SERVER_HTTP_ADDR=127.0.0.1 GF_SERVER_HTTP_PORT=$GRAFANA_PORT \
        GF_PATHS_DATA=$g/data GF_PATHS_LOGS=$g/logs GF_PATHS_PROVISIONING=$g/provisioning \
        GF_AUTH_ANONYMOUS_ENABLED=true GF_AUTH_ANONYMOUS_ORG_ROLE=Viewer \
        "$GRAFANA_BIN" "${sub[@]}" --homepath "$home" </dev/null >"$g/grafana.log" 2>&1 &
    record GRAFANA_PID $!
    GRAFANA_URL=http://127.0.0.1:$GRAFANA_PORT
    record GRAFANA_URL "$GRAFANA_URL"
    deadline=$((SECONDS + 60))
    until curl -sf -o /dev/null "$GRAFANA_URL/api/health"; do
        ((SECONDS < deadline)) || { log "Grafana did not answer; see $g/grafana.log"; break; }
        sleep 0.5
    done
fi
UP_OK=1

MODEL=$(curl -sf "$SPECD_URL/v1/models" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])' || echo MODEL)
cat <<EOF

specd local stack is up (state in $STATE):
  upstream    $UPSTREAM
  specd       $SPECD_URL        (metrics: $SPECD_URL/metrics, readiness: $SPECD_URL/readyz)
  Prometheus  ${PROM_URL:-not started}
  Grafana     ${GRAFANA_URL:-not installed: draw the dashboard with scripts/render_dashboard.py}

Try it:
  curl -sN $SPECD_URL/v1/completions -H 'content-type: application/json' \\
    -d '{"model": "$MODEL", "prompt": "1 2 3 4 5 6 7 8", "max_tokens": 32, "stream": true}'
  deploy/local/load.sh $SPECD_URL
  scripts/render_dashboard.py --prometheus ${PROM_URL:-PROMETHEUS_URL} --start -10m --out dashboard.png
  scripts/prometheus-check.sh --specd $SPECD_URL --metrics $METRICS_URL/metrics --load deploy/local/load.sh
Stop it:
  deploy/local/down.sh
EOF
