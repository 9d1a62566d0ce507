//! Per-token bookkeeping of one generation, in the order the upstream applies it: length
//! limits, then EOS and stop token ids, then stop strings on the detokenized text.

use serde_json::Value;

use super::reasoning::{Split, StreamSplit};
use super::tools::{StreamDelta, ToolPiece, ToolStream};
use crate::tokens::{Detokenizer, StopMatcher};
use crate::upstream::verify::Sample;

/// Why a generation ended, as OpenAI's `finish_reason` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    /// The matched stop string or stop token id (vLLM's `stop_reason`).
    pub stop_reason: Value,
}

impl Finish {
    pub fn length() -> Self {
        Finish {
            reason: FinishReason::Length,
            stop_reason: Value::Null,
        }
    }
}

pub struct Limits {
    pub max_tokens: u32,
    pub max_model_len: u32,
    pub prompt_len: u32,
    /// The tokenizer's EOS (ends generation unless `ignore_eos`).
    pub eos_id: Option<u32>,
    /// Further EOS ids from generation_config: stop token ids unless `ignore_eos`.
    pub extra_eos_ids: Vec<u32>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub include_stop_str: bool,
}

pub struct Generation<'t> {
    limits: Limits,
    detok: Detokenizer<'t>,
    stops: StopMatcher,
    pub generated: u32,
    /// Text released for the client since the last `take`.
    text: String,
    /// The text one token releases (reused from token to token).
    scratch: String,
    tokens: Vec<Sample>,
    /// With a reasoning parser: the same text, split as vLLM streams it.
    reasoning: Option<(StreamSplit, Split)>,
    /// With a tool-call parser: what the text adds to content and calls, as vLLM parses
    /// it step by step.
    tools: Option<(ToolStream, StreamDelta)>,
}

/// What a generation released since the last `take`.
#[derive(Debug, Default)]
pub struct Piece {
    pub text: String,
    pub tokens: Vec<Sample>,
    /// `text` as reasoning and content (with a reasoning parser).
    pub split: Option<Split>,
    /// What `text` adds to content and tool calls (with a tool-call parser).
    pub calls: Option<ToolPiece>,
}

impl<'t> Generation<'t> {
    pub fn new(limits: Limits, detok: Detokenizer<'t>, stop: Vec<String>) -> Self {
        let stops = StopMatcher::new(stop, limits.include_stop_str);
        Generation {
            limits,
            detok,
            stops,
            generated: 0,
            text: String::new(),
            scratch: String::new(),
            tokens: Vec::new(),
            reasoning: None,
            tools: None,
        }
    }

    /// Split the released text as `splitter` does (a reasoning parser).
    pub fn with_reasoning(mut self, splitter: StreamSplit) -> Self {
        self.reasoning = Some((splitter, Split::default()));
        self
    }

    /// Parse the released text for tool calls as `stream` does (a tool-call parser).
    pub fn with_tools(mut self, stream: ToolStream) -> Self {
        self.tools = Some((stream, StreamDelta::default()));
        self
    }

    /// Tokens still allowed before `max_tokens` or the context limit.
    pub fn remaining(&self) -> u32 {
        let by_max = self.limits.max_tokens.saturating_sub(self.generated);
        let by_ctx = self
            .limits
            .max_model_len
            .saturating_sub(self.limits.prompt_len + self.generated);
        by_max.min(by_ctx)
    }

    /// Add one generated token; `Some` when generation ends with it.
    pub fn push(&mut self, s: Sample) -> Option<Finish> {
        let id = s.id;
        // One buffer for every token's released text, not a String per token.
        let mut released = std::mem::take(&mut self.scratch);
        released.clear();
        let finish = self.step(s, &mut released);
        self.release(id, &released, finish.is_some());
        self.scratch = released;
        finish
    }

