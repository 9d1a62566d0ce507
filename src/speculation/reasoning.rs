//! Splitting a chat answer into `reasoning` and `content` as vLLM's `--reasoning-parser`
//! does (vLLM 0.32), so that a speculated answer reads exactly as a direct one.
//!
//! `deepseek_r1` (`vllm/reasoning/basic_parsers.py`, `deepseek_r1_reasoning_parser.py`
//! and `vllm/parser/abstract_parser.py`) splits the two shapes differently, and so does
//! this module:
//! - a whole response: by text. Text up to and including the first `<think>` is
//!   dropped; with no `</think>` after that, everything is reasoning and `content` is
//!   null; else reasoning is the text before the first `</think>`, content the text
//!   after it (null when empty).
//! - a stream: by token id, one generated token per step (what vLLM's engine hands its
//!   front end on an idle server). Whether reasoning is still open is first read from the
//!   prompt (its last think marker; none: open). While open, a step that is only the
//!   start or the end token emits nothing, and the end token closes reasoning; every
//!   other step is reasoning. Once closed, every step is content, markers included.
//!
//! `qwen3` and `kimi_k2` run on vLLM's grammar engine: `engine.rs`. In front of SGLang,
//! its own `deepseek-r1` (`sglang.rs`) splits the text of each chunk instead.

pub mod engine;
pub mod lexer;
pub mod sglang;

use std::sync::Arc;

use serde_json::Value;

use crate::config::ReasoningParser;
use crate::tokens::ModelTokenizer;
use crate::upstream::detect::UpstreamKind;
use engine::{Grammar, Texts};

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// A reasoning parser bound to the served model's vocabulary.
#[derive(Debug, Clone)]
pub struct Reasoning {
    pub parser: ReasoningParser,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// `deepseek_r1`: the think-token ids.
    R1 { start_id: u32, end_id: u32 },
    /// A grammar-engine parser.
    Engine(Arc<Grammar>),
    /// SGLang's `deepseek-r1`: the ids `</think>` encodes to (for its token count).
    Sglang { end_ids: Vec<u32> },
}

/// One streamed piece of an answer: the reasoning and the content it adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
    /// Reasoning was closed when this piece was taken (an empty last delta is then
    /// `content`).
    pub closed: bool,
    /// The last step added no delta at all: an empty last chunk is `{}`.
    pub bare: bool,
    /// The reasoning token count the parser kept while streaming, where it keeps one.
    pub counted: Option<u32>,
}

impl Split {
    pub fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.closed = other.closed;
        self.bare = other.bare;
        self.counted = other.counted.or(self.counted);
    }
}

impl Reasoning {
    /// The parser for this tokenizer and request (`chat_template_kwargs`, which switch
    /// thinking off); `None` when specd cannot reproduce it: a model without the think
    /// tokens (vLLM itself refuses to start then), or a switch of a shape specd does not
    /// read.
    pub fn resolve(
        parser: ReasoningParser,
        tok: &Arc<ModelTokenizer>,
        kwargs: Option<&Value>,
    ) -> Option<Self> {
        let start_id = tok.token_id(THINK_START)?;
        let end_id = tok.token_id(THINK_END)?;
        let kind = match parser {
            ReasoningParser::DeepseekR1 => Kind::R1 { start_id, end_id },
            ReasoningParser::Qwen3 | ReasoningParser::KimiK2 => {
                let thinking = thinking(parser, kwargs)?;
                let (one, all) = (tok.clone(), tok.clone());
                let texts = Texts {
                    one: Arc::new(move |id| one.token_text(id)),
                    all: Arc::new(move |ids| all.decode(ids)),
                };
                let specials = tok.special_tokens();
                let g = Grammar::new(parser, thinking, |t| tok.token_id(t), &specials, texts);
                Kind::Engine(Arc::new(g))
            }
        };
        Some(Reasoning { parser, kind })
    }

    /// SGLang's `deepseek-r1` for this tokenizer; `None` where `</think>` is not one
    /// token (specd does not count SGLang's reasoning tokens then).
    pub fn sglang_r1(tok: &ModelTokenizer) -> Option<Self> {
        let end = tok.token_id(THINK_END)?;
        Some(Reasoning {
            parser: ReasoningParser::DeepseekR1,
            kind: Kind::Sglang { end_ids: vec![end] },
        })
    }

