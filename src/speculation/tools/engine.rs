//! vLLM 0.32's `StreamingParserEngine` (`vllm/parser/engine/streaming_parser_engine.py`)
//! as a tool adapter runs it (started in content), over any config of terminals and
//! transitions (`Format`: kimi_k2, qwen3_coder), and the content side of
//! `ParserEngine._events_to_delta` (`parser_engine.py`) that every config shares.
//! Markers become state transitions and semantic events; argument text streams raw, or
//! (JSON bodies) with a top-level closing brace held back.

use std::collections::HashMap;
use std::sync::Arc;

use super::{CallDelta, StreamDelta};
use crate::speculation::reasoning::engine::DecodeOne;
use crate::speculation::reasoning::lexer::{Lexed, Lexer, Literal, Scanned, Scanner, Terminal};

/// The engine's states the tool adapter reaches (it starts in content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum St {
    Content,
    Preamble,
    Name,
    Args,
    Between,
}

/// A semantic event; tool events carry their call's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    Text(String),
    Start(usize),
    Name(usize, String),
    Arg(usize, String),
    End(usize),
}

/// A tool event a transition emits (`REASONING_END` has no effect on a tool adapter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    Start,
    End,
    /// `ARG_VALUE_CHUNK` carrying the marker's own text.
    Arg,
}

/// One config of the engine bound to the served model's vocabulary.
pub trait Format: std::fmt::Debug + Send + Sync {
    type T: Terminal + Eq + std::hash::Hash + Send + Sync;
    fn vocab(&self) -> &Vocab<Self::T>;
    /// The transition from `st` on `term`, if the config has one.
    fn transition(&self, st: St, term: Self::T) -> Option<(St, &'static [Emit])>;
    /// No reasoning parser runs and `term` is reasoning-only markup: it stays text
    /// (`skip_reasoning_parsing`).
    fn markup_as_text(&self, term: Self::T) -> bool;
    /// `tool_args_json`: arguments are a JSON body (closing braces held back).
    fn json_args(&self) -> bool;
}

/// `StreamingParserEngine` with one config, started in content.
#[derive(Debug)]
pub struct Engine<F: Format> {
    pub g: Arc<F>,
    st: St,
    /// The last call started (`tool_index`, -1 before any).
    index: Option<usize>,
    ever_ids: bool,
    lexer: Lexer,
    scanner: Scanner<F::T>,
    args: String,
    depth: u32,
    in_str: bool,
    escape: bool,
}

impl<F: Format> Clone for Engine<F> {
    fn clone(&self) -> Self {
        Engine {
            g: self.g.clone(),
            st: self.st,
            index: self.index,
            ever_ids: self.ever_ids,
            lexer: self.lexer.clone(),
            scanner: self.scanner.clone(),
            args: self.args.clone(),
            depth: self.depth,
            in_str: self.in_str,
            escape: self.escape,
        }
    }
}

impl<F: Format> Engine<F> {
    pub fn new(g: Arc<F>) -> Self {
        Engine {
            g,
            st: St::Content,
            index: None,
            ever_ids: false,
            lexer: Lexer::default(),
            scanner: Scanner::default(),
            args: String::new(),
            depth: 0,
            in_str: false,
            escape: false,
        }
    }

    /// One step's released text and its token ids.
    pub fn feed(&mut self, text: &str, ids: &[u32]) -> Vec<Ev> {
        let one = &self.g.vocab().one;
        let step: Vec<(u32, String)> = ids.iter().map(|&i| (i, one(i))).collect();
        self.ever_ids |= !step.is_empty();
        let g = self.g.clone();
        let items = self.scanner.scan(&g.vocab().ids, text, &step);
        self.items(items)
    }

    pub fn finish(&mut self) -> Vec<Ev> {
        let items = self.scanner.flush();
        let mut events = self.items(items);
        let g = self.g.clone();
        let rest = self.lexer.flush(&g.vocab().lits);
        events.extend(self.lexed(rest));
        if !self.args.is_empty() {
            events.push(Ev::Arg(self.idx(), std::mem::take(&mut self.args)));
        }
        if self.st != St::Content {
            if let Some(i) = self.index {
                events.push(Ev::End(i));
            }
            self.st = St::Content;
        }
        events
    }

    fn idx(&self) -> usize {
        self.index.unwrap_or(0)
    }

