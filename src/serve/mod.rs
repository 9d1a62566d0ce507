//! `specd serve`: wire the parts together, run until SIGTERM/SIGINT, then drain.

mod tokenizer;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio::sync::Semaphore;

use crate::config::ServeArgs;
use crate::draft::model::{DrafterOptions, ModelDrafter};
use crate::draft::ngram::NgramDrafter;
use crate::draft::suffix::{SuffixConfig, SuffixDrafter};
use crate::draft::{DrafterKind, Drafters};
use crate::inflight::InFlight;
use crate::metrics::Metrics;
use crate::server::{self, AppState, Shared};
use crate::speculation::controller::{Controller, ControllerConfig};
use crate::tokens::{locate, ModelTokenizer};
use crate::upstream::detect::UpstreamKind;
use crate::upstream::sglang::{ModelDefaults, SglangBackend};
use crate::upstream::verify::Backend;
use crate::upstream::vllm::VllmBackend;
use crate::upstream::{Upstream, UpstreamInfo};

pub fn build_state(args: ServeArgs) -> anyhow::Result<Shared> {
    let metrics = Arc::new(Metrics::new());
    let upstream = Arc::new(
        Upstream::new(&args, metrics.clone()).context("building the upstream HTTP client")?,
    );
    let mut drafters = Drafters::default();
    drafters.insert(Arc::new(NgramDrafter::new(args.ngram_min, args.ngram_max)));
    drafters.insert(Arc::new(SuffixDrafter::new(SuffixConfig {
        max_depth: args.suffix_max_depth,
        min_prob: args.suffix_min_prob,
        spec_factor: args.suffix_spec_factor,
        global_max_tokens: args.suffix_global_tokens,
        ..SuffixConfig::default()
    })));
    if args.enable_test_drafters {
        drafters.enable_test_drafters();
    }
    let in_flight = Arc::new(InFlight::default());
    let controller = Arc::new(
        Controller::new(
            ControllerConfig {
                probe_interval: std::time::Duration::from_secs_f64(args.controller_probe_interval),
                explore: args.controller_explore,
                watch_every: args.controller_watch_every,
            },
            Some(metrics.clone()),
        )
        .with_in_flight(in_flight.clone())
        .with_upstream_running({
            let up = upstream.clone();
            Box::new(move || up.load().map(|l| (l.running, l.at)))
        }),
    );
    let configured_tokenizer = match &args.tokenizer {
        Some(p) => {
            Some(Arc::new(ModelTokenizer::load(p).with_context(|| {
                format!("loading --tokenizer {}", p.display())
            })?))
        }
        None => None,
    };
    if let Some(dir) = &args.draft_model {
        let d = ModelDrafter::load_with(
            dir,
            args.draft_device,
            args.draft_dtype,
            DrafterOptions {
                max_streams: args.draft_max_streams,
                max_len: args.draft_max_len,
                ..Default::default()
            },
        )
        .with_context(|| format!("loading --draft-model {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), engine = d.engine(), "draft model loaded");
        drafters.insert(Arc::new(d));
    }
    let slots = Arc::new(Semaphore::new(if args.max_concurrent_streams == 0 {
        Semaphore::MAX_PERMITS
    } else {
        args.max_concurrent_streams
    }));
    Ok(Arc::new(AppState {
        upstream,
        metrics,
        drafters,
        controller,
        tokenizer: RwLock::new(None),
        configured_tokenizer,
        tokenizer_decided: AtomicBool::new(false),
        backend: RwLock::new(None),
        draining: AtomicBool::new(false),
        drain_cut: Default::default(),
        next_stream: AtomicU64::new(1),
        slots,
        queued: AtomicUsize::new(0),
        in_flight,
        args,
    }))
}

/// Called whenever the upstream is (re)detected: pick the backend, then check the
/// tokenizer against it (the returned task).
fn on_upstream(st: &Shared, info: &UpstreamInfo) -> tokio::task::JoinHandle<()> {
    let backend: Arc<dyn Backend> = match info.kind {
        UpstreamKind::Vllm => {
            Arc::new(VllmBackend::for_version(st.upstream.clone(), &info.version))
        }
        UpstreamKind::Sglang => Arc::new(sglang_backend(st, info)),
    };
    if let Ok(mut g) = st.backend.write() {
        *g = Some(backend);
    }
    tokio::spawn(tokenizer::verify(st.clone(), info.clone()))
}

/// SGLang needs the model's vocabulary size (an id beyond it crashes the server) and, for
/// the chat route, the sampling defaults of its generation_config.json.
fn sglang_backend(st: &Shared, info: &UpstreamInfo) -> SglangBackend {
    let tok = st.tokenizer().or_else(|| st.configured_tokenizer.clone());
    let tok_dir = tok
        .as_ref()
        .and_then(|t| t.path.parent().map(std::path::Path::to_path_buf));
    let dirs: Vec<std::path::PathBuf> = info
        .root
        .as_deref()
        .and_then(locate::model_dir)
        .into_iter()
        .chain(tok_dir)
        .filter(|d| d.is_dir())
        .collect();
    let config_vocab = dirs.iter().find_map(|d| {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("config.json")).ok()?).ok()?;
        let n = v
            .get("vocab_size")
            .or_else(|| v.pointer("/text_config/vocab_size"))?
            .as_u64()?;
        u32::try_from(n).ok()
    });
    let tok_vocab = tok.as_ref().and_then(|t| u32::try_from(t.vocab_size).ok());
    let vocab_limit = match (config_vocab, tok_vocab) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(u32::MAX),
    };
    let defaults = dirs
        .iter()
        .find(|d| d.join("generation_config.json").is_file())
        .map(|d| ModelDefaults::load(d))
        .unwrap_or_default();
    let settings = info.sglang.clone().unwrap_or_default();
    tracing::debug!(vocab_limit, chat_defaults = ?defaults, settings = ?settings, "SGLang backend");
    let (reasoning, tools) = parser_flags(&st.args);
    let b = SglangBackend::new(st.upstream.clone(), settings, defaults, vocab_limit)
        .with_parser_flags(reasoning, tools);
    if let Some(p) = b.sglang_parsers().filter(|p| p.disagree) {
        tracing::warn!(
            server_reasoning_parser = ?p.reasoning,
            server_tool_call_parser = ?p.tools,
            reasoning_parser = ?reasoning,
            tool_call_parser = ?tools,
            "SGLang runs other chat parsers than specd's flags name: chat passes through"
        );
    }
    b
}

