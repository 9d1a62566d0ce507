# shellcheck shell=bash
# Docker on a machine without registry access (sourced by scripts/image-test.sh and
# deploy/compose-cpu.sh): Debian's docker.io daemon on a private socket, and local base
# images made from a debootstrap of Debian bookworm, since no image can be pulled.
# Needs log/die/PYTHON from deploy/local/lib.sh.

CACHE=${SPECD_CACHE_DIR:-$HOME/.cache/specd}
DOCKER_DIR=${SPECD_DOCKER_DIR:-$CACHE/docker}
DOCKER_SOCK=$DOCKER_DIR/docker.sock
export DOCKER_HOST=unix://$DOCKER_SOCK
RUST_VERSION=${RUST_VERSION:-1.95}
RUNTIME_LOCAL=specd-local/debian:bookworm
BUILDER_LOCAL=specd-local/rust:$RUST_VERSION-bookworm
DEBIAN_MIRROR=${SPECD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
STARTED_DOCKERD=0

# Debian's client, which matches Debian's daemon, ahead of any other docker on PATH.
DOCKER_BIN=docker
[[ -x /usr/bin/docker ]] && DOCKER_BIN=/usr/bin/docker
docker_cli() { "$DOCKER_BIN" "$@"; }

_as_root() {
    if [[ $(id -u) == 0 ]]; then
        "$@"
    else
        sudo "$@"
    fi
}

# Install what is missing of: docker.io, debootstrap, docker-compose (Debian bookworm main).
docker_ensure_packages() {
    local missing=() p
    for p in docker.io:dockerd debootstrap:debootstrap docker-compose:docker-compose; do
        [[ -x /usr/sbin/${p#*:} || -x /usr/bin/${p#*:} ]] || missing+=("${p%%:*}")
    done
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]} (apt)"
    _as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    _as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# Start dockerd on $DOCKER_SOCK unless one answers there. It runs at a lower CPU priority
# (niceness 10, inherited by builds and containers) so that it shares a small machine.
docker_start_daemon() {
    mkdir -p "$DOCKER_DIR"
    if docker_cli info >/dev/null 2>&1; then
        log "using the Docker daemon already on $DOCKER_SOCK"
        return 0
    fi
    [[ $(id -u) == 0 ]] || die "dockerd needs root (run as root, or start a daemon on $DOCKER_SOCK)"
    log "starting dockerd on $DOCKER_SOCK (data in $DOCKER_DIR/data, log $DOCKER_DIR/dockerd.log)"
    rm -f "$DOCKER_SOCK"
    nice -n 10 dockerd --host="$DOCKER_HOST" --data-root="$DOCKER_DIR/data" \
        --exec-root="$DOCKER_DIR/exec" --pidfile="$DOCKER_DIR/docker.pid" \
        </dev/null >"$DOCKER_DIR/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    STARTED_DOCKERD=1
    local deadline=$((SECONDS + 60))
    until docker_cli info >/dev/null 2>&1; do
        kill -0 "$DOCKERD_PID" 2>/dev/null || {
            tail -n 20 "$DOCKER_DIR/dockerd.log" >&2
            die "dockerd exited during start-up"
        }
        ((SECONDS < deadline)) || die "dockerd did not answer on $DOCKER_SOCK"
        sleep 0.2
    done
}

# Stop the daemon if docker_start_daemon started it.
docker_stop_daemon() {
    ((STARTED_DOCKERD)) || return 0
    log "stopping dockerd (pid $DOCKERD_PID)"
    kill -TERM "$DOCKERD_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 300; i++)); do
        kill -0 "$DOCKERD_PID" 2>/dev/null || break
        sleep 0.1
    done
    STARTED_DOCKERD=0
}

# The host's toolchain directory for Rust $RUST_VERSION (its rustc reports that version).
_host_toolchain() {
    local d v
    for d in "${RUSTUP_HOME:-$HOME/.rustup}"/toolchains/*/; do
        [[ -x $d/bin/rustc && -x $d/bin/cargo ]] || continue
        v=$("$d/bin/rustc" --version 2>/dev/null | awk '{print $2}')
        if [[ $v == "$RUST_VERSION" || $v == "$RUST_VERSION".* ]]; then
            echo "${d%/}"
            return 0
        fi
    done
    return 1
}

# Make $RUNTIME_LOCAL (debootstrap minbase bookworm, imported) and $BUILDER_LOCAL (that,
# plus a C tool chain, this machine's CA certificates and its Rust toolchain) unless they
# exist.
docker_base_images() {
    local img=$DOCKER_DIR/images started=$SECONDS
    mkdir -p "$img"
    if ! docker_cli image inspect "$RUNTIME_LOCAL" >/dev/null 2>&1; then
        if [[ ! -f $img/bookworm-minbase.tar ]]; then
            log "debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR (a few minutes)"
            rm -rf "$img/rootfs"
            debootstrap --variant=minbase bookworm "$img/rootfs" "$DEBIAN_MIRROR" \
                >"$img/debootstrap.log" 2>&1 || {
                tail -n 20 "$img/debootstrap.log" >&2
                die "debootstrap failed"
            }
            # No package caches or lists in the image; apt-get update restores the lists.
            rm -rf "$img/rootfs/var/cache/apt/archives/"*.deb "$img/rootfs/var/lib/apt/lists/"*
            tar --numeric-owner -C "$img/rootfs" -cf "$img/bookworm-minbase.tar.tmp" .
            mv "$img/bookworm-minbase.tar.tmp" "$img/bookworm-minbase.tar"
            rm -rf "$img/rootfs"
        fi
        log "docker import $RUNTIME_LOCAL"
        docker_cli import --change 'CMD ["/bin/bash"]' "$img/bookworm-minbase.tar" "$RUNTIME_LOCAL" >/dev/null
        log "made $RUNTIME_LOCAL in $((SECONDS - started)) s"
        started=$SECONDS
    fi
    if docker_cli image inspect "$BUILDER_LOCAL" >/dev/null 2>&1; then
        return 0
    fi
    local tc ctx=$img/builder-context
    tc=$(_host_toolchain) || die "no Rust $RUST_VERSION toolchain under ${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
    log "making $BUILDER_LOCAL from $RUNTIME_LOCAL and the toolchain $tc"
    rm -rf "$ctx"
    mkdir -p "$ctx/rustup/toolchains" "$ctx/cargo/bin"
    local name
    name=$("$tc/bin/rustc" --version | awk '{print $2}')-x86_64-unknown-linux-gnu
    # The toolchain without its documentation (share/doc is most of its size).
    mkdir -p "$ctx/rustup/toolchains/$name"
    cp -a "$tc/bin" "$tc/lib" "$ctx/rustup/toolchains/$name/"
    [[ -d $tc/libexec ]] && cp -a "$tc/libexec" "$ctx/rustup/toolchains/$name/"
    [[ -d $tc/etc ]] && cp -a "$tc/etc" "$ctx/rustup/toolchains/$name/"
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\nauto_self_update = "disable"\n' \
        "$name" >"$ctx/rustup/settings.toml"
    local rustup_bin
    rustup_bin=$(command -v rustup || echo "${CARGO_HOME:-$HOME/.cargo}/bin/rustup")
    if [[ -x $rustup_bin ]]; then
        # rustup and its proxies, as in the official image.
        cp "$rustup_bin" "$ctx/cargo/bin/rustup"
        local p
        for p in cargo rustc rustdoc rust-gdb rust-lldb; do
            ln -s rustup "$ctx/cargo/bin/$p"
        done
    else
        local p
        for p in cargo rustc rustdoc; do
            ln -s "/usr/local/rustup/toolchains/$name/bin/$p" "$ctx/cargo/bin/$p"
        done
    fi
    # The builder trusts what this machine trusts: crates.io is reached through the same
    # network, which may inspect TLS with its own certificate authority.
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
    cat >"$ctx/Dockerfile" <<EOF
FROM $RUNTIME_LOCAL
RUN apt-get update \\
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev pkg-config \\
    && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV RUSTUP_HOME=/usr/local/rustup \\
    CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    RUST_VERSION=$name
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
RUN cargo --version && rustc --version
EOF
    docker_cli build --network host -t "$BUILDER_LOCAL" "$ctx" >"$img/builder.log" 2>&1 || {
        tail -n 20 "$img/builder.log" >&2
        die "building $BUILDER_LOCAL failed"
    }
    rm -rf "$ctx"
    log "made $BUILDER_LOCAL in $((SECONDS - started)) s"
}