    fn items(&mut self, items: Vec<Scanned<F::T>>) -> Vec<Ev> {
        let g = self.g.clone();
        let mut events = Vec::new();
        for item in items {
            match item {
                Scanned::Term { term, text } => {
                    let rest = self.lexer.flush(&g.vocab().lits);
                    events.extend(self.lexed(rest));
                    events.extend(self.terminal(term, text));
                }
                Scanned::Text {
                    text,
                    token_texts,
                    count,
                } => {
                    if !text.is_empty() {
                        let lexed = self.lexer.feed(&g.vocab().lits, &text, &token_texts, count);
                        events.extend(self.lexed(lexed));
                    }
                }
            }
        }
        events
    }

    fn lexed(&mut self, tokens: Vec<Lexed<F::T>>) -> Vec<Ev> {
        let mut events = Vec::new();
        for t in tokens {
            match t {
                // Once ids are seen, a marker that has an id counts only as that id.
                Lexed::Term(term, v, _, by_id) if !(by_id && self.ever_ids) => {
                    events.extend(self.terminal(term, v))
                }
                Lexed::Text(v, _) | Lexed::Term(_, v, _, _) => {
                    if !v.is_empty() {
                        events.extend(self.emit(&v));
                    }
                }
            }
        }
        events
    }

    /// `_on_terminal` (tool parsing on).
    fn terminal(&mut self, term: F::T, value: String) -> Vec<Ev> {
        let Some((next, emits)) = self.g.transition(self.st, term) else {
            if term.is_drop() {
                return Vec::new();
            }
            return self.emit(&value);
        };
        if self.g.markup_as_text(term) {
            return self.emit(&value);
        }
        let mut events = Vec::new();
        if self.st == St::Args && next != St::Args && !self.args.is_empty() {
            events.push(Ev::Arg(self.idx(), std::mem::take(&mut self.args)));
        }
        self.st = next;
        for e in emits {
            match e {
                Emit::Start => {
                    let i = self.index.map_or(0, |i| i + 1);
                    self.index = Some(i);
                    events.push(Ev::Start(i));
                }
                Emit::End => events.push(Ev::End(self.idx())),
                Emit::Arg => events.push(Ev::Arg(self.idx(), value.clone())),
            }
        }
        if next == St::Args {
            (self.depth, self.in_str, self.escape) = (0, false, false);
        }
        events
    }

    /// `_emit_for_state`.
    fn emit(&mut self, text: &str) -> Vec<Ev> {
        match self.st {
            St::Content => vec![Ev::Text(text.to_string())],
            St::Name => vec![Ev::Name(self.idx(), text.to_string())],
            St::Args if self.g.json_args() => {
                text.chars().filter_map(|c| self.arg_char(c)).collect()
            }
            St::Args => vec![Ev::Arg(self.idx(), text.to_string())],
            St::Preamble | St::Between => Vec::new(),
        }
    }

    /// `_feed_args_char`: everything so far streams, except a closing brace that
    /// returns to the top level (held until the next character, or the end).
    fn arg_char(&mut self, c: char) -> Option<Ev> {
        self.args.push(c);
        if self.escape {
            self.escape = false;
        } else if self.in_str {
            match c {
                '\\' => self.escape = true,
                '"' => self.in_str = false,
                _ => {}
            }
        } else if c == '"' {
            self.in_str = true;
        } else if c == '{' || c == '[' {
            self.depth += 1;
        } else if c == '}' || c == ']' {
            self.depth = self.depth.saturating_sub(1);
            if self.depth == 0 {
                return None;
            }
        }
        Some(Ev::Arg(self.idx(), std::mem::take(&mut self.args)))
    }
}

/// What a config's parser does with tool events (`_ensure_slot`, `_handle_tool_name`,
/// `_handle_arg_chunk`, `_handle_tool_end` and their overrides).
pub trait Calls {
    fn on(&mut self, ev: Ev, out: &mut Vec<CallDelta>);
    /// Some call was started (`self._tool_slots` not empty).
    fn any(&self) -> bool;
}

/// `ParserEngine` with one config over one answer: the engine, the calls' states and
/// the config's handling of tool events (`C`), and the content side of its deltas.
#[derive(Debug)]
pub struct Run<F: Format, C> {
    engine: Engine<F>,
    pub calls: C,
    content: Content,
    /// `tool_choice: "none"` with tools: tool events are ignored.
    suppress: bool,
}

impl<F: Format, C: Clone> Clone for Run<F, C> {
    fn clone(&self) -> Self {
        Run {
            engine: self.engine.clone(),
            calls: self.calls.clone(),
            content: self.content.clone(),
            suppress: self.suppress,
        }
    }
}

impl<F: Format, C: Calls> Run<F, C> {
    pub fn with(g: &Arc<F>, calls: C, suppress: bool) -> Self {
        Run {
            engine: Engine::new(g.clone()),
            calls,
            content: Content::default(),
            suppress,
        }
    }

