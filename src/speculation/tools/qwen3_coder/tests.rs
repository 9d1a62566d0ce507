//! The parser against vLLM's own `qwen3_coder` tool parser (alone and beside the `qwen3`
//! and `deepseek_r1` reasoning parsers), run by scripts/qwen3_coder_tool_reference.py on the same tokens:
//! whole answers and streams step by step (`tools::golden`).

use super::*;
use crate::config::{ReasoningParser, ToolCallParser};
use crate::speculation::reasoning::{engine, thinking, Reasoning};
use crate::speculation::tools::golden::{self, Case, Fixture};
use crate::speculation::tools::{EngineGrammar, Tools};

fn setup(f: &Fixture, c: &Case) -> (Tools, Option<Reasoning>) {
    let on = thinking(ReasoningParser::Qwen3, c.kwargs.as_ref()).expect("kwargs");
    let specials = f.specials();
    let vocab = |t: &str| f.vocab.get(t).copied();
    let texts = f.texts();
    let parser = c.reasoning.as_deref().map(|r| match r {
        "qwen3" => ReasoningParser::Qwen3,
        "deepseek_r1" => ReasoningParser::DeepseekR1,
        r => panic!("reasoning parser {r}"),
    });
    let grammar = Grammar::new(parser.is_none(), vocab, &specials, texts.one.clone());
    let grammar = EngineGrammar::Qwen3Coder(Arc::new(grammar));
    let delegated = parser == Some(ReasoningParser::DeepseekR1);
    let tools = f.tools(c, ToolCallParser::Qwen3Coder, grammar, delegated);
    let reasoning = parser.map(|p| {
        if p == ReasoningParser::DeepseekR1 {
            return Reasoning::with_ids(p, f.vocab["<think>"], f.vocab["</think>"]);
        }
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
