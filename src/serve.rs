//! `specd serve`: wire the parts together, run until SIGTERM/SIGINT, then drain.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use tokio::sync::Semaphore;

use crate::config::ServeArgs;
use crate::draft::ngram::NgramDrafter;
use crate::draft::Drafters;
use crate::metrics::Metrics;
use crate::server::{self, AppState, Shared};
use crate::spec::controller::Controller;
use crate::tokens::ModelTokenizer;
use crate::upstream::detect::UpstreamKind;
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
    let tokenizer = match &args.tokenizer {
        Some(p) => {
            Some(Arc::new(ModelTokenizer::load(p).with_context(|| {
                format!("loading --tokenizer {}", p.display())
            })?))
        }
        None => None,
    };
    let slots = Arc::new(Semaphore::new(if args.max_concurrent_streams == 0 {
        Semaphore::MAX_PERMITS
    } else {
        args.max_concurrent_streams
    }));
    Ok(Arc::new(AppState {
        upstream,
        metrics,
        drafters,
        controller: Arc::new(Controller::new()),
        tokenizer: RwLock::new(tokenizer),
        backend: RwLock::new(None),
        draining: AtomicBool::new(false),
        next_stream: AtomicU64::new(1),
        slots,
        queued: AtomicUsize::new(0),
        args,
    }))
}

/// Called whenever the upstream is (re)detected: pick the backend and find the tokenizer.
fn on_upstream(st: &Shared, info: &UpstreamInfo) {
    let backend: Arc<dyn Backend> = match info.kind {
        UpstreamKind::Vllm | UpstreamKind::Sglang => {
            Arc::new(VllmBackend::new(st.upstream.clone()))
        }
    };
    if let Ok(mut g) = st.backend.write() {
        *g = Some(backend);
    }
    if st.tokenizer().is_some() {
        return;
    }
    let Some(root) = &info.root else { return };
    match ModelTokenizer::load(std::path::Path::new(root)) {
        Ok(t) => {
            tracing::info!(path = %t.path.display(), eos = ?t.eos_ids, "tokenizer loaded from the upstream's model directory");
            if let Ok(mut g) = st.tokenizer.write() {
                *g = Some(Arc::new(t));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "no tokenizer: speculation is off until --tokenizer is given")
        }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    raise_open_files_limit();
    let st = build_state(args)?;
    // A forced kind that does not match is a start-up error, not a silent fallback.
    match st.upstream.refresh_info().await {
        Ok(info) => on_upstream(&st, &info),
        Err(e @ crate::upstream::detect::DetectError::KindMismatch { .. }) => return Err(e.into()),
        Err(e) => tracing::warn!(error = %e, "upstream not reachable yet; will keep trying"),
    }
    {
        let st2 = st.clone();
        let interval = st.args.health_interval();
        tokio::spawn(
            st.upstream
                .clone()
                .watch(interval, move |info| on_upstream(&st2, info)),
        );
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
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|v| *v).await;
            })
            .await
    });
    shutdown_signal().await;
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
    let _ = stop_tx.send(true);
    match tokio::time::timeout_at(deadline, server).await {
        Ok(_) if in_flight(&st) == 0 => tracing::info!("drained"),
        _ => tracing::warn!(
            left = in_flight(&st),
            "drain timeout reached; closing remaining connections"
        ),
    }
    Ok(())
}

/// Client requests being answered (generation streams and forwarded requests).
fn in_flight(st: &Shared) -> i64 {
    ["speculate", "passthrough"]
        .iter()
        .map(|m| st.metrics.active_streams.with_label_values(&[m]).get())
        .sum()
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

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
