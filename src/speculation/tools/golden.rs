//! The grammar-engine tool parsers against vLLM's own, on the goldens that
//! scripts/engine_tool_reference.py drives (`kimi_k2_vllm.json`, `qwen3_coder_vllm.json`):
//! whole answers as `read_whole` reads them, streams step by step as
//! `generation::parse_step` composes them.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::schema::Declared;
use super::{Choice, EngineGrammar, EngineTools, Tools};
use crate::config::ToolCallParser;
use crate::speculation::generation::parse_step;
use crate::speculation::output::read_whole;
use crate::speculation::reasoning::{engine::Texts, Reasoning};

#[derive(Deserialize)]
pub struct Fixture {
    pub vocab: HashMap<String, u32>,
    pub special: Vec<String>,
    pub tools: Value,
    pub cases: Vec<Case>,
}

impl Fixture {
    /// The stand-in tokenizer's special tokens and their ids.
    pub fn specials(&self) -> Vec<(String, u32)> {
        self.special
            .iter()
            .map(|t| (t.clone(), self.vocab[t]))
            .collect()
    }

    /// The stand-in tokenizer's texts: a token's alone, and a sequence's.
    pub fn texts(&self) -> Texts {
        let names: HashMap<u32, String> = self.vocab.iter().map(|(k, v)| (*v, k.clone())).collect();
        let names = Arc::new(names);
        let n = names.clone();
        Texts {
            one: Arc::new(move |id| n.get(&id).cloned().unwrap_or_default()),
            all: Arc::new(move |ids| ids.iter().filter_map(|i| names.get(i).cloned()).collect()),
        }
    }

    /// Case `c`'s tool parsing with `grammar`: the fixture's tools declared unless the
    /// case has none, `tool_choice` as the case's.
    pub fn tools(
        &self,
        c: &Case,
        parser: ToolCallParser,
        grammar: EngineGrammar,
        delegated: bool,
    ) -> Tools {
        let declared = (c.choice != "no_tools").then(|| Declared::of(&self.tools).expect("tools"));
        let choice = if c.choice == "auto" {
            Choice::Auto
        } else {
            Choice::None
        };
        Tools {
            parser,
            choice,
            engine: Some(Arc::new(EngineTools {
                grammar,
                declared,
                delegated,
            })),
            sglang: None,
        }
    }
}

#[derive(Deserialize)]
pub struct Case {
    pub reasoning: Option<String>,
    pub kwargs: Option<Value>,
    pub choice: String,
    pub prompt: Vec<u32>,
    pub steps: Vec<Step>,
    pub whole: Whole,
    /// Each step's `[reasoning, content, [[index, id, name, arguments]…]]`.
    pub deltas: Vec<Option<StepDelta>>,
}

pub type Piece = (u32, Option<String>, Option<String>, Option<String>);
pub type StepDelta = (Option<String>, Option<String>, Vec<Piece>);

#[derive(Deserialize)]
pub struct Step {
    pub tokens: Vec<(u32, String)>,
    pub text: String,
}

#[derive(Deserialize)]
pub struct Whole {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    /// `[id, name, arguments]`.
    pub calls: Vec<(String, String, String)>,
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

/// An empty step (vLLM's `tool_calls = []` of `tool_choice: "none"`) sends nothing new;
/// deepseek_r1's empty reasoning delta of a last step still in reasoning is the output
/// layer's to write (`output::delta`), not the parse's.
fn step_view(d: Option<StepDelta>) -> Option<StepDelta> {
    let (r, c, p) = d?;
    let r = r.filter(|r| !r.is_empty());
    let p = normalize(p);
    (r.is_some() || c.is_some() || !p.is_empty()).then_some((r, c, p))
}

/// Every case of `f`, with the parsers `setup` makes for it, equals vLLM's answer (whole
/// and each streamed step); how many cases called a tool.
pub fn check(f: &Fixture, setup: impl Fn(&Fixture, &Case) -> (Tools, Option<Reasoning>)) -> usize {
    let mut called = 0;
    for c in &f.cases {
        let (tools, reasoning_parser) = setup(f, c);
        let text: String = c.steps.iter().map(|s| s.text.as_str()).collect();
        let what = format!("{:?} {:?} {} {text:?}", c.reasoning, c.kwargs, c.choice);
        let (reasoning, e) = read_whole(reasoning_parser.as_ref(), &tools, &text);
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
        let mut split = reasoning_parser.as_ref().map(|r| r.stream(&c.prompt));
        let mut stream = tools.stream();
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
    called
}
