#!/usr/bin/env bash
# Start, stop or query a real SGLang server on the CPU, used as specd's test upstream.
#
#   scripts/sglang-cpu-upstream.sh [start|stop|status|install]   (default: start)
#
# start   installs the pinned sglang into a cached venv if needed, builds the test models
#         if missing, starts SGLang on 127.0.0.1 (or reuses a healthy instance), waits for
#         /health and prints `UPSTREAM=http://127.0.0.1:PORT` as the last line on stdout.
#         Everything else goes to stderr.
# stop    sends SIGTERM to the server's process group and waits for it to end.
# status  prints `UPSTREAM=...` when the instance is running and healthy, else exits 1.
# install only creates the venv (and the models).
#
# PyPI's sglang ships only the CUDA build of its kernel package (sgl-kernel), which cannot
# load without libcuda. Its loader falls back to `import common_ops`; an empty module of
# that name lets it import with no kernels, and SGLang's Llama path then runs in plain
# PyTorch on the CPU (torch_native attention, pytorch sampling, no CUDA graphs).
# --sleep-on-idle keeps the idle scheduler from spinning (about half a core otherwise).
#
# Environment:
#   SPECD_CACHE_DIR            cache root (default ~/.cache/specd)
#   SPECD_MODELS_DIR           model folder (default $SPECD_CACHE_DIR/models)
#   SPECD_SGLANG_VENV          venv path (default $SPECD_CACHE_DIR/sglang-venv)
#   SPECD_SGLANG_MODEL         model folder name under the models dir (default target)
#   SPECD_SGLANG_SERVED_NAME   served model name (default specd-$SPECD_SGLANG_MODEL)
#   SPECD_SGLANG_START_TIMEOUT seconds to wait for /health (default 1200)
#   SPECD_SGLANG_EXTRA_ARGS    extra arguments for the server (word-split; default
#                              "--dtype float32", which makes batched and single-sequence
#                              logprobs agree to ~1e-5)
#   SPECD_PYTHON               interpreter for the venv (default python3, needs >= 3.10)
set -euo pipefail

SGLANG_VERSION=0.5.23

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SPECD_CACHE_DIR:-$HOME/.cache/specd}
MODELS=${SPECD_MODELS_DIR:-$CACHE/models}
VENV=${SPECD_SGLANG_VENV:-$CACHE/sglang-venv}
MODEL=${SPECD_SGLANG_MODEL:-target}
SERVED=${SPECD_SGLANG_SERVED_NAME:-specd-$MODEL}
START_TIMEOUT=${SPECD_SGLANG_START_TIMEOUT:-1200}
EXTRA_ARGS=${SPECD_SGLANG_EXTRA_ARGS---dtype float32}
PYTHON=${SPECD_PYTHON:-python3}
RUN_ROOT=$CACHE/run
STATE=$RUN_ROOT/sglang-$SERVED
STAMP_WANT="sglang==$SGLANG_VERSION common_ops-shim"

log() { echo "sglang-cpu-upstream: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Take an exclusive lock on file $2 using fd $1 (released when the script exits).
lock() {
    mkdir -p "$(dirname "$2")"
    eval "exec $1>\"\$2\""
    flock "$1"
}

install_venv() {
    if [[ -f $VENV/.specd-complete && $(cat "$VENV/.specd-complete") == "$STAMP_WANT" ]]; then
        return 0
    fi
    log "building venv $VENV (sglang $SGLANG_VERSION, ~10 GB); takes a few minutes"
    rm -rf "$VENV"
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
        || die "$PYTHON is older than 3.10; set SPECD_PYTHON"
    "$PYTHON" -m venv "$VENV"
    local py=$VENV/bin/python
    "$py" -m pip install --quiet --disable-pip-version-check uv >&2
    # uv resolves and installs several times faster than pip; pip is the fallback.
    if ! UV_NATIVE_TLS=1 "$VENV/bin/uv" pip install --python "$py" \
        "sglang==$SGLANG_VERSION" >&2; then
        log "uv failed; falling back to pip"
        "$py" -m pip install --disable-pip-version-check "sglang==$SGLANG_VERSION" >&2
    fi
    local site
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '# Empty stand-in for the CUDA kernels of sgl-kernel (see %s).\n' \
        "scripts/sglang-cpu-upstream.sh" >"$site/common_ops.py"
    "$py" -c 'import sgl_kernel, sglang, torch' >&2
    echo "$STAMP_WANT" >"$VENV/.specd-complete"
    log "venv ready: $(du -sh "$VENV" | cut -f1)"
}

ensure_venv() {
    lock 8 "$CACHE/sglang-venv.lock"
    install_venv
    exec 8>&-
}

# The test models are built with the vLLM venv's tools when present (torch and
# transformers are in both venvs; make_models.py needs only those).
ensure_model() {
    if [[ -f $MODELS/$MODEL/.specd-complete ]]; then
        return 0
    fi
    local args=()
    [[ $MODEL == *-trained ]] && args+=(--trained)
    log "building test models in $MODELS"
    SPECD_MODELS_DIR=$MODELS "$VENV/bin/python" "$SCRIPT_DIR/make_models.py" "${args[@]}" >&2
    [[ -f $MODELS/$MODEL/.specd-complete ]] || die "model $MODEL not found in $MODELS"
}

# Is the recorded server alive, ours, and healthy? Sets PID and PORT.
healthy() {
    PID=$(cat "$STATE/pid" 2>/dev/null) || return 1
    PORT=$(cat "$STATE/port" 2>/dev/null) || return 1
    alive "$PID" || return 1
    curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:$PORT/health"
}

# The process exists and is an SGLang server (guards against a recycled pid).
alive() {
    [[ -n $1 ]] && kill -0 "$1" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q 'sglang.launch_server'
}

stop_server() {
    local pid
    pid=$(cat "$STATE/pid" 2>/dev/null) || return 0
    if alive "$pid"; then
        log "stopping SGLang (pid $pid)"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 300; i++)); do
            kill -0 -- "-$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 -- "-$pid" 2>/dev/null; then
            log "still running after 30 s; sending SIGKILL"
            kill -KILL -- "-$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$STATE/pid" "$STATE/port"
}

