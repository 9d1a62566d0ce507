//! The kimi_k2 config on vLLM 0.32's `StreamingParserEngine`
//! (`vllm/parser/engine/streaming_parser_engine.py`), started in content as the tool
//! adapter starts it: markers to state transitions and semantic events, argument text
//! streamed with a top-level closing brace held back.

use std::sync::Arc;

use super::{Grammar, KTerm};
use crate::speculation::reasoning::lexer::{Lexed, Lexer, Scanned, Scanner};

/// The engine's states the tool adapter reaches (it starts in content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum St {
    Content,
    Preamble,
    Name,
    Args,
    Between,
}

/// A semantic event; tool events carry their call's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ev {
    Text(String),
    Start(usize),
    Name(usize, String),
    Arg(usize, String),
    End(usize),
}

#[derive(Debug, Clone, Copy)]
enum Emit {
    Start,
    End,
}

/// The config's transitions from the states the tool adapter reaches.
fn transition(g: &Grammar, st: St, term: KTerm) -> Option<(St, Option<Emit>)> {
    use KTerm::*;
    Some(match (st, term) {
        (St::Content, ThinkEnd) if g.thinking => (St::Content, None),
        (St::Content, SectionStart) => (St::Preamble, None),
        (St::Preamble, CallStart) | (St::Between, CallStart) => (St::Name, Some(Emit::Start)),
        (St::Name, ArgStart) => (St::Args, None),
        (St::Args, CallEnd) => (St::Between, Some(Emit::End)),
        (St::Args, SectionEnd) => (St::Preamble, Some(Emit::End)),
        (St::Preamble, SectionEnd) | (St::Between, SectionEnd) => (St::Preamble, None),
        _ => return None,
    })
}

/// `StreamingParserEngine` with the kimi_k2 config, started in content.
#[derive(Debug, Clone)]
pub(super) struct Engine {
    pub(super) g: Arc<Grammar>,
    st: St,
    /// The last call started (`tool_index`, -1 before any).
    index: Option<usize>,
    ever_ids: bool,
    lexer: Lexer,
    scanner: Scanner<KTerm>,
    args: String,
    depth: u32,
    in_str: bool,
    escape: bool,
}

impl Engine {
    pub(super) fn new(g: Arc<Grammar>) -> Self {
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

    /// One step's released text and its tokens (`(id, text alone)`).
    pub(super) fn feed(&mut self, text: &str, step: &[(u32, String)]) -> Vec<Ev> {
        self.ever_ids |= !step.is_empty();
        let g = self.g.clone();
        let items = self.scanner.scan(&g.ids, text, step);
        self.items(items)
    }

    pub(super) fn finish(&mut self) -> Vec<Ev> {
        let items = self.scanner.flush();
        let mut events = self.items(items);
        let g = self.g.clone();
        let rest = self.lexer.flush(&g.lits);
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

    fn items(&mut self, items: Vec<Scanned<KTerm>>) -> Vec<Ev> {
        let g = self.g.clone();
        let mut events = Vec::new();
        for item in items {
            match item {
                Scanned::Term { term, text } => {
                    let rest = self.lexer.flush(&g.lits);
                    events.extend(self.lexed(rest));
                    events.extend(self.terminal(term, text));
                }
                Scanned::Text {
                    text,
                    token_texts,
                    count,
                } => {
                    if !text.is_empty() {
                        let lexed = self.lexer.feed(&g.lits, &text, &token_texts, count);
                        events.extend(self.lexed(lexed));
                    }
                }
            }
        }
        events
    }

    fn lexed(&mut self, tokens: Vec<Lexed<KTerm>>) -> Vec<Ev> {
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
    fn terminal(&mut self, term: KTerm, value: String) -> Vec<Ev> {
        let Some((next, emit)) = transition(&self.g, self.st, term) else {
            if term == KTerm::Drop {
                return Vec::new();
            }
            return self.emit(&value);
        };
        let reasoning_markup = matches!(term, KTerm::ThinkStart | KTerm::ThinkEnd);
        if self.g.skip_reasoning && reasoning_markup {
            return self.emit(&value);
        }
        let mut events = Vec::new();
        if self.st == St::Args && next != St::Args && !self.args.is_empty() {
            events.push(Ev::Arg(self.idx(), std::mem::take(&mut self.args)));
        }
        self.st = next;
        match emit {
            Some(Emit::Start) => {
                let i = self.index.map_or(0, |i| i + 1);
                self.index = Some(i);
                events.push(Ev::Start(i));
            }
            Some(Emit::End) => events.push(Ev::End(self.idx())),
            None => {}
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
            St::Args => text.chars().filter_map(|c| self.arg_char(c)).collect(),
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
