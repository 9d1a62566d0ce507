//! Turn a session's events into the client's response: SSE chunks as rounds complete, or
//! one JSON body. The HTTP status is decided by the first event, so an upstream failure
//! before any token gives a proper error status; a failure after that becomes an error
//! event followed by `[DONE]`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;

use super::drain::Cut;
use super::observe::{route_label, Outcome};
use super::Shared;
use crate::error::ApiError;
use crate::metrics::labels::StreamMode;
use crate::protocol::response::EnvelopeHead;
use crate::speculation::output::{self, new_id, Parsed, Shape};
use crate::speculation::reasoning::Reasoning;
use crate::speculation::request::{Endpoint, GenRequest};
use crate::speculation::session::{Event, Events};
use crate::speculation::tools::Tools;
use crate::tokens::ModelTokenizer;

pub async fn respond(
    st: &Shared,
    gen: &GenRequest,
    model: String,
    tokenizer: Arc<ModelTokenizer>,
    (reasoning, tools): (Option<Reasoning>, Option<Tools>),
    mut rx: Events,
) -> Response {
    let path = match gen.endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::Chat => "/v1/chat/completions",
    };
    let mut outcome = Outcome::new(
        st.metrics.clone(),
        route_label(path),
        st.in_flight.enter(StreamMode::Speculate),
    );
    let shape = Shape {
        endpoint: gen.endpoint,
        id: new_id(gen.endpoint),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model,
        want_logprobs: gen.want_logprobs,
        tokens_as_ids: gen.tokens_as_ids,
        tokenizer,
        reasoning,
        tools,
    };
    let mut cut = st.drain_cut.signal();
    let first = next_event(&mut rx, &mut cut).await;
    let first = match first {
        None => {
            let e = ApiError::Internal("generation ended without a result".into());
            outcome.set_status(e.status().as_u16());
            outcome.complete();
            return e.into_response();
        }
        Some(Event::Error(e)) => {
            outcome.set_status(e.status().as_u16());
            outcome.complete();
            return e.into_response();
        }
        Some(ev) => ev,
    };
    if gen.stream {
        stream_response(shape, gen.include_usage, first, (rx, cut), outcome)
    } else {
        full_response(shape, first, (rx, cut), outcome).await
    }
}

/// The session's next event, or the drain timeout's error once that has passed (checked
/// first, so that a fast stream cannot hold the cut off).
async fn next_event(rx: &mut Events, cut: &mut Cut) -> Option<Event> {
    tokio::select! {
        biased;
        () = cut.passed() => Some(Event::Error(ApiError::DrainTimeout)),
        e = rx.recv() => e,
    }
}

async fn full_response(
    shape: Shape,
    first: Event,
    (mut rx, mut cut): (Events, Cut),
    mut outcome: Outcome,
) -> Response {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut ev = Some(first);
    while let Some(e) = ev.take() {
        match e {
            Event::Delta {
                text: t,
                tokens: mut k,
                ..
            } => {
                text.push_str(&t);
                tokens.append(&mut k);
            }
            Event::Done {
                text: t,
                tokens: mut k,
                finish,
                stats,
                ..
            } => {
                text.push_str(&t);
                tokens.append(&mut k);
                let mut off = 0;
                let lp = shape.logprobs(&tokens, &mut off);
                let thought = shape.reasoning_tokens(tokens.iter().map(|s| s.id), None);
                outcome.tokens(tokens.len() as u64);
                outcome.complete();
                let body = shape.full(&text, lp, &finish, &stats, thought);
                return axum::Json(body).into_response();
            }
            Event::Error(e) => {
                outcome.set_status(e.status().as_u16());
                outcome.complete();
                return e.into_response();
            }
        }
        ev = next_event(&mut rx, &mut cut).await;
    }
    // Answered with an error: counted under its status, not as aborted.
    let e = ApiError::Internal("generation ended without a result".into());
    outcome.set_status(e.status().as_u16());
    outcome.complete();
    e.into_response()
}

struct StreamState {
    shape: Shape,
    include_usage: bool,
    rx: Events,
    cut: Cut,
    pending: Option<Event>,
    first_chunk: bool,
    offset: usize,
    /// Every output token id, for the reasoning token count (with a parser only).
    ids: Vec<u32>,
    finished: bool,
    outcome: Outcome,
    head: EnvelopeHead,
}

