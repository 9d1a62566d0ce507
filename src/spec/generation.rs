//! Per-token bookkeeping of one generation, in the order the upstream applies it: length
//! limits, then EOS and stop token ids, then stop strings on the detokenized text.

use serde_json::Value;

use crate::tokens::{Detokenizer, StopMatcher, StopOutcome};
use crate::upstream::verify::Sample;

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// "stop" or "length".
    pub reason: &'static str,
    /// The matched stop string or stop token id (vLLM's `stop_reason`).
    pub stop_reason: Value,
}

pub struct Limits {
    pub max_tokens: u32,
    pub max_model_len: u32,
    pub prompt_len: u32,
    pub eos_ids: Vec<u32>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub include_stop_str: bool,
}

pub struct Generation<'t> {
    limits: Limits,
    detok: Detokenizer<'t>,
    stops: StopMatcher,
    pub generated: u32,
    /// Text released for the client since the last `take`.
    text: String,
    tokens: Vec<Sample>,
}

impl<'t> Generation<'t> {
    pub fn new(limits: Limits, detok: Detokenizer<'t>, stop: Vec<String>) -> Self {
        let stops = StopMatcher::new(stop, limits.include_stop_str);
        Generation {
            limits,
            detok,
            stops,
            generated: 0,
            text: String::new(),
            tokens: Vec::new(),
        }
    }

    /// Tokens still allowed before `max_tokens` or the context limit.
    pub fn remaining(&self) -> u32 {
        let by_max = self.limits.max_tokens.saturating_sub(self.generated);
        let by_ctx = self
            .limits
            .max_model_len
            .saturating_sub(self.limits.prompt_len + self.generated);
        by_max.min(by_ctx)
    }

    /// Add one generated token; `Some` when generation ends with it.
    pub fn push(&mut self, s: Sample) -> Option<Finish> {
        let id = s.id;
        self.generated += 1;
        self.tokens.push(s);
        let length = self.generated >= self.limits.max_tokens
            || self.limits.prompt_len + self.generated >= self.limits.max_model_len;
        let mut engine_stop: Option<Finish> = None;
        if length {
            engine_stop = Some(Finish {
                reason: "length",
                stop_reason: Value::Null,
            });
        } else if !self.limits.ignore_eos && self.limits.eos_ids.contains(&id) {
            engine_stop = Some(Finish {
                reason: "stop",
                stop_reason: Value::Null,
            });
        } else if self.limits.stop_token_ids.contains(&id) {
            engine_stop = Some(Finish {
                reason: "stop",
                stop_reason: Value::from(id),
            });
        }
        // The token that ended generation by EOS/stop id is not rendered as text.
        let stop_terminated = engine_stop.as_ref().is_some_and(|f| f.reason == "stop");
        if !stop_terminated || self.limits.include_stop_str {
            let piece = self.detok.step(id);
            match self.stops.push(&piece) {
                StopOutcome::Continue(t) => self.text.push_str(&t),
                StopOutcome::Stopped(t, s) => {
                    self.text.push_str(&t);
                    return Some(Finish {
                        reason: "stop",
                        stop_reason: Value::from(s),
                    });
                }
            }
        }
        if engine_stop.is_some() {
            let rest = self.stops.flush();
            self.text.push_str(&rest);
        }
        engine_stop
    }

    /// Text and tokens produced since the last call.
    pub fn take(&mut self) -> (String, Vec<Sample>) {
        (
            std::mem::take(&mut self.text),
            std::mem::take(&mut self.tokens),
        )
    }

    /// End for a reason outside the tokens (e.g. an error): release held text.
    pub fn flush(&mut self) {
        let rest = self.stops.flush();
        self.text.push_str(&rest);
    }
}

impl Generation<'_> {
    /// Put back text and tokens taken by `take` (they go out with the final event).
    pub fn restore(&mut self, text: String, mut tokens: Vec<Sample>) {
        let mut t = text;
        t.push_str(&self.text);
        self.text = t;
        tokens.append(&mut self.tokens);
        self.tokens = tokens;
    }
}
