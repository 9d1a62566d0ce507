//! OpenAI-shaped responses (as vLLM writes them) for the speculated path: streamed
//! chunks and whole responses, for completions and chat completions.

use serde_json::{Map, Value};

use std::borrow::Cow;

use super::generation::Finish;
use super::reasoning::{Reasoning, Split};
use super::request::Endpoint;
use super::session::Stats;
use super::tools::{self, ToolPiece, Tools};
use crate::protocol::response::{
    ChatChoice, ChatChunkChoice, ChatLogprobs, ChatTokenLogprob, CompletionChoice,
    CompletionDetails, CompletionLogprobs, Delta, Envelope, Finished, FunctionCall, FunctionDelta,
    Logprobs, Message, SpeculationUsage, TokenLogprob, ToolCall, ToolCallDelta, Usage,
};
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
    /// The upstream's reasoning parser (chat only).
    pub reasoning: Option<Reasoning>,
    /// The upstream's tool-call parser (chat only).
    pub tools: Option<Tools>,
}

/// A streamed chunk's text as the parsers read it.
#[derive(Clone, Copy, Default)]
pub struct Parsed<'a> {
    /// As reasoning and content (a reasoning parser).
    pub split: Option<&'a Split>,
    /// As content and tool calls (a tool-call parser).
    pub calls: Option<&'a ToolPiece>,
}

/// A chunk or response of either endpoint, ready to serialize.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum Body<'a> {
    Completion(Envelope<'a, CompletionChoice<'a>>),
    ChatChunk(Envelope<'a, ChatChunkChoice<'a>>),
    Chat(Envelope<'a, ChatChoice<'a>>),
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

/// `usage` as vLLM writes it, plus specd's `speculation` object. The streamed usage
/// chunk leaves out null details; `reasoning_tokens` is counted with a reasoning parser.
pub fn usage(stats: &Stats, streamed: bool, reasoning_tokens: Option<u32>) -> Usage {
    let details = reasoning_tokens.map(|n| CompletionDetails {
        reasoning_tokens: n,
    });
    Usage {
        prompt_tokens: stats.prompt_tokens,
        completion_tokens: stats.completion_tokens,
        total_tokens: stats.prompt_tokens + stats.completion_tokens,
        prompt_tokens_details: (!streamed).then_some(()),
        completion_tokens_details: match (streamed, details) {
            (true, None) => None,
            (true, Some(d)) => Some(Some(d)),
            (false, d) => Some(d),
        },
        reasoning_tokens: None,
        speculation: SpeculationUsage {
            mode: stats.mode,
            drafter: stats.drafter,
            rounds: stats.rounds,
            draft_tokens: stats.draft_tokens,
            accepted_tokens: stats.accepted_tokens,
            relay_tokens: stats.relay_tokens,
            switches: stats.switches,
        },
    }
}

fn finished(finish: Option<&Finish>) -> Finished {
    match finish {
        Some(f) => Finished {
            finish_reason: Some(f.reason.as_str()),
            stop_reason: f.stop_reason.clone(),
        },
        None => Finished::default(),
    }
}

impl Shape {
    fn token_str(&self, id: u32) -> String {
        if self.tokens_as_ids {
            format!("token_id:{id}")
        } else {
            self.tokenizer.token_text(id)
        }
    }

    fn envelope<C>(&self, object: &'static str, choices: Vec<C>) -> Envelope<'_, C> {
        Envelope {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage: None,
        }
    }

    /// Logprobs for `tokens`, in the endpoint's format; `text_offset` starts at `offset`.
    pub fn logprobs(&self, tokens: &[Sample], offset: &mut usize) -> Option<Logprobs> {
        if !self.want_logprobs {
            return None;
        }
        Some(match self.endpoint {
            Endpoint::Completions => Logprobs::Completion(self.completion_logprobs(tokens, offset)),
            Endpoint::Chat => Logprobs::Chat(self.chat_logprobs(tokens)),
        })
    }

    fn completion_logprobs(&self, tokens: &[Sample], offset: &mut usize) -> CompletionLogprobs {
        let mut lp = CompletionLogprobs::default();
        for s in tokens {
            let t = self.token_str(s.id);
            lp.text_offset.push(*offset);
            *offset += t.len();
            lp.tokens.push(t);
            lp.token_logprobs.push(s.logprob.map(f64::from));
            let mut top = Map::new();
            for &(id, l) in &s.top {
                top.entry(self.token_str(id))
                    .or_insert(Value::from(f64::from(l)));
            }
            lp.top_logprobs.push((!s.top.is_empty()).then_some(top));
        }
        lp
    }

    fn chat_logprobs(&self, tokens: &[Sample]) -> ChatLogprobs {
        // vLLM floors logprobs at -9999 (and a missing one reads as that floor).
        let entry = |id: u32, lp: f32| {
            let token = self.token_str(id);
            TokenLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: f64::from(lp).max(-9999.0),
            }
        };
        let content = tokens
            .iter()
            .map(|s| ChatTokenLogprob {
                token: entry(s.id, s.logprob.unwrap_or(f32::NAN)),
                top_logprobs: s.top.iter().map(|&(id, lp)| entry(id, lp)).collect(),
            })
            .collect();
        ChatLogprobs { content }
    }

