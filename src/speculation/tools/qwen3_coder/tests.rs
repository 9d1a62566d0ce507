//! The parser against vLLM's own `qwen3_coder` tool parser (alone and beside the `qwen3`
//! and `deepseek_r1` reasoning parsers), run by scripts/qwen3_coder_tool_reference.py on the same tokens:
//! whole answers and streams step by step (`tools::golden`).

use std::collections::HashMap;

use super::*;
use crate::config::{ReasoningParser, ToolCallParser};
use crate::speculation::reasoning::{engine, thinking, Reasoning};
use crate::speculation::tools::golden::{self, Case, Fixture};
use crate::speculation::tools::{Choice, EngineGrammar, EngineTools, Tools};

fn setup(f: &Fixture, c: &Case) -> (Tools, Option<Reasoning>) {
    let on = thinking(ReasoningParser::Qwen3, c.kwargs.as_ref()).expect("kwargs");
    let names: HashMap<u32, String> = f.vocab.iter().map(|(k, v)| (*v, k.clone())).collect();
    let names = Arc::new(names);
    let specials: Vec<(String, u32)> = f.special.iter().map(|t| (t.clone(), f.vocab[t])).collect();
    let vocab = |t: &str| f.vocab.get(t).copied();
    let n1 = names.clone();
    let one: DecodeOne = Arc::new(move |id| n1.get(&id).cloned().unwrap_or_default());
    let parser = c.reasoning.as_deref().map(|r| match r {
        "qwen3" => ReasoningParser::Qwen3,
        "deepseek_r1" => ReasoningParser::DeepseekR1,
        r => panic!("reasoning parser {r}"),
    });
    let grammar = Grammar::new(parser.is_none(), vocab, &specials, one.clone());
    let declared = (c.choice != "no_tools").then(|| Declared::of(&f.tools).expect("tools"));
    let choice = if c.choice == "auto" {
        Choice::Auto
    } else {
        Choice::None
    };
    let tools = Tools {
        parser: ToolCallParser::Qwen3Coder,
        choice,
        engine: Some(Arc::new(EngineTools {
            grammar: EngineGrammar::Qwen3Coder(Arc::new(grammar)),
            declared,
            delegated: parser == Some(ReasoningParser::DeepseekR1),
        })),
        sglang: None,
    };
    let reasoning = parser.map(|p| {
        if p == ReasoningParser::DeepseekR1 {
            return Reasoning::with_ids(p, f.vocab["<think>"], f.vocab["</think>"]);
        }
        let n2 = names.clone();
        let texts = engine::Texts {
            one,
            all: Arc::new(move |ids| ids.iter().filter_map(|i| n2.get(i).cloned()).collect()),
        };
        let g = engine::Grammar::new(p, on, vocab, &specials, texts);
        Reasoning::with_grammar(p, g)
    });
    (tools, reasoning)
}

#[test]
fn qwen3_coder_equals_vllm() {
    let f: Fixture =
        serde_json::from_str(include_str!("../qwen3_coder_vllm.json")).expect("fixture");
    assert!(f.cases.len() > 400, "{} cases", f.cases.len());
    let called = golden::check(&f, setup);
    assert!(called > 100, "{called}");
}
