//! Request intake: read an OpenAI completions/chat body into what the round loop needs,
//! or say why it must be forwarded unchanged (passthrough).

use serde_json::{Map, Value};

use super::policy::{exact, fields};
use crate::config::SpecMode;
use crate::error::ApiError;
use crate::metrics::labels::PassthroughReason;
use crate::protocol::lax;
use crate::protocol::request::{RequestBody, StreamOptions};
use crate::upstream::verify::Sampling;

pub use crate::protocol::Endpoint;

#[derive(Debug, Clone)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    /// Chat: the whole request body is given to the upstream's tokenizer endpoint.
    Chat,
}

/// Per-request speculation options (`x-speculation` header and `speculation` body field).
#[derive(Debug, Clone, Default)]
pub struct SpecOptions {
    pub mode: Option<SpecMode>,
    pub max_draft_tokens: Option<usize>,
    pub drafter: Option<String>,
    /// Expected continuation, for the test drafters.
    pub oracle_tokens: Option<Vec<u32>>,
    /// Force a switch between relay and speculation every N tokens (tests of the hybrid).
    pub switch_every: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct GenRequest {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub sampling: Sampling,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub include_stop_str_in_output: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Client wants logprobs in the answer (completions: `logprobs: n`; chat: `logprobs: true`).
    pub want_logprobs: bool,
    pub tokens_as_ids: bool,
    pub spec: SpecOptions,
    /// The original body with specd's own field removed (for tokenize and passthrough).
    pub body: Map<String, Value>,
}

/// What a valid request is to become.
#[derive(Debug)]
pub enum Intake {
    /// specd may speculate it (the server's conditions still decide, see `policy::route`).
    Speculate(Box<GenRequest>),
    /// Forwarded unchanged: the body without specd's own field.
    Passthrough {
        reason: PassthroughReason,
        body: Map<String, Value>,
    },
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// Parse a body; an error is the client's 400.
pub fn parse(
    endpoint: Endpoint,
    mut body: Map<String, Value>,
    header: Option<&str>,
) -> Result<Intake, ApiError> {
    let spec = spec_options(header, &mut body)?;
    // Several prompts pass through whatever else the body holds.
    if endpoint == Endpoint::Completions && fields::many_prompts(body.get("prompt")) {
        let reason = PassthroughReason::MultiplePrompts;
        return Ok(Intake::Passthrough { reason, body });
    }
    let whole = Value::Object(body);
    let typed = read_typed(&whole)?;
    let Value::Object(body) = whole else {
        return Err(bad("request body must be a JSON object"));
    };
    let mut gen = validate(endpoint, typed, spec, body)?;
    Ok(match sampling_fields(endpoint, &mut gen) {
        Err(reason) => Intake::Passthrough {
            reason,
            body: gen.body,
        },
        Ok(()) => Intake::Speculate(Box::new(gen)),
    })
}

/// The policy's verdict on the request's fields; where it speculates, the sampling fields
/// to forward on every upstream call.
fn sampling_fields(endpoint: Endpoint, gen: &mut GenRequest) -> Result<(), PassthroughReason> {
    if let Some(reason) = fields::request_reason(endpoint, &gen.body) {
        return Err(reason);
    }
    gen.sampling.per_step = exact::read(&gen.body)?;
    let (max, stop, ids) = (gen.max_tokens, &gen.stop, &gen.stop_token_ids);
    gen.sampling.min_tokens = exact::min_tokens(&gen.body, max, stop, ids)?;
    Ok(())
}

/// The typed view; a field that does not read is named in the error.
fn read_typed(whole: &Value) -> Result<RequestBody, ApiError> {
    serde_path_to_error::deserialize(whole).map_err(|e| {
        let path = e.path().to_string();
        bad(format!("'{path}' {}", e.into_inner()))
    })
}

/// The checks specd makes itself, and the typed request. The rules are vLLM's; where its
/// message is copied, it is from vllm/sampling_params.py (`max_tokens`) or the request
/// models' validators in vllm/entrypoints/openai/*/protocol.py (`top_logprobs`,
/// `stream_options`). The checks on the tokenized prompt are in `limits`.
fn validate(
    endpoint: Endpoint,
    b: RequestBody,
    spec: SpecOptions,
    body: Map<String, Value>,
) -> Result<GenRequest, ApiError> {
    let prompt = prompt_input(endpoint, &b)?;
    let max_tokens = match b.max_completion_tokens.or(b.max_tokens) {
        None => None,
        Some(n) if n < 1 => return Err(bad(format!("max_tokens must be at least 1, got {n}."))),
        Some(n) => {
            Some(u32::try_from(n).map_err(|_| bad(format!("max_tokens is too large: {n}")))?)
        }
    };
    if b.temperature.is_some_and(|t| t < 0.0) {
        return Err(bad("temperature must be non-negative"));
    }
    if b.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(bad("top_p must be in (0, 1]"));
    }
    if b.min_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(bad("min_p must be in [0, 1]"));
    }
    let (want_logprobs, n_top) = logprobs(endpoint, &b)?;
    let stream = b.stream.unwrap_or(false);
    if StreamOptions::is_given(b.stream_options.as_ref()) && !stream {
        return Err(bad(
            "Stream options can only be defined when `stream=True`.",
        ));
    }
    // Not understood: the policy forwards it, so the value does not matter here.
    let include_usage =
        StreamOptions::read(b.stream_options.as_ref()).is_some_and(|o| o.include_usage);
    Ok(GenRequest {
        endpoint,
        model: b.model,
        prompt,
        sampling: Sampling {
            temperature: b.temperature,
            top_p: b.top_p,
            top_k: b.top_k,
            min_p: b.min_p,
            // vLLM takes any signed 64-bit seed.
            seed: b.seed.map(|s| s as u64),
            logprobs: n_top,
            per_step: Default::default(),
            min_tokens: None,
        },
        max_tokens,
        stop: b.stop,
        stop_token_ids: b.stop_token_ids.unwrap_or_default(),
        ignore_eos: b.ignore_eos.unwrap_or(false),
        skip_special_tokens: b.skip_special_tokens.unwrap_or(true),
        include_stop_str_in_output: b.include_stop_str_in_output.unwrap_or(false),
        stream,
        include_usage,
        want_logprobs,
        tokens_as_ids: b.return_tokens_as_token_ids.unwrap_or(false),
        spec,
        body,
    })
}

