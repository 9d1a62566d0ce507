//! Client-facing HTTP: specd's own endpoints, the generation routes it may speculate on,
//! and transparent passthrough of everything else.

pub mod admin;
pub mod drain;
pub mod generate;
pub mod observe;
pub mod passthrough;
pub mod respond;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::Semaphore;

use crate::config::ServeArgs;
use crate::draft::Drafters;
use crate::error::ApiError;
use crate::inflight::InFlight;
use crate::metrics::labels::RejectReason;
use crate::metrics::Metrics;
use crate::speculation::controller::Controller;
use crate::tokens::ModelTokenizer;
use crate::upstream::verify::Backend;
use crate::upstream::Upstream;

pub struct AppState {
    pub args: ServeArgs,
    pub upstream: Arc<Upstream>,
    pub metrics: Arc<Metrics>,
    pub drafters: Drafters,
    pub controller: Arc<Controller>,
    /// The tokenizer speculation uses: set once it agrees with the upstream's.
    pub tokenizer: RwLock<Option<Arc<ModelTokenizer>>>,
    /// `--tokenizer`, loaded at start (checked against the upstream like any other).
    pub configured_tokenizer: Option<Arc<ModelTokenizer>>,
    /// Whether any check has concluded yet (the first outcome is always logged).
    pub tokenizer_decided: AtomicBool,
    pub backend: RwLock<Option<Arc<dyn Backend>>>,
    pub draining: AtomicBool,
    /// Ends what is still in flight when the drain timeout passes.
    pub drain_cut: drain::DrainCut,
    pub next_stream: AtomicU64,
    pub slots: Arc<Semaphore>,
    pub queued: AtomicUsize,
    /// Client requests being answered (the drain waits for them).
    pub in_flight: Arc<InFlight>,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn tokenizer(&self) -> Option<Arc<ModelTokenizer>> {
        self.tokenizer.read().ok().and_then(|g| g.clone())
    }
    pub fn backend(&self) -> Option<Arc<dyn Backend>> {
        self.backend.read().ok().and_then(|g| g.clone())
    }
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// Routes on the client address. With a separate admin address, /metrics, /livez and
/// /readyz are served there instead.
pub fn router(state: Shared, with_admin: bool) -> Router {
    let mut r = Router::new()
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/upstream/metrics", get(passthrough::upstream_metrics))
        .fallback(passthrough::any);
    if with_admin {
        r = r.merge(admin::routes());
    }
    r.layer(middleware::from_fn_with_state(
        (state.clone(), with_admin),
        gate,
    ))
    .with_state(state)
}

pub fn admin_router(state: Shared) -> Router {
    admin::routes().with_state(state)
}

/// Refuse requests while draining and without the API key. specd's own admin routes stay
/// open where they are served; with a separate admin address the same paths here are the
/// upstream's and get the same checks as every other forwarded request.
async fn gate(
    State((st, with_admin)): State<(Shared, bool)>,
    req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if with_admin && admin::is_admin_path(path) {
        return next.run(req).await;
    }
    if st.is_draining() {
        st.metrics
            .rejected
            .with_label_values(&[RejectReason::Draining.as_str()])
            .inc();
        return ApiError::Draining.into_response();
    }
    if let Some(key) = &st.args.api_key {
        let ok = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| constant_time_eq(given.trim().as_bytes(), key.as_bytes()));
        if !ok {
            st.metrics
                .rejected
                .with_label_values(&[RejectReason::Unauthorized.as_str()])
                .inc();
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

/// Compare without an early exit, so timing does not reveal how much of a key matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= x ^ y;
    }
    diff == 0
}

/// Bind and report the address (tests and scripts read this line).
pub async fn bind(addr: SocketAddr, what: &str) -> std::io::Result<tokio::net::TcpListener> {
    let l = tokio::net::TcpListener::bind(addr).await?;
    let local = l.local_addr()?;
    eprintln!("specd {what} listening on http://{local}");
    tracing::info!(%local, what, "listening");
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn key_compare() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