    /// The reasoning tokens among `ids` (the whole output), with a reasoning parser;
    /// `streamed` is the count the parser kept while streaming, where it keeps one.
    pub fn reasoning_tokens(
        &self,
        ids: impl IntoIterator<Item = u32>,
        streamed: Option<u32>,
    ) -> Option<u32> {
        let r = self.reasoning.as_ref()?;
        Some(streamed.unwrap_or_else(|| r.reasoning_tokens(&ids.into_iter().collect::<Vec<_>>())))
    }

    /// One streamed chunk; `parsed` is `text` as the parsers read it.
    pub fn chunk<'a>(
        &'a self,
        text: &'a str,
        parsed: Parsed<'a>,
        logprobs: Option<Logprobs>,
        finish: Option<&Finish>,
        first: bool,
    ) -> Body<'a> {
        let mut finished = finished(finish);
        // vLLM: a stream that sent a call and stopped ends with "tool_calls".
        if parsed.calls.is_some_and(|c| c.called) && finished.finish_reason == Some("stop") {
            finished.finish_reason = Some("tool_calls");
        }
        match self.endpoint {
            Endpoint::Completions => Body::Completion(self.envelope(
                "text_completion",
                vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs,
                    finished,
                    prompt_logprobs: None,
                }],
            )),
            Endpoint::Chat => Body::ChatChunk(self.envelope(
                "chat.completion.chunk",
                vec![ChatChunkChoice {
                    index: 0,
                    delta: match self.sglang() {
                        true => sglang::delta(text, parsed, first),
                        false => delta(text, parsed, first, finish.is_some()),
                    },
                    logprobs,
                    finished,
                }],
            )),
        }
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, stats: &Stats, reasoning_tokens: Option<u32>) -> Body<'_> {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        let mut e = self.envelope(object, Vec::new());
        e.usage = Some(self.usage(stats, true, reasoning_tokens));
        Body::Completion(e)
    }

    /// A whole (non-streamed) response.
    pub fn full<'a>(
        &'a self,
        text: &'a str,
        logprobs: Option<Logprobs>,
        finish: &Finish,
        stats: &Stats,
        reasoning_tokens: Option<u32>,
    ) -> Body<'a> {
        let mut finished = finished(Some(finish));
        let usage = Some(self.usage(stats, false, reasoning_tokens));
        match self.endpoint {
            Endpoint::Completions => {
                let choice = CompletionChoice {
                    index: 0,
                    text,
                    logprobs,
                    finished,
                    prompt_logprobs: Some(()),
                };
                let mut e = self.envelope("text_completion", vec![choice]);
                e.usage = usage;
                Body::Completion(e)
            }
            Endpoint::Chat => {
                let message = match self.sglang() {
                    true => sglang::message(self, text),
                    false => self.message(text),
                };
                // vLLM: an answer in which `auto` found calls ends with "tool_calls";
                // SGLang: one that stopped.
                let stopped = finished.finish_reason == Some("stop");
                if !message.tool_calls.is_empty() && (stopped || !self.sglang()) {
                    finished.finish_reason = Some("tool_calls");
                }
                let choice = ChatChoice {
                    index: 0,
                    message,
                    logprobs,
                    finished,
                };
                let mut e = self.envelope("chat.completion", vec![choice]);
                e.usage = usage;
                Body::Chat(e)
            }
        }
    }
}

impl Shape {
    /// The upstream's parsers are SGLang's: its field names and shapes.
    fn sglang(&self) -> bool {
        use crate::upstream::detect::UpstreamKind::Sglang;
        self.reasoning
            .as_ref()
            .is_some_and(|r| r.dialect() == Sglang)
            || self.tools.as_ref().is_some_and(|t| t.dialect() == Sglang)
    }

    /// `usage` in the upstream's shape.
    fn usage(&self, stats: &Stats, streamed: bool, reasoning_tokens: Option<u32>) -> Usage {
        if !self.sglang() {
            return usage(stats, streamed, reasoning_tokens);
        }
        // SGLang: the count at the top, and in the details where there is one.
        let mut u = usage(stats, false, None);
        u.prompt_tokens_details = None;
        let n = reasoning_tokens.unwrap_or(0);
        u.reasoning_tokens = Some(n);
        u.completion_tokens_details = Some((n > 0).then_some(CompletionDetails {
            reasoning_tokens: n,
        }));
        u
    }

