#!/usr/bin/env bash
# Build specd's container image from the project's Dockerfile on a machine that cannot
# pull from any container registry, run it in front of a real vLLM on the CPU and check
# it through the container.
#
#   scripts/image-test.sh [--no-run] [--no-cuda] [--keep-docker]
#
#   --no-run        build only (no vLLM, no container checks)
#   --no-cuda       skip the attempt at the CUDA target
#   --keep-docker   leave the private Docker daemon running afterwards (for
#                   deploy/compose-cpu.sh or a second run)
#
# What it does:
#  1. installs Debian's docker.io and debootstrap when missing, and starts a private
#     dockerd (socket, data and exec roots under $SPECD_CACHE_DIR/docker; the layer cache
#     is kept there for the next run) unless one answers there already;
#  2. makes local base images, since none can be pulled:
#       specd-local/debian:bookworm      debootstrap --variant=minbase bookworm + docker import
#       specd-local/rust:1.95-bookworm   the same + gcc, libc6-dev, ca-certificates and this
#                                        machine's Rust toolchain, laid out like the official
#                                        rust:1.95-bookworm (RUSTUP_HOME=/usr/local/rustup,
#                                        CARGO_HOME=/usr/local/cargo)
#  3. builds the unchanged Dockerfile with
#       --build-arg BUILDER_IMAGE=specd-local/rust:1.95-bookworm
#       --build-arg RUNTIME_IMAGE=specd-local/debian:bookworm
#     (crates come from crates.io), and prints the build time and the image size;
#  4. starts vLLM on the CPU (scripts/vllm-cpu-upstream.sh; stopped again at the end if
#     this script started it), runs the image with --network host on a free loopback
#     port, the model folder mounted read-only for the tokenizer, and checks: /readyz, a
#     greedy completion with speculation on (usage.speculation.rounds > 0), specd_
#     metrics on /metrics, and `docker stop` (SIGTERM): exit status 0 and the drained log
#     line;
#  5. tries the CUDA target (--target cuda) and reports where it stops: its base images
#     nvidia/cuda:*-devel/-runtime cannot be pulled here and are not buildable from Debian.
#
# Environment: SPECD_CACHE_DIR (default ~/.cache/specd), SPECD_IMAGE_TAG (default
# specd:image-test), SPECD_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# SPECD_VLLM_MODEL (default target), SPECD_MODELS_DIR (default $SPECD_CACHE_DIR/models),
# SPECD_IMAGE_BUILD_TIMEOUT (seconds, default 3600). Run as root (dockerd, debootstrap).
# A cold build takes about 11 minutes on 2 cores, so this is not part of scripts/test.sh;
# see docs/deployment.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOG_PREFIX=image-test
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"
# shellcheck source=scripts/docker-local.sh
source "$ROOT/scripts/docker-local.sh"

RUN=1
CUDA=1
KEEP_DOCKER=0
while (($#)); do
    case $1 in
    --no-run) RUN=0 ;;
    --no-cuda) CUDA=0 ;;
    --keep-docker) KEEP_DOCKER=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $1" ;;
    esac
    shift
done

TAG=${SPECD_IMAGE_TAG:-specd:image-test}
MODEL=${SPECD_VLLM_MODEL:-target}
MODELS=${SPECD_MODELS_DIR:-$CACHE/models}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/specd-image-test.XXXXXX")
NAME=specd-image-test-$$
STARTED_VLLM=0
FAILED=0
# A vLLM server of this script's own (its own served name, so its own state folder):
# another user of scripts/vllm-cpu-upstream.sh with other arguments is left alone.
SERVED=specd-image-test-$MODEL
vllm_upstream() { SPECD_VLLM_MODEL=$MODEL SPECD_VLLM_SERVED_NAME=$SERVED "$ROOT/scripts/vllm-cpu-upstream.sh" "$@"; }

