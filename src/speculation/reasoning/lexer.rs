//! The text side of vLLM 0.32's parser engine (`vllm/parser/engine/incremental_lexer.py`
//! and `token_id_scanner.py`), reproduced step for step: marker token ids are split off
//! the step's text first, then the text is cut into literal markers and plain runs,
//! holding back a suffix that could still grow into a marker.
//!
//! Python indexes text by code point; these types keep one token count per `char` so
//! that the counts land where vLLM's do.

use std::collections::{HashMap, VecDeque};

use super::engine::Term;

/// What a marker stands for: one grammar's terminal names (`Term` for the reasoning
/// side, the tool-call grammars' own). `Drop` is a special token the grammar does not
/// name.
pub trait Terminal: Copy + PartialEq + std::fmt::Debug {
    fn is_drop(self) -> bool;
}

impl Terminal for Term {
    fn is_drop(self) -> bool {
        self == Term::Drop
    }
}

/// A literal marker and what it stands for.
#[derive(Debug, Clone)]
pub struct Literal<T = Term> {
    pub text: String,
    pub term: T,
    /// Its terminal is also matched by token id: once ids are seen, its text alone is
    /// plain text.
    pub by_id: bool,
}

/// A piece the lexer hands on: a marker, or plain text with the tokens it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lexed<T = Term> {
    /// A marker matched in the text: what it stands for, its text, its tokens, and
    /// whether its terminal is also matched by id.
    Term(T, String, u32, bool),
    Text(String, u32),
}

/// `IncrementalLexer` over literal terminals only (all the engine configs here use).
#[derive(Debug, Clone, Default)]
pub struct Lexer {
    buffer: String,
    counts: VecDeque<u32>,
}

impl Lexer {
    /// `feed`: the text, the texts of its tokens (to place their counts) and how many.
    pub fn feed<T: Terminal>(
        &mut self,
        lits: &[Literal<T>],
        text: &str,
        token_texts: &[String],
        token_count: u32,
    ) -> Vec<Lexed<T>> {
        let counts = char_token_counts(text, token_texts, token_count);
        if self.buffer.is_empty() && !has_first_char(lits, text) {
            return vec![Lexed::Text(text.to_string(), counts.iter().sum())];
        }
        self.buffer.push_str(text);
        self.counts.extend(counts);
        self.drain(lits, false)
    }

    /// `flush`: the end of the text; a held suffix is plain text.
    pub fn flush<T: Terminal>(&mut self, lits: &[Literal<T>]) -> Vec<Lexed<T>> {
        let mut out = Vec::new();
        if !self.buffer.is_empty() {
            out = self.drain(lits, true);
        }
        if !self.buffer.is_empty() {
            let n = self.counts.drain(..).sum();
            out.push(Lexed::Text(std::mem::take(&mut self.buffer), n));
        }
        out
    }

    fn pop(&mut self, chars: usize) -> (String, u32) {
        let end = self
            .buffer
            .char_indices()
            .nth(chars)
            .map_or(self.buffer.len(), |(i, _)| i);
        let text: String = self.buffer.drain(..end).collect();
        let n = self.counts.drain(..chars.min(self.counts.len())).sum();
        (text, n)
    }

    fn drain<T: Terminal>(&mut self, lits: &[Literal<T>], last: bool) -> Vec<Lexed<T>> {
        let mut out = Vec::new();
        while !self.buffer.is_empty() {
            if !has_first_char(lits, &self.buffer) {
                let n = self.counts.drain(..).sum();
                out.push(Lexed::Text(std::mem::take(&mut self.buffer), n));
                break;
            }
            let best = lits
                .iter()
                .filter(|l| self.buffer.starts_with(&l.text))
                .fold(None::<&Literal<T>>, |b, l| match b {
                    Some(b) if b.text.len() >= l.text.len() => Some(b),
                    _ => Some(l),
                });
            // The whole buffer could still grow into a (longer) marker: wait.
            if !last && is_proper_prefix(lits, &self.buffer) {
                match best {
                    Some(b) if !longer_starts(lits, &self.buffer, b.text.len()) => {}
                    _ => break,
                }
            }
            if let Some(b) = best {
                let (text, n) = self.pop(b.text.chars().count());
                out.push(Lexed::Term(b.term, text, n, b.by_id));
                continue;
            }
            let end = content_boundary(lits, &self.buffer);
            let chars = self.buffer[..end].chars().count().max(1);
            let (text, n) = self.pop(chars);
            out.push(Lexed::Text(text, n));
        }
        out
    }
}

fn has_first_char<T>(lits: &[Literal<T>], text: &str) -> bool {
    lits.iter()
        .filter_map(|l| l.text.chars().next())
        .any(|c| text.contains(c))
}

/// `buffer in prefix_set`: a proper prefix of some literal.
fn is_proper_prefix<T>(lits: &[Literal<T>], buf: &str) -> bool {
    lits.iter()
        .any(|l| l.text.len() > buf.len() && l.text.starts_with(buf))
}

