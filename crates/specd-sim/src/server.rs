//! The sim's HTTP face: the vLLM API subset specd uses.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};
use tokenizers::Tokenizer;
use tokio::sync::{mpsc, oneshot};

use super::engine::{Engine, Job, Sink};
use super::SimConfig;

/// How to run the sim server.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Model directory with tokenizer.json, reported as the model's `root`.
    #[arg(long, env = "SPECD_SIM_TOKENIZER")]
    pub tokenizer: PathBuf,
    /// Served model name.
    #[arg(long, default_value = "specd-sim")]
    pub model: String,
    #[command(flatten)]
    pub cost: SimConfig,
}

struct Sim {
    engine: Engine,
    tok: Tokenizer,
    root: String,
    model: String,
    cfg: SimConfig,
}

type St = Arc<Sim>;

/// An error answer, vLLM-shaped.
struct Bad(StatusCode, String);

impl IntoResponse for Bad {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.1, "type": "BadRequestError", "code": self.0.as_u16()}});
        (self.0, Json(body)).into_response()
    }
}

fn bad(status: StatusCode, msg: impl Into<String>) -> Bad {
    Bad(status, msg.into())
}

fn err(status: StatusCode, msg: impl Into<String>) -> Response {
    bad(status, msg).into_response()
}

/// Bind and serve until the process ends; returns the bound address once listening.
pub async fn start(args: ServeArgs) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let file = if args.tokenizer.is_dir() {
        args.tokenizer.join("tokenizer.json")
    } else {
        args.tokenizer.clone()
    };
    let tok = Tokenizer::from_file(&file)
        .map_err(|e| anyhow::anyhow!("loading {}: {e}", file.display()))?;
    let root = if args.tokenizer.is_dir() {
        args.tokenizer.clone()
    } else {
        args.tokenizer
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default()
    };
    let st = Arc::new(Sim {
        engine: Engine::start(args.cost.clone()),
        tok,
        root: root.display().to_string(),
        model: args.model,
        cfg: args.cost,
    });
    let app = Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route(
            "/version",
            get(|| async { Json(json!({"version": "0.0.0-specd-sim"})) }),
        )
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/v1/completions", post(completions))
        .with_state(st);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((addr, task))
}

async fn models(State(st): State<St>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": st.model, "object": "model", "created": 0, "owned_by": "vllm",
        "root": st.root, "parent": null, "max_model_len": st.cfg.max_model_len,
    }]}))
}

async fn metrics(State(st): State<St>) -> Response {
    let body = format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{}\"}} {}\n",
        st.model,
        st.engine.running()
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn encode(st: &Sim, text: &str, special: bool) -> Result<Vec<u32>, Bad> {
    st.tok
        .encode(text, special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| bad(StatusCode::BAD_REQUEST, format!("tokenizer: {e}")))
}

async fn tokenize(State(st): State<St>, Json(b): Json<Value>) -> Response {
    let tokens = if let Some(msgs) = b.get("messages").and_then(Value::as_array) {
        // ChatML, as the test models' template renders it.
        let mut text = String::from("<|begin_of_text|>");
        for m in msgs {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
            let content = m.get("content").and_then(Value::as_str).unwrap_or("");
            text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        if b.get("add_generation_prompt").and_then(Value::as_bool) != Some(false) {
            text.push_str("<|im_start|>assistant\n");
        }
        let special = b.get("add_special_tokens").and_then(Value::as_bool) == Some(true);
        encode(&st, &text, special)
    } else if let Some(p) = b.get("prompt").and_then(Value::as_str) {
        let special = b.get("add_special_tokens").and_then(Value::as_bool) != Some(false);
        encode(&st, p, special)
    } else {
        return err(StatusCode::BAD_REQUEST, "tokenize needs prompt or messages");
    };
    match tokens {
        Ok(t) => Json(json!({"count": t.len(), "max_model_len": st.cfg.max_model_len, "tokens": t, "token_strs": null})).into_response(),
        Err(r) => r.into_response(),
    }
}

fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|t| t.as_u64().map(|x| x as u32))
        .collect()
}

/// `prompt` as a list of token-id prompts.
fn prompts(st: &Sim, p: &Value) -> Result<Vec<Vec<u32>>, Bad> {
    if let Some(s) = p.as_str() {
        return Ok(vec![encode(st, s, true)?]);
    }
    if let Some(one) = ids(p).filter(|v| !v.is_empty()) {
        return Ok(vec![one]);
    }
    let list = p
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "prompt must be text or token ids"))?;
    list.iter()
        .map(|x| match x.as_str() {
            Some(s) => encode(st, s, true),
            None => ids(x)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| bad(StatusCode::BAD_REQUEST, "bad prompt entry")),
        })
        .collect()
}

