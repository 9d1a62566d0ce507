//! Tool calls read out of a chat answer as vLLM's `--enable-auto-tool-choice
//! --tool-call-parser NAME` reads them (vLLM 0.32: the parser itself, and
//! `vllm/parser/abstract_parser.py` with `entrypoints/openai/chat_completion/serving.py`
//! around it), so that a speculated answer reads exactly as a direct one.
//!
//! With a parser, vLLM shapes every chat answer through it:
//! - `tool_choice: "auto"` (what requests with `tools` default to): a whole answer's text
//!   is parsed once; found calls become `message.tool_calls` with fresh random ids, the
//!   text before the first call is `content` (null when blank) and `finish_reason` is
//!   `"tool_calls"`. A stream is parsed after every generated token on the text so far;
//!   each step sends the content or the call pieces (id, type and name; argument
//!   fragments) it adds, and a stream that sent any call and stopped ends with
//!   `"tool_calls"`.
//! - `tool_choice: "none"`, or no tools: the text is content; a streamed step that adds
//!   no text sends nothing (the last one an empty delta).

pub mod hermes;
pub mod llama3_json;
pub mod pyjson;

use crate::config::ToolCallParser;

/// One parsed call of a whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    /// `json.dumps` of the arguments the model wrote.
    pub arguments: String,
}

/// A whole answer as the parser reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

impl Extracted {
    fn text(t: &str) -> Self {
        Extracted {
            content: Some(t.to_string()),
            calls: Vec::new(),
        }
    }
}

/// A piece of one streamed call: its start (id, type and name), argument text, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    pub index: u32,
    /// Set on the call's first piece, which also carries its id and type.
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// What streamed steps add: `content` is `None` where vLLM writes null beside calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamDelta {
    pub content: Option<String>,
    pub calls: Vec<CallDelta>,
}

impl StreamDelta {
    /// Steps merged into one chunk: argument fragments that follow each other in one call
    /// join, as vLLM's diff of those steps together would.
    pub fn append(&mut self, other: StreamDelta) {
        if let Some(c) = other.content {
            self.content.get_or_insert_with(String::new).push_str(&c);
        }
        for d in other.calls {
            match self.calls.last_mut() {
                // A call's start stays its own piece, as in vLLM's deltas.
                Some(last) if last.index == d.index && last.name.is_none() && d.name.is_none() => {
                    let args = last.arguments.get_or_insert_with(String::new);
                    args.push_str(d.arguments.as_deref().unwrap_or(""));
                }
                _ => self.calls.push(d),
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.content.is_none() && self.calls.is_empty()
    }
}

/// What a generation's streamed steps added since the last take, and whether any step
/// so far sent a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolPiece {
    pub delta: StreamDelta,
    pub called: bool,
}

/// The request's `tool_choice` as far as specd speculates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// `auto` (or unset with tools): calls are parsed out.
    Auto,
    /// `none`, or a request without tools: the text is content.
    None,
}

/// The upstream's tool parser for one chat request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tools {
    pub parser: ToolCallParser,
    pub choice: Choice,
}

impl Tools {
    /// A whole answer: content and calls (no calls with `tool_choice: none`).
    pub fn extract(&self, text: &str) -> Extracted {
        if self.choice == Choice::None {
            return Extracted::text(text);
        }
        let mut e = match self.parser {
            ToolCallParser::Hermes => hermes::extract(text),
            ToolCallParser::Llama3Json => llama3_json::extract(text),
        };
        // The serving layer: beside calls, blank content is null.
        let blank = |c: &str| hermes::strip(c).is_empty();
        if !e.calls.is_empty() && e.content.as_deref().is_some_and(blank) {
            e.content = None;
        }
        e
    }

    pub fn stream(&self) -> ToolStream {
        ToolStream {
            tools: *self,
            text: String::new(),
            hermes: hermes::Stream::default(),
            called: false,
        }
    }
}

/// The streaming parse of one answer, fed the text released with each generated token.
#[derive(Debug, Clone)]
pub struct ToolStream {
    tools: Tools,
    /// The whole text so far (vLLM's `current_text`).
    text: String,
    hermes: hermes::Stream,
    /// Some step sent a call (vLLM's `tools_streamed`).
    called: bool,
}

impl ToolStream {
    /// One step: the text released with one token; `last` when generation ends with it.
    pub fn step(&mut self, released: &str, last: bool) -> Option<StreamDelta> {
        if self.tools.choice == Choice::None {
            return (!released.is_empty()).then(|| StreamDelta {
                content: Some(released.to_string()),
                calls: Vec::new(),
            });
        }
        self.text.push_str(released);
        let mut d = match self.tools.parser {
            ToolCallParser::Hermes => self.hermes.step(&self.text)?,
            // Not reached: such a stream passes through (policy). Plain text if it were.
            ToolCallParser::Llama3Json => StreamDelta {
                content: (!released.is_empty()).then(|| released.to_string()),
                calls: Vec::new(),
            },
        };
        if last {
            // vLLM's `finalize_generation`: arguments parsed but not streamed.
            if let Some(c) = d.calls.last_mut() {
                let rest = self.hermes.remaining_args();
                c.arguments.get_or_insert_with(String::new).push_str(rest);
            }
        }
        self.called |= !d.calls.is_empty();
        Some(d)
    }

    /// Whether any call was streamed: a stop then reads `"tool_calls"`.
    pub fn called(&self) -> bool {
        self.called
    }
}

/// A tool call id shaped like vLLM's (`make_tool_call_id`: 16 random hex digits), which
/// are random, so a direct answer's differ too.
pub fn call_id() -> String {
    format!("chatcmpl-tool-{:016x}", fastrand::u64(..))
}

#[cfg(test)]
mod tests;
