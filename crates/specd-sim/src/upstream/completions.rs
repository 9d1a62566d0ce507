//! `/v1/completions` (and `/v1/chat/completions`, its prompt rendered by `chat.rs`), whole
//! and streamed, on either clock, and the faults applied to the answer itself (malformed
//! JSON, cut bodies and streams).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::reply::{cut_body, encode, error};
use super::{Clock, St};
use crate::engine::{Job, Sink};
use crate::fault::Fault;

/// Counts a completions request as in flight until dropped.
pub(crate) struct InFlight(Arc<St>);

impl InFlight {
    pub(crate) fn new(st: &Arc<St>) -> InFlight {
        st.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(st.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|x| u32::try_from(x).ok()))
        .collect()
}

/// `prompt` as a list of token-id prompts (text is tokenized).
pub(crate) fn prompts(st: &St, p: Option<&Value>) -> Result<Vec<Vec<u32>>, String> {
    let p = p.ok_or("prompt is required")?;
    if let Some(s) = p.as_str() {
        return Ok(vec![encode(st, s, true)?]);
    }
    if let Some(one) = ids(p).filter(|v| !v.is_empty()) {
        return Ok(vec![one]);
    }
    let list = p
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or("prompt must not be empty")?;
    list.iter()
        .map(|x| match x.as_str() {
            Some(s) => encode(st, s, true),
            None => ids(x)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| "prompt entries must be text or token ids".to_string()),
        })
        .collect()
}

/// How the answer is shaped.
struct Shape {
    model: String,
    /// Chat-shaped (`message` / `delta`) rather than `text`.
    chat: bool,
    as_ids: bool,
    /// `return_token_ids`: each choice carries its `token_ids`, and the first one the
    /// prompt's (`prompt_token_ids`), as vLLM ≥ 0.10.2 answers.
    token_ids: bool,
    /// `Some(n)`: logprobs wanted, with n top entries.
    n_top: Option<usize>,
    usage: bool,
}

impl Shape {
    fn token(&self, st: &St, t: u32) -> String {
        if self.as_ids {
            format!("token_id:{t}")
        } else {
            st.tok.decode(&[t], false).unwrap_or_default()
        }
    }

    fn logprobs(&self, st: &St, toks: &[u32]) -> Value {
        let Some(n) = self.n_top else {
            return Value::Null;
        };
        // The sampled token first, then up to two others, less likely.
        let top: Vec<Value> = toks
            .iter()
            .map(|&t| {
                let mut m = serde_json::Map::new();
                for j in 0..n.min(3) as u32 {
                    let alt = if j == 0 { t } else { 4 + (t + j) % 97 };
                    m.insert(self.token(st, alt), json!(-0.25 - f64::from(j)));
                }
                Value::Object(m)
            })
            .collect();
        json!({"tokens": toks.iter().map(|&t| self.token(st, t)).collect::<Vec<_>>(),
               "token_logprobs": vec![-0.25; toks.len()],
               "top_logprobs": if n > 0 { json!(top) } else { Value::Null },
               "text_offset": vec![0; toks.len()]})
    }

    /// A completion choice; `prompt` is the prompt's ids where the choice reports them.
    fn choice(
        &self,
        st: &St,
        index: usize,
        (prompt, toks): (Option<&[u32]>, &[u32]),
        finish: Option<&str>,
    ) -> Value {
        let text = st.tok.decode(toks, true).unwrap_or_default();
        if self.chat {
            return json!({"index": index, "message": {"role": "assistant", "content": text},
                          "logprobs": null, "finish_reason": finish, "stop_reason": null});
        }
        let mut c = json!({"index": index, "text": text,
               "logprobs": self.logprobs(st, toks), "finish_reason": finish, "stop_reason": null});
        if self.token_ids {
            c["prompt_token_ids"] = json!(prompt);
            c["token_ids"] = json!(toks);
        }
        c
    }

    /// One streamed token's choice; `prompt` in the first one.
    fn delta(&self, st: &St, prompt: Option<&[u32]>, t: u32, finish: Option<&str>) -> Value {
        if !self.chat {
            return self.choice(st, 0, (prompt, &[t]), finish);
        }
        let text = st.tok.decode(&[t], true).unwrap_or_default();
        json!({"index": 0, "delta": {"content": text}, "logprobs": null,
               "finish_reason": finish})
    }