fn longer_starts<T>(lits: &[Literal<T>], buf: &str, than: usize) -> bool {
    let first = buf.chars().next();
    lits.iter()
        .any(|l| l.text.chars().next() == first && l.text.len() > than && l.text.starts_with(buf))
}

/// `_find_content_boundary`: the first position after the start where a literal, or
/// the start of one cut by the end of the buffer, begins.
fn content_boundary<T>(lits: &[Literal<T>], buf: &str) -> usize {
    for (i, c) in buf.char_indices().skip(1) {
        let rest = &buf[i..];
        let hit = lits.iter().any(|l| {
            l.text.starts_with(c) && (rest.starts_with(&l.text) || l.text.starts_with(rest))
        });
        if hit {
            return i;
        }
    }
    buf.len()
}

/// `_char_token_counts`: each token counts at the first char of its text, found in
/// order; tokens not found count at the first char.
fn char_token_counts(text: &str, token_texts: &[String], token_count: u32) -> Vec<u32> {
    let mut counts = vec![0u32; text.chars().count()];
    if counts.is_empty() {
        return counts;
    }
    if token_texts.is_empty() {
        counts[0] = token_count;
        return counts;
    }
    let (mut pos, mut assigned) = (0usize, 0u32);
    for t in token_texts.iter().filter(|t| !t.is_empty()) {
        if let Some(found) = text[pos..].find(t.as_str()) {
            let at = pos + found;
            counts[text[..at].chars().count()] += 1;
            assigned += 1;
            pos = at + t.len();
        }
    }
    counts[0] += token_count.saturating_sub(assigned);
    counts
}

/// One item of the scanner's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scanned<T = Term> {
    Text {
        text: String,
        token_texts: Vec<String>,
        count: u32,
    },
    Term {
        term: T,
        text: String,
    },
}

impl<T> Scanned<T> {
    fn text(text: &str, count: u32) -> Self {
        Scanned::Text {
            text: text.to_string(),
            token_texts: Vec::new(),
            count,
        }
    }

    fn str(&self) -> &str {
        match self {
            Scanned::Text { text, .. } | Scanned::Term { text, .. } => text,
        }
    }
}

/// A marker token whose text has not been released yet (`_deferred_terminals`).
#[derive(Debug, Clone)]
struct Deferred<T> {
    term: T,
    text: String,
    prefix_count: u32,
}

/// `TokenIDScanner`: splits marker token ids (and the special tokens the engine drops)
/// off a step's text.
#[derive(Debug, Clone)]
pub struct Scanner<T = Term> {
    deferred: Vec<Deferred<T>>,
    trailing: u32,
    post_text: String,
}

impl<T> Default for Scanner<T> {
    fn default() -> Self {
        Scanner {
            deferred: Vec::new(),
            trailing: 0,
            post_text: String::new(),
        }
    }
}

impl<T: Terminal> Scanner<T> {
    /// `scan`: `ids` maps marker ids to terms; `texts` are the step's tokens' texts.
    pub fn scan(
        &mut self,
        ids: &HashMap<u32, T>,
        text: &str,
        step: &[(u32, String)],
    ) -> Vec<Scanned<T>> {
        let (mut prefix, mut effective, mut trailing) = (Vec::new(), text.to_string(), 0);
        if !self.deferred.is_empty() {
            (prefix, effective, trailing) = self.resolve(text, step.len() as u32);
        }
        let texts = || step.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>();
        if !step.iter().any(|(id, _)| ids.contains_key(id)) {
            if !effective.is_empty() {
                let count = step.len() as u32 + if prefix.is_empty() { 0 } else { trailing };
                prefix.push(Scanned::Text {
                    text: effective,
                    token_texts: texts(),
                    count,
                });
            }
            return prefix;
        }
        let mut results = split_by_ids(ids, step);
        if trailing > 0 {
            results.insert(0, Scanned::text("", trailing));
        }
        if effective.is_empty() {
            // No released text to place the markers in: they wait for it.
            let mut pending = 0;
            for r in results {
                match r {
                    Scanned::Text { count, .. } => pending += count,
                    Scanned::Term { term, text } => {
                        self.deferred.push(Deferred {
                            term,
                            text,
                            prefix_count: pending,
                        });
                        pending = 0;
                    }
                }
            }
            self.trailing += pending;
            return prefix;
        }
        prefix.extend(self.recover_holdback(&effective, results));
        prefix
    }

    /// `flush_pending`: at the end, markers still waiting for their text.
    pub fn flush(&mut self) -> Vec<Scanned<T>> {
        let mut out = Vec::new();
        if self.deferred.is_empty() && self.post_text.is_empty() {
            return out;
        }
        if !self.post_text.is_empty() {
            let count = self.deferred.first().map_or(0, |d| d.prefix_count);
            out.push(Scanned::text(&std::mem::take(&mut self.post_text), count));
        }
        for d in self.deferred.drain(..) {
            out.push(Scanned::Term {
                term: d.term,
                text: d.text,
            });
        }
        if self.trailing > 0 {
            out.push(Scanned::text("", std::mem::take(&mut self.trailing)));
        }
        out
    }