fn prompt_input(endpoint: Endpoint, b: &RequestBody) -> Result<PromptInput, ApiError> {
    if endpoint == Endpoint::Chat {
        let msgs = b
            .messages
            .as_ref()
            .ok_or_else(|| bad("'messages' is required"))?;
        let arr = msgs
            .as_array()
            .ok_or_else(|| bad("'messages' must be a list"))?;
        if arr.is_empty() {
            return Err(bad("'messages' must not be empty"));
        }
        return Ok(PromptInput::Chat);
    }
    let shape = "'prompt' must be a string, a list of token ids, or a list of those";
    let tokens = |v: &Value| {
        lax::token_ids(v)
            .map(PromptInput::Tokens)
            .map_err(|e| bad(format!("'prompt' {e}")))
    };
    let prompt = match &b.prompt {
        None => return Err(bad("'prompt' is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) if a.is_empty() => return Err(bad("'prompt' must not be empty")),
        Some(v @ Value::Array(a)) if a.iter().all(Value::is_number) => tokens(v)?,
        // One prompt in a list (several were passed through before).
        Some(Value::Array(a)) => match a.first() {
            Some(Value::String(s)) => PromptInput::Text(s.clone()),
            Some(v @ Value::Array(_)) => tokens(v)?,
            _ => return Err(bad(shape)),
        },
        Some(_) => return Err(bad(shape)),
    };
    let empty = match &prompt {
        PromptInput::Text(t) => t.is_empty(),
        PromptInput::Tokens(t) => t.is_empty(),
        PromptInput::Chat => false,
    };
    if empty {
        return Err(bad("'prompt' must not be empty"));
    }
    Ok(prompt)
}

/// (answer with logprobs, how many top alternatives per token).
fn logprobs(endpoint: Endpoint, b: &RequestBody) -> Result<(bool, Option<u32>), ApiError> {
    let read = |k: &str, f: fn(&Value) -> Option<i64>| -> Result<Option<i64>, ApiError> {
        match &b.logprobs {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| bad(format!("'logprobs' must be {k}"))),
        }
    };
    match endpoint {
        Endpoint::Completions => match read("an integer", lax::int)? {
            None => Ok((false, None)),
            Some(n) if n < 0 => Err(bad("logprobs must be non-negative")),
            Some(n) => Ok((true, Some(n as u32))),
        },
        Endpoint::Chat => {
            let on = read("a boolean", |v| lax::boolean(v).map(i64::from))? == Some(1);
            let top = b.top_logprobs;
            if top.is_some_and(|n| n < 0) {
                return Err(bad("top_logprobs must be non-negative"));
            }
            if top.is_some_and(|n| n != 0) && !on {
                return Err(bad(
                    "when using `top_logprobs`, `logprobs` must be set to true.",
                ));
            }
            Ok((on, on.then(|| top.unwrap_or(0) as u32)))
        }
    }
}

/// Speculation options from the header and the body field (the field wins).
pub fn spec_options(
    header: Option<&str>,
    body: &mut Map<String, Value>,
) -> Result<SpecOptions, ApiError> {
    let mut o = SpecOptions::default();
    let mode = |s: &str, what: &str| {
        SpecMode::parse(s).ok_or_else(|| bad(format!("{what} must be on, off or auto, not '{s}'")))
    };
    if let Some(h) = header {
        o.mode = Some(mode(h, "x-speculation")?);
    }
    let s = match body.remove("speculation") {
        None | Some(Value::Null) => return Ok(o),
        Some(Value::Bool(b)) => {
            o.mode = Some(if b { SpecMode::On } else { SpecMode::Off });
            return Ok(o);
        }
        Some(Value::String(s)) => {
            o.mode = Some(mode(&s, "'speculation'")?);
            return Ok(o);
        }
        Some(Value::Object(s)) => s,
        Some(_) => {
            return Err(bad(
                "'speculation' must be an object, a string or a boolean",
            ))
        }
    };
    if let Some(m) = s.get("mode").and_then(Value::as_str) {
        o.mode = Some(mode(m, "'speculation.mode'")?);
    }
    if let Some(v) = s.get("max_draft_tokens") {
        let k = v
            .as_u64()
            .filter(|&k| k <= 64)
            .ok_or_else(|| bad("'speculation.max_draft_tokens' must be an integer in 0..=64"))?;
        o.max_draft_tokens = Some(k as usize);
    }
    if let Some(v) = s.get("drafter") {
        let name = v
            .as_str()
            .ok_or_else(|| bad("'speculation.drafter' must be a string"))?;
        o.drafter = Some(name.to_string());
    }
    if let Some(v) = s.get("oracle_tokens") {
        let ids = lax::token_ids(v).map_err(|e| bad(format!("'speculation.oracle_tokens' {e}")))?;
        o.oracle_tokens = Some(ids);
    }
    if let Some(v) = s.get("switch_every") {
        let n = v
            .as_u64()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("'speculation.switch_every' must be a positive integer"))?;
        o.switch_every = Some(n as usize);
    }
    Ok(o)
}

#[cfg(test)]
mod tests;