    fn chunk(&self, choices: Value, usage: Option<Value>, streamed: bool) -> Value {
        let (id, object) = match (self.chat, streamed) {
            (false, _) => ("cmpl-specd-sim", "text_completion"),
            (true, false) => ("chatcmpl-specd-sim", "chat.completion"),
            (true, true) => ("chatcmpl-specd-sim", "chat.completion.chunk"),
        };
        let mut v = json!({"id": id, "object": object, "created": 0,
                           "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
}

pub(super) async fn answer(
    st: Arc<St>,
    body: &Value,
    ps: Vec<Vec<u32>>,
    fault: Option<Fault>,
    in_flight: Option<InFlight>,
) -> Response {
    let max_model_len = st.max_model_len.load(Ordering::SeqCst);
    let longest = ps.iter().map(Vec::len).max().unwrap_or(0);
    let max_tokens = body
        .get("max_tokens")
        .and_then(Value::as_u64)
        .map_or(max_model_len.saturating_sub(longest), |n| n as usize);
    if longest + max_tokens > max_model_len {
        return error(400, &format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({longest} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or completion.",
            longest + max_tokens
        ));
    }
    let shape = Shape {
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&st.model)
            .to_string(),
        chat: body.get("messages").is_some(),
        as_ids: body.get("return_tokens_as_token_ids") == Some(&Value::Bool(true)),
        token_ids: body.get("return_token_ids") == Some(&Value::Bool(true)),
        n_top: body
            .get("logprobs")
            .and_then(Value::as_u64)
            .map(|n| n as usize),
        usage: body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)),
    };
    let prompt_tokens: usize = ps.iter().map(Vec::len).sum();
    if body.get("stream") == Some(&Value::Bool(true)) {
        if ps.len() != 1 {
            return error(400, "streaming takes one prompt");
        }
        let prompt = shape.token_ids.then(|| ps[0].clone());
        let Some(source) = Source::start(&st, ps, max_tokens) else {
            return error(503, "engine stopped");
        };
        let s = Streamed {
            st,
            shape,
            source,
            prompt,
            n: 0,
            max_tokens,
            prompt_tokens,
            fault,
            done: false,
            _in_flight: in_flight,
        };
        return stream(s);
    }
    let prompt_ids = if shape.token_ids {
        ps.clone()
    } else {
        Vec::new()
    };
    let Some(outs) = generate(&st, ps, max_tokens).await else {
        return error(503, "engine stopped");
    };
    let choices: Vec<Value> = (outs.iter().enumerate())
        .map(|(i, toks)| {
            let p = prompt_ids.get(i).map(Vec::as_slice);
            shape.choice(&st, i, (p, toks), Some("length"))
        })
        .collect();
    let completion: usize = outs.iter().map(Vec::len).sum();
    let v = shape.chunk(
        json!(choices),
        Some(usage(prompt_tokens, completion)),
        false,
    );
    match fault {
        Some(Fault::Malformed(_)) => {
            let s = v.to_string();
            (StatusCode::OK, s[..s.len() - 7].to_string()).into_response()
        }
        Some(Fault::Cut(_)) => cut_body(v.to_string().into_bytes()),
        _ => axum::Json(v).into_response(),
    }
}

/// Every prompt's continuation, once all are done.
async fn generate(st: &St, ps: Vec<Vec<u32>>, max_tokens: usize) -> Option<Vec<Vec<u32>>> {
    match &st.clock {
        Clock::Immediate => Some(
            ps.iter()
                .map(|p| st.tokens.continuation(p, max_tokens))
                .collect(),
        ),
        Clock::Model(engine) => {
            let (tx, rx) = oneshot::channel();
            let job = Job {
                prompts: ps,
                max_tokens: max_tokens as u32,
                sink: Sink::Batch(tx),
            };
            if !engine.submit(job) {
                return None;
            }
            rx.await.ok()
        }
    }
}

/// A streamed sequence's tokens as they come.
enum Source {
    Ready(std::vec::IntoIter<u32>),
    /// Dropping the receiver aborts the sequence in the engine, as vLLM aborts a request
    /// whose client went away.
    Engine(mpsc::UnboundedReceiver<u32>),
}

impl Source {
    fn start(st: &St, ps: Vec<Vec<u32>>, max_tokens: usize) -> Option<Source> {
        match &st.clock {
            Clock::Immediate => Some(Source::Ready(
                st.tokens.continuation(&ps[0], max_tokens).into_iter(),
            )),
            Clock::Model(engine) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let job = Job {
                    prompts: ps,
                    max_tokens: max_tokens as u32,
                    sink: Sink::Stream(tx),
                };
                engine.submit(job).then_some(Source::Engine(rx))
            }
        }
    }

    async fn next(&mut self, st: &St, first: bool) -> Option<u32> {
        match self {
            Source::Ready(it) => {
                let delay = st.token_delay_us.load(Ordering::SeqCst);
                if delay > 0 && !first {
                    tokio::time::sleep(Duration::from_micros(delay as u64)).await;
                }
                it.next()
            }
            Source::Engine(rx) => rx.recv().await,
        }
    }
}

struct Streamed {
    st: Arc<St>,
    shape: Shape,
    source: Source,
    /// The prompt's ids, until the first chunk reports them (`return_token_ids`).
    prompt: Option<Vec<u32>>,
    n: usize,
    max_tokens: usize,
    prompt_tokens: usize,
    fault: Option<Fault>,
    done: bool,
    _in_flight: Option<InFlight>,
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// The next piece of a stream: a token's chunk, the end, or the injected fault.
async fn step(mut s: Streamed) -> Option<(Result<Bytes, std::io::Error>, Streamed)> {
    if s.done {
        return None;
    }
    match s.fault {
        Some(Fault::Cut(n)) if s.n == n => {
            // Let what was written reach the peer first (the server flushes when the body
            // has nothing ready), then break the connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
            s.done = true;
            return Some((Err(std::io::Error::other("cut by the fake upstream")), s));
        }
        Some(Fault::Malformed(n)) if s.n == n => {
            s.done = true;
            let broken = Bytes::from_static(b"data: {\"choices\": [{\"tex\n\n");
            return Some((Ok(broken), s));
        }
        _ => {}
    }
    let Some(t) = s.source.next(&s.st, s.n == 0).await else {
        s.done = true;
        let mut out = Vec::new();
        if s.shape.usage {
            let u = usage(s.prompt_tokens, s.n);
            out.extend_from_slice(&sse(&s.shape.chunk(json!([]), Some(u), true)));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        return Some((Ok(Bytes::from(out)), s));
    };
    s.n += 1;
    let finish = (s.n >= s.max_tokens).then_some("length");
    let prompt = s.prompt.take();
    let choice = s.shape.delta(&s.st, prompt.as_deref(), t, finish);
    let chunk = sse(&s.shape.chunk(json!([choice]), None, true));
    Some((Ok(chunk), s))
}

fn stream(s: Streamed) -> Response {
    let body = futures_util::stream::unfold(s, step);
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    r
}
