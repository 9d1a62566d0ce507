//! A stand-in upstream for what a real server cannot be made to do on demand: it speaks
//! enough of vLLM's HTTP API for specd to detect and use it (`/health`, `/v1/models` owned
//! by vllm with the test model's directory as root, `/version`, `/tokenize`, token-id
//! `/v1/completions` with `return_tokens_as_token_ids` logprobs, streaming), and can be
//! told to refuse connections, delay, answer 5xx, send malformed JSON, cut a response
//! mid-way or never answer.
//!
//! Its "model" is deterministic: the token after a context depends only on the last token
//! ([`next_token`]), so direct output at any temperature is known and repeats in cycles the
//! n-gram drafter learns, which exercises both relay and speculation in specd.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod api;

use axum::body::Body;
use axum::Router;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use specd::tokens::ModelTokenizer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

pub const MODEL: &str = "specd-target";

/// The stand-in model: the token after `ctx`. Never an EOS or special id (0..=3).
pub fn next_token(ctx: &[u32]) -> u32 {
    let last = ctx.last().copied().unwrap_or(0);
    4 + (last.wrapping_mul(17).wrapping_add(5)) % 97
}

/// `n` tokens of direct output after `prompt`.
pub fn continuation(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    for _ in 0..n {
        ctx.push(next_token(&ctx));
    }
    ctx.split_off(prompt.len())
}

/// Which kind of upstream call a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Health,
    Models,
    Tokenize,
    /// A non-streamed `/v1/completions` with `max_tokens: 1` and token-id logprobs: what
    /// specd's verify rounds send.
    Verify,
    /// A streamed `/v1/completions` (specd's relay, or a client's passthrough stream).
    Stream,
    /// Any other non-streamed `/v1/completions`.
    Complete,
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and a vLLM-shaped error body.
    Status(u16),
    /// Answer 200 with a body that is not valid JSON (streams: after this many tokens).
    Malformed(usize),
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// Never answer (until the caller goes away).
    Hang,
    /// Streams: close the connection after this many tokens. Others: after half the body.
    Cut(usize),
}

#[derive(Debug, Clone)]
struct Rule {
    call: Call,
    fault: Fault,
    /// Only requests whose (first) prompt starts with this token.
    marker: Option<u32>,
    /// Applies this many more times; `None` = until cleared.
    times: Option<usize>,
}

/// A request as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

struct St {
    tok: ModelTokenizer,
    root: String,
    max_model_len: AtomicUsize,
    rules: Mutex<Vec<Rule>>,
    token_delay_us: AtomicUsize,
    running: AtomicUsize,
    calls: [AtomicUsize; 7],
    seen: Mutex<VecDeque<Seen>>,
}

pub struct FaultUpstream {
    pub url: String,
    pub addr: SocketAddr,
    st: Arc<St>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    running: Mutex<Option<(CancellationToken, tokio::task::JoinHandle<()>)>>,
}

pub fn models_dir() -> String {
    if let Ok(d) = std::env::var("SPECD_MODELS_DIR") {
        return d;
    }
    let cache = std::env::var("SPECD_CACHE_DIR")
        .unwrap_or_else(|_| format!("{}/.cache/specd", std::env::var("HOME").unwrap_or_default()));
    format!("{cache}/models")
}

impl FaultUpstream {
    /// Start on 127.0.0.1, port 0.
    pub async fn start() -> FaultUpstream {
        Self::start_with(None).await
    }

    /// Start serving HTTPS with the given server configuration.
    pub async fn start_tls(cfg: Arc<tokio_rustls::rustls::ServerConfig>) -> FaultUpstream {
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(cfg))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> FaultUpstream {
        let root = format!("{}/target", models_dir());
        let tok = ModelTokenizer::load(std::path::Path::new(&root))
            .expect("test model tokenizer (scripts/make_models.py)");
        let st = Arc::new(St {
            tok,
            root,
            max_model_len: AtomicUsize::new(2048),
            rules: Mutex::new(Vec::new()),
            token_delay_us: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            calls: Default::default(),
            seen: Mutex::new(VecDeque::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let up = FaultUpstream {
            url: format!("{scheme}://{addr}"),
            addr,
            st,
            tls,
            running: Mutex::new(None),
        };
        up.serve(listener);
        up
    }

    fn serve(&self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let app = Router::new()
            .fallback(api::handle)
            .with_state(self.st.clone());
        let task = tokio::spawn(accept_loop(listener, app, stop.clone(), self.tls.clone()));
        *self.running.lock().expect("lock") = Some((stop, task));
    }

    /// Stop listening and drop every open connection: new connections are refused.
    pub async fn down(&self) {
        let r = self.running.lock().expect("lock").take();
        if let Some((stop, task)) = r {
            stop.cancel();
            let _ = task.await;
        }
    }

    /// Listen again on the same address.
    pub async fn up(&self) {
        let listener = TcpListener::bind(self.addr).await.expect("rebind");
        self.serve(listener);
    }

    /// Inject `fault` into calls of kind `call` (every one, until cleared).
    pub fn fail(&self, call: Call, fault: Fault) {
        self.add(call, fault, None, None);
    }

    /// Inject `fault` into the next `times` calls of kind `call`.
    pub fn fail_times(&self, call: Call, fault: Fault, times: usize) {
        self.add(call, fault, None, Some(times));
    }

    /// Inject `fault` only into calls whose prompt starts with token `marker`.
    pub fn fail_marked(&self, call: Call, fault: Fault, marker: u32) {
        self.add(call, fault, Some(marker), None);
    }

    fn add(&self, call: Call, fault: Fault, marker: Option<u32>, times: Option<usize>) {
        self.st.rules.lock().expect("lock").push(Rule {
            call,
            fault,
            marker,
            times,
        });
    }

    pub fn clear(&self) {
        self.st.rules.lock().expect("lock").clear();
    }

    /// Delay between streamed tokens.
    pub fn set_token_delay(&self, d: Duration) {
        self.st
            .token_delay_us
            .store(d.as_micros() as usize, Ordering::SeqCst);
    }

    pub fn set_max_model_len(&self, n: usize) {
        self.st.max_model_len.store(n, Ordering::SeqCst);
    }

    /// `/v1/completions` requests being answered now (vLLM's `num_requests_running`).
    pub fn running(&self) -> usize {
        self.st.running.load(Ordering::SeqCst)
    }

    /// Calls of one kind received so far.
    pub fn calls(&self, call: Call) -> usize {
        self.st.calls[call as usize].load(Ordering::SeqCst)
    }

    /// The most recent requests (up to 256).
    pub fn seen(&self) -> Vec<Seen> {
        self.st.seen.lock().expect("lock").iter().cloned().collect()
    }
}

impl Drop for FaultUpstream {
    fn drop(&mut self) {
        if let Ok(mut g) = self.running.lock() {
            if let Some((stop, _)) = g.take() {
                stop.cancel();
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    app: Router,
    stop: CancellationToken,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
            _ = stop.cancelled() => return,
        };
        let (app, stop, tls) = (app.clone(), stop.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                Some(acc) => {
                    if let Ok(s) = acc.accept(sock).await {
                        serve_conn(s, app, stop).await;
                    }
                }
                None => serve_conn(sock, app, stop).await,
            }
        });
    }
}

async fn serve_conn<S>(io: S, app: Router, stop: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        app.clone().oneshot(req.map(Body::new))
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc);
    // Dropping the connection closes the socket at once, whatever it was sending.
    tokio::select! {
        _ = conn => {}
        _ = stop.cancelled() => {}
    }
}
