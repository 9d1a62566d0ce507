//! vLLM 0.32's `qwen3_coder` tool parser: the `Qwen3Parser` config of its grammar engine
//! (`vllm/parser/qwen3.py`, `qwen3_config`) run as a tool parser
//! (`Qwen3EngineToolParser`, a `ParserEngineToolAdapter`), reproduced step for step.
//! Calls are
//! `<tool_call><function=NAME><parameter=P>VALUE</parameter>…</function></tool_call>`.
//!
//! The engine (`engine.rs`) hands on the raw text between `<function=NAME>` and
//! `</function>`; the parser reads it as parameters (`convert.rs`), types the values by
//! the called tool's schema (`schema.rs`) and streams the part of that JSON that can no
//! longer change: the arguments streamed and the whole answer's are the same JSON. Ids
//! are random (vLLM's `make_tool_call_id`), content is stripped beside calls.

use std::sync::Arc;

use super::engine::{name_and_args, name_in_args, piece, strip, Calls, Emit};
use super::engine::{Ev, Format, Run, St, Vocab};
use super::schema::Declared;
use super::{Call, CallDelta};
use crate::speculation::reasoning::engine::DecodeOne;
use crate::speculation::reasoning::lexer::Terminal;

mod convert;

/// The config's terminals, and a dropped special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QTerm {
    ThinkStart,
    ThinkEnd,
    ToolStart,
    ToolEnd,
    FuncPrefix,
    FuncEnd,
    ParamStart,
    ParamEnd,
    CloseAngle,
    Drop,
}

impl Terminal for QTerm {
    fn is_drop(self) -> bool {
        self == QTerm::Drop
    }
}

/// The terminals, and whether each is matched by token id too (`token_id_terminals`).
const MARKERS: [(&str, QTerm, bool); 9] = [
    ("<think>", QTerm::ThinkStart, true),
    ("</think>", QTerm::ThinkEnd, true),
    ("<tool_call>", QTerm::ToolStart, true),
    ("</tool_call>", QTerm::ToolEnd, true),
    ("<function=", QTerm::FuncPrefix, false),
    ("</function>", QTerm::FuncEnd, false),
    ("<parameter=", QTerm::ParamStart, false),
    ("</parameter>", QTerm::ParamEnd, false),
    (">", QTerm::CloseAngle, false),
];

/// The config bound to the served model's vocabulary.
pub struct Grammar {
    vocab: Vocab<QTerm>,
    /// No reasoning parser runs: the think markers stay text (`skip_reasoning_parsing`).
    skip_reasoning: bool,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("ids", &self.vocab.ids)
            .finish()
    }
}

impl Grammar {
    /// `vocab` maps a token's text to its id, `specials` are the tokenizer's special
    /// tokens, `one` decodes one token alone.
    pub fn new(
        skip_reasoning: bool,
        vocab: impl Fn(&str) -> Option<u32>,
        specials: &[(String, u32)],
        one: DecodeOne,
    ) -> Self {
        let named =
            MARKERS.map(|(text, term, by_id)| (text, term, by_id.then(|| vocab(text)).flatten()));
        let vocab = Vocab::new(named, specials, &MARKERS.map(|(t, ..)| t), QTerm::Drop, one);
        Grammar {
            vocab,
            skip_reasoning,
        }
    }
}

impl Format for Grammar {
    type T = QTerm;
    fn vocab(&self) -> &Vocab<QTerm> {
        &self.vocab
    }
    /// `qwen3_config`'s transitions from the states the tool adapter reaches.
    fn transition(&self, st: St, term: QTerm) -> Option<(St, &'static [Emit])> {
        use QTerm::*;
        const START: &[Emit] = &[Emit::Start];
        const END: &[Emit] = &[Emit::End];
        const ARG: &[Emit] = &[Emit::Arg];
        Some(match (st, term) {
            (St::Content, ThinkEnd) => (St::Content, &[]),
            (St::Content | St::Between, ToolStart) => (St::Preamble, START),
            (St::Content | St::Between, FuncPrefix) => (St::Name, START),
            (St::Preamble, ToolEnd) => (St::Content, END),
            (St::Preamble, FuncPrefix) => (St::Name, &[]),
            (St::Name, CloseAngle) => (St::Args, &[]),
            (St::Name | St::Args, FuncEnd) => (St::Between, END),
            (St::Args, ParamStart | ParamEnd) => (St::Args, ARG),
            (St::Between, ToolEnd) => (St::Content, &[]),
            _ => return None,
        })
    }
    fn markup_as_text(&self, term: QTerm) -> bool {
        self.skip_reasoning && matches!(term, QTerm::ThinkStart | QTerm::ThinkEnd)
    }
    fn json_args(&self) -> bool {
        false
    }
}

/// One call's state in the parser (`ToolCallSlot`).
#[derive(Debug, Clone, Default)]
struct Slot {
    name: String,
    args: String,
    name_sent: bool,
    /// `string_keys`: set with the name.
    string_keys: Option<Vec<String>>,
    /// The converted arguments streamed so far.
    streamed: String,
}

/// `ParserEngine` with the qwen3 config, over one answer.
pub type Parser = Run<Grammar, Slots>;

impl Parser {
    /// `declared`: the request's tools (`None` without tools).
    pub fn new(g: &Arc<Grammar>, declared: Option<&Declared>, suppress: bool) -> Self {
        let slots = Slots {
            slots: Vec::new(),
            declared: declared.cloned(),
        };
        Run::with(g, slots, suppress)
    }

