//! vLLM 0.32's `kimi_k2` tool parser: the `KimiK2Parser` config of its grammar engine
//! (`vllm/parser/kimi_k2.py`) run as a tool parser (`ParserEngineToolAdapter`, over
//! `vllm/parser/engine/streaming_parser_engine.py` and `parser_engine.py`), reproduced
//! step for step. Calls are
//! `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>`;
//! the header before the arguments is the call's id, made by the model.
//!
//! The parse always starts in content (the tool adapter's start state). Markers are
//! matched by token id where the model has them (and by text until the first id is
//! seen), special tokens the config does not name are dropped, text between calls and
//! after the section is never content, and argument text streams as it comes, a
//! top-level closing brace held back until the next character. Whole answers convert
//! argument values to the called tool's schema types (`schema.rs`); streamed fragments
//! are the raw text.

use std::sync::Arc;

use super::engine::{name_and_args, name_in_args, piece, strip, Calls, Emit};
use super::engine::{Ev, Format, Run, St, Vocab};
use super::schema::Declared;
use super::{Call, CallDelta};
use crate::speculation::reasoning::engine::DecodeOne;
use crate::speculation::reasoning::lexer::Terminal;

/// The config's terminals (`THINK_START` … `ARG_START`), and a dropped special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KTerm {
    ThinkStart,
    ThinkEnd,
    SectionStart,
    SectionEnd,
    CallStart,
    CallEnd,
    ArgStart,
    Drop,
}

impl Terminal for KTerm {
    fn is_drop(self) -> bool {
        self == KTerm::Drop
    }
}

pub const SECTION_START: &str = "<|tool_calls_section_begin|>";
const MARKERS: [(&str, KTerm); 7] = [
    ("<think>", KTerm::ThinkStart),
    ("</think>", KTerm::ThinkEnd),
    (SECTION_START, KTerm::SectionStart),
    ("<|tool_calls_section_end|>", KTerm::SectionEnd),
    ("<|tool_call_begin|>", KTerm::CallStart),
    ("<|tool_call_end|>", KTerm::CallEnd),
    ("<|tool_call_argument_begin|>", KTerm::ArgStart),
];

/// The config bound to the served model's vocabulary and the request.
pub struct Grammar {
    vocab: Vocab<KTerm>,
    /// Thinking on (`chat_template_kwargs`): the config names the think markers.
    thinking: bool,
    /// No reasoning parser runs: the think markers stay text (`skip_reasoning_parsing`).
    skip_reasoning: bool,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("ids", &self.vocab.ids)
            .field("thinking", &self.thinking)
            .finish()
    }
}

impl Grammar {
    /// `vocab` maps a token's text to its id, `specials` are the tokenizer's special
    /// tokens, `one` decodes one token alone.
    pub fn new(
        thinking: bool,
        skip_reasoning: bool,
        vocab: impl Fn(&str) -> Option<u32>,
        specials: &[(String, u32)],
        one: DecodeOne,
    ) -> Self {
        let named = MARKERS
            .into_iter()
            .filter(|(_, t)| thinking || !matches!(t, KTerm::ThinkStart | KTerm::ThinkEnd))
            .map(|(text, term)| (text, term, vocab(text)));
        // The think markers are configured texts even with thinking off: never dropped.
        let vocab = Vocab::new(named, specials, &MARKERS.map(|(t, _)| t), KTerm::Drop, one);
        Grammar {
            vocab,
            thinking,
            skip_reasoning,
        }
    }
}

impl Format for Grammar {
    type T = KTerm;
    fn vocab(&self) -> &Vocab<KTerm> {
        &self.vocab
    }
    /// The config's transitions from the states the tool adapter reaches.
    fn transition(&self, st: St, term: KTerm) -> Option<(St, &'static [Emit])> {
        use KTerm::*;
        const START: &[Emit] = &[Emit::Start];
        const END: &[Emit] = &[Emit::End];
        Some(match (st, term) {
            (St::Content, ThinkEnd) if self.thinking => (St::Content, &[]),
            (St::Content, SectionStart) => (St::Preamble, &[]),
            (St::Preamble, CallStart) | (St::Between, CallStart) => (St::Name, START),
            (St::Name, ArgStart) => (St::Args, &[]),
            (St::Args, CallEnd) => (St::Between, END),
            (St::Args, SectionEnd) => (St::Preamble, END),
            (St::Preamble, SectionEnd) | (St::Between, SectionEnd) => (St::Preamble, &[]),
            _ => return None,
        })
    }
    fn markup_as_text(&self, term: KTerm) -> bool {
        self.skip_reasoning && matches!(term, KTerm::ThinkStart | KTerm::ThinkEnd)
    }
    fn json_args(&self) -> bool {
        true
    }
}

/// One call's state in the parser (`ToolCallSlot`).
#[derive(Debug, Clone, Default)]
struct Slot {
    id: Option<String>,
    name: String,
    args: String,
    name_sent: bool,
}

/// `ParserEngine` with `KimiK2Parser`'s overrides, over one answer.
pub type Parser = Run<Grammar, Slots>;

impl Parser {
    pub fn new(g: &Arc<Grammar>, suppress: bool) -> Self {
        Run::with(g, Slots::default(), suppress)
    }

