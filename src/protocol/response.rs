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
