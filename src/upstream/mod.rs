//! The upstream inference server: HTTP client, health, detection, and the calls specd
//! makes to it (tokenize, verify, relay).

pub mod detect;
mod idle;
pub mod load;
pub mod prom_text;
pub mod relay_chunk;
pub mod sglang;
pub mod sse;
pub mod tokenizer_check;
pub mod verify;
pub mod vllm;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::HeaderValue;
use reqwest::Client;
use serde_json::Value;

use crate::config::{ServeArgs, UpstreamKindArg};
use crate::error::ApiError;
use crate::metrics::Metrics;

pub use detect::{UpstreamInfo, UpstreamKind};
pub use load::Load;

/// How often the upstream's `/metrics` is read for [`Upstream::load`].
const LOAD_INTERVAL: Duration = Duration::from_secs(1);

pub struct Upstream {
    pub base: String,
    pub client: Client,
    forced_kind: Option<UpstreamKind>,
    info: RwLock<Option<Arc<UpstreamInfo>>>,
    ready: AtomicBool,
    verify_timeout: Duration,
    metrics: Arc<Metrics>,
    load: RwLock<Option<Load>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read the upstream CA certificate {0}: {1}")]
    CaRead(PathBuf, std::io::Error),
    #[error("no usable PEM certificate in {0}: {1}")]
    CaParse(PathBuf, String),
    #[error(transparent)]
    Build(#[from] reqwest::Error),
}

/// Attempts of one upstream call that may be repeated (see [`retry`]).
const ATTEMPTS: u32 = 3;

/// Pause before attempt `attempt + 1`: 50 ms, then 200 ms.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(50 * 4u64.pow(attempt.saturating_sub(1)))
}

/// Run `call` up to [`ATTEMPTS`] times while it fails transiently (see [`is_transient`]),
/// pausing [`backoff`] between attempts.
pub(crate) async fn retry<T, F, Fut>(path: &str, mut call: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Err(e) if attempt < ATTEMPTS && is_transient(&e) => {
                tracing::debug!(error = %e, attempt, path, "upstream call failed; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            r => return r,
        }
    }
}

