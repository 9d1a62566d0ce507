//! Per-request accounting. A request's outcome is recorded once, when its response body
//! ends or is dropped — a stream cut short by the client or the upstream is counted as
//! such, not as a success.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::Stream;

use crate::metrics::Metrics;

pub fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/completions" => "completions",
        "/v1/chat/completions" => "chat_completions",
        "/v1/models" => "models",
        "/tokenize" | "/detokenize" | "/v1/tokenize" | "/v1/detokenize" => "tokenize",
        "/health" | "/health_generate" => "health",
        _ => "other",
    }
}

pub struct Outcome {
    metrics: Arc<Metrics>,
    route: &'static str,
    mode: &'static str,
    start: Instant,
    status: u16,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u64,
    complete: bool,
}

impl Outcome {
    pub fn new(metrics: Arc<Metrics>, route: &'static str, mode: &'static str) -> Self {
        metrics.active_streams.with_label_values(&[mode]).inc();
        Outcome {
            metrics,
            route,
            mode,
            start: Instant::now(),
            status: 200,
            first: None,
            last: None,
            tokens: 0,
            complete: false,
        }
    }

    pub fn set_status(&mut self, s: u16) {
        self.status = s;
    }

    /// `n` tokens reached the client now.
    pub fn tokens(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some(now);
        }
        self.last = Some(now);
        self.tokens += n;
    }

    /// The body ended normally.
    pub fn complete(&mut self) {
        self.complete = true;
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        let m = &self.metrics;
        m.active_streams.with_label_values(&[self.mode]).dec();
        let status = if self.complete {
            status_label(self.status)
        } else {
            "aborted"
        };
        m.requests
            .with_label_values(&[self.route, self.mode, status])
            .inc();
        m.request_duration
            .with_label_values(&[self.route, self.mode])
            .observe(self.start.elapsed().as_secs_f64());
        if self.mode == "passthrough" {
            m.output_tokens
                .with_label_values(&["passthrough"])
                .inc_by(self.tokens);
        }
        if let (Some(first), Some(last)) = (self.first, self.last) {
            m.ttft
                .with_label_values(&[self.mode])
                .observe((first - self.start).as_secs_f64());
            if self.tokens > 1 {
                let per = (last - first).as_secs_f64() / (self.tokens - 1) as f64;
                m.tpot.with_label_values(&[self.mode]).observe(per);
            }
        }
    }
}

fn status_label(s: u16) -> &'static str {
    match s {
        200 => "200",
        400 => "400",
        401 => "401",
        404 => "404",
        413 => "413",
        422 => "422",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        s if s < 300 => "2xx",
        s if s < 400 => "3xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

/// A passthrough body: bytes go through untouched; SSE `data:` events are counted as
/// tokens for TTFT and time per output token.
pub struct ObservedBody<S> {
    inner: S,
    outcome: Outcome,
    sse: bool,
    tail: Vec<u8>,
}

impl<S> ObservedBody<S> {
    pub fn new(inner: S, outcome: Outcome, sse: bool) -> Self {
        ObservedBody {
            inner,
            outcome,
            sse,
            tail: Vec::new(),
        }
    }

    /// Count completed events carrying choices (not `[DONE]`, not the usage-only chunk).
    fn count(&mut self, chunk: &[u8]) -> u64 {
        self.tail.extend_from_slice(chunk);
        let mut n = 0;
        while let Some(pos) = self.tail.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = self.tail.drain(..pos + 2).collect();
            let ev = &ev[..pos];
            if ev.starts_with(b"data:")
                && !contains(ev, b"[DONE]")
                && !contains(ev, b"\"choices\":[]")
                && !contains(ev, b"\"error\"")
            {
                n += 1;
            }
        }
        n
    }
}

fn contains(h: &[u8], n: &[u8]) -> bool {
    h.windows(n.len()).any(|w| w == n)
}

impl<S, E> Stream for ObservedBody<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => {
                if this.sse {
                    let n = this.count(&b);
                    this.outcome.tokens(n);
                }
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.outcome.set_status(502);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.outcome.complete();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