    /// Whose parser this is.
    pub fn dialect(&self) -> UpstreamKind {
        match self.kind {
            Kind::Sglang { .. } => UpstreamKind::Sglang,
            _ => UpstreamKind::Vllm,
        }
    }

    #[cfg(test)]
    pub fn with_ids(parser: ReasoningParser, start_id: u32, end_id: u32) -> Self {
        Reasoning {
            parser,
            kind: Kind::R1 { start_id, end_id },
        }
    }

    #[cfg(test)]
    pub fn with_grammar(parser: ReasoningParser, g: Grammar) -> Self {
        Reasoning {
            parser,
            kind: Kind::Engine(Arc::new(g)),
        }
    }

    /// The grammar-engine parsers keep special tokens in the text (their
    /// `adjust_request`).
    pub fn keeps_special_tokens(&self) -> bool {
        matches!(self.kind, Kind::Engine(_))
    }

    /// A whole answer's `(reasoning, content)`; `None` where vLLM writes null.
    pub fn split_full(&self, text: &str) -> (Option<String>, Option<String>) {
        if let Kind::Engine(g) = &self.kind {
            return g.split_full(text);
        }
        if let Kind::Sglang { .. } = self.kind {
            // SGLang: no reasoning reads null, the content is always text.
            let (r, c) = sglang::split_full(text);
            return ((!r.is_empty()).then_some(r), Some(c));
        }
        let rest = match text.split_once(THINK_START) {
            Some((_, after)) => after,
            None => text,
        };
        match rest.split_once(THINK_END) {
            None => (Some(rest.to_string()), None),
            Some((r, c)) => (Some(r.to_string()), (!c.is_empty()).then(|| c.to_string())),
        }
    }

    /// The streaming splitter of one answer to `prompt`.
    pub fn stream(&self, prompt: &[u32]) -> StreamSplit {
        let inner = match &self.kind {
            Kind::R1 { start_id, end_id } => Inner::R1 {
                start_id: *start_id,
                end_id: *end_id,
                ended: ended_in(*start_id, *end_id, prompt),
            },
            Kind::Engine(g) => Inner::Engine(Box::new(engine::Stream::new(g, prompt))),
            Kind::Sglang { .. } => Inner::Sglang(sglang::Stream::default()),
        };
        StreamSplit { inner }
    }

    /// vLLM's `count_reasoning_tokens` of a whole answer's output `ids`.
    pub fn reasoning_tokens(&self, ids: &[u32]) -> u32 {
        match &self.kind {
            Kind::R1 { start_id, end_id } => r1_reasoning_tokens(*start_id, *end_id, ids),
            Kind::Engine(g) => g.count(ids),
            Kind::Sglang { end_ids } => sglang::reasoning_tokens(ids, end_ids),
        }
    }
}

/// `chat_template_kwargs`' thinking switch as each parser reads it (`None`: a shape
/// specd does not read). qwen3: `enable_thinking`, on unless false; kimi_k2: on unless
/// `thinking` or `enable_thinking` is given, then on if either is true.
pub(crate) fn thinking(parser: ReasoningParser, kwargs: Option<&Value>) -> Option<bool> {
    let kwargs = match kwargs {
        None | Some(Value::Null) => return Some(true),
        Some(Value::Object(m)) => m,
        Some(_) => return None,
    };
    let flag = |k: &str| match kwargs.get(k) {
        None => Some(None),
        Some(Value::Bool(b)) => Some(Some(*b)),
        Some(_) => None,
    };
    match parser {
        ReasoningParser::KimiK2 => match (flag("thinking")?, flag("enable_thinking")?) {
            (None, None) => Some(true),
            (a, b) => Some(a.unwrap_or(false) || b.unwrap_or(false)),
        },
        _ => Some(flag("enable_thinking")?.unwrap_or(true)),
    }
}

/// vLLM's `is_reasoning_end` for `deepseek_r1`: the last think marker is an end marker.
fn ended_in(start_id: u32, end_id: u32, ids: &[u32]) -> bool {
    ids.iter()
        .rev()
        .find(|&&t| t == start_id || t == end_id)
        .is_some_and(|&t| t == end_id)
}

