//! Per-request accounting. A request's outcome is recorded once, when its response body
//! ends or is dropped — a stream cut short by the client or the upstream is counted as
//! such, not as a success.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::Stream;

use super::drain::Cut;
use crate::error::ApiError;
use crate::inflight::InFlightGuard;
use crate::metrics::labels::StreamMode;
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
    mode: StreamMode,
    /// Counts this request in flight until the body ends.
    _in_flight: InFlightGuard,
    start: Instant,
    status: u16,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u64,
    complete: bool,
}

impl Outcome {
    pub fn new(metrics: Arc<Metrics>, route: &'static str, in_flight: InFlightGuard) -> Self {
        let mode = in_flight.mode();
        metrics
            .active_streams
            .with_label_values(&[mode.as_str()])
            .inc();
        Outcome {
            metrics,
            route,
            mode,
            _in_flight: in_flight,
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
        let mode = self.mode.as_str();
        m.active_streams.with_label_values(&[mode]).dec();
        let status = if self.complete {
            status_label(self.status)
        } else {
            "aborted"
        };
        m.requests
            .with_label_values(&[self.route, mode, status])
            .inc();
        m.request_duration
            .with_label_values(&[self.route, mode])
            .observe(self.start.elapsed().as_secs_f64());
        if self.mode == StreamMode::Passthrough {
            m.output_tokens
                .with_label_values(&[mode])
                .inc_by(self.tokens);
        }
        if let (Some(first), Some(last)) = (self.first, self.last) {
            m.ttft
                .with_label_values(&[mode])
                .observe((first - self.start).as_secs_f64());
            if self.tokens > 1 {
                let per = (last - first).as_secs_f64() / (self.tokens - 1) as f64;
                m.tpot.with_label_values(&[mode]).observe(per);
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
/// tokens for TTFT and time per output token. An SSE stream is forwarded event by event
/// (a partial event is held until it completes), so when the upstream cuts it, or ends it
/// without `[DONE]`, the client gets a well-formed error event and `[DONE]` instead of a
/// silently truncated stream.
pub struct ObservedBody<S> {
    inner: S,
    outcome: Outcome,
    sse: bool,
    /// SSE bytes received but not yet forwarded (an incomplete event).
    tail: Vec<u8>,
    saw_done: bool,
    ended: bool,
    /// Resolves when the drain timeout passes (SSE only).
    cut: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<S> ObservedBody<S> {
    pub fn new(inner: S, outcome: Outcome, sse: bool) -> Self {
        ObservedBody {
            inner,
            outcome,
            sse,
            tail: Vec::new(),
            saw_done: false,
            ended: false,
            cut: None,
        }
    }

    /// End an SSE stream with the drain timeout's error once that passes.
    pub fn with_cut(mut self, cut: Cut) -> Self {
        if self.sse {
            self.cut = Some(cut.into_future());
        }
        self
    }

    /// Take the complete events out of `tail`; count those carrying choices (not
    /// `[DONE]`, not the usage-only chunk, not errors).
    fn complete_events(&mut self) -> Option<Bytes> {
        let end = last_event_end(&self.tail)?;
        let events: Vec<u8> = self.tail.drain(..end).collect();
        let mut n = 0;
        for ev in split_events(&events) {
            if !ev.starts_with(b"data:") {
                continue;
            }
            if contains(ev, b"[DONE]") {
                self.saw_done = true;
            } else if !contains(ev, b"\"choices\":[]") && !contains(ev, b"\"error\"") {
                n += 1;
            }
        }
        self.outcome.tokens(n);
        Some(Bytes::from(events))
    }

    /// End an SSE stream the upstream did not finish: error event, then `[DONE]`.
    fn upstream_end(&mut self, why: &str) -> Bytes {
        self.error_end(ApiError::UpstreamUnreachable(format!(
            "the upstream ended the stream before it finished: {why}"
        )))
    }

    fn error_end(&mut self, e: ApiError) -> Bytes {
        self.tail.clear();
        self.ended = true;
        self.outcome.set_status(e.status().as_u16());
        self.outcome.complete();
        let mut out = e.sse_event().into_bytes();
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }
}

/// Index just past the last blank line (`\n\n` or `\n\r\n`) in `b`.
fn last_event_end(b: &[u8]) -> Option<usize> {
    (1..b.len()).rev().find_map(|i| match (b[i - 1], b[i]) {
        (b'\n', b'\n') => Some(i + 1),
        (b'\r', b'\n') if i >= 2 && b[i - 2] == b'\n' => Some(i + 1),
        _ => None,
    })
}

/// Events of a buffer that ends at an event boundary.
fn split_events(b: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = b;
    std::iter::from_fn(move || {
        while rest.first().is_some_and(|&c| c == b'\n' || c == b'\r') {
            rest = &rest[1..];
        }
        if rest.is_empty() {
            return None;
        }
        let end = rest
            .windows(2)
            .position(|w| w == b"\n\n" || w == b"\n\r")
            .unwrap_or(rest.len());
        let (ev, r) = rest.split_at(end);
        rest = r;
        Some(ev)
    })
}

fn contains(h: &[u8], n: &[u8]) -> bool {
    h.windows(n.len()).any(|w| w == n)
}

impl<S, E> Stream for ObservedBody<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(cut) = this.cut.as_mut() {
            if cut.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Some(Ok(this.error_end(ApiError::DrainTimeout))));
            }
        }
        loop {
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(b))) if this.sse => {
                    this.tail.extend_from_slice(&b);
                    if let Some(out) = this.complete_events() {
                        return Poll::Ready(Some(Ok(out)));
                    }
                    // No complete event yet: read on (the inner stream registers the waker
                    // when it has nothing).
                }
                Poll::Ready(Some(Ok(b))) => return Poll::Ready(Some(Ok(b))),
                Poll::Ready(Some(Err(e))) if this.sse => {
                    return Poll::Ready(Some(Ok(this.upstream_end(&e.to_string()))));
                }
                Poll::Ready(Some(Err(e))) => {
                    this.outcome.set_status(502);
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if this.sse && !this.saw_done {
                        return Poll::Ready(Some(Ok(this.upstream_end("no [DONE]"))));
                    }
                    this.ended = true;
                    this.outcome.complete();
                    let rest = std::mem::take(&mut this.tail);
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Bytes::from(rest))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn body(
        chunks: Vec<Result<&'static [u8], &'static str>>,
    ) -> ObservedBody<impl Stream<Item = Result<Bytes, String>> + Unpin> {
        let m = Arc::new(Metrics::new());
        let s = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| c.map(Bytes::from_static).map_err(str::to_string)),
        );
        let guard = Arc::new(crate::inflight::InFlight::default()).enter(StreamMode::Passthrough);
        ObservedBody::new(s, Outcome::new(m, "completions", guard), true)
    }

