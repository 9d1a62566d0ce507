//! `/v1/completions` and `/v1/chat/completions`: read the request, admit it, then
//! speculate or forward it unchanged as `speculation::policy` decides.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::{Map, Value};

use super::passthrough::forward_bytes;
use super::{respond, Shared};
use crate::config::SpecMode;
use crate::error::ApiError;
use crate::metrics::labels::{PassthroughReason, RejectReason};
use crate::speculation::limits;
use crate::speculation::policy::{self, Conditions, Plan, Route};
use crate::speculation::request::{self, Endpoint, Intake, PromptInput};
use crate::speculation::session::{self, SessionDeps, SessionParams};
use crate::upstream::verify::Tokenized;

pub async fn completions(State(st): State<Shared>, req: Request) -> Response {
    handle(st, Endpoint::Completions, req).await
}

pub async fn chat_completions(State(st): State<Shared>, req: Request) -> Response {
    handle(st, Endpoint::Chat, req).await
}

async fn handle(st: Shared, endpoint: Endpoint, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(&st, body).await {
        Ok(b) => b,
        Err(e) => return reject(&st, e),
    };
    let (intake, had_spec_field) = match read_request(endpoint, &parts, &bytes) {
        Ok(r) => r,
        Err(e) => return reject(&st, e),
    };
    // Every generation request holds a stream slot, passed through or speculated, so
    // the limits bound what specd holds open whatever the mode.
    let permit = match admit(&st).await {
        Ok(p) => p,
        Err(e) => return reject(&st, e),
    };
    let conditions = Conditions {
        default_mode: st.args.speculation,
        controller: &st.controller,
        backend: st.backend(),
        tokenizer: st.tokenizer(),
        reasoning: st.args.reasoning_parser.as_ref(),
        // Without `--enable-auto-tool-choice`, vLLM runs no tool parser at all.
        tools: st
            .args
            .tool_call_parser
            .as_ref()
            .filter(|_| st.args.enable_auto_tool_choice),
    };
    let resp = match policy::route(intake, &conditions) {
        Route::Passthrough { reason, body } => {
            // The client's bytes, unless specd's own field had to be removed.
            let out = had_spec_field.then(|| Bytes::from(Value::Object(body.clone()).to_string()));
            pass(&st, &parts, body, out.unwrap_or(bytes), reason).await
        }
        Route::Speculate(plan) => match speculate(&st, *plan, &parts).await {
            Ok(resp) => resp,
            Err(e) => {
                drop(permit);
                return reject(&st, e);
            }
        },
    };
    respond::with_permit(resp, permit)
}

/// The body as JSON, parsed; and whether it carried specd's own `speculation` field.
fn read_request(
    endpoint: Endpoint,
    parts: &Parts,
    bytes: &[u8],
) -> Result<(Intake, bool), ApiError> {
    let header = parts
        .headers
        .get("x-speculation")
        .and_then(|v| v.to_str().ok());
    let obj: Map<String, Value> = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return Err(ApiError::BadRequest(
                "request body must be a JSON object".into(),
            ))
        }
        Err(e) => return Err(ApiError::BadRequest(format!("invalid JSON body: {e}"))),
    };
    let had_spec_field = obj.contains_key("speculation");
    Ok((request::parse(endpoint, obj, header)?, had_spec_field))
}

async fn pass(
    st: &Shared,
    parts: &Parts,
    body: Map<String, Value>,
    bytes: Bytes,
    reason: PassthroughReason,
) -> Response {
    if let Some(b) = st.backend() {
        if let Err(e) = b.screen(&body) {
            return reject(st, e);
        }
    }
    let path_q = parts.uri.path_and_query().map_or("", |p| p.as_str());
    forward_bytes(st, path_q, &parts.headers, bytes, reason).await
}

fn reject(st: &Shared, e: ApiError) -> Response {
    let reason = match &e {
        ApiError::BadRequest(_) | ApiError::NotFound(_) => Some(RejectReason::BadRequest),
        ApiError::TooLarge(_) => Some(RejectReason::TooLarge),
        ApiError::Overloaded { .. } => Some(RejectReason::Overloaded),
        ApiError::Unauthorized => Some(RejectReason::Unauthorized),
        _ => None,
    };
    if let Some(r) = reason {
        st.metrics.rejected.with_label_values(&[r.as_str()]).inc();
    }
    e.into_response()
}

