//! vLLM 0.32's grammar-engine reasoning parsers (`qwen3`, `kimi_k2`: the
//! `ParserEngineReasoningAdapter`s of `vllm/parser/qwen3.py` and `kimi_k2.py` over
//! `vllm/parser/engine/`), as the serving layer runs them with no tool parser: markers
//! are matched by token id where the model has one and by text otherwise, tool-call
//! markup is text (a tool-call opener still ends reasoning), and special tokens the
//! grammar does not name are dropped.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::lexer::{Lexed, Lexer, Literal, Scanned, Scanner};
use crate::config::ReasoningParser;

/// What a marker does to the reasoning split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Term {
    /// `<think>`: dropped while reasoning, text after.
    Start,
    /// `</think>`: ends reasoning (dropped); dropped after, too.
    End,
    /// A tool-call opener: ends reasoning and is itself content.
    ImplicitEnd,
    /// Other grammar markup: text where it stands.
    Plain,
    /// A special token the grammar does not name: dropped.
    Drop,
}

/// Decodes one token alone (`tokenizer.decode([id])`).
pub type DecodeOne = Arc<dyn Fn(u32) -> String + Send + Sync>;
/// Decodes a sequence (`tokenizer.decode(ids)`).
pub type DecodeAll = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;

/// A token's text as the tokenizer decodes it alone, and a sequence's text.
#[derive(Clone)]
pub struct Texts {
    pub one: DecodeOne,
    pub all: DecodeAll,
}

impl fmt::Debug for Texts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Texts")
    }
}

/// One parser config bound to the model's vocabulary.
#[derive(Debug)]
pub struct Grammar {
    lits: Vec<Literal<Term>>,
    ids: HashMap<u32, Term>,
    /// `strip_trailing_reasoning_whitespace` (kimi_k2).
    strip_ws: bool,
    /// Thinking on (`chat_template_kwargs`): off, vLLM never splits.
    pub thinking: bool,
    end_ids: Vec<u32>,
    start_id: Option<u32>,
    boundary_ids: Vec<u32>,
    texts: Texts,
}

/// The markers of each config: text, effect, matched by id too.
fn markers(parser: ReasoningParser) -> &'static [(&'static str, Term, bool)] {
    use Term::*;
    match parser {
        ReasoningParser::Qwen3 => &[
            ("<think>", Start, true),
            ("</think>", End, true),
            ("<tool_call>", ImplicitEnd, true),
            ("</tool_call>", Plain, true),
            ("<function=", Plain, false),
            ("</function>", Plain, false),
            ("<parameter=", Plain, false),
            ("</parameter>", Plain, false),
            (">", Plain, false),
        ],
        ReasoningParser::KimiK2 => &[
            ("<think>", Start, true),
            ("</think>", End, true),
            ("<|tool_calls_section_begin|>", ImplicitEnd, true),
            ("<|tool_calls_section_end|>", Plain, true),
            ("<|tool_call_begin|>", Plain, true),
            ("<|tool_call_end|>", Plain, true),
            ("<|tool_call_argument_begin|>", Plain, true),
        ],
        ReasoningParser::DeepseekR1 => &[],
    }
}

impl Grammar {
    /// `vocab` maps a token's text to its id; `specials` are the tokenizer's special
    /// tokens (`all_special_tokens`); `thinking` is the request's switch.
    pub fn new(
        parser: ReasoningParser,
        thinking: bool,
        vocab: impl Fn(&str) -> Option<u32>,
        specials: &[(String, u32)],
        texts: Texts,
    ) -> Self {
        let mut ids = HashMap::new();
        let mut lits = Vec::new();
        let (mut end_ids, mut start_id) = (Vec::new(), None);
        let named = markers(parser);
        for &(text, term, by_id) in named {
            let id = by_id.then(|| vocab(text)).flatten();
            if let Some(id) = id {
                ids.insert(id, term);
                match term {
                    Term::End | Term::ImplicitEnd => end_ids.push(id),
                    Term::Start => start_id = Some(id),
                    _ => {}
                }
            }
            lits.push(Literal {
                text: text.to_string(),
                term,
                by_id: id.is_some(),
            });
        }
        for (text, id) in specials {
            if named.iter().all(|(t, ..)| t != text) {
                ids.insert(*id, Term::Drop);
                lits.push(Literal {
                    text: text.clone(),
                    term: Term::Drop,
                    by_id: true,
                });
            }
        }
        let boundary_ids = match parser {
            ReasoningParser::Qwen3 => ["<|im_start|>", "<|im_end|>"]
                .iter()
                .filter_map(|t| vocab(t))
                .collect(),
            _ => Vec::new(),
        };
        Grammar {
            lits,
            ids,
            strip_ws: parser == ReasoningParser::KimiK2,
            thinking,
            end_ids,
            start_id,
            boundary_ids,
            texts,
        }
    }