/// specd's `--reasoning-parser` and `--tool-call-parser` names, where given.
fn parser_flags(args: &ServeArgs) -> (Option<&str>, Option<&str>) {
    use crate::config::{ReasoningParserArg as R, ToolCallParserArg as T};
    let reasoning = args.reasoning_parser.as_ref().map(|r| match r {
        R::Known(p) => p.as_str(),
        R::Unimplemented(n) => n.as_str(),
    });
    let tools = args.tool_call_parser.as_ref().map(|t| match t {
        T::Known(p) => p.as_str(),
        T::Unimplemented(n) => n.as_str(),
    });
    (reasoning, tools)
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let signals = ShutdownSignal::install();
    raise_open_files_limit();
    let st = build_state(args)?;
    // A forced kind that does not match is a start-up error, not a silent fallback.
    match st.upstream.refresh_info().await {
        Ok(info) => {
            // Speculate from the first request on: wait (bounded) for the tokenizer check.
            let check = on_upstream(&st, &info);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(60), check).await;
        }
        Err(e @ crate::upstream::detect::DetectError::KindMismatch { .. }) => return Err(e.into()),
        Err(e) => tracing::warn!(error = %e, "upstream not reachable yet; will keep trying"),
    }
    // The draft model drafts target ids directly or, with another vocabulary, through text.
    if let (Some(dir), Some(d)) = (&st.args.draft_model, st.drafters.get(DrafterKind::Model)) {
        match st.tokenizer() {
            Some(t) => d
                .bind_target(&t, Some(&st.metrics))
                .map_err(|e| anyhow::anyhow!("--draft-model {}: {e}", dir.display()))?,
            None => anyhow::bail!(
                "--draft-model needs the target's tokenizer to check vocabularies: pass --tokenizer or start specd once the upstream answers"
            ),
        }
    }
    {
        let st2 = st.clone();
        let interval = st.args.health_interval();
        tokio::spawn(st.upstream.clone().watch(interval, move |info| {
            on_upstream(&st2, info);
        }));
    }
    let separate_admin = st.args.metrics_listen.is_some();
    let app = server::router(st.clone(), !separate_admin);
    let listener = server::bind(st.args.listen, "api")
        .await
        .with_context(|| format!("binding {}", st.args.listen))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(addr) = st.args.metrics_listen {
        let admin = server::admin_router(st.clone());
        let l = server::bind(addr, "admin")
            .await
            .with_context(|| format!("binding {addr}"))?;
        let mut rx = stop_rx.clone();
        tokio::spawn(async move {
            let _ = axum::serve(l, admin)
                .with_graceful_shutdown(async move {
                    let _ = rx.wait_for(|v| *v).await;
                })
                .await;
        });
    }
    let mut rx = stop_rx.clone();
    let server = tokio::spawn(async move {
        // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds
        // each one back until the client acknowledges the previous one.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|v| *v).await;
            })
            .await
    });
    signals.recv().await;
    let drain = st.args.drain_timeout();
    tracing::info!(
        timeout_s = drain.as_secs_f64(),
        "shutting down: draining in-flight requests"
    );
    // Keep listening while draining: /readyz answers 503 and new requests get a clean 503
    // (not a refused connection) while the requests in flight finish.
    st.draining.store(true, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + drain;
    while in_flight(&st) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let left = in_flight(&st);
    if left > 0 {
        tracing::warn!(
            left,
            "drain timeout reached; ending the requests still in flight with a 503"
        );
        st.drain_cut.cut();
    }
    let _ = stop_tx.send(true);
    // The ended streams send their last event, then their connections close; a request
    // still waiting for its upstream's first byte is given the same short grace.
    match tokio::time::timeout(CLOSE_GRACE, server).await {
        Ok(_) if left == 0 => tracing::info!("drained"),
        Ok(_) => tracing::info!("closed"),
        Err(_) => tracing::warn!(
            left = in_flight(&st),
            "connections still open after the drain; closing them"
        ),
    }
    Ok(())
}

