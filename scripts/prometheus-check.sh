#!/usr/bin/env bash
# Prove the Grafana dashboard against a real Prometheus scraping a running specd.
#
#   scripts/prometheus-check.sh --specd http://127.0.0.1:PORT [--load "COMMAND"] [options]
#
# 1. installs Debian's prometheus package if missing;
# 2. lints specd's /metrics with `promtool check metrics`;
# 3. checks every dashboard expression parses (`promtool check rules` on a generated
#    rules file);
# 4. starts a private Prometheus on 127.0.0.1 (ephemeral port, temporary storage,
#    1 s scrape interval) scraping specd, and waits for a successful scrape;
# 5. runs the load command, if given (bash -c, with SPECD_URL and PROMETHEUS_URL set),
#    then waits for a scrape taken after the load ended;
# 6. evaluates every PromQL expression of the dashboard through /api/v1/query
#    (template variables substituted: job/instance match all, $__rate_interval and
#    $__range cover the whole run) and fails listing each one that errors, returns no
#    series, or only NaN/Inf.
# Prometheus is stopped on exit. Exit status 0 only if every step passed.
#
# Options:
#   --specd URL          specd's base URL (or SPECD_URL in the environment)
#   --metrics URL        where to scrape (default SPECD_URL/metrics)
#   --load COMMAND       load to drive once Prometheus scrapes specd
#   --dashboard PATH     dashboard JSON (default dashboards/specd.json)
#   --rate-interval DUR  value for $__rate_interval (default: the whole run, >= 30s)
#   --render PNG         also draw the dashboard with scripts/render_dashboard.py
#   --no-metrics-lint    skip `promtool check metrics`
#   --keep DIR           keep Prometheus's data and logs in DIR (default: a temp dir, removed)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_PREFIX=prometheus-check
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"

SPECD=${SPECD_URL:-}
METRICS=""
LOAD=""
DASHBOARD=$ROOT/dashboards/specd.json
RATE_INTERVAL=""
RENDER=""
LINT_METRICS=1
KEEP=""

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

while (($#)); do
    case $1 in
    --specd) SPECD=$2; shift 2 ;;
    --metrics) METRICS=$2; shift 2 ;;
    --load) LOAD=$2; shift 2 ;;
    --dashboard) DASHBOARD=$2; shift 2 ;;
    --rate-interval) RATE_INTERVAL=$2; shift 2 ;;
    --render) RENDER=$2; shift 2 ;;
    --no-metrics-lint) LINT_METRICS=0; shift ;;
    --keep) KEEP=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n $SPECD ]] || { echo "--specd URL (or SPECD_URL) is required" >&2; usage; }
SPECD=${SPECD%/}
METRICS=${METRICS:-$SPECD/metrics}
[[ -f $DASHBOARD ]] || die "no dashboard at $DASHBOARD"

ensure_prometheus

if [[ -n $KEEP ]]; then
    WORK=$KEEP
    mkdir -p "$WORK"
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/specd-prometheus-check.XXXXXX")
fi
PROM_PID=""
cleanup() {
    local rc=$?
    stop_pid "$PROM_PID" prometheus
    if [[ -z $KEEP ]]; then
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

FAILED=0

# 2. metric lint: names, help text, suffixes.
curl -sf --max-time 10 "$METRICS" -o "$WORK/metrics.txt" || die "cannot read $METRICS"
if ((LINT_METRICS)); then
    if promtool check metrics <"$WORK/metrics.txt" >"$WORK/metrics-lint.txt" 2>&1; then
        log "promtool check metrics: ok"
    else
        log "promtool check metrics found problems:"
        cat "$WORK/metrics-lint.txt" >&2
        FAILED=1
    fi
fi

# 3. parse check of every expression.
"$PYTHON" "$ROOT/scripts/dashboard_metrics.py" --dashboard "$DASHBOARD" rules "$WORK/dashboard-rules.yml"
if promtool check rules "$WORK/dashboard-rules.yml" >"$WORK/rules-check.txt" 2>&1; then
    log "promtool check rules: $(grep -o '[0-9]* rules found' "$WORK/rules-check.txt")"
else
    cat "$WORK/rules-check.txt" >&2
    FAILED=1
fi

# 4. a private Prometheus scraping specd.
path=/${METRICS#*://*/}
[[ $METRICS == *://*/* ]] || path=/metrics
start_prometheus "$WORK" "$(url_hostport "$METRICS")" 1s "$path" specd
log "prometheus $PROM_URL scraping $METRICS (data in $WORK)"
STARTED=$(date +%s)
wait_for_scrape "$PROM_URL" 0 60 || die "prometheus could not scrape $METRICS"
log "first scrape ok"

# 5. load.
if [[ -n $LOAD ]]; then
    log "running load: $LOAD"
    if ! SPECD_URL=$SPECD PROMETHEUS_URL=$PROM_URL bash -c "$LOAD"; then
        log "load command failed"
        FAILED=1
    fi
fi
LOAD_END=$(date +%s.%N)
wait_for_scrape "$PROM_URL" "$LOAD_END" 30 || die "no scrape after the load ended"

# 6. every expression must return data.
window=$(($(date +%s) - STARTED + 5))
((window >= 30)) || window=30
RATE_INTERVAL=${RATE_INTERVAL:-${window}s}
log "evaluating dashboard queries with \$__rate_interval=$RATE_INTERVAL \$__range=${window}s"
if ! "$PYTHON" "$ROOT/scripts/dashboard_metrics.py" --dashboard "$DASHBOARD" \
    --rate-interval "$RATE_INTERVAL" --range "${window}s" check --prometheus "$PROM_URL"; then
    FAILED=1
fi

if [[ -n $RENDER ]]; then
    "$ROOT/scripts/render_dashboard.py" --prometheus "$PROM_URL" --dashboard "$DASHBOARD" \
        --start "$STARTED" --end "$(date +%s)" --out "$RENDER" || FAILED=1
fi

if ((FAILED)); then
    log "FAILED"
    exit 1
fi
log "all dashboard queries returned data"