    /// `is_reasoning_end` on the prompt: its last marker (after the last turn boundary)
    /// closes reasoning; none: open while thinking.
    pub fn ended_in(&self, prompt: &[u32]) -> bool {
        for t in prompt.iter().rev() {
            if self.end_ids.contains(t) {
                return true;
            }
            if Some(*t) == self.start_id {
                // Only a thinking config's start marker opens reasoning.
                if self.thinking {
                    return false;
                }
                break;
            }
            if self.boundary_ids.contains(t) {
                break;
            }
        }
        !self.thinking
    }

    /// A whole answer (`extract_reasoning`): the split of its text alone.
    pub fn split_full(self: &Arc<Self>, text: &str) -> (Option<String>, Option<String>) {
        if !self.thinking {
            return (None, Some(text.to_string()));
        }
        let mut e = Engine::new(self.clone());
        let mut events = e.feed(text, &[]);
        events.extend(e.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for ev in events {
            match ev {
                Ev::Reasoning(t, _) => reasoning.push_str(&t),
                Ev::Text(t) => content.push_str(&t),
                Ev::End => {}
            }
        }
        if self.strip_ws {
            reasoning.truncate(rstrip(&reasoning).len());
        }
        let some = |s: String| (!s.is_empty()).then_some(s);
        (some(reasoning), some(content))
    }

    /// `count_reasoning_tokens` of an answer not split token by token: one pass over
    /// its decoded text and all its ids.
    pub fn count(self: &Arc<Self>, ids: &[u32]) -> u32 {
        if !self.thinking || ids.is_empty() {
            return 0;
        }
        let step: Vec<(u32, String)> = ids.iter().map(|&i| (i, (self.texts.one)(i))).collect();
        let mut e = Engine::new(self.clone());
        e.feed(&(self.texts.all)(ids), &step);
        e.finish();
        e.count
    }

    fn token_text(&self, id: u32) -> String {
        (self.texts.one)(id)
    }
}

/// Python's `str.rstrip()`.
fn rstrip(s: &str) -> &str {
    s.trim_end_matches(is_space)
}

/// Python's `str.isspace`.
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Reasoning,
    Content,
}

/// A semantic event: reasoning text (with its tokens), content text, reasoning's end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Reasoning(String, u32),
    Text(String),
    End,
}

/// What one call of the engine adds (`DeltaMessage` of reasoning and content).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub reasoning: Option<String>,
    pub content: Option<String>,
}

/// `StreamingParserEngine` with the `ParserEngine` state around it.
#[derive(Debug)]
struct Engine {
    g: Arc<Grammar>,
    state: State,
    lexer: Lexer,
    scanner: Scanner<Term>,
    ever_ids: bool,
    count: u32,
    ended: bool,
    deferred_content: String,
    has_nonws: bool,
    deferred_reasoning: String,
}

impl Engine {
    fn new(g: Arc<Grammar>) -> Self {
        Engine {
            g,
            state: State::Reasoning,
            lexer: Lexer::default(),
            scanner: Scanner::default(),
            ever_ids: false,
            count: 0,
            ended: false,
            deferred_content: String::new(),
            has_nonws: false,
            deferred_reasoning: String::new(),
        }
    }

