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

use std::collections::HashMap;
use std::sync::Arc;

use super::schema::Declared;
use super::{Call, CallDelta, StreamDelta};
use crate::speculation::reasoning::engine::DecodeOne;
use crate::speculation::reasoning::lexer::{Literal, Terminal};
use engine::{Engine, Ev};

mod engine;

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
    lits: Vec<Literal<KTerm>>,
    ids: HashMap<u32, KTerm>,
    /// Thinking on (`chat_template_kwargs`): the config names the think markers.
    thinking: bool,
    /// No reasoning parser runs: the think markers stay text (`skip_reasoning_parsing`).
    skip_reasoning: bool,
    one: DecodeOne,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("ids", &self.ids)
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
        let named: Vec<(&str, KTerm)> = MARKERS
            .into_iter()
            .filter(|(_, t)| thinking || !matches!(t, KTerm::ThinkStart | KTerm::ThinkEnd))
            .collect();
        let (mut lits, mut ids) = (Vec::new(), HashMap::new());
        for &(text, term) in &named {
            let id = vocab(text);
            if let Some(id) = id {
                ids.insert(id, term);
            }
            lits.push(Literal {
                text: text.to_string(),
                term,
                by_id: id.is_some(),
            });
        }
        // The think markers are configured texts even with thinking off: never dropped.
        for (text, id) in specials {
            if MARKERS.iter().all(|(t, _)| t != text) {
                ids.insert(*id, KTerm::Drop);
                lits.push(Literal {
                    text: text.clone(),
                    term: KTerm::Drop,
                    by_id: true,
                });
            }
        }
        Grammar {
            lits,
            ids,
            thinking,
            skip_reasoning,
            one,
        }
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
#[derive(Debug, Clone)]
pub struct Parser {
    engine: Engine,
    slots: Vec<Slot>,
    deferred: String,
    has_nonws: bool,
    /// `tool_choice: "none"` with tools: tool events are ignored.
    suppress: bool,
}

/// A step's content and call pieces (`DeltaMessage`), before the serving layer.
type Delta = Option<StreamDelta>;

impl Parser {
    pub fn new(g: &Arc<Grammar>, suppress: bool) -> Self {
        Parser {
            engine: Engine::new(g.clone()),
            slots: Vec::new(),
            deferred: String::new(),
            has_nonws: false,
            suppress,
        }
    }

    /// `extract_tool_calls_streaming`: one step's text and tokens.
    pub fn step(&mut self, text: &str, ids: &[u32]) -> Delta {
        let one = self.engine.g.one.clone();
        let step: Vec<(u32, String)> = ids.iter().map(|&i| (i, one(i))).collect();
        let events = self.engine.feed(text, &step);
        self.delta(events, false)
    }

    /// `finish_streaming`: what the engine still holds.
    pub fn finish(&mut self) -> Delta {
        let events = self.engine.finish();
        if events.is_empty() && self.deferred.is_empty() {
            return None;
        }
        self.delta(events, true)
    }

    /// `extract_tool_calls_from_content`: a whole text's content and calls (ids `None`
    /// where vLLM makes a random one).
    pub fn whole(mut self, text: &str, declared: Option<&Declared>) -> (Option<String>, Vec<Call>) {
        let mut events = self.engine.feed(text, &[]);
        events.extend(self.engine.finish());
        let content = self.delta(events, true).and_then(|d| d.content);
        let calls = self.calls(declared);
        // `_strip_content_whitespace` (kimi_k2 keeps surrounding whitespace).
        let content = content.filter(|c| calls.is_empty() || !strip(c).is_empty());
        (content.filter(|c| !c.is_empty()), calls)
    }

