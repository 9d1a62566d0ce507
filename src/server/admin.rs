//! specd's own endpoints: `/livez` (the process runs), `/readyz` (the upstream answers,
//! the tokenizer check has concluded, and specd is not draining), `/metrics` (Prometheus text). `/specd/metrics` is an alias.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::Shared;

pub fn is_admin_path(p: &str) -> bool {
    matches!(p, "/livez" | "/readyz" | "/metrics" | "/specd/metrics")
}

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/specd/metrics", get(metrics))
}

async fn livez() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

async fn readyz(State(st): State<Shared>) -> impl IntoResponse {
    if st.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else if !st.upstream.is_ready() {
        (StatusCode::SERVICE_UNAVAILABLE, "upstream not ready\n")
    } else if !st
        .tokenizer_decided
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        (StatusCode::SERVICE_UNAVAILABLE, "checking the tokenizer\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(st): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
}
