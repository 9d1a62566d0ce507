//! Request intake: read an OpenAI completions/chat body into what the round loop needs,
//! or say why it must be forwarded unchanged (passthrough).

use serde_json::{Map, Value};

use crate::config::SpecMode;
use crate::error::ApiError;
use crate::metrics::labels::PassthroughReason;
use crate::upstream::verify::Sampling;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

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

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

// Scalars are read the way vLLM's request models (pydantic, lax mode) read them, so a
// request vLLM accepts is accepted here and one it refuses is refused: integers also from
// floats without a fraction, booleans and digit strings; numbers also from booleans and
// numeric strings; booleans also from 0/1 and the usual words.

fn lax_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e18)
                .map(|f| f as i64)
        }),
        Value::Bool(b) => Some(i64::from(*b)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn lax_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn lax_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Some(false),
            Some(1.0) => Some(true),
            _ => None,
        },
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

fn opt_f64(m: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => lax_f64(v)
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| bad(format!("'{k}' must be a number"))),
    }
}

fn opt_i64(m: &Map<String, Value>, k: &str) -> Result<Option<i64>, ApiError> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => lax_int(v)
            .map(Some)
            .ok_or_else(|| bad(format!("'{k}' must be an integer"))),
    }
}

fn opt_bool(m: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => lax_bool(v)
            .map(Some)
            .ok_or_else(|| bad(format!("'{k}' must be a boolean"))),
    }
}

fn token_list(v: &Value, what: &str) -> Result<Vec<u32>, ApiError> {
    v.as_array()
        .ok_or_else(|| bad(format!("'{what}' must be a list of token ids")))?
        .iter()
        .map(|t| {
            t.is_number()
                .then(|| lax_int(t))
                .flatten()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| bad(format!("'{what}' must hold non-negative integer token ids")))
        })
        .collect()
}

/// Fields whose effect specd cannot reproduce exactly; their presence (with a non-default
/// value) sends the request to passthrough under the given reason.
fn unsupported_reason(m: &Map<String, Value>, endpoint: Endpoint) -> Option<PassthroughReason> {
    let non_default =
        |k: &str, default: &Value| m.get(k).is_some_and(|v| !v.is_null() && v != default);
    let zero = Value::from(0);
    let zero_f = Value::from(0.0);
    let one = Value::from(1);
    let one_f = Value::from(1.0);
    if non_default("n", &one) {
        return Some(PassthroughReason::N);
    }
    if m.get("best_of").is_some_and(|v| !v.is_null() && v != &one) {
        return Some(PassthroughReason::BestOf);
    }
    if m.get("logit_bias")
        .is_some_and(|v| v.as_object().is_none_or(|o| !o.is_empty()))
        && !m["logit_bias"].is_null()
    {
        return Some(PassthroughReason::LogitBias);
    }
    for k in ["presence_penalty", "frequency_penalty"] {
        if non_default(k, &zero) && non_default(k, &zero_f) {
            return Some(PassthroughReason::Penalty);
        }
    }
    if non_default("repetition_penalty", &one) && non_default("repetition_penalty", &one_f) {
        return Some(PassthroughReason::Penalty);
    }
    for k in [
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "guided_decoding_backend",
    ] {
        if m.get(k).is_some_and(|v| !v.is_null()) {
            if k == "response_format" && m[k].get("type").and_then(Value::as_str) == Some("text") {
                continue;
            }
            return Some(PassthroughReason::GuidedDecoding);
        }
    }
    if m.get("tools")
        .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
    {
        return Some(PassthroughReason::Tools);
    }
    if m.get("echo").is_some_and(|v| v == &Value::Bool(true)) {
        return Some(PassthroughReason::Echo);
    }
    if m.get("prompt_logprobs").is_some_and(|v| !v.is_null()) {
        return Some(PassthroughReason::PromptLogprobs);
    }
    if non_default("min_tokens", &zero) {
        return Some(PassthroughReason::MinTokens);
    }
    if m.get("suffix").is_some_and(|v| !v.is_null()) {
        return Some(PassthroughReason::Suffix);
    }
    for k in [
        "allowed_token_ids",
        "bad_words",
        "logits_processors",
        "lora_request",
        "vllm_xargs",
        "kv_transfer_params",
        "repetition_detection",
        "thinking_token_budget",
    ] {
        if m.get(k).is_some_and(|v| !v.is_null()) {
            return Some(PassthroughReason::UnsupportedParam);
        }
    }
    if endpoint == Endpoint::Chat {
        if let Some(msgs) = m.get("messages").and_then(Value::as_array) {
            // Multimodal content needs the upstream's processors.
            let multimodal = msgs.iter().any(|msg| {
                msg.get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|parts| {
                        parts.iter().any(|p| {
                            p.get("type")
                                .and_then(Value::as_str)
                                .is_some_and(|t| t != "text")
                        })
                    })
            });
            if multimodal {
                return Some(PassthroughReason::Multimodal);
            }
        }
    }
    None
}