/// `deepseek_r1`'s `count_reasoning_tokens`: tokens inside start/end markers of the
/// output (an unopened block, as a template that opens it in the prompt leaves, counts 0).
fn r1_reasoning_tokens(start_id: u32, end_id: u32, ids: &[u32]) -> u32 {
    let (mut count, mut depth) = (0u32, 0u32);
    for &t in ids {
        if t == start_id {
            depth += 1;
        } else if t == end_id {
            depth = depth.saturating_sub(1);
        } else if depth > 0 {
            count += 1;
        }
    }
    count
}

/// The streamed split of one answer, fed one generated token at a time.
#[derive(Debug)]
pub struct StreamSplit {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    R1 {
        start_id: u32,
        end_id: u32,
        /// Reasoning has been closed (by the prompt or an end token): the rest is content.
        ended: bool,
    },
    Engine(Box<engine::Stream>),
    Sglang(sglang::Stream),
}

impl StreamSplit {
    /// One generated token `id` and the text released with it; `last` when generation
    /// ends with it.
    pub fn step(&mut self, id: u32, text: &str, last: bool, out: &mut Split) {
        match &mut self.inner {
            Inner::R1 {
                start_id,
                end_id,
                ended,
            } => {
                if *ended {
                    out.content.push_str(text);
                } else if id == *end_id {
                    *ended = true;
                } else if id != *start_id {
                    out.reasoning.push_str(text);
                }
            }
            Inner::Engine(s) => engine_step(s, Some(id), text, last, out),
            Inner::Sglang(s) => sglang_step(s, text, last, out),
        }
    }

    /// SGLang hands the tool parser the normal text of every chunk, reasoning open or
    /// not; vLLM only once reasoning has ended.
    pub fn feeds_tools_while_open(&self) -> bool {
        matches!(self.inner, Inner::Sglang(_))
    }

    /// Whether reasoning has been closed: the rest of the answer is content.
    pub fn is_closed(&self) -> bool {
        match &self.inner {
            Inner::R1 { ended, .. } => *ended,
            Inner::Engine(s) => s.is_closed(),
            Inner::Sglang(s) => s.is_closed(),
        }
    }

    /// What the tool phase is fed of the tokens of the step that ended reasoning (the
    /// reasoning parser's `extract_content_ids` of that step's one token: deepseek_r1's
    /// keeps only tokens after its end token, none of a one-token step).
    pub fn content_ids(&self, id: u32) -> Vec<u32> {
        match &self.inner {
            Inner::R1 { .. } => Vec::new(),
            Inner::Sglang(_) => vec![id],
            Inner::Engine(s) => s.content_ids(id),
        }
    }

    /// The parser's own reasoning token count of the stream, where it keeps one.
    pub fn counted(&self) -> Option<u32> {
        match &self.inner {
            Inner::R1 { .. } | Inner::Sglang(_) => None,
            Inner::Engine(s) => s.counted(),
        }
    }

    /// Text released without a token (held back, flushed at the end): where it stands.
    pub fn held(&mut self, text: &str, out: &mut Split) {
        match &mut self.inner {
            Inner::R1 { ended: true, .. } => out.content.push_str(text),
            Inner::R1 { .. } => out.reasoning.push_str(text),
            Inner::Engine(s) => engine_step(s, None, text, true, out),
            Inner::Sglang(s) => sglang_step(s, text, true, out),
        }
    }
}

/// One SGLang chunk, and on the last its `parse_stream_end`.
fn sglang_step(s: &mut sglang::Stream, text: &str, last: bool, out: &mut Split) {
    let (r, c) = s.step(text);
    out.reasoning.push_str(&r);
    out.content.push_str(&c);
    if last {
        let (r, c) = s.finish();
        out.reasoning.push_str(&r);
        out.content.push_str(&c);
    }
}

fn engine_step(s: &mut engine::Stream, id: Option<u32>, text: &str, last: bool, out: &mut Split) {
    let d = s.step(id, text, last);
    out.bare = d.is_none();
    if let Some(d) = d {
        out.reasoning.push_str(d.reasoning.as_deref().unwrap_or(""));
        out.content.push_str(d.content.as_deref().unwrap_or(""));
    }
}

#[cfg(test)]
mod tests;