    /// `_resolve_deferred`: place waiting markers in the newly released text.
    fn resolve(&mut self, text: &str, step_count: u32) -> (Vec<Scanned<T>>, String, u32) {
        let deferred = std::mem::take(&mut self.deferred);
        let mut trailing = std::mem::take(&mut self.trailing);
        let mut out = Vec::new();
        let mut remaining = std::mem::take(&mut self.post_text) + text;
        for mut d in deferred {
            match remaining.find(&d.text) {
                Some(pos) => {
                    if pos > 0 {
                        out.push(Scanned::text(&remaining[..pos], d.prefix_count));
                    }
                    remaining = remaining[pos + d.text.len()..].to_string();
                    out.push(Scanned::Term {
                        term: d.term,
                        text: d.text,
                    });
                }
                None => {
                    if !remaining.is_empty() {
                        self.post_text.push_str(&remaining);
                        d.prefix_count += step_count;
                        remaining.clear();
                    }
                    self.deferred.push(d);
                }
            }
        }
        if !self.deferred.is_empty() {
            self.trailing = trailing;
            trailing = 0;
        }
        (out, remaining, trailing)
    }

    /// `_recover_holdback_text`: released text beyond the step's tokens comes first.
    fn recover_holdback(&mut self, text: &str, results: Vec<Scanned<T>>) -> Vec<Scanned<T>> {
        if results.is_empty() {
            return vec![Scanned::text(text, 0)];
        }
        let joined: String = results.iter().map(Scanned::str).collect();
        if joined.is_empty() {
            let mut out = vec![Scanned::text(text, 0)];
            out.extend(results);
            return out;
        }
        match text.find(&joined) {
            Some(0) => results,
            Some(pos) => {
                let mut out = vec![Scanned::text(&text[..pos], 0)];
                out.extend(results);
                out
            }
            None => self.rebuild(text, results),
        }
    }

    /// `_rebuild_from_anchors`: the markers, placed right to left in the released text,
    /// cut it; a marker not found waits.
    fn rebuild(&mut self, text: &str, results: Vec<Scanned<T>>) -> Vec<Scanned<T>> {
        let mut groups: Vec<(Vec<String>, u32)> = vec![(Vec::new(), 0)];
        let mut anchors = Vec::new();
        for r in results {
            match r {
                Scanned::Term { term, text } => {
                    anchors.push((term, text));
                    groups.push((Vec::new(), 0));
                }
                Scanned::Text {
                    token_texts, count, ..
                } => {
                    if let Some(g) = groups.last_mut() {
                        g.0.extend(token_texts);
                        g.1 += count;
                    }
                }
            }
        }
        if anchors.is_empty() {
            return vec![Scanned::text(text, 0)];
        }
        let mut positions = vec![None; anchors.len()];
        let mut end = text.len();
        for (i, (_, t)) in anchors.iter().enumerate().rev() {
            if let Some(p) = text[..end].rfind(t.as_str()) {
                positions[i] = Some(p);
                end = p;
            }
        }
        let mut out = Vec::new();
        let mut consumed = 0;
        for (i, (term, t)) in anchors.into_iter().enumerate() {
            match positions[i].filter(|&p| p >= consumed) {
                Some(p) => {
                    if p > consumed {
                        out.push(Scanned::Text {
                            text: text[consumed..p].to_string(),
                            token_texts: std::mem::take(&mut groups[i].0),
                            count: groups[i].1,
                        });
                    }
                    consumed = p + t.len();
                    out.push(Scanned::Term { term, text: t });
                }
                None => {
                    let later = positions[i + 1..].iter().any(Option::is_some);
                    if !later && consumed < text.len() && !term.is_drop() {
                        self.post_text.push_str(&text[consumed..]);
                        consumed = text.len();
                    }
                    self.deferred.push(Deferred {
                        term,
                        text: t,
                        prefix_count: groups[i].1,
                    });
                }
            }
        }
        if consumed < text.len() {
            let (texts, count) = groups.pop().unwrap_or_default();
            out.push(Scanned::Text {
                text: text[consumed..].to_string(),
                token_texts: texts,
                count,
            });
        }
        out
    }
}

/// The step's tokens in order: marker ids as terms, runs of other tokens as text.
fn split_by_ids<T: Terminal>(ids: &HashMap<u32, T>, step: &[(u32, String)]) -> Vec<Scanned<T>> {
    let mut out = Vec::new();
    let mut run: Vec<String> = Vec::new();
    let close = |run: &mut Vec<String>, out: &mut Vec<Scanned<T>>| {
        let text: String = run.concat();
        if !text.is_empty() {
            out.push(Scanned::Text {
                text,
                count: run.len() as u32,
                token_texts: std::mem::take(run),
            });
        }
        run.clear();
    };
    for (id, t) in step {
        match ids.get(id) {
            Some(&term) => {
                close(&mut run, &mut out);
                out.push(Scanned::Term {
                    term,
                    text: t.clone(),
                });
            }
            None => run.push(t.clone()),
        }
    }
    close(&mut run, &mut out);
    out
}