/// Speculation options from the header and the body field (the field wins).
pub fn spec_options(
    header: Option<&str>,
    body: &mut Map<String, Value>,
) -> Result<SpecOptions, ApiError> {
    let mut o = SpecOptions::default();
    if let Some(h) = header {
        o.mode = Some(
            SpecMode::parse(h)
                .ok_or_else(|| bad(format!("x-speculation must be on, off or auto, not '{h}'")))?,
        );
    }
    match body.remove("speculation") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => o.mode = Some(if b { SpecMode::On } else { SpecMode::Off }),
        Some(Value::String(s)) => {
            o.mode =
                Some(SpecMode::parse(&s).ok_or_else(|| {
                    bad(format!("'speculation' must be on, off or auto, not '{s}'"))
                })?)
        }
        Some(Value::Object(s)) => {
            if let Some(m) = s.get("mode").and_then(Value::as_str) {
                o.mode = Some(SpecMode::parse(m).ok_or_else(|| {
                    bad(format!(
                        "'speculation.mode' must be on, off or auto, not '{m}'"
                    ))
                })?);
            }
            if let Some(v) = s.get("max_draft_tokens") {
                let k = v.as_u64().filter(|&k| k <= 64).ok_or_else(|| {
                    bad("'speculation.max_draft_tokens' must be an integer in 0..=64")
                })?;
                o.max_draft_tokens = Some(k as usize);
            }
            if let Some(v) = s.get("drafter") {
                o.drafter = Some(
                    v.as_str()
                        .ok_or_else(|| bad("'speculation.drafter' must be a string"))?
                        .to_string(),
                );
            }
            if let Some(v) = s.get("oracle_tokens") {
                o.oracle_tokens = Some(token_list(v, "speculation.oracle_tokens")?);
            }
            if let Some(v) = s.get("switch_every") {
                o.switch_every =
                    Some(v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                        bad("'speculation.switch_every' must be a positive integer")
                    })? as usize);
            }
        }
        Some(_) => {
            return Err(bad(
                "'speculation' must be an object, a string or a boolean",
            ))
        }
    }
    Ok(o)
}

/// Parse a body. `Ok(Err(reason))` means valid but to be passed through.
/// A valid request specd forwards unchanged: the reason, the body without specd's field,
/// and the speculation options it carried.
pub type Passthrough = (PassthroughReason, Map<String, Value>, SpecOptions);