impl Upstream {
    pub fn new(args: &ServeArgs, metrics: Arc<Metrics>) -> Result<Self, ClientError> {
        let mut builder = Client::builder()
            .connect_timeout(args.connect_timeout())
            .pool_idle_timeout(args.upstream_idle_timeout())
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true);
        if let Some(path) = &args.upstream_ca_cert {
            // Trusted in addition to the built-in web roots, for upstreams behind a private CA.
            let pem = std::fs::read(path).map_err(|e| ClientError::CaRead(path.clone(), e))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ClientError::CaParse(path.clone(), e.to_string()))?;
            if certs.is_empty() {
                return Err(ClientError::CaParse(
                    path.clone(),
                    "no certificate found".into(),
                ));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let client = builder.build()?;
        let forced_kind = match args.upstream_kind {
            UpstreamKindArg::Auto => None,
            UpstreamKindArg::Vllm => Some(UpstreamKind::Vllm),
            UpstreamKindArg::Sglang => Some(UpstreamKind::Sglang),
        };
        Ok(Upstream {
            base: args.upstream.trim_end_matches('/').to_string(),
            client,
            forced_kind,
            info: RwLock::new(None),
            ready: AtomicBool::new(false),
            verify_timeout: args.verify_timeout(),
            metrics,
            load: RwLock::new(None),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn info(&self) -> Option<Arc<UpstreamInfo>> {
        self.info.read().ok().and_then(|g| g.clone())
    }

    /// The upstream's latest load reading (requests running and waiting, KV cache use),
    /// refreshed about every second from its `/metrics` while it is ready. `None` until a
    /// first reading, or when the server exports no metrics (SGLang needs
    /// `--enable-metrics`). Check `Load::at` for staleness.
    pub fn load(&self) -> Option<Load> {
        *self.load.read().ok()?
    }

    /// Read `/metrics` once and publish the load it shows.
    pub async fn refresh_load(&self) -> Option<Load> {
        let kind = self.info()?.kind;
        let resp = self
            .client
            .get(self.url("/metrics"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let text = resp.text().await.ok()?;
        let l = load::parse(kind, &text)?;
        if let Ok(mut g) = self.load.write() {
            *g = Some(l);
        }
        Some(l)
    }

    /// Load loop: runs until the process ends; backs off when the upstream has no metrics.
    async fn watch_load(self: Arc<Self>) {
        let mut misses = 0u32;
        loop {
            let wait = if self.is_ready() && self.refresh_load().await.is_some() {
                misses = 0;
                LOAD_INTERVAL
            } else {
                misses = misses.saturating_add(1);
                if misses == 3 && self.is_ready() {
                    tracing::info!("upstream exports no load metrics; load signal unavailable");
                }
                LOAD_INTERVAL * misses.min(30)
            };
            tokio::time::sleep(wait).await;
        }
    }

    pub fn verify_timeout(&self) -> Duration {
        self.verify_timeout
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// One health probe: `/health` must answer 2xx.
    pub async fn check_health(&self) -> bool {
        let r = self
            .client
            .get(self.url("/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        matches!(r, Ok(resp) if resp.status().is_success())
    }

    /// Detect the upstream and publish what was found. Errors when the upstream does not
    /// answer, or when a forced kind does not match what it is.
    pub async fn refresh_info(&self) -> Result<Arc<UpstreamInfo>, detect::DetectError> {
        let info = Arc::new(detect::detect(&self.client, &self.base).await?);
        if let Some(forced) = self.forced_kind {
            if forced != info.kind {
                return Err(detect::DetectError::KindMismatch {
                    forced,
                    found: info.kind,
                });
            }
        }
        let changed = self.info().map(|old| *old != *info).unwrap_or(true);
        if changed {
            tracing::info!(kind = %info.kind, model = %info.model, version = %info.version,
                max_model_len = info.max_model_len, root = ?info.root, "upstream detected");
            self.metrics.upstream_info.reset();
            self.metrics
                .upstream_info
                .with_label_values(&[
                    info.kind.as_str(),
                    &info.model,
                    &info.version,
                    &info.max_model_len.to_string(),
                ])
                .set(1);
            if let Ok(mut g) = self.info.write() {
                *g = Some(info.clone());
            }
        }
        Ok(info)
    }

    /// Health and detection loop: runs until the process ends.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        on_ready: impl Fn(&UpstreamInfo) + Send + 'static,
    ) {
        tokio::spawn(self.clone().watch_load());
        let mut since_detect = Duration::MAX;
        loop {
            let healthy = self.check_health().await;
            let was = self.ready.load(Ordering::Relaxed);
            let mut ready = healthy;
            if healthy && (!was || since_detect >= Duration::from_secs(30)) {
                match self.refresh_info().await {
                    Ok(info) => {
                        since_detect = Duration::ZERO;
                        on_ready(&info);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "upstream detection failed");
                        ready = false;
                    }
                }
            }
            if ready != was {
                tracing::info!(ready, upstream = %self.base, "upstream readiness changed");
            }
            self.ready.store(ready, Ordering::Relaxed);
            self.metrics.upstream_ready.set(i64::from(ready));
            tokio::time::sleep(interval).await;
            since_detect = since_detect.saturating_add(interval);
        }
    }

    /// POST a JSON body and parse a JSON answer, mapping failures to client errors.
    pub async fn post_json(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        self.post_json_auth(path, body, timeout, None).await
    }

    /// [`Self::post_json`] carrying the client's `Authorization` header, if any.
    pub async fn post_json_auth(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, ApiError> {
        let mut req = self.client.post(self.url(path)).json(body).timeout(timeout);
        if let Some(a) = auth {
            req = req.header(http::header::AUTHORIZATION, a.clone());
        }
        let resp = req.send().await.map_err(|e| self.map_send_error(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.map_send_error(e))?;
        if !status.is_success() {
            self.count_error("status");
            return Err(ApiError::Upstream {
                status: status.as_u16(),
                message: upstream_error_message(&bytes),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            self.count_error("protocol");
            ApiError::UpstreamProtocol(format!("invalid JSON from {path}: {e}"))
        })
    }

    /// [`Self::post_json_auth`] for a call whose answer specd only uses once it arrived
    /// whole (a verify round, a tokenization): repeating it cannot duplicate output, so a
    /// connection that failed or broke, or a 502/503/504, is retried a bounded number of
    /// times. Timeouts are not retried: the timeout is the bound on a call.
    pub async fn post_json_retry(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
        auth: Option<&HeaderValue>,
    ) -> Result<Value, ApiError> {
        retry(path, || self.post_json_auth(path, body, timeout, auth)).await
    }

    /// Start a streamed call (a relay): the response once its status is 2xx. Nothing of
    /// it has reached the client yet, so a failed start is retried like a verify call;
    /// the wait for the answer is bounded by the verify timeout.
    pub async fn start_stream(
        &self,
        path: &str,
        body: &Value,
        auth: Option<&HeaderValue>,
    ) -> Result<reqwest::Response, ApiError> {
        let idle = self.verify_timeout;
        retry(path, || async move {
            match tokio::time::timeout(idle, self.send_stream(path, body, auth)).await {
                Ok(r) => r,
                Err(_) => {
                    self.count_error("timeout");
                    Err(ApiError::UpstreamTimeout(format!(
                        "the upstream did not answer within {}s",
                        idle.as_secs_f64()
                    )))
                }
            }
        })
        .await
    }

    async fn send_stream(
        &self,
        path: &str,
        body: &Value,
        auth: Option<&HeaderValue>,
    ) -> Result<reqwest::Response, ApiError> {
        let mut req = self.client.post(self.url(path)).json(body);
        if let Some(a) = auth {
            req = req.header(http::header::AUTHORIZATION, a.clone());
        }
        let resp = req.send().await.map_err(|e| self.map_send_error(e))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.unwrap_or_default();
            self.count_error("status");
            return Err(ApiError::Upstream {
                status,
                message: upstream_error_message(&bytes),
            });
        }
        Ok(resp)
    }

    /// The body of a streamed answer, chunk by chunk. Waiting longer than the verify
    /// timeout for the next chunk is an error: a stalled upstream fails the stream
    /// instead of hanging it.
    pub fn stream_chunks(self: &Arc<Self>, resp: reqwest::Response) -> idle::IdleBounded {
        idle::IdleBounded::new(self.clone(), resp, self.verify_timeout)
    }

    pub fn count_error(&self, kind: &'static str) {
        self.metrics
            .upstream_errors
            .with_label_values(&[kind])
            .inc();
    }

    pub fn map_send_error(&self, e: reqwest::Error) -> ApiError {
        let message = with_causes(&e);
        if e.is_timeout() {
            self.count_error("timeout");
            ApiError::UpstreamTimeout(message)
        } else if e.is_connect() {
            self.count_error("connect");
            ApiError::UpstreamUnreachable(message)
        } else {
            self.count_error("protocol");
            ApiError::UpstreamUnreachable(message)
        }
    }
}

/// An error with the chain of its causes: reqwest's own message ("error sending request
/// for url …") leaves out what happened (a refused connection, one the upstream closed).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// A failure another attempt may not see: the connection (not the answer) failed, or a
/// proxy or overloaded server said so.
pub fn is_transient(e: &ApiError) -> bool {
    match e {
        ApiError::UpstreamUnreachable(_) => true,
        ApiError::Upstream { status, .. } => matches!(status, 502..=504),
        _ => false,
    }
}

/// The message of an upstream error body (`{"error": {"message"}}`, `{"message"}`, or text).
pub fn upstream_error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if let Some(m) = v.pointer("/error/message").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            return m.to_string();
        }
        if let Some(m) = v.get("detail").and_then(Value::as_str) {
            return m.to_string();
        }
    }
    let text = String::from_utf8_lossy(body);
    text.chars().take(500).collect()
}
