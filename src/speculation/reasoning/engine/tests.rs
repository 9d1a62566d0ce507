//! The engine against vLLM's own `qwen3` and `kimi_k2` reasoning parsers, run by
//! scripts/reasoning_parser_reference.py on the same tokens.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::*;
use crate::speculation::reasoning::thinking;

#[derive(Deserialize)]
struct Fixture {
    vocab: HashMap<String, VocabDef>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct VocabDef {
    tokens: HashMap<String, u32>,
    special: Vec<String>,
}

#[derive(Deserialize)]
struct Case {
    parser: String,
    kwargs: Option<Value>,
    prompt: Vec<u32>,
    steps: Vec<Step>,
    whole: Whole,
    /// Each step's `[reasoning, content]`, null where vLLM sends nothing.
    deltas: Vec<Option<(Option<String>, Option<String>)>>,
    stream_count: u32,
}

#[derive(Deserialize)]
struct Step {
    tokens: Vec<(u32, String)>,
    text: String,
}

#[derive(Deserialize)]
struct Whole {
    reasoning: Option<String>,
    content: Option<String>,
    count: u32,
}

fn grammar(f: &Fixture, c: &Case) -> Arc<Grammar> {
    let parser = ReasoningParser::ALL
        .into_iter()
        .find(|p| p.as_str() == c.parser)
        .expect("parser name");
    let v = &f.vocab[&c.parser];
    let texts: HashMap<u32, String> = c.steps.iter().flat_map(|s| s.tokens.clone()).collect();
    let specials: Vec<(String, u32)> = v.special.iter().map(|t| (t.clone(), v.tokens[t])).collect();
    let one = Arc::new(texts);
    let one2 = one.clone();
    let texts = Texts {
        one: Arc::new(move |id| one.get(&id).cloned().unwrap_or_default()),
        all: Arc::new(move |ids| ids.iter().filter_map(|id| one2.get(id).cloned()).collect()),
    };
    let on = thinking(parser, c.kwargs.as_ref()).expect("kwargs");
    Arc::new(Grammar::new(
        parser,
        on,
        |t| v.tokens.get(t).copied(),
        &specials,
        texts,
    ))
}

#[test]
fn engine_equals_vllm() {
    let f: Fixture = serde_json::from_str(include_str!("../engine_vllm.json")).expect("fixture");
    assert!(f.cases.len() > 100, "{} cases", f.cases.len());
    for c in &f.cases {
        let g = grammar(&f, c);
        let text: String = c.steps.iter().map(|s| s.text.as_str()).collect();
        let ids: Vec<u32> = c
            .steps
            .iter()
            .flat_map(|s| s.tokens.iter().map(|t| t.0))
            .collect();
        let what = format!("{} {:?} {:?} {text:?}", c.parser, c.kwargs, c.prompt);
        let (reasoning, content) = g.split_full(&text);
        assert_eq!(
            (&reasoning, &content),
            (&c.whole.reasoning, &c.whole.content),
            "whole: {what}"
        );
        assert_eq!(g.count(&ids), c.whole.count, "whole count: {what}");
        let mut s = Stream::new(&g, &c.prompt);
        for (k, (step, want)) in c.steps.iter().zip(&c.deltas).enumerate() {
            let [(id, _)] = step.tokens[..] else {
                panic!("one token a step: {what}");
            };
            let got = s
                .step(Some(id), &step.text, k + 1 == c.steps.len())
                .map(|d| (d.reasoning, d.content));
            assert_eq!(&got, want, "step {k} ({:?}) of {what}", step.text);
        }
        let counted = s.counted().unwrap_or_else(|| g.count(&ids));
        assert_eq!(counted, c.stream_count, "stream count: {what}");
    }
}

#[derive(Deserialize)]
struct ToolFixture {
    vocab: HashMap<String, VocabDef>,
    with_hermes: Vec<ToolCase>,
}

/// A step's `[reasoning, content, [index, name, arguments]…]`.
type ToolDelta = (
    Option<String>,
    Option<String>,
    Vec<(u32, Option<String>, Option<String>)>,
);

#[derive(Deserialize)]
struct ToolCase {
    choice: String,
    prompt: Vec<u32>,
    steps: Vec<Step>,
    whole: ToolWhole,
    deltas: Vec<Option<ToolDelta>>,
}

#[derive(Deserialize)]
struct ToolWhole {
    reasoning: Option<String>,
    content: Option<String>,
    calls: Vec<(String, String)>,
}

/// `qwen3` beside `hermes`, composed as generation.rs composes every step.
#[test]
fn engine_with_hermes_equals_vllm() {
    use crate::config::ToolCallParser;
    use crate::speculation::generation::parse_step;
    use crate::speculation::output::read_whole;
    use crate::speculation::reasoning::Reasoning;
    use crate::speculation::tools::{Choice, Tools};
    let f: ToolFixture =
        serde_json::from_str(include_str!("../engine_vllm.json")).expect("fixture");
    assert!(f.with_hermes.len() > 40, "{} cases", f.with_hermes.len());
    let v = &f.vocab["qwen3"];
    for c in &f.with_hermes {
        let texts: HashMap<u32, String> = c.steps.iter().flat_map(|s| s.tokens.clone()).collect();
        let one = Arc::new(texts);
        let one2 = one.clone();
        let texts = Texts {
            one: Arc::new(move |id| one.get(&id).cloned().unwrap_or_default()),
            all: Arc::new(move |ids| ids.iter().filter_map(|id| one2.get(id).cloned()).collect()),
        };
        let specials: Vec<(String, u32)> =
            v.special.iter().map(|t| (t.clone(), v.tokens[t])).collect();
        let g = Grammar::new(
            ReasoningParser::Qwen3,
            true,
            |t| v.tokens.get(t).copied(),
            &specials,
            texts,
        );
        let r = Reasoning::with_grammar(ReasoningParser::Qwen3, g);
        let choice = if c.choice == "none" {
            Choice::None
        } else {
            Choice::Auto
        };
        let tools = Tools::new(ToolCallParser::Hermes, choice);
        let text: String = c.steps.iter().map(|s| s.text.as_str()).collect();
        let what = format!("{} {:?} {text:?}", c.choice, c.prompt);
        let (reasoning, e) = read_whole(Some(&r), &tools, &text);
        let calls: Vec<(String, String)> =
            e.calls.into_iter().map(|c| (c.name, c.arguments)).collect();
        assert_eq!(
            (&reasoning, &e.content, &calls),
            (&c.whole.reasoning, &c.whole.content, &c.whole.calls),
            "whole: {what}"
        );
        let (mut split, mut ts) = (r.stream(&c.prompt), tools.stream());
        for (k, (step, want)) in c.steps.iter().zip(&c.deltas).enumerate() {
            let [(id, _)] = step.tokens[..] else {
                panic!("one token a step: {what}");
            };
            let last = k + 1 == c.steps.len();
            let (s, d) = parse_step(Some(&mut split), Some(&mut ts), id, &step.text, last);
            let d = d.unwrap_or_default();
            let got = (!s.reasoning.is_empty() || !d.is_empty()).then(|| {
                let calls = d
                    .calls
                    .iter()
                    .map(|c| (c.index, c.name.clone(), c.arguments.clone()));
                (
                    (!s.reasoning.is_empty()).then_some(s.reasoning),
                    d.content.clone(),
                    calls.collect::<Vec<_>>(),
                )
            });
            assert_eq!(&got, want, "step {k} ({:?}) of {what}", step.text);
        }
    }
}
