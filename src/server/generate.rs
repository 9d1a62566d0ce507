//! `/v1/completions` and `/v1/chat/completions`: speculate when the request allows it,
//! forward it unchanged otherwise.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use serde_json::{Map, Value};

use super::passthrough::forward_bytes;
use super::{respond, Shared};
use crate::config::SpecMode;
use crate::draft::testing::ScriptedDrafter;
use crate::draft::{Drafter, DrafterKind};
use crate::error::ApiError;
use crate::metrics::labels::{PassthroughReason, RejectReason};
use crate::speculation::request::{self, Endpoint, GenRequest, PromptInput};
use crate::speculation::session::{self, SessionDeps, SessionParams};

pub async fn completions(State(st): State<Shared>, req: Request) -> Response {
    handle(st, Endpoint::Completions, req).await
}

pub async fn chat_completions(State(st): State<Shared>, req: Request) -> Response {
    handle(st, Endpoint::Chat, req).await
}

async fn handle(st: Shared, endpoint: Endpoint, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path_q = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let bytes = match read_body(&st, body).await {
        Ok(b) => b,
        Err(e) => return reject(&st, e),
    };
    let header = parts
        .headers
        .get("x-speculation")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let obj: Map<String, Value> = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return reject(
                &st,
                ApiError::BadRequest("request body must be a JSON object".into()),
            )
        }
        Err(e) => return reject(&st, ApiError::BadRequest(format!("invalid JSON body: {e}"))),
    };
    let had_spec_field = obj.contains_key("speculation");
    let parsed = match request::parse(endpoint, obj, header.as_deref()) {
        Ok(p) => p,
        Err(e) => return reject(&st, e),
    };
    // Passthrough keeps the client's bytes unless specd's own field had to be removed.
    let pass = |body: Map<String, Value>, reason: PassthroughReason| {
        let st = st.clone();
        let headers = parts.headers.clone();
        let path_q = path_q.clone();
        let bytes = bytes.clone();
        async move {
            if let Some(b) = st.backend() {
                if let Err(e) = b.screen(&body) {
                    return reject(&st, e);
                }
            }
            let out = if had_spec_field {
                Bytes::from(Value::Object(body).to_string())
            } else {
                bytes
            };
            forward_bytes(&st, &path_q, &headers, out, reason).await
        }
    };
    // Every generation request holds a stream slot, passed through or speculated, so
    // the limits bound what specd holds open whatever the mode.
    let permit = match admit(&st).await {
        Ok(p) => p,
        Err(e) => return reject(&st, e),
    };
    let gen = match parsed {
        Ok(g) => g,
        Err((reason, body, _)) => return respond::with_permit(pass(body, reason).await, permit),
    };
    let mode = gen.spec.mode.unwrap_or(st.args.speculation);
    if mode == SpecMode::Off {
        return respond::with_permit(pass(gen.body, PassthroughReason::Disabled).await, permit);
    }
    // Where speculation has not been paying, most `auto` requests skip specd's loop
    // (seeded sampled ones never: their output must not depend on the path).
    if mode == SpecMode::Auto
        && !gen.sampling.is_seeded_sampled()
        && gen.spec.switch_every.is_none()
        && !st.controller.watch_auto()
    {
        return respond::with_permit(pass(gen.body, PassthroughReason::NotPaying).await, permit);
    }
    let Some(backend) = st.backend() else {
        return respond::with_permit(
            pass(gen.body, PassthroughReason::UpstreamNotReady).await,
            permit,
        );
    };
    let Some(tokenizer) = st.tokenizer() else {
        return respond::with_permit(pass(gen.body, PassthroughReason::NoTokenizer).await, permit);
    };
    // The upstream may fill sampling defaults of its own, or apply what specd cannot.
    let mut gen = gen;
    let chat = gen.endpoint == Endpoint::Chat;
    if let Err(reason) = backend.prepare(chat, &gen.body, &mut gen.sampling) {
        return respond::with_permit(pass(gen.body, reason).await, permit);
    }
    // Calls made for this request carry the client's credentials, as a direct request would.
    let backend = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|a| backend.with_auth(a))
        .unwrap_or(backend);
    match speculate(&st, gen, mode, backend, tokenizer, &parts.headers).await {
        Ok(resp) => respond::with_permit(resp, permit),
        Err(e) => {
            drop(permit);
            reject(&st, e)
        }
    }
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