    fn feed(&mut self, text: &str, step: &[(u32, String)]) -> Vec<Ev> {
        if !step.is_empty() {
            self.ever_ids = true;
        }
        let g = self.g.clone();
        let items = self.scanner.scan(&g.ids, text, step);
        let events = self.items(items);
        self.record(&events);
        events
    }

    fn finish(&mut self) -> Vec<Ev> {
        let items = self.scanner.flush();
        let mut events = self.items(items);
        let g = self.g.clone();
        let rest = self.lexer.flush(&g.lits);
        events.extend(self.lexed(rest));
        if self.state == State::Reasoning {
            events.push(Ev::End);
            self.state = State::Content;
        }
        self.record(&events);
        events
    }

    fn record(&mut self, events: &[Ev]) {
        for e in events {
            if let Ev::Reasoning(_, n) = e {
                self.count += n;
            }
        }
    }

    fn items(&mut self, items: Vec<Scanned<Term>>) -> Vec<Ev> {
        let g = self.g.clone();
        let mut events = Vec::new();
        for item in items {
            match item {
                Scanned::Term { term, text } => {
                    let rest = self.lexer.flush(&g.lits);
                    events.extend(self.lexed(rest));
                    events.extend(self.terminal(term, text, 0));
                }
                Scanned::Text { text, count, .. } if text.is_empty() && count > 0 => {
                    events.extend(self.emit(String::new(), count));
                }
                Scanned::Text {
                    text,
                    token_texts,
                    count,
                } => {
                    let lexed = self.lexer.feed(&g.lits, &text, &token_texts, count);
                    events.extend(self.lexed(lexed));
                }
            }
        }
        events
    }

    fn lexed(&mut self, tokens: Vec<Lexed<Term>>) -> Vec<Ev> {
        let mut events = Vec::new();
        for t in tokens {
            match t {
                // Once ids are seen, a marker that has an id counts only as that id.
                Lexed::Term(term, v, n, by_id) if !(by_id && self.ever_ids) => {
                    events.extend(self.terminal(term, v, n))
                }
                Lexed::Text(v, n) | Lexed::Term(_, v, n, _) => {
                    if !v.is_empty() {
                        events.extend(self.emit(v, n));
                    }
                }
            }
        }
        events
    }

    /// `_on_terminal` with tool parsing skipped (the reasoning adapter's mode).
    fn terminal(&mut self, term: Term, value: String, count: u32) -> Vec<Ev> {
        match (self.state, term) {
            (_, Term::Drop) | (State::Reasoning, Term::Start) | (State::Content, Term::End) => {
                Vec::new()
            }
            (State::Reasoning, Term::End) => {
                self.state = State::Content;
                vec![Ev::End]
            }
            (State::Reasoning, Term::ImplicitEnd) => {
                self.state = State::Content;
                vec![Ev::End, Ev::Text(value)]
            }
            _ => self.emit(value, count),
        }
    }

    fn emit(&self, text: String, count: u32) -> Vec<Ev> {
        vec![match self.state {
            State::Reasoning => Ev::Reasoning(text, count),
            State::Content => Ev::Text(text),
        }]
    }

    /// `_events_to_delta` (no tool calls): whitespace-only content waits until
    /// something else comes, or the end.
    fn delta(&mut self, events: Vec<Ev>, finished: bool) -> Option<Delta> {
        if events.is_empty() && self.deferred_content.is_empty() {
            return None;
        }
        let (mut content, mut reasoning) =
            (std::mem::take(&mut self.deferred_content), String::new());
        for ev in events {
            match ev {
                Ev::Text(t) => content.push_str(&t),
                Ev::Reasoning(t, _) => reasoning.push_str(&t),
                Ev::End => self.ended = true,
            }
        }
        if !self.has_nonws && !content.is_empty() {
            if !content.trim_matches(is_space).is_empty() {
                self.has_nonws = true;
            } else if !finished {
                self.deferred_content = std::mem::take(&mut content);
            }
        }
        let some = |s: String| (!s.is_empty()).then_some(s);
        let d = Delta {
            content: some(content),
            reasoning: some(reasoning),
        };
        (d.content.is_some() || d.reasoning.is_some()).then_some(d)
    }

