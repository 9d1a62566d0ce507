//! The response bodies specd writes for speculated requests, shaped as vLLM writes them:
//! whole responses, streamed chunks and the final usage chunk, for completions and chat.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::SpecMode;
use crate::draft::DrafterChoice;

/// A response or a streamed chunk: the envelope both endpoints share.
#[derive(Debug, Serialize)]
pub struct Envelope<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The part of a stream's chunks that stays the same (`{"id":…,"object":…,"created":…,
/// "model":…,"choices":`), serialized once per stream: escaping those strings again for
/// every relayed token was a tenth of its CPU.
#[derive(Debug, Default)]
pub struct EnvelopeHead {
    key: (String, &'static str, u64, String),
    json: Vec<u8>,
}

impl<C: Serialize> Envelope<'_, C> {
    /// Append this envelope's JSON to `out`, exactly as `serde_json` writes it, the head
    /// from `head` (made again whenever it does not match).
    pub fn write_json(&self, out: &mut Vec<u8>, head: &mut EnvelopeHead) -> serde_json::Result<()> {
        if self.usage.is_some() {
            return serde_json::to_writer(out, self);
        }
        let k = &head.key;
        let same = k.0 == self.id && k.1 == self.object && k.2 == self.created && k.3 == self.model;
        if !same || head.json.is_empty() {
            let bare = Envelope::<()> {
                id: self.id,
                object: self.object,
                created: self.created,
                model: self.model,
                choices: Vec::new(),
                usage: None,
            };
            let mut json = serde_json::to_vec(&bare)?;
            // `…,"choices":[]}` → `…,"choices":`
            json.truncate(json.len().saturating_sub(3));
            head.key = (self.id.into(), self.object, self.created, self.model.into());
            head.json = json;
        }
        out.extend_from_slice(&head.json);
        serde_json::to_writer(&mut *out, &self.choices)?;
        out.push(b'}');
        Ok(())
    }
}

/// `finish_reason` and vLLM's `stop_reason` (the matched stop string or token id).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Finished {
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Value,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: Option<Logprobs>,
    #[serde(flatten)]
    pub finished: Finished,
    /// Whole responses only; specd never computes prompt logprobs (such requests pass
    /// through).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<()>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<Logprobs>,
    #[serde(flatten)]
    pub finished: Finished,
}

/// A chat chunk's delta. Without parsers it always has `content`; with one, only the
/// fields that chunk adds (as vLLM writes it: unset fields are left out, and `content`
/// is null beside tool calls that came without text).
#[derive(Debug, Serialize)]
pub struct Delta<'a> {
    /// The first chunk of a chat stream names the role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<&'a str>,
    /// SGLang's name for the reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A piece of a streamed tool call: the first names it (with its id and type), the
/// others add argument text.
#[derive(Debug, Serialize)]
pub struct ToolCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub index: u32,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A tool call of a whole chat answer.
#[derive(Debug, Serialize)]
pub struct ToolCall {
    pub id: String,
    /// SGLang numbers the calls of a whole answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice<'a> {
    pub index: u32,
    pub message: Message<'a>,
    pub logprobs: Option<Logprobs>,
    #[serde(flatten)]
    pub finished: Finished,
}

#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub role: &'static str,
    /// Null where a reasoning parser found no content.
    pub content: Option<Cow<'a, str>>,
    /// With a tool-call parser, the calls it found; else always empty.
    pub tool_calls: Vec<ToolCall>,
    /// With a reasoning parser only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// SGLang's name for the reasoning (null where there is none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Option<String>>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Logprobs {
    Completion(CompletionLogprobs),
    Chat(ChatLogprobs),
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f64>>,
    /// Per token, the top alternatives by token text (`null` when none were asked for).
    pub top_logprobs: Vec<Option<Map<String, Value>>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    #[serde(flatten)]
    pub token: TokenLogprob,
    pub top_logprobs: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u8>,
}

/// `usage` as vLLM writes it, plus specd's `speculation` object.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// Present (as null) in whole responses; the streamed usage chunk has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<()>,
    /// Whole responses: null, or the reasoning token count with a reasoning parser; the
    /// streamed usage chunk has only the count, with a parser.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<Option<CompletionDetails>>,
    /// SGLang also writes the reasoning token count at the top.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u32>,
    pub speculation: SpeculationUsage,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct CompletionDetails {
    pub reasoning_tokens: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpeculationUsage {
    pub mode: SpecMode,
    pub drafter: DrafterChoice,
    pub rounds: u32,
    pub draft_tokens: u32,
    pub accepted_tokens: u32,
    pub relay_tokens: u32,
    pub switches: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(id: &'a str, object: &'static str, text: &'a str) -> Envelope<'a, Value> {
        Envelope {
            id,
            object,
            created: 17,
            model: "m\"odel",
            choices: vec![serde_json::json!({"index": 0, "text": text})],
            usage: None,
        }
    }

    #[test]
    fn envelopes_written_with_a_kept_head_equal_serde_jsons_output() {
        let mut head = EnvelopeHead::default();
        let cases = [
            env("cmpl-1", "text_completion", "a"),
            env("cmpl-1", "text_completion", "b\n\u{1}\"q"),
            env("cmpl-2", "text_completion", "c"),
            env("cmpl-2", "chat.completion.chunk", ""),
        ];
        for e in &cases {
            let mut out = b"data: ".to_vec();
            e.write_json(&mut out, &mut head).unwrap();
            let want = [b"data: ".as_slice(), &serde_json::to_vec(e).unwrap()].concat();
            assert_eq!(
                String::from_utf8(out).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }
}
