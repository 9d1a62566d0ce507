//! Splitting a chat answer into `reasoning` and `content` as vLLM's `--reasoning-parser`
//! does (vLLM 0.32, `vllm/reasoning/basic_parsers.py`, `deepseek_r1_reasoning_parser.py`
//! and `vllm/parser/abstract_parser.py`), so that a speculated answer reads exactly as a
//! direct one.
//!
//! vLLM splits the two shapes differently, and so does this module:
//! - a whole response: by text. Text up to and including the first `<think>` is
//!   dropped; with no `</think>` after that, everything is reasoning and `content` is
//!   null; else reasoning is the text before the first `</think>`, content the text
//!   after it (null when empty).
//! - a stream: by token id, one generated token per step (what vLLM's engine hands its
//!   front end on an idle server). Whether reasoning is still open is first read from the
//!   prompt (its last think marker; none: open). While open, a step that is only the
//!   start or the end token emits nothing, and the end token closes reasoning; every
//!   other step is reasoning. Once closed, every step is content, markers included.

use crate::config::ReasoningParser;
use crate::tokens::ModelTokenizer;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// A reasoning parser bound to the served model's think-token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reasoning {
    pub parser: ReasoningParser,
    start_id: u32,
    end_id: u32,
}

/// One streamed piece of an answer: the reasoning and the content it adds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
    /// Reasoning was closed when this piece was taken (an empty last delta is then
    /// `content`).
    pub closed: bool,
}

impl Split {
    pub fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.closed = other.closed;
    }
}

impl Reasoning {
    /// The parser for this tokenizer; `None` when specd cannot reproduce it with this
    /// model (vLLM itself refuses to start without the think tokens).
    pub fn resolve(parser: ReasoningParser, tok: &ModelTokenizer) -> Option<Self> {
        Some(Reasoning {
            parser,
            start_id: tok.token_id(THINK_START)?,
            end_id: tok.token_id(THINK_END)?,
        })
    }

    #[cfg(test)]
    pub fn with_ids(parser: ReasoningParser, start_id: u32, end_id: u32) -> Self {
        Reasoning {
            parser,
            start_id,
            end_id,
        }
    }

    /// A whole answer's `(reasoning, content)`; `content` is `None` where vLLM writes null.
    pub fn split_full(&self, text: &str) -> (String, Option<String>) {
        let rest = match text.split_once(THINK_START) {
            Some((_, after)) => after,
            None => text,
        };
        match rest.split_once(THINK_END) {
            None => (rest.to_string(), None),
            Some((r, c)) => (r.to_string(), (!c.is_empty()).then(|| c.to_string())),
        }
    }

    /// The streaming splitter of one answer to `prompt`.
    pub fn stream(&self, prompt: &[u32]) -> StreamSplit {
        StreamSplit {
            r: *self,
            ended: self.ended_in(prompt),
        }
    }

    /// vLLM's `is_reasoning_end`: the last think marker is an end marker.
    fn ended_in(&self, ids: &[u32]) -> bool {
        ids.iter()
            .rev()
            .find(|&&t| t == self.start_id || t == self.end_id)
            .is_some_and(|&t| t == self.end_id)
    }

    /// vLLM's `count_reasoning_tokens`: tokens inside start/end markers of the output
    /// (an unopened block, as a template that opens it in the prompt leaves, counts 0).
    pub fn reasoning_tokens(&self, ids: impl IntoIterator<Item = u32>) -> u32 {
        let (mut count, mut depth) = (0u32, 0u32);
        for t in ids {
            if t == self.start_id {
                depth += 1;
            } else if t == self.end_id {
                depth = depth.saturating_sub(1);
            } else if depth > 0 {
                count += 1;
            }
        }
        count
    }
}

/// The streamed split of one answer, fed one generated token at a time.
#[derive(Debug, Clone)]
pub struct StreamSplit {
    r: Reasoning,
    /// Reasoning has been closed (by the prompt or an end token): the rest is content.
    ended: bool,
}

impl StreamSplit {
    /// One generated token `id` and the text released with it.
    pub fn step(&mut self, id: u32, text: &str, out: &mut Split) {
        if self.ended {
            out.content.push_str(text);
        } else if id == self.r.end_id {
            self.ended = true;
        } else if id != self.r.start_id {
            out.reasoning.push_str(text);
        }
    }

    /// Whether reasoning has been closed: the rest of the answer is content.
    pub fn is_closed(&self) -> bool {
        self.ended
    }

    /// Text released without a token (held back, flushed at the end): where it stands.
    pub fn held(&self, text: &str, out: &mut Split) {
        if self.ended {
            out.content.push_str(text);
        } else {
            out.reasoning.push_str(text);
        }
    }
}

#[cfg(test)]
mod tests;
