# shellcheck shell=bash
# Helpers shared by deploy/local/*.sh and scripts/prometheus-check.sh (source this file).
# Everything listens on 127.0.0.1 only.

log() { echo "${LOG_PREFIX:-specd}: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

PYTHON=${SPECD_PYTHON:-python3}

# Install Debian's prometheus package (server + promtool) when it is missing.
ensure_prometheus() {
    if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
        return 0
    fi
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || die "prometheus is not installed and this user cannot install it"
        sudo=(sudo)
    fi
    log "installing Debian's prometheus package"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends prometheus >&2
    command -v prometheus >/dev/null || die "prometheus did not install"
}

# host:port of an http://host:port[/path] URL.
url_hostport() {
    local rest=${1#*://}
    echo "${rest%%/*}"
}

# start_prometheus DIR TARGET [SCRAPE_INTERVAL] [METRICS_PATH] [JOB]
# Writes DIR/prometheus.yml, keeps its TSDB in DIR/data, logs to DIR/prometheus.log.
# Listens on an ephemeral loopback port chosen by the kernel (no probe-then-bind race).
# Sets PROM_PID and PROM_URL.
start_prometheus() {
    local dir=$1 target=$2 interval=${3:-1s} path=${4:-/metrics} job=${5:-specd}
    mkdir -p "$dir/data"
    cat >"$dir/prometheus.yml" <<EOF
global:
  scrape_interval: $interval
  scrape_timeout: $interval
  evaluation_interval: $interval
scrape_configs:
  - job_name: $job
    metrics_path: $path
    static_configs:
      - targets: ['$target']
EOF
    promtool check config "$dir/prometheus.yml" >&2 || die "bad Prometheus config $dir/prometheus.yml"
    # The log exists before the loop below reads it: the background job opens it only
    # once it runs, and on a busy machine `sed` got there first (exit 2 under set -e).
    : >"$dir/prometheus.log"
    prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
        --storage.tsdb.retention.time=1d --web.listen-address=127.0.0.1:0 \
        --web.enable-lifecycle </dev/null >"$dir/prometheus.log" 2>&1 &
    PROM_PID=$!
    echo "$PROM_PID" >"$dir/prometheus.pid"
    local deadline=$((SECONDS + 60)) addr=""
    while ((SECONDS < deadline)); do
        kill -0 "$PROM_PID" 2>/dev/null || {
            tail -n 20 "$dir/prometheus.log" >&2
            die "prometheus exited during start-up"
        }
        addr=$(sed -n 's/.*msg="Listening on" address=\([0-9.:]*\).*/\1/p' "$dir/prometheus.log" | head -n1)
        [[ -n $addr ]] && break
        sleep 0.1
    done
    [[ -n $addr ]] || die "prometheus did not report its address (log: $dir/prometheus.log)"
    PROM_URL=http://$addr
    echo "$PROM_URL" >"$dir/prometheus.url"
    while ((SECONDS < deadline)); do
        curl -sf -o /dev/null --max-time 2 "$PROM_URL/-/ready" && return 0
        sleep 0.1
    done
    die "prometheus at $PROM_URL did not become ready"
}

# wait_for_scrape PROM_URL [AFTER_EPOCH] [TIMEOUT_S]
# Returns once every active target is up and was scraped after AFTER_EPOCH (default 0).
wait_for_scrape() {
    "$PYTHON" - "$@" <<'EOF'
import json, re, sys, time, urllib.request
from datetime import datetime
url, after = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
deadline = time.monotonic() + (float(sys.argv[3]) if len(sys.argv) > 3 else 60)
last = "no answer"
def epoch(ts):
    ts = re.sub(r"(\.\d{6})\d+", r"\1", ts).replace("Z", "+00:00")
    return datetime.fromisoformat(ts).timestamp()
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url + "/api/v1/targets?state=active", timeout=5) as r:
            targets = json.load(r)["data"]["activeTargets"]
        if targets and all(t["health"] == "up" and epoch(t["lastScrape"]) > after for t in targets):
            sys.exit(0)
        last = "; ".join(f'{t["scrapeUrl"]}: {t["health"]} {t.get("lastError", "")}' for t in targets) or "no targets"
    except Exception as e:  # Prometheus still starting
        last = str(e)
    time.sleep(0.2)
print(f"no successful scrape: {last}", file=sys.stderr)
sys.exit(1)
EOF
}

# stop_pid PID [NAME]: SIGTERM, wait up to 20 s, then SIGKILL.
stop_pid() {
    local pid=$1 name=${2:-process} i
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    log "$name still running after 20 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}