cleanup() {
    local rc=$?
    docker_cli rm -f "$NAME" >/dev/null 2>&1 || true
    if ((STARTED_VLLM)); then
        vllm_upstream stop || true
    fi
    ((KEEP_DOCKER)) || docker_stop_daemon
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

fail() {
    log "FAIL: $*"
    FAILED=$((FAILED + 1))
}

docker_ensure_packages
docker_start_daemon
docker_base_images

# --- 3. the image -----------------------------------------------------------------------
log "building $TAG from the Dockerfile (BUILDER_IMAGE=$BUILDER_LOCAL, RUNTIME_IMAGE=$RUNTIME_LOCAL)"
build_start=$SECONDS
if ! DOCKER_BUILDKIT=1 timeout "${SPECD_IMAGE_BUILD_TIMEOUT:-3600}" \
    "$DOCKER_BIN" build --progress=plain --network host \
    --build-arg BUILDER_IMAGE="$BUILDER_LOCAL" --build-arg RUNTIME_IMAGE="$RUNTIME_LOCAL" \
    -t "$TAG" "$ROOT" >"$WORK/build.log" 2>&1; then
    tail -n 40 "$WORK/build.log" >&2
    die "docker build failed (log above)"
fi
BUILD_S=$((SECONDS - build_start))
# The steps with their times ("#12 [builder 3/5] RUN cargo chef cook ..." ... "#12 DONE 812.3s").
"$PYTHON" - "$WORK/build.log" >&2 <<'EOF'
import re, sys
names, done = {}, {}
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"#(\d+) (\[.*)", line)
    if m and m.group(1) not in names:
        names[m.group(1)] = m.group(2).strip()[:100]
    m = re.match(r"#(\d+) (DONE [\d.]+s|CACHED)", line)
    if m:
        done[m.group(1)] = m.group(2)
for k, name in names.items():
    print(f"  {done.get(k, '?'):>12}  {name}")
EOF
size=$(docker_cli image inspect -f '{{.Size}}' "$TAG")
base=$(docker_cli image inspect -f '{{.Size}}' "$RUNTIME_LOCAL")
echo "image $TAG: build ${BUILD_S} s, size $((size / 1000000)) MB" \
    "(runtime base $RUNTIME_LOCAL $((base / 1000000)) MB, specd layers $(((size - base) / 1000000)) MB)"
echo "binary: $(docker_cli run --rm --entrypoint /usr/local/bin/specd "$TAG" --version 2>&1 | head -n1)"

# --- 4. run it in front of vLLM ---------------------------------------------------------
if ((RUN)); then
    log "starting vLLM on the CPU (model $MODEL)"
    if ! vllm_upstream status >/dev/null 2>&1; then
        STARTED_VLLM=1
    fi
    UPSTREAM=$(vllm_upstream start | tail -n1)
    UPSTREAM=${UPSTREAM#UPSTREAM=}
    [[ $UPSTREAM == http://127.0.0.1:* ]] || die "no upstream URL (got '$UPSTREAM')"

    # A free loopback port: the kernel picks one, specd binds it right after.
    PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    URL=http://127.0.0.1:$PORT
    log "running $TAG on $URL in front of $UPSTREAM (tokenizer /models/$MODEL, read-only mount)"
    docker_cli run -d --name "$NAME" --network host \
        -v "$MODELS/$MODEL:/models/$MODEL:ro" \
        -e SPECD_UPSTREAM="$UPSTREAM" -e SPECD_LISTEN="127.0.0.1:$PORT" \
        -e SPECD_TOKENIZER="/models/$MODEL" -e SPECD_SPECULATION=auto -e SPECD_LOG_FORMAT=text \
        "$TAG" >/dev/null

    deadline=$((SECONDS + 120))
    until curl -sf -o /dev/null --max-time 5 "$URL/readyz"; do
        [[ $(docker_cli inspect -f '{{.State.Running}}' "$NAME") == true ]] || {
            docker_cli logs "$NAME" 2>&1 | tail -n 20 >&2
            die "the specd container exited"
        }
        ((SECONDS < deadline)) || die "specd in the container did not become ready"
        sleep 0.2
    done
    echo "ok    /readyz through the container: $(curl -s "$URL/readyz")"

    # The prompt repeats itself, so the n-gram drafter has something to propose.
    body=$("$PYTHON" -c 'import json,sys; print(json.dumps({"model": sys.argv[1],
        "prompt": "one two three four five six seven eight " * 6, "max_tokens": 48,
        "temperature": 0, "speculation": {"mode": "on", "drafter": "ngram"}}))' "$SERVED")
    resp=$(curl -sf --max-time 300 "$URL/v1/completions" -H 'content-type: application/json' -d "$body") \
        || die "the completion through the container failed"
    spec=$("$PYTHON" -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["usage"].get("speculation")))' "$resp")
    echo "usage.speculation through the container: $spec"
    if "$PYTHON" -c 'import json,sys; s=json.loads(sys.argv[1]); sys.exit(0 if s and s.get("rounds", 0) > 0 else 1)' "$spec"; then
        echo "ok    speculated request (rounds > 0)"
    else
        fail "the completion was not speculated: $resp"
    fi

    # The same request through the header instead of the body field.
    body=$("$PYTHON" -c 'import json,sys; print(json.dumps({"model": sys.argv[1],
        "prompt": "a b c d a b c d a b c d a b c d", "max_tokens": 24, "temperature": 0}))' "$SERVED")
    resp=$(curl -sf --max-time 300 "$URL/v1/completions" -H 'content-type: application/json' \
        -H 'x-speculation: on' -d "$body") || die "the completion with x-speculation: on failed"
    if "$PYTHON" -c 'import json,sys; s=json.loads(sys.argv[1])["usage"].get("speculation"); sys.exit(0 if s and s.get("rounds", 0) > 0 else 1)' "$resp"; then
        echo "ok    speculated request (x-speculation: on header)"
    else
        fail "the x-speculation: on completion was not speculated: $resp"
    fi

    metrics=$(curl -sf "$URL/metrics") || die "/metrics failed"
    n=$(grep -c '^specd_' <<<"$metrics" || true)
    drafts=$(awk '/^specd_spec_decode_num_drafts_total/ {s += $NF} END {print s + 0}' <<<"$metrics")
    if ((n > 0)) && grep -q '^specd_requests_total' <<<"$metrics" && [[ $drafts != 0 ]]; then
        echo "ok    /metrics: $n specd_ samples, specd_spec_decode_num_drafts_total $drafts"
    else
        fail "/metrics lacks specd_ metrics (samples $n, drafts $drafts)"
    fi

    log "docker stop (SIGTERM) and waiting for the drain"
    docker_cli stop -t 60 "$NAME" >/dev/null
    code=$(docker_cli inspect -f '{{.State.ExitCode}}' "$NAME")
    drained=$(docker_cli logs "$NAME" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | grep -i 'drained' | tail -n1 || true)
    if [[ $code == 0 && -n $drained ]]; then
        echo "ok    SIGTERM drain: exit status 0, log: ${drained}"
    else
        fail "after docker stop: exit status $code, drained line '${drained}'"
        docker_cli logs "$NAME" 2>&1 | tail -n 20 >&2
    fi
