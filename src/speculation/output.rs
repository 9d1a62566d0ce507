//! OpenAI-shaped responses (as vLLM writes them) for the speculated path: streamed
//! chunks and whole responses, for completions and chat completions.

use serde_json::{json, Map, Value};

use super::generation::Finish;
use super::request::Endpoint;
use super::session::Stats;
use crate::tokens::ModelTokenizer;
use crate::upstream::verify::Sample;

pub struct Shape {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub want_logprobs: bool,
    pub tokens_as_ids: bool,
    pub tokenizer: std::sync::Arc<ModelTokenizer>,
}

pub fn new_id(endpoint: Endpoint) -> String {
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    format!(
        "{prefix}-{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    )
}

/// `usage` as vLLM writes it (the streamed usage chunk has no `*_details` fields), plus
/// specd's `speculation` object.
pub fn usage(stats: &Stats, streamed: bool) -> Value {
    let mut u = json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": null,
        "completion_tokens_details": null,
        "speculation": {
            "mode": stats.mode,
            "drafter": stats.drafter,
            "rounds": stats.rounds,
            "draft_tokens": stats.draft_tokens,
            "accepted_tokens": stats.accepted_tokens,
            "relay_tokens": stats.relay_tokens,
            "switches": stats.switches,
        }
    });
    if streamed {
        if let Some(o) = u.as_object_mut() {
            o.remove("prompt_tokens_details");
            o.remove("completion_tokens_details");
        }
    }
    u
}

impl Shape {
    fn token_str(&self, id: u32) -> String {
        if self.tokens_as_ids {
            format!("token_id:{id}")
        } else {
            self.tokenizer.token_text(id)
        }
    }

    /// Logprobs for `tokens`, in the endpoint's format; `text_offset` starts at `offset`.
    pub fn logprobs(&self, tokens: &[Sample], offset: &mut usize) -> Value {
        if !self.want_logprobs {
            return Value::Null;
        }
        match self.endpoint {
            Endpoint::Completions => {
                let mut toks = Vec::new();
                let mut lps = Vec::new();
                let mut tops = Vec::new();
                let mut offs = Vec::new();
                for s in tokens {
                    let t = self.token_str(s.id);
                    offs.push(*offset);
                    *offset += t.len();
                    toks.push(Value::from(t));
                    lps.push(s.logprob.map_or(Value::Null, |x| Value::from(f64::from(x))));
                    let mut top = Map::new();
                    for &(id, lp) in &s.top {
                        top.entry(self.token_str(id))
                            .or_insert(Value::from(f64::from(lp)));
                    }
                    tops.push(if s.top.is_empty() {
                        Value::Null
                    } else {
                        Value::Object(top)
                    });
                }
                json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
            }
            Endpoint::Chat => {
                let entry = |id: u32, lp: f32| {
                    let t = self.token_str(id);
                    let bytes: Vec<u8> = t.as_bytes().to_vec();
                    json!({"token": t, "logprob": f64::from(lp).max(-9999.0), "bytes": bytes})
                };
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|s| {
                        let mut e = entry(s.id, s.logprob.unwrap_or(f32::NAN));
                        let top: Vec<Value> = s.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e["top_logprobs"] = Value::from(top);
                        e
                    })
                    .collect();
                json!({"content": content})
            }
        }
    }

    fn finish_fields(finish: Option<&Finish>) -> (Value, Value) {
        match finish {
            Some(f) => (Value::from(f.reason.as_str()), f.stop_reason.clone()),
            None => (Value::Null, Value::Null),
        }
    }

    /// One streamed chunk.
    pub fn chunk(
        &self,
        text: &str,
        logprobs: Value,
        finish: Option<&Finish>,
        first: bool,
    ) -> Value {
        let (fr, sr) = Self::finish_fields(finish);
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": fr, "stop_reason": sr}]
            }),
            Endpoint::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else {
                    json!({"content": text})
                };
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": fr, "stop_reason": sr}]
                })
            }
        }
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, stats: &Stats) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [], "usage": usage(stats, true)})
    }

    /// A whole (non-streamed) response.
    pub fn full(&self, text: &str, logprobs: Value, finish: &Finish, stats: &Stats) -> Value {
        let (fr, sr) = Self::finish_fields(Some(finish));
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": fr, "stop_reason": sr, "prompt_logprobs": null}],
                "usage": usage(stats, false)
            }),
            Endpoint::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": logprobs, "finish_reason": fr, "stop_reason": sr}],
                "usage": usage(stats, false)
            }),
        }
    }
}
