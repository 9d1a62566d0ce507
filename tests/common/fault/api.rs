//! The stand-in's vLLM API: request handling, completions (whole and streamed) and the
//! faults applied to them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::{continuation, Call, Fault, Seen, St, MODEL};

fn classify(path: &str, body: &Value) -> Call {
    match path {
        "/health" => Call::Health,
        "/v1/models" => Call::Models,
        "/tokenize" => Call::Tokenize,
        "/v1/completions" if body.get("stream") == Some(&Value::Bool(true)) => Call::Stream,
        "/v1/completions"
            if body.get("max_tokens") == Some(&json!(1))
                && body.get("return_tokens_as_token_ids") == Some(&Value::Bool(true)) =>
        {
            Call::Verify
        }
        "/v1/completions" => Call::Complete,
        _ => Call::Any,
    }
}

/// Prompts of a completions body as token lists (text prompts are tokenized).
fn prompts(st: &St, body: &Value) -> Vec<Vec<u32>> {
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().map(|x| x as u32))
            .collect()
    };
    let text = |s: &str| -> Vec<u32> {
        st.tok
            .tokenizer
            .encode(s, true)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    };
    match body.get("prompt") {
        Some(Value::String(s)) => vec![text(s)],
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            ids(&json!(a)).into_iter().collect()
        }
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(text(s)),
                v => ids(v),
            })
            .collect(),
        _ => Vec::new(),
    }
}

impl St {
    fn take_fault(&self, call: Call, first_token: Option<u32>) -> Option<Fault> {
        let mut rules = self.rules.lock().ok()?;
        let i = rules.iter().position(|r| {
            (r.call == call || r.call == Call::Any)
                && r.marker.is_none_or(|m| Some(m) == first_token)
        })?;
        let fault = rules[i].fault;
        if let Some(t) = &mut rules[i].times {
            *t -= 1;
            if *t == 0 {
                rules.remove(i);
            }
        }
        Some(fault)
    }

    fn record(&self, s: Seen) {
        if let Ok(mut q) = self.seen.lock() {
            if q.len() >= 256 {
                q.pop_front();
            }
            q.push_back(s);
        }
    }
}

/// Counts a completions request as running until dropped.
struct Running(Arc<St>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn error(status: u16, msg: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = if status < 500 {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    (
        code,
        axum::Json(json!({"error": {"message": msg, "type": kind, "param": null, "code": status}})),
    )
        .into_response()
}

fn cut_body(full: Vec<u8>) -> Response {
    let half = Bytes::from(full[..full.len() / 2].to_vec());
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        vec![Ok(half), Err(std::io::Error::other("cut by the stand-in"))];
    let mut r = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) async fn handle(State(st): State<Arc<St>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    st.record(Seen {
        path: path.clone(),
        authorization: parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: body.clone(),
    });
    let call = classify(&path, &body);
    st.calls[call as usize].fetch_add(1, Ordering::SeqCst);
    let ps = if path == "/v1/completions" {
        prompts(&st, &body)
    } else {
        Vec::new()
    };
    let running = (path == "/v1/completions").then(|| {
        st.running.fetch_add(1, Ordering::SeqCst);
        Running(st.clone())
    });
    let fault = st.take_fault(call, ps.first().and_then(|p| p.first().copied()));
    match fault {
        Some(Fault::Status(s)) => return error(s, "fault injected by the stand-in upstream"),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::Hang) => std::future::pending::<()>().await,
        _ => {}
    }
    let max_model_len = st.max_model_len.load(Ordering::SeqCst);
    match path.as_str() {
        "/health" => StatusCode::OK.into_response(),
        "/version" => axum::Json(json!({"version": "0.0.0+standin"})).into_response(),
        "/v1/models" => axum::Json(json!({"object": "list", "data": [{
            "id": MODEL, "object": "model", "created": 0, "owned_by": "vllm",
            "root": st.root, "parent": null, "max_model_len": max_model_len, "permission": []}]}))
        .into_response(),
        "/tokenize" => {
            let text = match (body.get("prompt"), body.get("messages")) {
                (Some(Value::String(s)), _) => s.clone(),
                (_, Some(Value::Array(m))) => m
                    .iter()
                    .filter_map(|x| x.get("content").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => return error(400, "tokenize needs a prompt or messages"),
            };
            let ids = prompts(&st, &json!({"prompt": text})).remove(0);
            axum::Json(json!({"count": ids.len(), "max_model_len": max_model_len,
                              "tokens": ids, "token_strs": null}))
            .into_response()
        }
        "/metrics" => format!(
            "# stand-in upstream metrics\nvllm:num_requests_running{{model_name=\"{MODEL}\"}} {}\n",
            st.running.load(Ordering::SeqCst)
        )
        .into_response(),
        "/v1/completions" => completions(&st, &body, ps, fault, running).await,
        _ => error(404, "not found"),
    }
}

struct Opts {
    n_top: Option<usize>,
    as_ids: bool,
    usage: bool,
}

impl Opts {
    fn logprobs(&self, st: &St, toks: &[u32]) -> Value {
        let Some(n) = self.n_top else {
            return Value::Null;
        };
        let name = |t: u32| {
            if self.as_ids {
                format!("token_id:{t}")
            } else {
                st.tok.token_text(t)
            }
        };
        let top: Vec<Value> = toks
            .iter()
            .map(|&t| {
                let mut m = serde_json::Map::new();
                for j in 0..n.min(3) as u32 {
                    m.insert(
                        name(if j == 0 { t } else { 4 + (t + j) % 97 }),
                        json!(-0.25 - f64::from(j)),
                    );
                }
                Value::Object(m)
            })
            .collect();
        json!({"tokens": toks.iter().map(|&t| name(t)).collect::<Vec<_>>(),
               "token_logprobs": toks.iter().map(|_| -0.25).collect::<Vec<_>>(),
               "top_logprobs": if n > 0 { json!(top) } else { Value::Null },
               "text_offset": toks.iter().map(|_| 0).collect::<Vec<_>>()})
    }
}

async fn completions(
    st: &Arc<St>,
    body: &Value,
    ps: Vec<Vec<u32>>,
    fault: Option<Fault>,
    running: Option<Running>,
) -> Response {
    if ps.is_empty() || ps.iter().any(Vec::is_empty) {
        return error(400, "prompt must not be empty");
    }
    let max_model_len = st.max_model_len.load(Ordering::SeqCst);
    let plen = ps.iter().map(Vec::len).max().unwrap_or(0);
    let max_tokens = body
        .get("max_tokens")
        .and_then(Value::as_u64)
        .map_or(max_model_len.saturating_sub(plen), |n| n as usize);
    if plen + max_tokens > max_model_len {
        return error(400, "This model's maximum context length is exceeded.");
    }
    let opts = Opts {
        n_top: body
            .get("logprobs")
            .and_then(Value::as_u64)
            .map(|n| n as usize),
        as_ids: body.get("return_tokens_as_token_ids") == Some(&Value::Bool(true)),
        usage: body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)),
    };
    let outs: Vec<Vec<u32>> = ps.iter().map(|p| continuation(p, max_tokens)).collect();
    if body.get("stream") == Some(&Value::Bool(true)) {
        let toks = outs.into_iter().next().unwrap_or_default();
        return stream(st.clone(), opts, toks, plen, fault, running);
    }
    let choices: Vec<Value> = outs
        .iter()
        .enumerate()
        .map(|(i, toks)| {
            let text: String = toks.iter().map(|&t| st.tok.token_text(t)).collect();
            json!({"index": i, "text": text, "logprobs": opts.logprobs(st, toks),
                   "finish_reason": "length", "stop_reason": null})
        })
        .collect();
    let completion: usize = outs.iter().map(Vec::len).sum();
    let v = json!({"id": "cmpl-standin", "object": "text_completion", "created": 0, "model": MODEL,
                   "choices": choices,
                   "usage": {"prompt_tokens": plen, "completion_tokens": completion,
                             "total_tokens": plen + completion}});
    match fault {
        Some(Fault::Malformed(_)) => {
            let s = v.to_string();
            (StatusCode::OK, s[..s.len() - 7].to_string()).into_response()
        }
        Some(Fault::Cut(_)) => cut_body(v.to_string().into_bytes()),
        _ => axum::Json(v).into_response(),
    }
}