    /// `extract_tool_calls_streaming`: one step's text and tokens.
    pub fn step(&mut self, text: &str, ids: &[u32]) -> Option<StreamDelta> {
        let events = self.engine.feed(text, ids);
        self.delta(events, false)
    }

    /// `finish_streaming`: what the engine still holds.
    pub fn finish(&mut self) -> Option<StreamDelta> {
        let events = self.engine.finish();
        if events.is_empty() && !self.content.waiting() {
            return None;
        }
        self.delta(events, true)
    }

    /// `extract_tool_calls_from_content`'s pass over a whole text: its content, the
    /// calls left in `calls` (for the config's `_build_extracted_result`).
    pub fn whole_content(&mut self, text: &str) -> Option<String> {
        let mut events = self.engine.feed(text, &[]);
        events.extend(self.engine.finish());
        self.delta(events, true).and_then(|d| d.content)
    }

    fn delta(&mut self, events: Vec<Ev>, finished: bool) -> Option<StreamDelta> {
        self.content
            .delta(events, finished, self.suppress, &mut self.calls)
    }
}

/// A config's literals and terminals by token id, and a token's text decoded alone.
pub struct Vocab<T> {
    pub lits: Vec<Literal<T>>,
    pub ids: HashMap<u32, T>,
    pub one: DecodeOne,
}

impl<T: Terminal + Eq + std::hash::Hash> Vocab<T> {
    /// `named` (text, terminal, the token id where it is matched by id too), then the
    /// tokenizer's other special tokens (none of `configured`), dropped.
    pub fn new(
        named: impl IntoIterator<Item = (&'static str, T, Option<u32>)>,
        specials: &[(String, u32)],
        configured: &[&str],
        drop: T,
        one: DecodeOne,
    ) -> Self {
        let (mut lits, mut ids) = (Vec::new(), HashMap::new());
        for (text, term, id) in named {
            if let Some(id) = id {
                ids.insert(id, term);
            }
            lits.push(Literal {
                text: text.to_string(),
                term,
                by_id: id.is_some(),
            });
        }
        for (text, id) in specials {
            if !configured.contains(&text.as_str()) {
                ids.insert(*id, drop);
                lits.push(Literal {
                    text: text.clone(),
                    term: drop,
                    by_id: true,
                });
            }
        }
        Vocab { lits, ids, one }
    }
}

/// The content side of `_events_to_delta`: text after a tool event waits for the
/// next delta that sends no call, and whitespace-only content waits for more (and is
/// dropped once a call has started: `drop_whitespace_only_content_before_tools`).
#[derive(Debug, Clone, Default)]
pub struct Content {
    deferred: String,
    has_nonws: bool,
}

impl Content {
    /// Whether anything waits to be sent (`finish_streaming` sends a delta then).
    pub fn waiting(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// `_events_to_delta`; `suppress`: `tool_choice: "none"` with tools, tool events
    /// are ignored.
    pub fn delta(
        &mut self,
        events: Vec<Ev>,
        finished: bool,
        suppress: bool,
        calls: &mut impl Calls,
    ) -> Option<StreamDelta> {
        if events.is_empty() && self.deferred.is_empty() {
            return None;
        }
        let mut pieces: Vec<CallDelta> = Vec::new();
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
            if suppress {
                continue;
            }
            seen_tool = true;
            calls.on(ev, &mut pieces);
        }
        let pieces = coalesce(pieces);
        if !self.deferred.is_empty() && (!seen_tool || pieces.is_empty()) {
            let now = self.deferred[carried.len()..].to_string();
            content = carried + &content + &now;
            self.deferred.clear();
        }
        if !self.has_nonws && !content.is_empty() {
            if !strip(&content).is_empty() {
                self.has_nonws = true;
            } else if calls.any() {
                content.clear();
            } else if !finished {
                self.deferred = std::mem::take(&mut content);
            }
        }
        let content = (!content.is_empty()).then_some(content);
        (content.is_some() || !pieces.is_empty()).then_some(StreamDelta {
            content,
            calls: pieces,
        })
    }
}

pub fn piece(i: usize, id: Option<String>, name: Option<String>, args: Option<&str>) -> CallDelta {
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

/// `_try_extract_name`: the first `"name"\s*:\s*"([^"]*)"`, when not empty.
pub fn name_in_args(args: &str) -> Option<&str> {
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

/// `_extract_name_and_args` of a body with no name of its own.
pub fn name_and_args(raw: &str) -> (String, String) {
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
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}