fi

# --- 5. the CUDA target -----------------------------------------------------------------
if ((CUDA)); then
    log "trying the CUDA target (docker build --target cuda)"
    # cuda_build LOG [BUILD-ARGS...]: build --target cuda; prints where it stopped.
    cuda_build() {
        local out=$1
        shift
        if DOCKER_BUILDKIT=1 docker_cli build --progress=plain --network host --target cuda \
            --build-arg BUILDER_IMAGE="$BUILDER_LOCAL" --build-arg RUNTIME_IMAGE="$RUNTIME_LOCAL" \
            "$@" -t specd:cuda-image-test "$ROOT" >"$out" 2>&1; then
            echo "cuda  the CUDA image built"
            return 0
        fi
        local step why
        step=$(grep -E '^#[0-9]+ \[' "$out" | tail -n1 | cut -c1-110)
        why=$(grep -E 'curl: \(|no such host' "$out" | tail -n1 | cut -c1-250)
        [[ -n $why ]] || why=$(grep -E 'ERROR|error:' "$out" | tail -n1 | cut -c1-250)
        echo "cuda  stops at: ${step:-resolving the base images}"
        echo "      because: ${why:-see the build log}"
        return 1
    }
    echo "cuda  1. the Dockerfile's CUDA base images (nvidia/cuda devel and runtime):"
    cuda_build "$WORK/cuda.log" || true
    echo "cuda  2. with Debian stand-ins for them (CUDA_DEVEL_IMAGE=$BUILDER_LOCAL,"
    echo "      CUDA_RUNTIME_IMAGE=$RUNTIME_LOCAL), to see the next step that needs the network:"
    cuda_build "$WORK/cuda2.log" --build-arg CUDA_DEVEL_IMAGE="$BUILDER_LOCAL" \
        --build-arg CUDA_RUNTIME_IMAGE="$RUNTIME_LOCAL" || true
    echo "      The CUDA image needs NVIDIA's CUDA images (toolkit with nvcc, runtime libraries),"
    echo "      which only a container registry provides (Debian's main component has no CUDA"
    echo "      toolkit), and rustup's installer from static.rust-lang.org; neither is reachable"
    echo "      here. The specd binary with the cuda feature builds on this machine without them:"
    echo "      scripts/build-cuda.sh (CUDA from PyPI wheels, a stub libcuda for linking)."
    docker_cli rmi specd:cuda-image-test >/dev/null 2>&1 || true
fi

if ((FAILED)); then
    die "$FAILED check(s) failed"
fi
log "all checks passed"
