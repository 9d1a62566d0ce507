//! The parser against vLLM's own `llama3_json` tool parser (alone and beside the
//! `deepseek_r1`, `qwen3` and `kimi_k2` reasoning parsers), run by
//! scripts/llama3_json_reference.py on the same tokens: whole answers as `read_whole`
//! reads them, streams step by step as `generation::parse_step` composes them, and the
//! partial JSON reading under them.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::config::{ReasoningParser, ToolCallParser};
use crate::speculation::generation::parse_step;
use crate::speculation::output::read_whole;
use crate::speculation::reasoning::engine::{Grammar, Texts};
use crate::speculation::reasoning::Reasoning;
use crate::speculation::tools::{Choice, Tools};

#[derive(Deserialize)]
struct Fixture {
    vocab: HashMap<String, u32>,
    special: Vec<String>,
    whole: Vec<WholeCase>,
    streams: Vec<StreamCase>,
    partial: Vec<PartialCase>,
}

/// `[text, Allow.STR, [json.dumps(value), characters taken] | null]`.
type PartialCase = (String, bool, Option<(String, usize)>);

#[derive(Deserialize)]
struct WholeCase {
    text: String,
    content: Option<String>,
    calls: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct StreamCase {
    reasoning: Option<String>,
    choice: String,
    prompt: Vec<u32>,
    steps: Vec<Step>,
    whole: Whole,
    /// Each step's `[reasoning, content, [[index, id, name, arguments]…]]`.
    deltas: Vec<Option<StepDelta>>,
}

type Piece = (u32, Option<String>, Option<String>, Option<String>);
type StepDelta = (Option<String>, Option<String>, Vec<Piece>);

#[derive(Deserialize)]
struct Step {
    tokens: Vec<(u32, String)>,
    text: String,
}

#[derive(Deserialize)]
struct Whole {
    reasoning: Option<String>,
    content: Option<String>,
    calls: Vec<(String, String)>,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("../llama3_json_vllm.json")).expect("reference json")
}

/// vLLM's own llama3_json parser on whole answers.
#[test]
fn llama3_json_equals_vllm() {
    let f = fixture();
    let t = Tools::new(ToolCallParser::Llama3Json, Choice::Auto);
    assert!(f.whole.len() > 20);
    for c in &f.whole {
        let e = t.extract(&c.text);
        let calls: Vec<(String, String)> =
            e.calls.into_iter().map(|c| (c.name, c.arguments)).collect();
        assert_eq!((&e.content, &calls), (&c.content, &c.calls), "{:?}", c.text);
    }
}

/// The `partial_json_parser` library as vLLM calls it, on every prefix of random texts.
#[test]
fn partial_json_equals_the_library() {
    use crate::speculation::tools::{partial_json, pyjson};
    let f = fixture();
    assert!(f.partial.len() > 3000, "{}", f.partial.len());
    let raised = f.partial.iter().filter(|c| c.2.is_none()).count();
    assert!(raised > 100, "{raised}");
    for (text, strings, want) in &f.partial {
        let got = partial_json::vllm_loads(text, *strings)
            .ok()
            .map(|(v, n)| (pyjson::dumps(&v), n));
        assert_eq!(&got, want, "{text:?} strings {strings}");
    }
}

fn reasoning_of(f: &Fixture, c: &StreamCase) -> Option<Reasoning> {
    let parser = ReasoningParser::ALL
        .into_iter()
        .find(|p| Some(p.as_str()) == c.reasoning.as_deref())?;
    if parser == ReasoningParser::DeepseekR1 {
        let r = Reasoning::with_ids(parser, f.vocab["<think>"], f.vocab["</think>"]);
        return Some(r);
    }
    let names: HashMap<u32, String> = f.vocab.iter().map(|(k, v)| (*v, k.clone())).collect();
    let one = Arc::new(names);
    let one2 = one.clone();
    let texts = Texts {
        one: Arc::new(move |id| one.get(&id).cloned().unwrap_or_default()),
        all: Arc::new(move |ids| ids.iter().filter_map(|i| one2.get(i).cloned()).collect()),
    };
    let specials: Vec<(String, u32)> = f.special.iter().map(|t| (t.clone(), f.vocab[t])).collect();
    let g = Grammar::new(parser, true, |t| f.vocab.get(t).copied(), &specials, texts);
    Some(Reasoning::with_grammar(parser, g))
}

/// vLLM's random ids read as `None` (specd makes its own); empty argument pieces
/// joined into the piece before (specd's chunks join a step's fragments).
fn normalize(pieces: Vec<Piece>) -> Vec<Piece> {
    pieces
        .into_iter()
        .map(|(i, id, name, args)| {
            let id = id.filter(|s| !s.starts_with("chatcmpl-tool-"));
            (i, id, name, args)
        })
        .collect()
}

/// vLLM's streamed steps, every one, beside and without reasoning parsers.
#[test]
fn llama3_json_streams_equal_vllm() {
    let f = fixture();
    assert!(f.streams.len() > 300, "{} cases", f.streams.len());
    let (mut steps, mut called) = (0, 0);
    for c in &f.streams {
        let reasoning = reasoning_of(&f, c);
        assert_eq!(
            reasoning.is_some(),
            c.reasoning.is_some(),
            "{:?}",
            c.reasoning
        );
        let choice = if c.choice == "auto" {
            Choice::Auto
        } else {
            Choice::None
        };
        let tools = Tools::new(ToolCallParser::Llama3Json, choice);
        let text: String = c.steps.iter().map(|s| s.text.as_str()).collect();
        let what = format!("{:?} {} {:?} {text:?}", c.reasoning, c.choice, c.prompt);
        let (r, e) = read_whole(reasoning.as_ref(), &tools, &text);
        let calls: Vec<(String, String)> =
            e.calls.into_iter().map(|k| (k.name, k.arguments)).collect();
        assert_eq!(
            (&r, &e.content, &calls),
            (&c.whole.reasoning, &c.whole.content, &c.whole.calls),
            "whole: {what}"
        );
        let mut split = reasoning.as_ref().map(|r| r.stream(&c.prompt));
        let mut stream = tools.stream();
        for (k, (step, want)) in c.steps.iter().zip(&c.deltas).enumerate() {
            let [(id, _)] = step.tokens[..] else {
                panic!("one token a step: {what}");
            };
            let last = k + 1 == c.steps.len();
            let (sp, d) = parse_step(split.as_mut(), Some(&mut stream), id, &step.text, last);
            let r = (!sp.reasoning.is_empty()).then_some(sp.reasoning);
            let got = match d {
                None if r.is_none() => None,
                None => Some((r, None, Vec::new())),
                Some(d) => {
                    let p = d.calls.into_iter();
                    let p = p.map(|p| (p.index, p.id, p.name, p.arguments)).collect();
                    Some((r, d.content, p))
                }
            };
            // An empty reasoning piece (deepseek_r1's step that adds nothing while
            // reasoning is open) is the output layer's to write (output.rs `delta`).
            let want = want.clone().and_then(|(r, c, p)| {
                let r = r.filter(|r| !r.is_empty());
                (r.is_some() || c.is_some() || !p.is_empty()).then(|| (r, c, normalize(p)))
            });
            assert_eq!(got, want, "step {k} ({:?}) of {what}", step.text);
            steps += 1;
            called += usize::from(want.is_some_and(|w| w.2.iter().any(|p| p.2.is_some())));
        }
    }
    assert!(
        steps > 10_000 && called > 100,
        "{steps} steps, {called} with a name"
    );
}