    /// The text released with token `id` is one streaming step for the parsers; `last`
    /// when generation ends with it.
    fn release(&mut self, id: u32, text: &str, last: bool) {
        self.text.push_str(text);
        let (step, calls) = parse_step(
            self.reasoning.as_mut().map(|(s, _)| s),
            self.tools.as_mut().map(|(t, _)| t),
            id,
            text,
            last,
        );
        if let Some((_, split)) = &mut self.reasoning {
            split.reasoning.push_str(&step.reasoning);
            split.content.push_str(&step.content);
            split.bare = step.bare;
        }
        if let (Some((_, acc)), Some(d)) = (&mut self.tools, calls) {
            acc.append(d);
        }
    }

    fn step(&mut self, s: Sample, released: &mut String) -> Option<Finish> {
        let id = s.id;
        self.generated += 1;
        self.tokens.push(s);
        let length = self.generated >= self.limits.max_tokens
            || self.limits.prompt_len + self.generated >= self.limits.max_model_len;
        let l = &self.limits;
        // vLLM's order: EOS, stop token ids, then the length limits.
        let engine_stop = if !l.ignore_eos && l.eos_id == Some(id) {
            Some(Finish {
                reason: FinishReason::Stop,
                stop_reason: Value::Null,
            })
        } else if l.stop_token_ids.contains(&id) || (!l.ignore_eos && l.extra_eos_ids.contains(&id))
        {
            Some(Finish {
                reason: FinishReason::Stop,
                stop_reason: Value::from(id),
            })
        } else if length {
            Some(Finish::length())
        } else {
            None
        };
        // The token that ended generation by EOS/stop id is not rendered as text.
        let stop_terminated = engine_stop
            .as_ref()
            .is_some_and(|f| f.reason == FinishReason::Stop);
        if !stop_terminated || self.limits.include_stop_str {
            let piece = self.detok.step(id);
            if let Some(s) = self.stops.push_into(&piece, released) {
                return Some(Finish {
                    reason: FinishReason::Stop,
                    stop_reason: Value::from(s),
                });
            }
        }
        if engine_stop.is_some() {
            released.push_str(&self.stops.flush());
        }
        engine_stop
    }

    /// Tokens whose text could not be decoded.
    pub fn decode_errors(&self) -> u64 {
        self.detok.errors()
    }

    /// Text and tokens produced since the last call.
    pub fn take(&mut self) -> Piece {
        Piece {
            text: std::mem::take(&mut self.text),
            tokens: std::mem::take(&mut self.tokens),
            split: self.reasoning.as_mut().map(|(splitter, split)| Split {
                closed: splitter.is_closed(),
                counted: splitter.counted(),
                ..std::mem::take(split)
            }),
            calls: self.tools.as_mut().map(|(stream, acc)| ToolPiece {
                delta: std::mem::take(acc),
                called: stream.called(),
            }),
        }
    }

    /// End for a reason outside the tokens (e.g. an error): release held text.
    pub fn flush(&mut self) {
        let rest = self.stops.flush();
        self.text.push_str(&rest);
        let mut content = Some(rest.as_str());
        if let Some((splitter, split)) = &mut self.reasoning {
            splitter.held(&rest, split);
            content = content.filter(|_| splitter.is_closed());
        }
        if let (Some((stream, acc)), Some(c)) = (&mut self.tools, content) {
            if let Some(d) = stream.step(c, &[], true) {
                acc.append(d);
            }
        }
    }
}

impl Generation<'_> {
    /// Put back what `take` returned (it goes out with the final event).
    pub fn restore(&mut self, piece: Piece) {
        let mut t = piece.text;
        t.push_str(&self.text);
        self.text = t;
        let mut tokens = piece.tokens;
        tokens.append(&mut self.tokens);
        self.tokens = tokens;
        if let (Some(mut earlier), Some((_, split))) = (piece.split, self.reasoning.as_mut()) {
            earlier.append(std::mem::take(split));
            *split = earlier;
        }
        if let (Some(mut earlier), Some((_, acc))) = (piece.calls, self.tools.as_mut()) {
            earlier.delta.append(std::mem::take(acc));
            *acc = earlier.delta;
        }
    }
}

