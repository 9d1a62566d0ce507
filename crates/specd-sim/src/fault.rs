//! Faults the fake upstream can be told to inject, for what a real server cannot be made
//! to do on demand: answer 5xx, send malformed JSON, cut a response mid-way, delay, or never
//! answer. (Refused connections are [`crate::Upstream::down`].)

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

/// Which kind of upstream call a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Health,
    Models,
    Tokenize,
    /// A non-streamed `/v1/completions` with `max_tokens: 1` and token-id logprobs: what
    /// specd's verify rounds send.
    Verify,
    /// A streamed `/v1/completions` (specd's relay, or a client's passthrough stream).
    Stream,
    /// Any other non-streamed `/v1/completions`.
    Complete,
    Any,
}

impl Call {
    pub(crate) const COUNT: usize = 7;

    /// The kind of a request to `path` with JSON `body`.
    pub fn of(path: &str, body: &Value) -> Call {
        match path {
            "/health" => Call::Health,
            "/v1/models" => Call::Models,
            "/tokenize" => Call::Tokenize,
            "/v1/completions" if body.get("stream") == Some(&Value::Bool(true)) => Call::Stream,
            "/v1/completions"
                if body.get("max_tokens") == Some(&json!(1))
                    && (body.get("return_tokens_as_token_ids") == Some(&Value::Bool(true))
                        || body.get("return_token_ids") == Some(&Value::Bool(true))) =>
            {
                Call::Verify
            }
            "/v1/completions" => Call::Complete,
            _ => Call::Any,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and a vLLM-shaped error body.
    Status(u16),
    /// Answer 200 with a body that is not valid JSON (streams: after this many tokens).
    Malformed(usize),
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// Never answer (until the caller goes away).
    Hang,
    /// Streams: close the connection after this many tokens. Others: after half the body.
    Cut(usize),
    /// Close the connection without answering, as a server does that closes an idle
    /// keep-alive connection just as a request is sent on it.
    Drop,
}

#[derive(Debug, Clone)]
struct Rule {
    call: Call,
    fault: Fault,
    /// Only requests whose (first) prompt starts with this token.
    marker: Option<u32>,
    /// Applies this many more times; `None` = until cleared.
    times: Option<usize>,
}

/// The faults in force, first match wins.
#[derive(Debug, Default)]
pub(crate) struct Rules(Mutex<Vec<Rule>>);

impl Rules {
    pub(crate) fn add(&self, call: Call, fault: Fault, marker: Option<u32>, times: Option<usize>) {
        if let Ok(mut r) = self.0.lock() {
            r.push(Rule {
                call,
                fault,
                marker,
                times,
            });
        }
    }

    pub(crate) fn clear(&self) {
        if let Ok(mut r) = self.0.lock() {
            r.clear();
        }
    }

    /// The fault for a call of kind `call` whose first prompt starts with `first_token`,
    /// counting one use of its rule.
    pub(crate) fn take(&self, call: Call, first_token: Option<u32>) -> Option<Fault> {
        let mut rules = self.0.lock().ok()?;
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
}
