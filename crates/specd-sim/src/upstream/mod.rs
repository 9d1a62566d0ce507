//! The fake vLLM server: its options, its state, and its connections (served by hand
//! rather than by `axum::serve` so that [`Upstream::down`] can drop every open connection
//! at once, as a crashed server would).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokenizers::Tokenizer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::fault::{Call, Fault, Rules};
use crate::{SimConfig, Tokens};

mod api;
mod chat;
mod completions;
mod reply;

/// What `/version` reports unless set: older than any vLLM, so specd reads sampled ids
/// from logprobs, the way that works on every version.
pub const DEFAULT_VERSION: &str = "0.0.0+specd-sim";

/// When tokens come out.
#[derive(Debug, Clone)]
pub enum Timing {
    /// At once (streams: [`Upstream::set_token_delay`] apart).
    Immediate,
    /// On the cost model's clock, batched as vLLM batches.
    Model(SimConfig),
}

/// How to run the fake upstream.
#[derive(Debug, Clone)]
pub struct Options {
    /// Address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// Model directory with tokenizer.json (reported as the model's `root`), or the file.
    pub tokenizer: PathBuf,
    /// Served model name.
    pub model: String,
    /// Context length reported in `/v1/models` and enforced on completions.
    pub max_model_len: usize,
    pub tokens: Tokens,
    pub timing: Timing,
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<ServerConfig>>,
}

/// A request as the fake upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

pub(crate) enum Clock {
    Immediate,
    Model(Engine),
}

pub(crate) struct St {
    pub(crate) tok: Tokenizer,
    pub(crate) root: String,
    pub(crate) model: String,
    pub(crate) tokens: Tokens,
    pub(crate) clock: Clock,
    pub(crate) max_model_len: AtomicUsize,
    pub(crate) token_delay_us: AtomicUsize,
    /// What `/version` reports: from 0.10.2 on, specd reads sampled ids from
    /// `return_token_ids` rather than from logprobs.
    pub(crate) version: Mutex<String>,
    /// `/v1/completions` requests being answered now.
    pub(crate) in_flight: AtomicUsize,
    pub(crate) rules: Rules,
    pub(crate) calls: [AtomicUsize; Call::COUNT],
    pub(crate) seen: Mutex<VecDeque<Seen>>,
}

impl St {
    /// vLLM's `num_requests_running`: sequences in the batch on the model's clock,
    /// requests being answered otherwise.
    pub(crate) fn running(&self) -> usize {
        match &self.clock {
            Clock::Model(e) => e.running(),
            Clock::Immediate => self.in_flight.load(Ordering::SeqCst),
        }
    }
}

pub struct Upstream {
    pub url: String,
    pub addr: SocketAddr,
    st: Arc<St>,
    tls: Option<TlsAcceptor>,
    serving: Mutex<Option<(CancellationToken, JoinHandle<()>)>>,
}

fn load_tokenizer(path: &std::path::Path) -> anyhow::Result<(Tokenizer, PathBuf)> {
    let (file, root) = if path.is_dir() {
        (path.join("tokenizer.json"), path.to_path_buf())
    } else {
        let parent = path.parent().map(PathBuf::from).unwrap_or_default();
        (path.to_path_buf(), parent)
    };
    let tok = Tokenizer::from_file(&file)
        .map_err(|e| anyhow::anyhow!("loading {}: {e}", file.display()))?;
    Ok((tok, root))
}

impl Upstream {
    /// Bind and start serving.
    pub async fn start(o: Options) -> anyhow::Result<Upstream> {
        let (tok, root) = load_tokenizer(&o.tokenizer)?;
        let clock = match o.timing {
            Timing::Immediate => Clock::Immediate,
            Timing::Model(cfg) => Clock::Model(Engine::start(cfg, o.tokens)),
        };
        let st = Arc::new(St {
            tok,
            root: root.display().to_string(),
            model: o.model,
            tokens: o.tokens,
            clock,
            max_model_len: AtomicUsize::new(o.max_model_len),
            token_delay_us: AtomicUsize::new(0),
            version: Mutex::new(DEFAULT_VERSION.to_string()),
            in_flight: AtomicUsize::new(0),
            rules: Rules::default(),
            calls: Default::default(),
            seen: Mutex::new(VecDeque::new()),
        });
        let listener = TcpListener::bind(o.listen).await?;
        let addr = listener.local_addr()?;
        let scheme = if o.tls.is_some() { "https" } else { "http" };
        let up = Upstream {
            url: format!("{scheme}://{addr}"),
            addr,
            st,
            tls: o.tls.map(TlsAcceptor::from),
            serving: Mutex::new(None),
        };
        up.serve(listener);
        Ok(up)
    }