async fn read_body(st: &Shared, body: Body) -> Result<Bytes, ApiError> {
    let limit = st.args.max_body_bytes;
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::TooLarge(limit))
        }
        Err(e) => Err(ApiError::BadRequest(format!(
            "could not read request body: {e}"
        ))),
    }
}

/// A stream slot, waiting in a bounded queue when all are taken.
async fn admit(st: &Shared) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ApiError> {
    if st.args.max_concurrent_streams == 0 {
        return Ok(None);
    }
    if let Ok(p) = st.slots.clone().try_acquire_owned() {
        return Ok(Some(p));
    }
    if st.queued.fetch_add(1, Ordering::SeqCst) >= st.args.max_queue {
        st.queued.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError::Overloaded {
            retry_after_secs: 1,
        });
    }
    let p = st.slots.clone().acquire_owned().await;
    st.queued.fetch_sub(1, Ordering::SeqCst);
    p.map(Some).map_err(|_| ApiError::Draining)
}

/// Tokenize, check against the model's limits, choose the drafter and start the session.
async fn speculate(st: &Shared, plan: Plan, parts: &Parts) -> Result<Response, ApiError> {
    let Plan {
        gen,
        mode,
        backend,
        tokenizer,
        reasoning,
        tools,
    } = plan;
    // Calls made for this request carry the client's credentials, as a direct request would.
    let backend = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|a| backend.with_auth(a))
        .unwrap_or(backend);
    let info = st
        .upstream
        .info()
        .ok_or_else(|| ApiError::UpstreamUnreachable("upstream not detected yet".into()))?;
    let model = gen.model.clone().unwrap_or_else(|| info.model.clone());
    let tokenized = match &gen.prompt {
        PromptInput::Tokens(t) => Tokenized {
            tokens: t.clone(),
            max_model_len: None,
        },
        PromptInput::Text(t) => backend.tokenize_prompt(&model, t).await?,
        PromptInput::Chat => backend.tokenize_chat(&model, &gen.body).await?,
    };
    let prompt = tokenized.tokens;
    if prompt.is_empty() {
        return Err(ApiError::BadRequest(
            "prompt is empty after tokenization".into(),
        ));
    }
    limits::check_vocab(&prompt, &gen.stop_token_ids, tokenizer.vocab_size)?;
    let max_model_len = tokenized.max_model_len.unwrap_or(info.max_model_len).max(1);
    let max_tokens = limits::max_tokens(prompt.len(), gen.max_tokens, max_model_len)?;
    let drafters = st
        .drafters
        .for_request(
            gen.spec.drafter.as_deref(),
            st.args.drafter,
            gen.spec.oracle_tokens.as_deref(),
            tokenizer.vocab_size,
        )
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let params = SessionParams {
        stream: st.next_stream.fetch_add(1, Ordering::Relaxed),
        model: model.clone(),
        prompt,
        sampling: gen.sampling.clone(),
        max_tokens,
        max_model_len,
        stop: gen.stop.clone(),
        stop_token_ids: gen.stop_token_ids.clone(),
        ignore_eos: gen.ignore_eos,
        skip_special_tokens: gen.skip_special_tokens,
        include_stop_str: gen.include_stop_str_in_output,
        mode,
        k_max: gen.spec.max_draft_tokens.unwrap_or(match mode {
            SpecMode::Auto => st.args.auto_max_draft_tokens,
            _ => st.args.max_draft_tokens,
        }),
        switch_every: gen.spec.switch_every,
        reasoning: reasoning.clone(),
        tools: tools.clone(),
    };
    let deps = SessionDeps {
        backend,
        drafters,
        tokenizer: tokenizer.clone(),
        metrics: st.metrics.clone(),
        controller: st.controller.clone(),
    };
    let rx = session::start(params, deps);
    Ok(respond::respond(st, &gen, model, tokenizer, (reasoning, tools), rx).await)
}
