//! Request handling: every request is recorded, counted by kind and checked against the
//! fault rules before it is answered; then the small endpoints, and the error shape.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::chat;
use super::completions::{self, InFlight};
use super::reply::{encode, error};
use super::{Seen, St};
use crate::fault::{Call, Fault};

impl St {
    fn record(&self, s: Seen) {
        if let Ok(mut q) = self.seen.lock() {
            if q.len() >= 256 {
                q.pop_front();
            }
            q.push_back(s);
        }
    }
}

/// Answer one request; `close` closes its connection unanswered (`Fault::Drop`).
pub(super) async fn handle(
    st: Arc<St>,
    req: Request<hyper::body::Incoming>,
    close: CancellationToken,
) -> Response {
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
    let call = Call::of(&path, &body);
    st.calls[call as usize].fetch_add(1, Ordering::SeqCst);
    let is_chat = path == "/v1/chat/completions";
    let is_completion = is_chat || path == "/v1/completions";
    let prompts = if is_chat {
        encode(&st, &chat::render(&body), false).map(|p| vec![p])
    } else if is_completion {
        completions::prompts(&st, body.get("prompt"))
    } else {
        Ok(Vec::new())
    };
    let in_flight = is_completion.then(|| InFlight::new(&st));
    let first = prompts
        .as_ref()
        .ok()
        .and_then(|p| p.first()?.first().copied());
    let fault = st.rules.take(call, first);
    match fault {
        Some(Fault::Status(s)) => return error(s, "fault injected by the fake upstream"),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::Hang) => std::future::pending::<()>().await,
        Some(Fault::Drop) => {
            close.cancel();
            std::future::pending::<()>().await
        }
        _ => {}
    }
    match path.as_str() {
        "/health" => StatusCode::OK.into_response(),
        "/version" => {
            let v = st.version.lock().map(|v| v.clone()).unwrap_or_default();
            Json(json!({"version": v})).into_response()
        }
        "/v1/models" => models(&st),
        "/metrics" => metrics(&st),
        "/tokenize" => tokenize(&st, &body),
        "/detokenize" => detokenize(&st, &body),
        "/v1/completions" | "/v1/chat/completions" => match prompts {
            Ok(p) => completions::answer(st, &body, p, fault, in_flight).await,
            Err(msg) => error(400, &msg),
        },
        _ => error(404, "not found"),
    }
}

fn models(st: &St) -> Response {
    Json(json!({"object": "list", "data": [{
        "id": st.model, "object": "model", "created": 0, "owned_by": "vllm",
        "root": st.root, "parent": null, "permission": [],
        "max_model_len": st.max_model_len.load(Ordering::SeqCst),
    }]}))
    .into_response()
}

fn metrics(st: &St) -> Response {
    let body = format!(
        "# specd-sim: stand-in upstream metrics\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{}\"}} {}\n",
        st.model,
        st.running()
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn tokenize(st: &St, b: &Value) -> Response {
    let tokens = if b.get("messages").is_some_and(Value::is_array) {
        let special = b.get("add_special_tokens").and_then(Value::as_bool) == Some(true);
        encode(st, &chat::render(b), special)
    } else if let Some(p) = b.get("prompt").and_then(Value::as_str) {
        let special = b.get("add_special_tokens").and_then(Value::as_bool) != Some(false);
        encode(st, p, special)
    } else {
        return error(400, "tokenize needs a prompt or messages");
    };
    match tokens {
        Ok(t) => Json(
            json!({"count": t.len(), "max_model_len": st.max_model_len.load(Ordering::SeqCst),
                             "tokens": t, "token_strs": null}),
        )
        .into_response(),
        Err(msg) => error(400, &msg),
    }
}

fn detokenize(st: &St, b: &Value) -> Response {
    let Some(ids) = completions::ids(b.get("tokens").unwrap_or(&Value::Null)) else {
        return error(400, "detokenize needs tokens");
    };
    // vLLM's /detokenize keeps special tokens.
    match st.tok.decode(&ids, false) {
        Ok(text) => Json(json!({"prompt": text})).into_response(),
        Err(e) => error(400, &format!("tokenizer: {e}")),
    }
}