free_port() {
    "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

launch() {
    local model_dir=$MODELS/$MODEL
    mkdir -p "$STATE/tmp" "$STATE/cache"
    PORT=$(free_port)
    local extra=()
    # shellcheck disable=SC2206
    [[ -n $EXTRA_ARGS ]] && extra=($EXTRA_ARGS)
    log "starting SGLang $SGLANG_VERSION: model $model_dir as $SERVED on 127.0.0.1:$PORT (log $STATE/log)"
    # setsid makes the server a process-group leader, so stop reaches all its workers.
    # fd 9 (the state lock) must not leak into the server, or it would hold the lock.
    SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 \
        TMPDIR=$STATE/tmp XDG_CACHE_HOME=$STATE/cache \
        TRITON_CACHE_DIR=$STATE/cache/triton TORCHINDUCTOR_CACHE_DIR=$STATE/cache/inductor \
        setsid "$VENV/bin/python" -m sglang.launch_server \
        --model-path "$model_dir" --served-model-name "$SERVED" \
        --host 127.0.0.1 --port "$PORT" --device cpu \
        --attention-backend torch_native --sampling-backend pytorch \
        --disable-cuda-graph --enable-metrics --skip-server-warmup --sleep-on-idle \
        --context-length 2048 --max-total-tokens 8192 "${extra[@]}" \
        </dev/null >"$STATE/log" 2>&1 9>&- 8>&- &
    PID=$!
    echo "$PID" >"$STATE/pid"
    echo "$PORT" >"$STATE/port"
    echo "$MODEL" >"$STATE/model"
}

wait_healthy() {
    local deadline=$((SECONDS + START_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$PID" 2>/dev/null; then
            return 2
        fi
        if curl -sf -o /dev/null --max-time 5 "http://127.0.0.1:$PORT/health"; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

cmd_start() {
    ensure_venv
    mkdir -p "$STATE"
    lock 9 "$STATE/lock"
    if healthy; then
        if [[ $(cat "$STATE/model" 2>/dev/null) != "$MODEL" ]]; then
            die "$SERVED is already served from model $(cat "$STATE/model"); stop it first"
        fi
        log "reusing running SGLang (pid $PID)"
        echo "UPSTREAM=http://127.0.0.1:$PORT"
        return 0
    fi
    stop_server # a dead or unhealthy leftover
    ensure_model
    local attempt rc started=$SECONDS
    for attempt in 1 2 3; do
        launch
        rc=0
        wait_healthy || rc=$?
        if ((rc == 0)); then
            log "SGLang healthy after $((SECONDS - started)) s"
            echo "UPSTREAM=http://127.0.0.1:$PORT"
            return 0
        fi
        # Another process may have taken a port between probing and binding (SGLang also
        # binds internal ports next to the HTTP one).
        if ((rc == 2)) && grep -qi 'address already in use' "$STATE/log"; then
            log "a port was taken; retrying ($attempt)"
            continue
        fi
        break
    done
    log "SGLang did not become healthy (rc $rc); log tail:"
    tail -n 40 "$STATE/log" >&2 || true
    stop_server
    exit 1
}

cmd_stop() {
    [[ -d $STATE ]] || return 0
    lock 9 "$STATE/lock"
    stop_server
}

cmd_status() {
    if healthy; then
        echo "UPSTREAM=http://127.0.0.1:$PORT"
    else
        log "$SERVED is not running"
        exit 1
    fi
}

cmd_install() {
    ensure_venv
    ensure_model
}

case ${1:-start} in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
install) cmd_install ;;
*)
    echo "usage: $0 [start|stop|status|install]" >&2
    exit 2
    ;;
esac