    /// A whole chat answer's message: split by the reasoning parser, or read by the
    /// tool-call parser, if any.
    fn message<'a>(&self, text: &'a str) -> Message<'a> {
        if let Some(t) = &self.tools {
            let (reasoning, e) = read_whole(self.reasoning.as_ref(), t, text);
            let content = e.content;
            let tool_calls = e
                .calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id.unwrap_or_else(tools::call_id),
                    index: None,
                    kind: "function",
                    function: FunctionCall {
                        name: c.name,
                        arguments: c.arguments,
                    },
                })
                .collect();
            return Message {
                role: "assistant",
                content: content.map(Cow::Owned),
                tool_calls,
                reasoning,
                reasoning_content: None,
            };
        }
        let (reasoning, content) = match &self.reasoning {
            None => (None, Some(Cow::Borrowed(text))),
            Some(r) => {
                let (reasoning, content) = r.split_full(text);
                (reasoning, content.map(Cow::Owned))
            }
        };
        Message {
            role: "assistant",
            content,
            tool_calls: Vec::new(),
            reasoning,
            reasoning_content: None,
        }
    }
}

/// A whole chat answer read by the tool-call parser (and split by the reasoning parser
/// first, if any): the reasoning, and the content and calls.
pub fn read_whole(
    reasoning: Option<&Reasoning>,
    tools: &Tools,
    text: &str,
) -> (Option<String>, tools::Extracted) {
    // With a reasoning parser too, calls are read from the content only.
    let (reasoning, content) = match reasoning {
        None => (None, Some(text.to_string())),
        Some(r) => r.split_full(text),
    };
    let mut e = tools.extract(content.as_deref().unwrap_or(""));
    // No calls: the content as it was (null where the reasoning never closed), where the
    // parser leaves it so.
    if e.calls.is_empty() && !tools.reads_content() {
        e.content = content;
    }
    (reasoning, e)
}

/// A chat delta: all `text` as content, or (with a parser) the parts this chunk adds.
fn delta<'a>(text: &'a str, parsed: Parsed<'a>, first: bool, last: bool) -> Delta<'a> {
    let role = first.then_some("assistant");
    if let Some(c) = parsed.calls {
        let mut d = tool_delta(role, &c.delta);
        // With a reasoning parser too: the reasoning the chunk adds, and a last chunk
        // that adds nothing while reasoning is open is an empty reasoning delta (`{}`
        // where the parser's last step added no delta).
        if let Some(s) = parsed.split {
            let open_end = last && !s.closed && !s.bare && c.delta.is_empty();
            d.reasoning = (!s.reasoning.is_empty() || open_end).then_some(s.reasoning.as_str());
        }
        return d;
    }
    let Some(s) = parsed.split else {
        return Delta {
            role,
            content: Some(Some(text)),
            reasoning: None,
            reasoning_content: None,
            tool_calls: None,
        };
    };
    // A last chunk that adds nothing names the side it ends on with "" (vLLM's last
    // step, the unrendered EOS, is an empty delta of that side), or is `{}` where the
    // parser's last step added no delta.
    let some = |t: &'a String| (!t.is_empty()).then_some(t.as_str());
    let (mut content, mut reasoning) = (some(&s.content), some(&s.reasoning));
    if last && content.is_none() && reasoning.is_none() && !s.bare {
        if s.closed {
            content = Some("");
        } else {
            reasoning = Some("");
        }
    }
    Delta {
        role,
        content: content.map(Some),
        reasoning,
        reasoning_content: None,
        tool_calls: None,
    }
}

/// A delta of a tool-call parser's steps: the content they add (null beside calls that
/// came without any), and the call pieces, each started with a fresh id. Steps that add
/// nothing are an empty delta (`{}`), as vLLM writes a step its parser held back.
fn tool_delta<'a>(role: Option<&'static str>, d: &'a tools::StreamDelta) -> Delta<'a> {
    if d.is_empty() {
        // The first chunk of all is vLLM's role chunk with "" content.
        return Delta {
            role,
            content: role.map(|_| Some("")),
            reasoning: None,
            reasoning_content: None,
            tool_calls: None,
        };
    }
    let calls: Vec<ToolCallDelta> = d
        .calls
        .iter()
        .map(|c| ToolCallDelta {
            id: c
                .name
                .as_ref()
                .map(|_| c.id.clone().unwrap_or_else(tools::call_id)),
            kind: c.name.as_ref().map(|_| "function"),
            index: c.index,
            function: FunctionDelta {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect();
    Delta {
        role,
        content: Some(d.content.as_deref()),
        reasoning: None,
        reasoning_content: None,
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

mod sglang;
#[cfg(test)]
mod tests;