/// Append `body` to `out` as one SSE event, serialized in place (no copy of the JSON).
fn sse(out: &mut Vec<u8>, body: &output::Body<'_>, head: &mut EnvelopeHead) {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    let written = match body {
        output::Body::Completion(e) => e.write_json(out, head),
        output::Body::ChatChunk(e) => e.write_json(out, head),
        output::Body::Chat(_) => serde_json::to_writer(&mut *out, body),
    };
    // Serializing these typed bodies cannot fail (string keys, no maps of non-strings);
    // were it to, the event is left out whole.
    if written.is_err() {
        out.truncate(start);
        return;
    }
    out.extend_from_slice(b"\n\n");
}

fn stream_response(
    shape: Shape,
    include_usage: bool,
    first: Event,
    (rx, cut): (Events, Cut),
    outcome: Outcome,
) -> Response {
    let state = StreamState {
        shape,
        include_usage,
        rx,
        cut,
        pending: Some(first),
        first_chunk: true,
        offset: 0,
        ids: Vec::new(),
        finished: false,
        outcome,
        head: EnvelopeHead::default(),
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        if s.finished {
            return None;
        }
        // Room for a usual chunk, so that serializing it rarely grows the buffer.
        let mut out: Vec<u8> = Vec::with_capacity(512);
        if s.first_chunk && s.shape.endpoint == Endpoint::Chat {
            let role = s.shape.chunk("", Parsed::default(), None, None, true);
            sse(&mut out, &role, &mut s.head);
            s.first_chunk = false;
        }
        let ev = match s.pending.take() {
            Some(e) => Some(e),
            None => next_event(&mut s.rx, &mut s.cut).await,
        };
        match ev {
            Some(Event::Delta {
                text,
                tokens,
                split,
                calls,
            }) => {
                let lp = s.shape.logprobs(&tokens, &mut s.offset);
                s.note_ids(&tokens);
                // A chunk whose text a parser dropped entirely (a lone think marker, text
                // a tool parser holds back) is not sent, as vLLM sends none.
                let visible = match (&split, &calls) {
                    (Some(p), Some(c)) => !p.reasoning.is_empty() || !c.delta.is_empty(),
                    (None, Some(c)) => !c.delta.is_empty(),
                    (Some(p), None) => !p.reasoning.is_empty() || !p.content.is_empty(),
                    (None, None) => !text.is_empty(),
                };
                if visible || lp.is_some() {
                    let parsed = Parsed {
                        split: split.as_ref(),
                        calls: calls.as_ref(),
                    };
                    let chunk = s.shape.chunk(&text, parsed, lp, None, s.first_chunk);
                    sse(&mut out, &chunk, &mut s.head);
                    s.first_chunk = false;
                }
                s.outcome.tokens(tokens.len() as u64);
            }
            Some(Event::Done {
                text,
                tokens,
                split,
                calls,
                finish,
                stats,
            }) => {
                let lp = s.shape.logprobs(&tokens, &mut s.offset);
                s.note_ids(&tokens);
                let parsed = Parsed {
                    split: split.as_ref(),
                    calls: calls.as_ref(),
                };
                let chunk = s
                    .shape
                    .chunk(&text, parsed, lp, Some(&finish), s.first_chunk);
                sse(&mut out, &chunk, &mut s.head);
                s.outcome.tokens(tokens.len() as u64);
                if s.include_usage {
                    let counted = split.as_ref().and_then(|p| p.counted);
                    let thought = s.shape.reasoning_tokens(s.ids.iter().copied(), counted);
                    sse(&mut out, &s.shape.usage_chunk(&stats, thought), &mut s.head);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                s.outcome.complete();
                s.finished = true;
            }
            Some(Event::Error(e)) => {
                out.extend_from_slice(e.sse_event().as_bytes());
                out.extend_from_slice(b"data: [DONE]\n\n");
                s.outcome.set_status(e.status().as_u16());
                s.outcome.complete();
                s.finished = true;
            }
            None => {
                let e = ApiError::Internal("generation ended without a result".into());
                out.extend_from_slice(e.sse_event().as_bytes());
                out.extend_from_slice(b"data: [DONE]\n\n");
                s.outcome.set_status(e.status().as_u16());
                s.outcome.complete();
                s.finished = true;
            }
        }
        Some((Ok::<Bytes, std::convert::Infallible>(Bytes::from(out)), s))
    });
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

impl StreamState {
    fn note_ids(&mut self, tokens: &[crate::upstream::verify::Sample]) {
        if self.shape.reasoning.is_some() {
            self.ids.extend(tokens.iter().map(|t| t.id));
        }
    }
}

/// Keep a stream slot until the response body is finished or dropped.
pub fn with_permit(resp: Response, permit: Option<tokio::sync::OwnedSemaphorePermit>) -> Response {
    let Some(permit) = permit else { return resp };
    resp.map(|b| {
        let s = b.into_data_stream().map(move |x| {
            let _held = &permit;
            x
        });
        Body::from_stream(s)
    })
}