    /// `extract_tool_calls_from_content`: a whole text's content and calls (ids are
    /// random: `None`).
    pub fn whole(mut self, text: &str) -> (Option<String>, Vec<Call>) {
        let content = self.whole_content(text);
        let calls = self.calls.calls();
        // `_strip_content_whitespace` (qwen3 strips content beside calls).
        let content = match content {
            Some(c) if !calls.is_empty() => Some(strip(&c).to_string()),
            c => c,
        };
        (content.filter(|c| !c.is_empty()), calls)
    }
}

/// The calls' states (`_tool_slots`) and the base `ParserEngine`'s handling of tool
/// events, with the qwen3 argument converter.
#[derive(Debug, Clone)]
pub struct Slots {
    slots: Vec<Slot>,
    declared: Option<Declared>,
}

impl Calls for Slots {
    fn on(&mut self, ev: Ev, calls: &mut Vec<CallDelta>) {
        match ev {
            Ev::Start(i) => self.slot(i),
            Ev::Name(i, v) => {
                self.slot(i);
                self.slots[i].name.push_str(&v);
            }
            Ev::Arg(i, v) => self.arg_chunk(i, &v, calls),
            Ev::End(i) => self.end(i, calls),
            Ev::Text(_) => {}
        }
    }

    fn any(&self) -> bool {
        !self.slots.is_empty()
    }
}

impl Slots {
    fn slot(&mut self, i: usize) {
        while self.slots.len() <= i {
            self.slots.push(Slot::default());
        }
    }

    /// `_fix_arg_types`.
    fn fix(&self, args: String, name: &str) -> String {
        match &self.declared {
            Some(d) => d.fix(&args, name),
            None => args,
        }
    }

    /// `_build_extracted_result`.
    fn calls(&self) -> Vec<Call> {
        let mut out = Vec::new();
        for slot in &self.slots {
            if slot.name.is_empty() && slot.args.is_empty() {
                continue;
            }
            let mut name = strip(&slot.name).to_string();
            let args = if name.is_empty() && !strip(&slot.args).is_empty() {
                let (n, a) = name_and_args(strip(&slot.args));
                name = n;
                a
            } else if !strip(&slot.args).is_empty() {
                convert::convert(&slot.args, false)
            } else {
                "{}".to_string()
            };
            if name.is_empty() {
                continue;
            }
            let arguments = self.fix(args, &name);
            out.push(Call {
                id: None,
                name,
                arguments,
            });
        }
        out
    }

    /// `_emit_name_delta`.
    fn send_name(&mut self, i: usize, name: String, calls: &mut Vec<CallDelta>) {
        if name.is_empty() {
            return;
        }
        let keys = self.declared.as_ref().and_then(|d| d.string_keys(&name));
        let s = &mut self.slots[i];
        s.name = name.clone();
        s.name_sent = true;
        s.string_keys = keys;
        calls.push(piece(i, None, Some(name), None));
    }

    /// `_handle_arg_chunk`: the first chunk sends the name; later ones what the
    /// converted arguments add.
    fn arg_chunk(&mut self, i: usize, value: &str, calls: &mut Vec<CallDelta>) {
        self.slot(i);
        self.slots[i].args.push_str(value);
        let s = &self.slots[i];
        if !s.name_sent {
            if !s.name.is_empty() {
                self.send_name(i, s.name.clone(), calls);
            } else if !value.is_empty() {
                if let Some(n) = name_in_args(&s.args).map(str::to_string) {
                    self.send_name(i, n, calls);
                }
            }
        } else if !value.is_empty() {
            if let Some(d) = self.arg_delta(i) {
                calls.push(piece(i, None, None, Some(&d)));
            }
        }
    }

    /// `_compute_arg_delta`: what the safe prefix of the converted arguments adds.
    fn arg_delta(&mut self, i: usize) -> Option<String> {
        let s = &self.slots[i];
        let mut current = convert::convert(&s.args, true);
        if !s.name.is_empty() {
            current = self.fix(current, &s.name);
        }
        let s = &mut self.slots[i];
        let safe = convert::safe_prefix(&current, s.string_keys.as_deref());
        if safe.is_empty() || safe == s.streamed || !safe.starts_with(s.streamed.as_str()) {
            return None;
        }
        let diff = safe[s.streamed.len()..].to_string();
        s.streamed = safe.to_string();
        Some(diff)
    }

    /// `_flush_arg_converter`: what the finished arguments add to those streamed.
    fn flush(&mut self, i: usize) -> Option<String> {
        let s = &self.slots[i];
        let mut done = convert::convert(&s.args, false);
        if !done.is_empty() {
            done = self.fix(done, &s.name);
        }
        let s = &mut self.slots[i];
        if done.len() <= s.streamed.len() || !done.starts_with(s.streamed.as_str()) {
            return None;
        }
        let diff = done[s.streamed.len()..].to_string();
        s.streamed = done;
        Some(diff)
    }

    /// `_handle_tool_end`: the rest of the arguments; a call whose name was never sent
    /// sends it now, with them.
    fn end(&mut self, i: usize, calls: &mut Vec<CallDelta>) {
        if i >= self.slots.len() {
            return;
        }
        let mut rest = self.flush(i);
        if !self.slots[i].name_sent {
            let s = &self.slots[i];
            let name = if s.name.is_empty() {
                name_in_args(&s.args).unwrap_or("").to_string()
            } else {
                s.name.clone()
            };
            if !name.is_empty() {
                let keys = self.declared.as_ref().and_then(|d| d.string_keys(&name));
                let s = &mut self.slots[i];
                s.name = name.clone();
                s.name_sent = true;
                s.string_keys = keys;
                let args = rest.take().unwrap_or_default();
                calls.push(piece(i, None, Some(name), Some(&args)));
            }
        }
        if let Some(r) = rest.filter(|r| !r.is_empty() && self.slots[i].name_sent) {
            calls.push(piece(i, None, None, Some(&r)));
        }
    }
}

#[cfg(test)]
mod tests;