    /// `extract_tool_calls_from_content`: a whole text's content and calls (ids `None`
    /// where vLLM makes a random one).
    pub fn whole(mut self, text: &str, declared: Option<&Declared>) -> (Option<String>, Vec<Call>) {
        let content = self.whole_content(text);
        let calls = self.calls.calls(declared);
        // `_strip_content_whitespace` (kimi_k2 keeps surrounding whitespace).
        let content = content.filter(|c| calls.is_empty() || !strip(c).is_empty());
        (content.filter(|c| !c.is_empty()), calls)
    }
}

/// The calls' states (`_tool_slots`) and kimi_k2's handling of tool events.
#[derive(Debug, Clone, Default)]
pub struct Slots(Vec<Slot>);

impl Calls for Slots {
    fn on(&mut self, ev: Ev, calls: &mut Vec<CallDelta>) {
        match ev {
            Ev::Start(i) => self.slot(i),
            Ev::Name(i, v) => {
                self.slot(i);
                self.0[i].name.push_str(&v);
            }
            Ev::Arg(i, v) => self.arg_chunk(i, &v, calls),
            Ev::End(i) => self.end(i, calls),
            Ev::Text(_) => {}
        }
    }

    fn any(&self) -> bool {
        !self.0.is_empty()
    }
}

impl Slots {
    /// `_build_extracted_result`.
    fn calls(&self, declared: Option<&Declared>) -> Vec<Call> {
        let mut out = Vec::new();
        for slot in &self.0 {
            if slot.name.is_empty() && slot.args.is_empty() {
                continue;
            }
            let mut name = strip(&slot.name).to_string();
            let raw = strip(&slot.args);
            let args = if name.is_empty() && !raw.is_empty() {
                let (n, a) = name_and_args(raw);
                name = n;
                a
            } else if raw.is_empty() {
                "{}".to_string()
            } else {
                raw.to_string()
            };
            if name.is_empty() {
                continue;
            }
            let arguments = match declared {
                Some(d) => d.fix(&args, &name),
                None => args,
            };
            out.push(Call {
                id: slot.id.clone(),
                name,
                arguments,
            });
        }
        out
    }

    fn slot(&mut self, i: usize) {
        while self.0.len() <= i {
            self.0.push(Slot::default());
        }
    }

    /// `_handle_arg_chunk` with kimi_k2's override: the first chunk also sends the name
    /// (read from the header), then itself.
    fn arg_chunk(&mut self, i: usize, value: &str, calls: &mut Vec<CallDelta>) {
        self.slot(i);
        let sent_before = self.0[i].name_sent;
        self.0[i].args.push_str(value);
        if !sent_before {
            let header = if self.0[i].name.is_empty() {
                name_in_args(&self.0[i].args).map(str::to_string)
            } else {
                Some(self.0[i].name.clone())
            };
            self.send_name(i, header.as_deref(), calls);
            if !value.is_empty() && self.0[i].name_sent {
                calls.push(piece(i, None, None, Some(value)));
            }
        } else if !value.is_empty() {
            calls.push(piece(i, None, None, Some(value)));
        }
    }

    /// kimi_k2's `_emit_name_delta`: the header gives the id and the name.
    fn send_name(&mut self, i: usize, header: Option<&str>, calls: &mut Vec<CallDelta>) {
        let Some((id, name)) = header.and_then(id_and_name) else {
            self.0[i].name.clear();
            return;
        };
        if name.is_empty() {
            self.0[i].name.clear();
            return;
        }
        let s = &mut self.0[i];
        s.id = Some(id);
        s.name = name.clone();
        s.name_sent = true;
        calls.push(piece(i, s.id.clone(), Some(name), None));
    }

    /// `_handle_tool_end` with kimi_k2's override: a call whose name was never sent
    /// sends it now, with empty arguments.
    fn end(&mut self, i: usize, calls: &mut Vec<CallDelta>) {
        if i >= self.0.len() {
            return;
        }
        let s = &mut self.0[i];
        if s.name_sent {
            return;
        }
        if let Some((id, name)) = id_and_name(&s.name).filter(|(_, n)| !n.is_empty()) {
            s.id = Some(id);
            s.name = name;
        }
        let name = if s.name.is_empty() {
            name_in_args(&s.args).unwrap_or("").to_string()
        } else {
            s.name.clone()
        };
        if name.is_empty() {
            return;
        }
        s.name = name.clone();
        s.name_sent = true;
        calls.push(piece(i, s.id.clone(), Some(name), Some("")));
    }
}

/// `_extract_tool_id_and_name`: `re.match(r"(?P<id>.+:\d+)", header.strip())`, the
/// name being the id's part before the first colon, less `functions.`.
fn id_and_name(header: &str) -> Option<(String, String)> {
    let line = strip(header).split('\n').next().unwrap_or("");
    let b = line.as_bytes();
    // Greedy `.+` backs off to the last colon that a digit follows (not at the start).
    let colon = (1..b.len())
        .rev()
        .find(|&k| b[k] == b':' && b.get(k + 1).is_some_and(u8::is_ascii_digit))?;
    let end = colon
        + 1
        + b[colon + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
    let id = strip(&line[..end]).to_string();
    let first = id.split(':').next().unwrap_or("");
    let name = first
        .strip_prefix("functions.")
        .unwrap_or(first)
        .to_string();
    Some((id, name))
}

/// The kimi_k2 reasoning parser's `extract_content_ids` of the step that ends
/// reasoning: what the tool phase is fed of its tokens.
pub fn content_ids(g: &Grammar, id: u32) -> Vec<u32> {
    if !g.thinking {
        return vec![id];
    }
    match g.vocab.ids.get(&id) {
        Some(KTerm::SectionStart) => vec![id],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