pub fn parse(
    endpoint: Endpoint,
    mut body: Map<String, Value>,
    header: Option<&str>,
) -> Result<Result<GenRequest, Passthrough>, ApiError> {
    let spec = spec_options(header, &mut body)?;
    let m = &body;
    let model = match m.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("'model' must be a string")),
    };
    let prompt = match endpoint {
        Endpoint::Chat => {
            let msgs = m
                .get("messages")
                .ok_or_else(|| bad("'messages' is required"))?;
            let arr = msgs
                .as_array()
                .ok_or_else(|| bad("'messages' must be a list"))?;
            if arr.is_empty() {
                return Err(bad("'messages' must not be empty"));
            }
            PromptInput::Chat
        }
        Endpoint::Completions => match m.get("prompt") {
            None | Some(Value::Null) => return Err(bad("'prompt' is required")),
            Some(Value::String(s)) => PromptInput::Text(s.clone()),
            Some(Value::Array(a)) if a.is_empty() => return Err(bad("'prompt' must not be empty")),
            Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
                PromptInput::Tokens(token_list(&m["prompt"], "prompt")?)
            }
            Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
                Value::String(s) => PromptInput::Text(s.clone()),
                v @ Value::Array(_) => PromptInput::Tokens(token_list(v, "prompt")?),
                _ => {
                    return Err(bad(
                        "'prompt' must be a string, a list of token ids, or a list of those",
                    ))
                }
            },
            Some(Value::Array(_)) => {
                return Ok(Err((PassthroughReason::MultiplePrompts, body, spec)))
            }
            Some(_) => {
                return Err(bad(
                    "'prompt' must be a string, a list of token ids, or a list of those",
                ))
            }
        },
    };
    if let PromptInput::Tokens(t) = &prompt {
        if t.is_empty() {
            return Err(bad("'prompt' must not be empty"));
        }
    }
    if let PromptInput::Text(t) = &prompt {
        if t.is_empty() {
            return Err(bad("'prompt' must not be empty"));
        }
    }
    let max_tokens = {
        let a = opt_i64(m, "max_tokens")?;
        let b = opt_i64(m, "max_completion_tokens")?;
        match b.or(a) {
            None => None,
            Some(n) if n < 1 => {
                return Err(bad(format!("max_tokens must be at least 1, got {n}.")))
            }
            Some(n) => {
                Some(u32::try_from(n).map_err(|_| bad(format!("max_tokens is too large: {n}")))?)
            }
        }
    };
    let temperature = opt_f64(m, "temperature")?;
    if temperature.is_some_and(|t| t < 0.0) {
        return Err(bad("temperature must be non-negative"));
    }
    let top_p = opt_f64(m, "top_p")?;
    if top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(bad("top_p must be in (0, 1]"));
    }
    let top_k = opt_i64(m, "top_k")?;
    let min_p = opt_f64(m, "min_p")?;
    if min_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(bad("min_p must be in [0, 1]"));
    }
    // vLLM takes any signed 64-bit seed.
    let seed = opt_i64(m, "seed")?.map(|s| s as u64);
    let (want_logprobs, n_top) = match endpoint {
        Endpoint::Completions => match opt_i64(m, "logprobs")? {
            None => (false, None),
            Some(n) if n < 0 => return Err(bad("logprobs must be non-negative")),
            Some(n) => (true, Some(n as u32)),
        },
        Endpoint::Chat => {
            let on = opt_bool(m, "logprobs")?.unwrap_or(false);
            let top = opt_i64(m, "top_logprobs")?;
            if top.is_some_and(|n| n < 0) {
                return Err(bad("top_logprobs must be non-negative"));
            }
            if top.is_some_and(|n| n != 0) && !on {
                return Err(bad(
                    "when using `top_logprobs`, `logprobs` must be set to true.",
                ));
            }
            (
                on,
                if on {
                    Some(top.unwrap_or(0) as u32)
                } else {
                    None
                },
            )
        }
    };
    let stop = match m.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("'stop' must be a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("'stop' must be a string or a list of strings")),
    };
    let stop_token_ids = match m.get("stop_token_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => token_list(v, "stop_token_ids")?,
    };
    let stream = opt_bool(m, "stream")?.unwrap_or(false);
    let stream_options = m
        .get("stream_options")
        .is_some_and(|o| !o.is_null() && o.as_object().is_none_or(|o| !o.is_empty()));
    if stream_options && !stream {
        return Err(bad(
            "Stream options can only be defined when `stream=True`.",
        ));
    }
    let include_usage = m
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(reason) = unsupported_reason(m, endpoint) {
        return Ok(Err((reason, body, spec)));
    }
    Ok(Ok(GenRequest {
        endpoint,
        model,
        prompt,
        sampling: Sampling {
            temperature,
            top_p,
            top_k,
            min_p,
            seed,
            logprobs: n_top,
        },
        max_tokens,
        stop,
        stop_token_ids,
        ignore_eos: opt_bool(m, "ignore_eos")?.unwrap_or(false),
        skip_special_tokens: opt_bool(m, "skip_special_tokens")?.unwrap_or(true),
        include_stop_str_in_output: opt_bool(m, "include_stop_str_in_output")?.unwrap_or(false),
        stream,
        include_usage,
        want_logprobs,
        tokens_as_ids: opt_bool(m, "return_tokens_as_token_ids")?.unwrap_or(false),
        spec,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn parses_completion_and_strips_spec_field() {
        let b = obj(
            json!({"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0,
            "stop": "x", "speculation": {"mode": "on", "max_draft_tokens": 3, "drafter": "ngram"}, "foo": 1}),
        );
        let r = parse(Endpoint::Completions, b, None)
            .expect("valid")
            .expect("speculable");
        assert_eq!(r.max_tokens, Some(5));
        assert!(r.sampling.is_greedy());
        assert_eq!(r.stop, vec!["x"]);
        assert_eq!(r.spec.max_draft_tokens, Some(3));
        assert!(!r.body.contains_key("speculation"));
        assert!(r.body.contains_key("foo"));
    }

    #[test]
    fn passthrough_reasons() {
        for (b, reason) in [
            (json!({"prompt": "a", "n": 2}), "n"),
            (json!({"prompt": "a", "presence_penalty": 0.5}), "penalty"),
            (json!({"prompt": "a", "logit_bias": {"1": 2}}), "logit_bias"),
            (json!({"prompt": ["a", "b"]}), "multiple_prompts"),
            (json!({"prompt": "a", "echo": true}), "echo"),
        ] {
            match parse(Endpoint::Completions, obj(b), None) {
                Ok(Err((r, _, _))) => assert_eq!(r.as_str(), reason),
                _ => panic!("expected passthrough {reason}"),
            }
        }
        let ok = parse(
            Endpoint::Completions,
            obj(json!({"prompt": "a", "n": 1, "presence_penalty": 0})),
            None,
        );
        assert!(matches!(ok, Ok(Ok(_))));
    }

    #[test]
    fn rejects_bad_input() {
        for b in [
            json!({"prompt": "a", "max_tokens": -1}),
            json!({"prompt": "a", "max_tokens": "x"}),
            json!({"prompt": ""}),
            json!({"prompt": []}),
            json!({"prompt": [1, -2]}),
            json!({"prompt": "a", "temperature": -1}),
            json!({"prompt": "a", "top_p": 0}),
            json!({"prompt": "a", "stop": 5}),
            json!({"prompt": "a", "speculation": {"mode": "maybe"}}),
        ] {
            assert!(
                parse(Endpoint::Completions, obj(b.clone()), None).is_err(),
                "{b}"
            );
        }
        assert!(parse(Endpoint::Chat, obj(json!({"messages": []})), None).is_err());
        assert!(parse(
            Endpoint::Completions,
            obj(json!({"prompt": "a"})),
            Some("sometimes")
        )
        .is_err());
    }
}
