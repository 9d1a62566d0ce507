//! The parser against vLLM's own `kimi_k2` tool parser (alone and beside the `kimi_k2`
//! reasoning parser), run by scripts/kimi_k2_tool_reference.py on the same tokens:
//! whole answers and streams step by step (`tools::golden`).

use super::*;
use crate::config::{ReasoningParser, ToolCallParser};
use crate::speculation::reasoning::{engine, thinking, Reasoning};
use crate::speculation::tools::golden::{self, Case, Fixture};
use crate::speculation::tools::{EngineGrammar, Tools};

fn setup(f: &Fixture, c: &Case) -> (Tools, Option<Reasoning>) {
    let on = thinking(ReasoningParser::KimiK2, c.kwargs.as_ref()).expect("kwargs");
    let specials = f.specials();
    let vocab = |t: &str| f.vocab.get(t).copied();
    let texts = f.texts();
    let with_reasoning = c.reasoning.is_some();
    let grammar = Grammar::new(on, !with_reasoning, vocab, &specials, texts.one.clone());
    let grammar = EngineGrammar::KimiK2(Arc::new(grammar));
    let tools = f.tools(c, ToolCallParser::KimiK2, grammar, false);
    let reasoning = with_reasoning.then(|| {
        let g = engine::Grammar::new(ReasoningParser::KimiK2, on, vocab, &specials, texts);
        Reasoning::with_grammar(ReasoningParser::KimiK2, g)
    });
    (tools, reasoning)
}

#[test]
fn kimi_k2_equals_vllm() {
    let f: Fixture = serde_json::from_str(include_str!("../kimi_k2_vllm.json")).expect("fixture");
    assert!(f.cases.len() > 200, "{} cases", f.cases.len());
    let called = golden::check(&f, setup);
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