    fn serve(&self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept_loop(
            listener,
            self.st.clone(),
            stop.clone(),
            self.tls.clone(),
        ));
        if let Ok(mut s) = self.serving.lock() {
            *s = Some((stop, task));
        }
    }

    /// Serve until the process ends, whatever becomes of this handle.
    pub fn detach(self) -> JoinHandle<()> {
        let serving = self.serving.lock().ok().and_then(|mut s| s.take());
        match serving {
            Some((_, task)) => task,
            None => tokio::spawn(async {}),
        }
    }

    /// Stop listening and drop every open connection: new connections are refused.
    pub async fn down(&self) {
        let serving = self.serving.lock().ok().and_then(|mut s| s.take());
        if let Some((stop, task)) = serving {
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
        self.st.rules.add(call, fault, None, None);
    }

    /// Inject `fault` into the next `times` calls of kind `call`.
    pub fn fail_times(&self, call: Call, fault: Fault, times: usize) {
        self.st.rules.add(call, fault, None, Some(times));
    }

    /// Inject `fault` only into calls whose prompt starts with token `marker`.
    pub fn fail_marked(&self, call: Call, fault: Fault, marker: u32) {
        self.st.rules.add(call, fault, Some(marker), None);
    }

    pub fn clear(&self) {
        self.st.rules.clear();
    }

    /// Delay between streamed tokens (immediate timing).
    pub fn set_token_delay(&self, d: Duration) {
        self.st
            .token_delay_us
            .store(d.as_micros() as usize, Ordering::SeqCst);
    }

    /// The vLLM version `/version` reports.
    pub fn set_version(&self, v: &str) {
        if let Ok(mut g) = self.st.version.lock() {
            *g = v.to_string();
        }
    }

    pub fn set_max_model_len(&self, n: usize) {
        self.st.max_model_len.store(n, Ordering::SeqCst);
    }

    /// What `/metrics` reports as `vllm:num_requests_running`.
    pub fn running(&self) -> usize {
        self.st.running()
    }

    /// Calls of one kind received so far.
    pub fn calls(&self, call: Call) -> usize {
        self.st.calls[call as usize].load(Ordering::SeqCst)
    }

    /// The most recent requests (up to 256).
    pub fn seen(&self) -> Vec<Seen> {
        self.st
            .seen
            .lock()
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Ok(mut g) = self.serving.lock() {
            if let Some((stop, _)) = g.take() {
                stop.cancel();
            }
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    st: Arc<St>,
    stop: CancellationToken,
    tls: Option<TlsAcceptor>,
) {
    loop {
        let sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
            _ = stop.cancelled() => return,
        };
        let (st, stop, tls) = (st.clone(), stop.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                Some(acc) => {
                    if let Ok(s) = acc.accept(sock).await {
                        serve_conn(s, st, stop).await;
                    }
                }
                None => serve_conn(sock, st, stop).await,
            }
        });
    }
}

async fn serve_conn<S>(io: S, st: Arc<St>, stop: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let close = CancellationToken::new();
    let svc = {
        let close = close.clone();
        hyper::service::service_fn(move |req| {
            let (st, close) = (st.clone(), close.clone());
            async move { Ok::<_, std::convert::Infallible>(api::handle(st, req, close).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc);
    // Dropping the connection closes the socket at once, whatever it was sending.
    tokio::select! {
        _ = conn => {}
        _ = stop.cancelled() => {}
        _ = close.cancelled() => {}
    }
}