struct Shape {
    model: String,
    as_ids: bool,
    /// `Some(n)`: logprobs wanted, with n top entries.
    logprobs: Option<u64>,
}

impl Shape {
    fn token(&self, st: &Sim, t: u32) -> String {
        if self.as_ids {
            format!("token_id:{t}")
        } else {
            st.tok.decode(&[t], false).unwrap_or_default()
        }
    }
    fn logprobs(&self, st: &Sim, toks: &[u32]) -> Value {
        let Some(n) = self.logprobs else {
            return Value::Null;
        };
        let names: Vec<String> = toks.iter().map(|&t| self.token(st, t)).collect();
        let top: Value = if n > 0 {
            names.iter().map(|s| json!({ s.clone(): 0.0 })).collect()
        } else {
            Value::Null
        };
        json!({"text_offset": vec![0; toks.len()], "token_logprobs": vec![0.0; toks.len()], "tokens": names, "top_logprobs": top})
    }
    fn choice(&self, st: &Sim, index: usize, toks: &[u32], finish: Option<&str>) -> Value {
        json!({"index": index, "text": st.tok.decode(toks, true).unwrap_or_default(),
               "logprobs": self.logprobs(st, toks), "finish_reason": finish, "stop_reason": null})
    }
}

async fn completions(State(st): State<St>, Json(b): Json<Value>) -> Response {
    let ps = match b.get("prompt").map(|p| prompts(&st, p)) {
        Some(Ok(p)) => p,
        Some(Err(r)) => return r.into_response(),
        None => return err(StatusCode::BAD_REQUEST, "prompt is required"),
    };
    let max_tokens = b.get("max_tokens").and_then(Value::as_u64).unwrap_or(16) as u32;
    if let Some(p) = ps
        .iter()
        .find(|p| p.len() + max_tokens as usize > st.cfg.max_model_len as usize)
    {
        return err(
            StatusCode::BAD_REQUEST,
            format!(
                "prompt of {} tokens + {max_tokens} exceeds the context",
                p.len()
            ),
        );
    }
    let shape = Shape {
        model: b
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&st.model)
            .to_string(),
        as_ids: b.get("return_tokens_as_token_ids").and_then(Value::as_bool) == Some(true),
        logprobs: b.get("logprobs").and_then(Value::as_u64),
    };
    let prompt_tokens: usize = ps.iter().map(Vec::len).sum();
    if b.get("stream").and_then(Value::as_bool) == Some(true) {
        if ps.len() != 1 {
            return err(StatusCode::BAD_REQUEST, "streaming takes one prompt");
        }
        let usage = b
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        return stream(st, ps, max_tokens, shape, usage, prompt_tokens);
    }
    let (tx, rx) = oneshot::channel();
    let n = ps.len();
    if !st.engine.submit(Job {
        prompts: ps,
        max_tokens,
        sink: Sink::Batch(tx),
    }) {
        return err(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
    }
    let Ok(out) = rx.await else {
        return err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "engine dropped the request",
        );
    };
    let choices: Vec<Value> = (0..n)
        .map(|i| shape.choice(&st, i, &out[i], Some("length")))
        .collect();
    let completion: usize = out.iter().map(Vec::len).sum();
    Json(json!({"id": "cmpl-sim", "object": "text_completion", "created": 0, "model": shape.model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}}))
    .into_response()
}

fn stream(
    st: St,
    ps: Vec<Vec<u32>>,
    max_tokens: u32,
    shape: Shape,
    usage: bool,
    prompt_tokens: usize,
) -> Response {
    let (tx, mut rx) = mpsc::unbounded_channel();
    if !st.engine.submit(Job {
        prompts: ps,
        max_tokens,
        sink: Sink::Stream(tx),
    }) {
        return err(StatusCode::SERVICE_UNAVAILABLE, "engine stopped");
    }
    let (out_tx, out_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut n = 0u32;
        let chunk = |v: Value| Ok(Bytes::from(format!("data: {v}\n\n")));
        while let Some(t) = rx.recv().await {
            n += 1;
            let finish = (n >= max_tokens).then_some("length");
            let v = json!({"id": "cmpl-sim", "object": "text_completion", "created": 0, "model": shape.model,
                "choices": [shape.choice(&st, 0, &[t], finish)]});
            if out_tx.send(chunk(v)).await.is_err() {
                return; // client gone: dropping `rx` aborts the sequence
            }
        }
        if usage {
            let v = json!({"id": "cmpl-sim", "object": "text_completion", "created": 0, "model": shape.model, "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n as usize}});
            let _ = out_tx.send(chunk(v)).await;
        }
        let _ = out_tx
            .send(Ok(Bytes::from_static(b"data: [DONE]\n\n")))
            .await;
    });
    let body = Body::from_stream(tokio_stream_from(out_rx));
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