    async fn collect(b: ObservedBody<impl Stream<Item = Result<Bytes, String>> + Unpin>) -> String {
        let parts: Vec<_> = b.collect().await;
        parts
            .into_iter()
            .map(|p| String::from_utf8(p.expect("no error item").to_vec()).expect("utf8"))
            .collect()
    }

    #[tokio::test]
    async fn whole_stream_passes_unchanged() {
        let text = "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n";
        let got = collect(body(vec![
            Ok(&text.as_bytes()[..7]),
            Ok(&text.as_bytes()[7..]),
        ]))
        .await;
        assert_eq!(got, text);
    }

    #[tokio::test]
    async fn cut_stream_ends_with_error_event() {
        let got = collect(body(vec![
            Ok(b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"cho"),
            Err("connection reset"),
        ]))
        .await;
        assert!(
            got.starts_with("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\""),
            "{got}"
        );
        assert!(got.ends_with("data: [DONE]\n\n"), "{got}");
        assert!(
            !got.contains("{\"cho\n"),
            "the partial event is not forwarded: {got}"
        );
    }

    #[tokio::test]
    async fn stream_without_done_gets_one() {
        let got = collect(body(vec![Ok(b"data: {\"choices\":[]}\r\n\r\n")])).await;
        assert!(got.contains("\"error\""), "{got}");
        assert!(got.ends_with("data: [DONE]\n\n"), "{got}");
    }

    #[test]
    fn event_boundaries() {
        assert_eq!(last_event_end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(last_event_end(b"data: a\r\n\r\n"), Some(11));
        assert_eq!(last_event_end(b"data: a\n"), None);
        let evs: Vec<&[u8]> = split_events(b"data: a\n\ndata: b\r\n\r\n").collect();
        assert_eq!(evs, vec![&b"data: a"[..], &b"data: b\r"[..]]);
    }
}
