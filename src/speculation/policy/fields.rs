//! The passthrough policy's first half: which request fields and values speculation
//! reproduces exactly. A field whose effect it cannot reproduce, and a value it does not
//! fully understand, is forwarded, so the client gets the upstream's own answer — its
//! result or its error — never specd's guess.

use serde_json::{Map, Value};

use crate::metrics::labels::PassthroughReason as Reason;
use crate::protocol::request::StreamOptions;
use crate::protocol::{lax, Endpoint};

/// Values of a field that leave the output as specd makes it.
#[derive(Clone, Copy)]
enum Harmless {
    /// Only `null` (or no field).
    Null,
    /// `null`, or this number written as an integer or a float.
    Number(i64),
    /// `null` or false (read laxly, as the upstream reads it).
    False,
    /// `null` or a `response_format` of type "text".
    TextFormat,
}

impl Harmless {
    fn allows(self, v: &Value) -> bool {
        if v.is_null() {
            return true;
        }
        match self {
            Harmless::Null => false,
            Harmless::Number(n) => *v == n || *v == n as f64,
            Harmless::False => lax::boolean(v) == Some(false),
            Harmless::TextFormat => v.get("type").and_then(Value::as_str) == Some("text"),
        }
    }
}

/// Fields whose effect speculation does not reproduce: any other value passes through
/// under the reason. Checked in order (the first reason found is counted), `tools`
/// between the two tables.
#[rustfmt::skip]
const SAMPLING: &[(&str, Harmless, Reason)] = &[
    ("n", Harmless::Number(1), Reason::N),
    ("best_of", Harmless::Number(1), Reason::BestOf),
    // Penalties on output tokens only, which in a verify call are prompt (the repetition
    // penalty counts prompt and output alike: `exact`).
    ("presence_penalty", Harmless::Number(0), Reason::Penalty),
    ("frequency_penalty", Harmless::Number(0), Reason::Penalty),
    // Guided decoding constrains sampling inside the server.
    ("response_format", Harmless::TextFormat, Reason::GuidedDecoding),
    ("guided_json", Harmless::Null, Reason::GuidedDecoding),
    ("guided_regex", Harmless::Null, Reason::GuidedDecoding),
    ("guided_choice", Harmless::Null, Reason::GuidedDecoding),
    ("guided_grammar", Harmless::Null, Reason::GuidedDecoding),
    ("structured_outputs", Harmless::Null, Reason::GuidedDecoding),
    ("guided_decoding_backend", Harmless::Null, Reason::GuidedDecoding),
];

#[rustfmt::skip]
const OUTPUT: &[(&str, Harmless, Reason)] = &[
    ("echo", Harmless::False, Reason::Echo),
    ("prompt_logprobs", Harmless::Null, Reason::PromptLogprobs),
    ("suffix", Harmless::Null, Reason::Suffix),
    ("logits_processors", Harmless::Null, Reason::UnsupportedParam),
    ("lora_request", Harmless::Null, Reason::UnsupportedParam),
    ("vllm_xargs", Harmless::Null, Reason::UnsupportedParam),
    ("kv_transfer_params", Harmless::Null, Reason::UnsupportedParam),
    ("repetition_detection", Harmless::Null, Reason::UnsupportedParam),
    ("thinking_token_budget", Harmless::Null, Reason::UnsupportedParam),
];

/// vLLM's limit on stop strings (`VLLM_MAX_STOP_STRINGS`, default 4, in
/// vllm/entrypoints/generate/base/protocol.py `StopParam`). A server may raise it, so more
/// are not an error here: they are the upstream's to accept or refuse.
const MAX_STOP_STRINGS: usize = 4;

/// vLLM refuses temperatures above 2 (vllm/sampling_params.py `_verify_args`); other
/// servers may take them. Either way the upstream answers.
const MAX_TEMPERATURE: f64 = 2.0;

/// Completions given several prompts (each is its own generation).
pub fn many_prompts(prompt: Option<&Value>) -> bool {
    match prompt {
        Some(Value::Array(a)) => a.len() > 1 && !a.iter().all(Value::is_number),
        _ => false,
    }
}