/// How long the last events of cut streams have to reach their clients.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Client requests being answered (generation streams and forwarded requests).
fn in_flight(st: &Shared) -> usize {
    st.in_flight.total()
}

/// Every stream holds a client connection and an upstream one; a service manager's
/// default soft limit (often 1024 open files) would cap specd near 500 streams. Raise the
/// soft limit to the hard one, as servers commonly do.
#[cfg(unix)]
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct given to it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return;
    }
    let old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit only reads the struct given to it.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        tracing::info!(from = old, to = lim.rlim_cur, "raised the open files limit");
    } else if old < 4096 {
        tracing::warn!(
            limit = old,
            "open files limit is low: every stream needs two connections"
        );
    }
}

#[cfg(not(unix))]
fn raise_open_files_limit() {}

/// SIGTERM/SIGINT listeners. Created before specd binds and reports its address: a signal
/// that arrives right after start-up must drain and exit cleanly, not hit the default
/// action (a tokio signal handler is installed when its listener is created).
struct ShutdownSignal {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignal {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            ShutdownSignal {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        ShutdownSignal {}
    }

    async fn recv(mut self) {
        #[cfg(unix)]
        {
            async fn next(s: Option<&mut tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = next(self.term.as_mut()) => {}
                _ = next(self.int.as_mut()) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
