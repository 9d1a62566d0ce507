//! The parser against vLLM's own `kimi_k2` tool parser (alone and beside the `kimi_k2`
//! reasoning parser), run by scripts/kimi_k2_tool_reference.py on the same tokens:
//! whole answers as `read_whole` reads them, streams step by step as
//! `generation::parse_step` composes them.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::*;
use crate::config::{ReasoningParser, ToolCallParser};
use crate::speculation::generation::parse_step;
use crate::speculation::output::read_whole;
use crate::speculation::reasoning::{engine, thinking, Reasoning};
use crate::speculation::tools::{Choice, EngineTools, Tools};

#[derive(Deserialize)]
struct Fixture {
    vocab: HashMap<String, u32>,
    special: Vec<String>,
    tools: Value,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    reasoning: Option<String>,
    kwargs: Option<Value>,
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
    /// `[id, name, arguments]`.
    calls: Vec<(String, String, String)>,
}

/// vLLM's random ids read as `None` (specd makes its own); argument fragments of one
/// call that follow each other joined (vLLM appends the end's flush as pieces of their
/// own, specd's chunks join them).
fn normalize(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for (i, id, name, args) in pieces {
        let id = id.filter(|s| !s.starts_with("chatcmpl-tool-"));
        match out.last_mut() {
            Some(last) if last.0 == i && id.is_none() && name.is_none() => {
                if let Some(a) = args {
                    last.3.get_or_insert_with(String::new).push_str(&a);
                }
            }
            _ => out.push((i, id, name, args)),
        }
    }
    out
}

/// An empty step (vLLM's `tool_calls = []` of `tool_choice: "none"`) sends nothing new.
fn step_view(d: Option<StepDelta>) -> Option<StepDelta> {
    let (r, c, p) = d?;
    let p = normalize(p);
    (r.is_some() || c.is_some() || !p.is_empty()).then_some((r, c, p))
}

struct Setup {
    tools: Tools,
    reasoning: Option<Reasoning>,
}

fn setup(f: &Fixture, c: &Case) -> Setup {
    let on = thinking(ReasoningParser::KimiK2, c.kwargs.as_ref()).expect("kwargs");
    let names: HashMap<u32, String> = f.vocab.iter().map(|(k, v)| (*v, k.clone())).collect();
    let names = Arc::new(names);
    let specials: Vec<(String, u32)> = f.special.iter().map(|t| (t.clone(), f.vocab[t])).collect();
    let vocab = |t: &str| f.vocab.get(t).copied();
    let n1 = names.clone();
    let one: DecodeOne = Arc::new(move |id| n1.get(&id).cloned().unwrap_or_default());
    let with_reasoning = c.reasoning.is_some();
    let grammar = Grammar::new(on, !with_reasoning, vocab, &specials, one.clone());
    let declared = (c.choice != "no_tools").then(|| Declared::of(&f.tools).expect("tools"));
    let choice = if c.choice == "auto" {
        Choice::Auto
    } else {
        Choice::None
    };
    let tools = Tools {
        parser: ToolCallParser::KimiK2,
        choice,
        engine: Some(Arc::new(EngineTools {
            grammar: Arc::new(grammar),
            declared,
        })),
        sglang: None,
    };
    let reasoning = with_reasoning.then(|| {
        let n2 = names.clone();
        let texts = engine::Texts {
            one,
            all: Arc::new(move |ids| ids.iter().filter_map(|i| n2.get(i).cloned()).collect()),
        };
        let g = engine::Grammar::new(ReasoningParser::KimiK2, on, vocab, &specials, texts);
        Reasoning::with_grammar(ReasoningParser::KimiK2, g)
    });
    Setup { tools, reasoning }
}

#[test]
fn kimi_k2_equals_vllm() {
    let f: Fixture = serde_json::from_str(include_str!("../kimi_k2_vllm.json")).expect("fixture");
    assert!(f.cases.len() > 200, "{} cases", f.cases.len());
    let mut called = 0;
    for c in &f.cases {
        let s = setup(&f, c);
        let text: String = c.steps.iter().map(|s| s.text.as_str()).collect();
        let what = format!("{:?} {:?} {} {text:?}", c.reasoning, c.kwargs, c.choice);
        let (reasoning, e) = read_whole(s.reasoning.as_ref(), &s.tools, &text);
        let calls: Vec<(Option<String>, String, String)> = e
            .calls
            .into_iter()
            .map(|k| (k.id, k.name, k.arguments))
            .collect();
        let want: Vec<(Option<String>, String, String)> = c
            .whole
            .calls
            .iter()
            .map(|(id, n, a)| {
                let id = Some(id.clone()).filter(|s| !s.starts_with("chatcmpl-tool-"));
                (id, n.clone(), a.clone())
            })
            .collect();
        called += usize::from(!want.is_empty());
        assert_eq!(
            (&reasoning, &e.content, &calls),
            (&c.whole.reasoning, &c.whole.content, &want),
            "whole: {what}"
        );
        let mut split = s.reasoning.as_ref().map(|r| r.stream(&c.prompt));
        let mut stream = s.tools.stream();
        for (k, (step, want)) in c.steps.iter().zip(&c.deltas).enumerate() {
            let [(id, _)] = step.tokens[..] else {
                panic!("one token a step: {what}");
            };
            let last = k + 1 == c.steps.len();
            let (sp, d) = parse_step(split.as_mut(), Some(&mut stream), id, &step.text, last);
            let reasoning = (!sp.reasoning.is_empty()).then_some(sp.reasoning);
            let got = match d {
                None => (reasoning, None, Vec::new()),
                Some(d) => {
                    let pieces = d
                        .calls
                        .into_iter()
                        .map(|p| (p.index, p.id, p.name, p.arguments))
                        .collect();
                    (reasoning, d.content, pieces)
                }
            };
            assert_eq!(
                step_view(Some(got)),
                step_view(want.clone()),
                "step {k} ({:?}) of {what}",
                step.text
            );
        }
    }
    assert!(called > 100, "{called}");
}

#[test]
fn headers_give_id_and_name() {
    let ok = id_and_name;
    assert_eq!(
        ok(" functions.get_weather:0 "),
        Some(("functions.get_weather:0".into(), "get_weather".into()))
    );
    assert_eq!(
        ok("functions.a:1:2x"),
        Some(("functions.a:1:2".into(), "a".into()))
    );
    assert_eq!(ok("get_weather"), None);
    assert_eq!(ok(":1"), None);
    assert_eq!(ok("f\n:1"), None);
    assert_eq!(name_in_args(r#"{"name" : "x"}"#), Some("x"));
    assert_eq!(name_in_args(r#"{"name": ""}"#), None);
}
