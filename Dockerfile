# specd container images.
#
#   CPU drafters (ngram, suffix, model on the CPU), the default target:
#     docker build -t specd .
#   Draft model on an NVIDIA GPU (cargo feature `cuda`):
#     docker build --target cuda --build-arg CUDA_COMPUTE_CAP=90 -t specd:cuda .
#
# cargo-chef builds the dependencies from a recipe of the manifests in their own layer,
# so a change to specd's sources rebuilds only specd. Both images run as a non-root user
# and listen on 0.0.0.0:8100 (override with SPECD_LISTEN or --listen).
# Build with BuildKit (the default builder): it skips the stages a target does not need
# (the legacy builder would build the CUDA stages for the CPU image too). The Dockerfile
# uses only the builder's built-in syntax, so no frontend image is pulled.
#
# The base images are build arguments, so that a machine without access to the public
# registries can substitute local ones (scripts/image-test.sh builds this Dockerfile from
# a debootstrapped Debian that way); the defaults below are what a user gets:
#   BUILDER_IMAGE       Debian bookworm with Rust (cargo on PATH, a C compiler)
#   RUNTIME_IMAGE       the CPU image's base: glibc and libgcc, nothing else needed
#   CUDA_DEVEL_IMAGE    the CUDA toolkit (nvcc) for the `cuda` build
#   CUDA_RUNTIME_IMAGE  the CUDA runtime libraries for the `cuda` image

ARG RUST_VERSION=1.95
ARG CARGO_CHEF_VERSION=0.1.78
ARG CUDA_VERSION=13.0.0
ARG UBUNTU_VERSION=24.04
ARG BUILDER_IMAGE=rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}

FROM ${BUILDER_IMAGE} AS chef
ARG CARGO_CHEF_VERSION
RUN cargo install --locked cargo-chef --version "${CARGO_CHEF_VERSION}"
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin specd
COPY . .
RUN cargo build --release --locked --bin specd \
    && strip target/release/specd

# --- CUDA: the same build on the CUDA devel image, run on the CUDA runtime image. ---
FROM ${CUDA_DEVEL_IMAGE} AS cuda-chef
ARG RUST_VERSION
ARG CARGO_CHEF_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl gcc g++ pkg-config \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:${PATH}
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --no-modify-path --profile minimal --default-toolchain "${RUST_VERSION}" \
    && cargo install --locked cargo-chef --version "${CARGO_CHEF_VERSION}"
WORKDIR /src

FROM cuda-chef AS cuda-builder
# candle compiles its kernels for this compute capability: 90 = H100/H200, 80 = A100,
# 89 = L4/L40S, 100 = B200, 120 = RTX 50xx.
ARG CUDA_COMPUTE_CAP=90
# The linker resolves libcuda against the toolkit's stub; the driver's libcuda.so.1 is
# used at run time (mounted by the NVIDIA container toolkit).
ENV CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP} \
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --features cuda --recipe-path recipe.json --bin specd
COPY . .
RUN cargo build --release --locked --features cuda --bin specd \
    && strip target/release/specd

FROM ${CUDA_RUNTIME_IMAGE} AS cuda
RUN groupadd --system --gid 10001 specd \
    && useradd --system --uid 10001 --gid specd --no-create-home --shell /usr/sbin/nologin specd
COPY --from=cuda-builder /src/target/release/specd /usr/local/bin/specd
USER 10001:10001
ENV SPECD_LISTEN=0.0.0.0:8100
EXPOSE 8100
ENTRYPOINT ["/usr/local/bin/specd"]
CMD ["serve"]

# --- CPU runtime (default target, last so that a plain `docker build` picks it). ---
FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=builder /src/target/release/specd /usr/local/bin/specd
# distroless "nonroot" user
USER 65532:65532
ENV SPECD_LISTEN=0.0.0.0:8100
EXPOSE 8100
ENTRYPOINT ["/usr/local/bin/specd"]
CMD ["serve"]
