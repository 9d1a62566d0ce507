//! The parser against vLLM's own `kimi_k2` tool parser (alone and beside the `kimi_k2`
//! reasoning parser), run by scripts/kimi_k2_tool_reference.py on the same tokens:
//! whole answers and streams step by step (`tools::golden`).

use std::collections::HashMap;

use super::*;
use crate::config::{ReasoningParser, ToolCallParser};
use crate::speculation::reasoning::{engine, thinking, Reasoning};
use crate::speculation::tools::golden::{self, Case, Fixture};
use crate::speculation::tools::{Choice, EngineGrammar, EngineTools, Tools};

fn setup(f: &Fixture, c: &Case) -> (Tools, Option<Reasoning>) {
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
            grammar: EngineGrammar::KimiK2(Arc::new(grammar)),
            declared,
            delegated: false,
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