/// One streaming step through the parsers, as vLLM's `parse_delta` composes them: what
/// the reasoning parser splits off, and what the tool-call parser makes of the content.
/// With both, tool calls are parsed from the content once reasoning has ended (the step
/// that ends it parses its content, none for a lone `</think>`); content the reasoning
/// parser releases while still open (its held text, at the end) is content as it is.
pub fn parse_step(
    reasoning: Option<&mut StreamSplit>,
    tools: Option<&mut ToolStream>,
    id: u32,
    text: &str,
    last: bool,
) -> (Split, Option<StreamDelta>) {
    let mut step = Split::default();
    if reasoning.is_none() && tools.is_none() {
        return (step, None);
    }
    let mut content = Some(text);
    let mut raw = None;
    let mut ids = vec![id];
    if let Some(splitter) = reasoning {
        let was_closed = splitter.is_closed();
        splitter.step(id, text, last, &mut step);
        if splitter.feeds_tools_while_open() {
            content = Some(step.content.as_str());
        } else if splitter.is_closed() {
            content = Some(step.content.as_str());
            if !was_closed {
                ids = splitter.content_ids(id);
            }
        } else {
            content = None;
            raw = (!step.content.is_empty()).then(|| step.content.clone());
        }
    }
    let mut calls = None;
    if let Some(stream) = tools {
        if let Some(c) = content {
            calls = stream.step(c, &ids, last);
        }
        if let Some(r) = raw {
            let d = calls.get_or_insert_with(StreamDelta::default);
            d.content.get_or_insert_with(String::new).push_str(&r);
        }
    }
    (step, calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::Tokenizer;

    fn tok() -> Tokenizer {
        let vocab = [("a", 0), ("b", 1), ("<eos>", 2), ("c", 3), ("<end>", 4)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let wl = WordLevel::builder()
            .vocab(vocab)
            .unk_token("a".into())
            .build()
            .expect("vocab");
        Tokenizer::new(wl)
    }

    fn limits(max_tokens: u32) -> Limits {
        Limits {
            max_tokens,
            max_model_len: 100,
            prompt_len: 2,
            eos_id: Some(2),
            extra_eos_ids: vec![4],
            stop_token_ids: vec![3],
            ignore_eos: false,
            include_stop_str: false,
        }
    }

    fn run(l: Limits, stop: Vec<String>, ids: &[u32]) -> (String, u32, Option<Finish>) {
        let t = tok();
        let mut g = Generation::new(l, Detokenizer::new(&t, true, &[0, 1]), stop);
        let mut fin = None;
        for &i in ids {
            if let Some(f) = g.push(Sample::id(i)) {
                fin = Some(f);
                break;
            }
        }
        if fin.is_none() {
            g.flush();
        }
        (g.take().text, g.generated, fin)
    }

    #[test]
    fn eos_wins_over_length_like_vllm() {
        let (_, n, f) = run(limits(2), vec![], &[0, 2]);
        assert_eq!(n, 2);
        assert_eq!(f.expect("finish").reason, FinishReason::Stop);
        let (_, _, f) = run(limits(2), vec![], &[0, 0]);
        assert_eq!(f.expect("finish").reason, FinishReason::Length);
    }

    #[test]
    fn stop_ids_report_the_id_and_ignore_eos_keeps_going() {
        let (_, _, f) = run(limits(10), vec![], &[0, 3, 0]);
        assert_eq!(f.expect("finish").stop_reason, Value::from(3));
        let (_, _, f) = run(limits(10), vec![], &[0, 4]);
        assert_eq!(f.expect("finish").stop_reason, Value::from(4));
        let mut l = limits(3);
        l.ignore_eos = true;
        let (_, n, f) = run(l, vec![], &[2, 4, 0, 0]);
        assert_eq!(n, 3);
        assert_eq!(f.expect("finish").reason, FinishReason::Length);
    }

    #[test]
    fn tokens_after_a_stop_string_are_not_generated() {
        let (text, n, f) = run(limits(10), vec!["b a".into()], &[0, 1, 0, 0, 0]);
        let f = f.expect("finish");
        assert_eq!(
            (f.reason, f.stop_reason),
            (FinishReason::Stop, Value::from("b a"))
        );
        assert_eq!(n, 3);
        assert!(!text.contains("b a"), "{text}");
    }
}