    /// `_build_extracted_result`.
    fn calls(&mut self, declared: Option<&Declared>) -> Vec<Call> {
        let mut out = Vec::new();
        for slot in &self.slots {
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

    /// `_events_to_delta`.
    fn delta(&mut self, events: Vec<Ev>, finished: bool) -> Delta {
        if events.is_empty() && self.deferred.is_empty() {
            return None;
        }
        let mut calls: Vec<CallDelta> = Vec::new();
        let mut content = String::new();
        let carried = self.deferred.clone();
        let mut seen_tool = false;
        for ev in events {
            if let Ev::Text(t) = ev {
                if seen_tool {
                    self.deferred.push_str(&t);
                } else {
                    content.push_str(&t);
                }
                continue;
            }
            if self.suppress {
                continue;
            }
            seen_tool = true;
            match ev {
                Ev::Start(i) => self.slot(i),
                Ev::Name(i, v) => {
                    self.slot(i);
                    self.slots[i].name.push_str(&v);
                }
                Ev::Arg(i, v) => self.arg_chunk(i, &v, &mut calls),
                Ev::End(i) => self.end(i, &mut calls),
                Ev::Text(_) => {}
            }
        }
        let calls = coalesce(calls);
        if !self.deferred.is_empty() && (!seen_tool || calls.is_empty()) {
            let now = self.deferred[carried.len()..].to_string();
            content = carried + &content + &now;
            self.deferred.clear();
        }
        if !self.has_nonws && !content.is_empty() {
            if !strip(&content).is_empty() {
                self.has_nonws = true;
            } else if !self.slots.is_empty() {
                // `drop_whitespace_only_content_before_tools`.
                content.clear();
            } else if !finished {
                self.deferred = std::mem::take(&mut content);
            }
        }
        let content = (!content.is_empty()).then_some(content);
        (content.is_some() || !calls.is_empty()).then_some(StreamDelta { content, calls })
    }

    fn slot(&mut self, i: usize) {
        while self.slots.len() <= i {
            self.slots.push(Slot::default());
        }
    }

    /// `_handle_arg_chunk` with kimi_k2's override: the first chunk also sends the name
    /// (read from the header), then itself.
    fn arg_chunk(&mut self, i: usize, value: &str, calls: &mut Vec<CallDelta>) {
        self.slot(i);
        let sent_before = self.slots[i].name_sent;
        self.slots[i].args.push_str(value);
        if !sent_before {
            let header = if self.slots[i].name.is_empty() {
                name_in_args(&self.slots[i].args).map(str::to_string)
            } else {
                Some(self.slots[i].name.clone())
            };
            self.send_name(i, header.as_deref(), calls);
            if !value.is_empty() && self.slots[i].name_sent {
                calls.push(piece(i, None, None, Some(value)));
            }
        } else if !value.is_empty() {
            calls.push(piece(i, None, None, Some(value)));
        }
    }

    /// kimi_k2's `_emit_name_delta`: the header gives the id and the name.
    fn send_name(&mut self, i: usize, header: Option<&str>, calls: &mut Vec<CallDelta>) {
        let Some((id, name)) = header.and_then(id_and_name) else {
            self.slots[i].name.clear();
            return;
        };
        if name.is_empty() {
            self.slots[i].name.clear();
            return;
        }
        let s = &mut self.slots[i];
        s.id = Some(id);
        s.name = name.clone();
        s.name_sent = true;
        calls.push(piece(i, s.id.clone(), Some(name), None));
    }

    /// `_handle_tool_end` with kimi_k2's override: a call whose name was never sent
    /// sends it now, with empty arguments.
    fn end(&mut self, i: usize, calls: &mut Vec<CallDelta>) {
        if i >= self.slots.len() {
            return;
        }
        let s = &mut self.slots[i];
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

fn piece(i: usize, id: Option<String>, name: Option<String>, args: Option<&str>) -> CallDelta {
    CallDelta {
        index: i as u32,
        id,
        name,
        arguments: args.map(str::to_string),
    }
}

/// `_coalesce_tool_call_deltas`: one piece per call index, in first-seen order.
fn coalesce(deltas: Vec<CallDelta>) -> Vec<CallDelta> {
    let mut out: Vec<CallDelta> = Vec::new();
    for d in deltas {
        match out.iter_mut().find(|e| e.index == d.index) {
            None => out.push(d),
            Some(e) => {
                if e.id.is_none() {
                    e.id = d.id;
                }
                if e.name.is_none() {
                    e.name = d.name;
                }
                if let Some(a) = d.arguments {
                    e.arguments.get_or_insert_with(String::new).push_str(&a);
                }
            }
        }
    }
    out
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

/// `_try_extract_name`: the first `"name"\s*:\s*"([^"]*)"`, when not empty.
fn name_in_args(args: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = args[from..].find("\"name\"") {
        let mut rest = args[from + at + 6..].trim_start_matches(is_space);
        if let Some(r) = rest.strip_prefix(':') {
            rest = r.trim_start_matches(is_space);
            if let Some(body) = rest.strip_prefix('"') {
                if let Some(n) = body.find('"') {
                    return (n > 0).then(|| &body[..n]);
                }
            }
        }
        from += at + 1;
    }
    None
}

/// `_extract_name_and_args` of a body with no header name.
fn name_and_args(raw: &str) -> (String, String) {
    use super::pyjson::{self, PyValue};
    let Some(PyValue::Dict(kv)) = pyjson::loads(raw) else {
        return (String::new(), raw.to_string());
    };
    let name = match kv.iter().find(|(k, _)| k == "name") {
        Some((_, PyValue::Str(s))) => s.clone(),
        _ => String::new(),
    };
    for key in ["arguments", "parameters"] {
        if let Some((_, v)) = kv.iter().find(|(k, _)| k == key) {
            let args = match v {
                PyValue::Str(s) => s.clone(),
                v => pyjson::dumps(v),
            };
            return (name, args);
        }
    }
    let rest: Vec<(String, PyValue)> = kv.into_iter().filter(|(k, _)| k != "name").collect();
    (name, pyjson::dumps(&PyValue::Dict(rest)))
}

/// Python's `str.isspace`.
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// The kimi_k2 reasoning parser's `extract_content_ids` of the step that ends
/// reasoning: what the tool phase is fed of its tokens.
pub fn content_ids(g: &Grammar, id: u32) -> Vec<u32> {
    if !g.thinking {
        return vec![id];
    }
    match g.ids.get(&id) {
        Some(KTerm::SectionStart) => vec![id],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