    /// `_strip_trailing_reasoning`: trailing whitespace of reasoning waits for more.
    fn strip(&mut self, d: Option<Delta>) -> Option<Delta> {
        if !self.g.strip_ws {
            return d;
        }
        match d {
            Some(mut d) if d.reasoning.is_some() => {
                let combined = std::mem::take(&mut self.deferred_reasoning)
                    + d.reasoning.as_deref().unwrap_or("");
                let trimmed = rstrip(&combined).len();
                self.deferred_reasoning = combined[trimmed..].to_string();
                d.reasoning = (trimmed > 0).then(|| combined[..trimmed].to_string());
                (d.reasoning.is_some() || d.content.is_some()).then_some(d)
            }
            d => {
                if self.ended {
                    self.deferred_reasoning.clear();
                }
                d
            }
        }
    }
}

/// The serving layer's streamed split with this parser alone (`DelegatingParser
/// .parse_delta`), one generated token per step.
#[derive(Debug)]
pub struct Stream {
    engine: Engine,
    /// Reasoning has ended (the prompt closed it, or the engine confirmed it): the rest
    /// is the released text as it comes.
    ended: bool,
    /// The engine was fed: its own count is the reasoning token count.
    fed: bool,
}

impl Stream {
    pub fn new(g: &Arc<Grammar>, prompt: &[u32]) -> Self {
        Stream {
            ended: g.ended_in(prompt),
            engine: Engine::new(g.clone()),
            fed: false,
        }
    }

    pub fn is_closed(&self) -> bool {
        self.ended
    }

    /// `extract_content_ids` of one token: nothing of a `</think>`; kimi_k2's keeps a
    /// tool-section opener only, qwen3's (the base `ParserEngine`'s) any other token;
    /// every token with thinking off.
    pub fn content_ids(&self, id: u32) -> Vec<u32> {
        let g = &self.engine.g;
        if !g.thinking {
            return vec![id];
        }
        match g.ids.get(&id) {
            Some(Term::ImplicitEnd) => vec![id],
            Some(Term::End) => Vec::new(),
            _ if g.strip_ws => Vec::new(),
            _ => vec![id],
        }
    }

    /// The reasoning token count vLLM reports for the stream so far, where the engine
    /// keeps it (`None`: it counts the whole answer again).
    pub fn counted(&self) -> Option<u32> {
        self.fed.then_some(self.engine.count)
    }

    /// One step: token `id` (`None` for text released without one) and the text
    /// released with it; `last` when generation ends with it.
    pub fn step(&mut self, id: Option<u32>, text: &str, last: bool) -> Option<Delta> {
        let mut d;
        if !self.ended {
            self.fed = true;
            let step: Vec<(u32, String)> = id
                .map(|i| (i, self.engine.g.token_text(i)))
                .into_iter()
                .collect();
            let events = self.engine.feed(text, &step);
            let raw = self.engine.delta(events, false);
            d = self.engine.strip(raw);
            if self.engine.ended {
                self.ended = true;
                // The engine's held text comes out now; only its content is kept.
                let events = self.engine.finish();
                let flushed = self.engine.delta(events, true);
                let mut content = d
                    .as_ref()
                    .and_then(|d| d.content.clone())
                    .unwrap_or_default();
                content.push_str(flushed.and_then(|f| f.content).as_deref().unwrap_or(""));
                if !content.is_empty() {
                    d.get_or_insert_with(Delta::default).content = Some(content);
                }
            }
        } else {
            d = Some(Delta {
                reasoning: None,
                content: Some(text.to_string()),
            });
        }
        if last && !self.ended {
            // `_flush_engine_parsers`: what the engine still holds.
            let events = self.engine.finish();
            if let Some(f) = self.engine.delta(events, true) {
                let m = d.get_or_insert_with(Delta::default);
                append(&mut m.content, f.content);
                append(&mut m.reasoning, f.reasoning);
            }
        }
        d
    }
}

fn append(to: &mut Option<String>, more: Option<String>) {
    if let Some(m) = more.filter(|m| !m.is_empty()) {
        to.get_or_insert_with(String::new).push_str(&m);
    }
}

#[cfg(test)]
mod tests;