struct StreamState {
    st: Arc<St>,
    opts: Opts,
    toks: Vec<u32>,
    i: usize,
    plen: usize,
    fault: Option<Fault>,
    done: bool,
    _running: Option<Running>,
}

fn stream(
    st: Arc<St>,
    opts: Opts,
    toks: Vec<u32>,
    plen: usize,
    fault: Option<Fault>,
    running: Option<Running>,
) -> Response {
    let s = StreamState {
        st,
        opts,
        toks,
        i: 0,
        plen,
        fault,
        done: false,
        _running: running,
    };
    let body = futures_util::stream::unfold(s, |mut s| async move {
        if s.done {
            return None;
        }
        let chunk = |v: Value| Bytes::from(format!("data: {v}\n\n"));
        match s.fault {
            Some(Fault::Cut(n)) if s.i == n => {
                // Let what was written reach the peer first (the server flushes when the
                // body has nothing ready), then break the connection.
                tokio::time::sleep(Duration::from_millis(20)).await;
                s.done = true;
                return Some((Err(std::io::Error::other("cut by the stand-in")), s));
            }
            Some(Fault::Malformed(n)) if s.i == n => {
                s.done = true;
                return Some((
                    Ok(Bytes::from_static(b"data: {\"choices\": [{\"tex\n\n")),
                    s,
                ));
            }
            _ => {}
        }
        if s.i == s.toks.len() {
            s.done = true;
            let usage = json!({"id": "cmpl-standin", "object": "text_completion", "created": 0,
                "model": MODEL, "choices": [], "usage": {"prompt_tokens": s.plen,
                "completion_tokens": s.toks.len(), "total_tokens": s.plen + s.toks.len()}});
            let mut out = if s.opts.usage {
                chunk(usage).to_vec()
            } else {
                Vec::new()
            };
            out.extend_from_slice(b"data: [DONE]\n\n");
            return Some((Ok(Bytes::from(out)), s));
        }
        let delay = s.st.token_delay_us.load(Ordering::SeqCst);
        if delay > 0 && s.i > 0 {
            tokio::time::sleep(Duration::from_micros(delay as u64)).await;
        }
        let t = s.toks[s.i];
        s.i += 1;
        let finish = if s.i == s.toks.len() {
            json!("length")
        } else {
            Value::Null
        };
        let v = json!({"id": "cmpl-standin", "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": s.st.tok.token_text(t),
                         "logprobs": s.opts.logprobs(&s.st, &[t]),
                         "finish_reason": finish, "stop_reason": null}]});
        Some((Ok(chunk(v)), s))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    r
}