/// Why this (valid) request must be forwarded, from its fields alone.
pub fn request_reason(endpoint: Endpoint, body: &Map<String, Value>) -> Option<Reason> {
    let table = |fields: &[(&str, Harmless, Reason)]| {
        fields.iter().find_map(|&(key, harmless, reason)| {
            body.get(key)
                .is_some_and(|v| !harmless.allows(v))
                .then_some(reason)
        })
    };
    let multimodal = || {
        let msgs = body.get("messages").and_then(Value::as_array);
        let any =
            endpoint == Endpoint::Chat && msgs.is_some_and(|m| m.iter().any(has_non_text_part));
        // Multimodal content needs the upstream's processors.
        any.then_some(Reason::Multimodal)
    };
    table(SAMPLING)
        .or_else(|| tools_reason(body))
        .or_else(|| table(OUTPUT))
        .or_else(multimodal)
        .or_else(|| not_understood(body).then_some(Reason::UnsupportedParam))
}

/// `tools` with `tool_choice` `auto` (or unset) or `none` may be speculated (whether
/// they are depends on the upstream's parser: `policy::route`). The rest is forwarded:
/// choices the server enforces with a grammar under their own reasons, and values specd
/// does not fully understand (vLLM refuses even an empty list) for the upstream to answer.
fn tools_reason(body: &Map<String, Value>) -> Option<Reason> {
    let choice = body.get("tool_choice");
    let Some(tools) = body.get("tools").filter(|t| !t.is_null()) else {
        // Without tools only "none" is valid.
        let understood = choice.is_none_or(|c| c.is_null() || c.as_str() == Some("none"));
        return (!understood).then_some(Reason::UnsupportedParam);
    };
    let Some(tools) = tools.as_array().filter(|a| !a.is_empty()) else {
        return Some(Reason::UnsupportedParam);
    };
    let mut strict = false;
    for t in tools {
        strict |= match function_tool_strict(t) {
            Some(s) => s,
            None => return Some(Reason::UnsupportedParam),
        };
    }
    match choice {
        // An explicit null is neither vLLM's "auto" default nor "none": its serving
        // layer treats it inconsistently, so it is the upstream's.
        Some(Value::Null) => return Some(Reason::UnsupportedParam),
        None => {}
        Some(Value::String(s)) if s == "auto" || s == "none" => {}
        Some(Value::String(s)) if s == "required" => return Some(Reason::ToolChoiceRequired),
        Some(Value::Object(_)) => return Some(Reason::ToolChoiceNamed),
        Some(_) => return Some(Reason::UnsupportedParam),
    }
    if choice.and_then(Value::as_str) == Some("none") {
        return None;
    }
    if strict {
        return Some(Reason::StrictTools);
    }
    // `parallel_tool_calls: false` makes vLLM constrain the output to one call.
    match body.get("parallel_tool_calls") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => None,
        Some(Value::Bool(false)) => Some(Reason::SingleToolCall),
        Some(_) => Some(Reason::UnsupportedParam),
    }
}

/// A function tool as vLLM reads one: its `strict` flag, or `None` where the tool is not
/// of a shape specd understands.
fn function_tool_strict(t: &Value) -> Option<bool> {
    let t = t.as_object()?;
    if t.get("type")
        .is_some_and(|v| v.as_str() != Some("function"))
    {
        return None;
    }
    let f = t.get("function")?.as_object()?;
    f.get("name")?.as_str()?;
    match f.get("strict") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Some(false),
        Some(Value::Bool(true)) => Some(true),
        Some(_) => None,
    }
}

/// The `tool_choice` of a request whose tools may be speculated (after
/// [`request_reason`] found none to forward): `None` without tools.
pub fn tool_choice(body: &Map<String, Value>) -> Option<crate::speculation::tools::Choice> {
    use crate::speculation::tools::Choice;
    body.get("tools").filter(|t| !t.is_null())?;
    Some(match body.get("tool_choice").and_then(Value::as_str) {
        Some("none") => Choice::None,
        _ => Choice::Auto,
    })
}

fn has_non_text_part(msg: &Value) -> bool {
    let parts = msg.get("content").and_then(Value::as_array);
    parts.is_some_and(|parts| {
        parts.iter().any(|p| {
            p.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t != "text")
        })
    })
}

/// Values of fields specd reads that it does not fully understand (the typed intake has
/// already refused the ones of the wrong type).
fn not_understood(body: &Map<String, Value>) -> bool {
    let stops: Vec<&str> = match body.get("stop") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    // vLLM: "stop cannot contain an empty string." (vllm/sampling_params.py).
    if stops.len() > MAX_STOP_STRINGS || stops.iter().any(|s| s.is_empty()) {
        return true;
    }
    if StreamOptions::read(body.get("stream_options")).is_none() {
        return true;
    }
    let temperature = body.get("temperature").and_then(lax::float);
    temperature.is_some_and(|t| t > MAX_TEMPERATURE)
}