async fn speculate(
    st: &Shared,
    gen: GenRequest,
    mode: SpecMode,
    backend: Arc<dyn crate::upstream::verify::Backend>,
    tokenizer: Arc<crate::tokens::ModelTokenizer>,
    _headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let info = st
        .upstream
        .info()
        .ok_or_else(|| ApiError::UpstreamUnreachable("upstream not detected yet".into()))?;
    let model = gen.model.clone().unwrap_or_else(|| info.model.clone());
    let tokenized = match &gen.prompt {
        PromptInput::Tokens(t) => crate::upstream::verify::Tokenized {
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
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= tokenizer.vocab_size) {
        return Err(ApiError::BadRequest(format!(
            "token id {bad} is out of vocabulary (size {})",
            tokenizer.vocab_size
        )));
    }
    if let Some(&bad) = gen
        .stop_token_ids
        .iter()
        .find(|&&t| t as usize >= tokenizer.vocab_size)
    {
        return Err(ApiError::BadRequest(format!(
            "token_id(s) [{bad}] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {}",
            tokenizer.vocab_size
        )));
    }
    let max_model_len = tokenized.max_model_len.unwrap_or(info.max_model_len).max(1);
    let plen = prompt.len() as u32;
    if plen >= max_model_len {
        return Err(ApiError::BadRequest(format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has {plen} input tokens. Please reduce the length of the input messages."
        )));
    }
    // vLLM's rule: more than the whole context is an error; otherwise the request is
    // capped at what the context leaves after the prompt.
    let max_tokens = match gen.max_tokens {
        Some(n) if n > max_model_len => {
            return Err(ApiError::BadRequest(format!(
                "max_tokens={n} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens."
            )))
        }
        Some(n) => n.min(max_model_len - plen),
        None => max_model_len - plen,
    };
    let drafter = choose_drafter(st, &gen, tokenizer.vocab_size)?;
    let k_max = gen
        .spec
        .max_draft_tokens
        .unwrap_or(st.args.max_draft_tokens);
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
        k_max,
        switch_every: gen.spec.switch_every,
    };
    let deps = SessionDeps {
        backend,
        drafter,
        tokenizer: tokenizer.clone(),
        metrics: st.metrics.clone(),
        controller: st.controller.clone(),
    };
    let rx = session::spawn(params, deps);
    Ok(respond::respond(st, &gen, model, tokenizer, rx).await)
}

/// The request's drafter, else the server's default.
fn choose_drafter(
    st: &Shared,
    gen: &GenRequest,
    vocab_size: usize,
) -> Result<Arc<dyn Drafter>, ApiError> {
    let unknown = |name: &str| {
        ApiError::BadRequest(format!(
            "unknown drafter '{name}'; available: {}",
            st.drafters.names().join(", ")
        ))
    };
    let kind = match &gen.spec.drafter {
        Some(name) => DrafterKind::parse(name).ok_or_else(|| unknown(name))?,
        None => st.args.drafter,
    };
    if kind.is_test_only() && st.args.enable_test_drafters {
        let truth = gen.spec.oracle_tokens.clone().ok_or_else(|| {
            ApiError::BadRequest("the test drafters need speculation.oracle_tokens".into())
        })?;
        return Ok(Arc::new(ScriptedDrafter {
            truth,
            adversarial: kind == DrafterKind::Adversarial,
            vocab_size: vocab_size as u32,
        }));
    }
    st.drafters.get(kind).ok_or_else(|| unknown(kind.as_str()))
}
