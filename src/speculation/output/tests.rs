//! The typed bodies serialize to exactly the JSON vLLM writes (as specd wrote it before
//! they were typed).

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::*;
use crate::config::SpecMode;
use crate::draft::{DrafterChoice, DrafterKind};
use crate::speculation::generation::FinishReason;

fn shape(endpoint: Endpoint, want_logprobs: bool) -> Shape {
    let vocab: Map<String, Value> = (0..8).map(|i| (format!("t{i}"), i.into())).collect();
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    let tokenizer: tokenizers::Tokenizer = tok.to_string().parse().expect("tokenizer json");
    Shape {
        endpoint,
        id: "id-1".into(),
        created: 7,
        model: "m".into(),
        want_logprobs,
        tokens_as_ids: false,
        tokenizer: Arc::new(ModelTokenizer::from_tokenizer(tokenizer)),
        reasoning: None,
        tools: None,
    }
}

fn stats() -> Stats {
    Stats {
        prompt_tokens: 3,
        completion_tokens: 2,
        rounds: 1,
        draft_tokens: 2,
        accepted_tokens: 1,
        relay_tokens: 0,
        switches: 0,
        drafter: DrafterChoice::One(DrafterKind::Ngram),
        mode: SpecMode::On,
    }
}

fn to_value(b: &Body<'_>) -> Value {
    serde_json::to_value(b).expect("serializable")
}

fn spec_usage() -> Value {
    json!({"mode": "on", "drafter": "ngram", "rounds": 1, "draft_tokens": 2,
           "accepted_tokens": 1, "relay_tokens": 0, "switches": 0})
}

#[test]
fn whole_responses() {
    let finish = Finish {
        reason: FinishReason::Stop,
        stop_reason: json!("x"),
    };
    let usage = json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": null, "completion_tokens_details": null, "speculation": spec_usage()});
    let s = shape(Endpoint::Completions, false);
    assert_eq!(
        to_value(&s.full("ab", None, &finish, &stats(), None)),
        json!({"id": "id-1", "object": "text_completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "text": "ab", "logprobs": null, "finish_reason": "stop",
                         "stop_reason": "x", "prompt_logprobs": null}],
            "usage": usage})
    );
    let s = shape(Endpoint::Chat, false);
    assert_eq!(
        to_value(&s.full("ab", None, &finish, &stats(), None)),
        json!({"id": "id-1", "object": "chat.completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ab", "tool_calls": []},
                         "logprobs": null, "finish_reason": "stop", "stop_reason": "x"}],
            "usage": usage})
    );
}

#[test]
fn chunks_and_usage_chunk() {
    let s = shape(Endpoint::Chat, false);
    assert_eq!(
        to_value(&s.chunk("", Parsed::default(), None, None, true)),
        json!({"id": "id-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": null, "finish_reason": null, "stop_reason": null}]})
    );
    assert_eq!(
        to_value(&s.chunk("a", Parsed::default(), None, None, false))["choices"][0]["delta"],
        json!({"content": "a"})
    );
    let s = shape(Endpoint::Completions, false);
    assert_eq!(
        to_value(&s.chunk("a", Parsed::default(), None, Some(&Finish::length()), false)),
        json!({"id": "id-1", "object": "text_completion", "created": 7, "model": "m",
            "choices": [{"index": 0, "text": "a", "logprobs": null, "finish_reason": "length",
                         "stop_reason": null}]})
    );
    assert_eq!(
        to_value(&s.usage_chunk(&stats(), None)),
        json!({"id": "id-1", "object": "text_completion", "created": 7, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                      "speculation": spec_usage()}})
    );
}

#[test]
fn logprobs_in_both_formats() {
    let samples = [
        Sample {
            id: 1,
            logprob: Some(-0.5),
            top: vec![(1, -0.5), (2, -1.0)],
        },
        Sample {
            id: 3,
            logprob: None,
            top: vec![],
        },
    ];
    let s = shape(Endpoint::Completions, true);
    let mut off = 10;
    let lp = serde_json::to_value(s.logprobs(&samples, &mut off)).expect("serializable");
    assert_eq!(
        lp,
        json!({"tokens": ["t1", "t3"], "token_logprobs": [-0.5, null],
               "top_logprobs": [{"t1": -0.5, "t2": -1.0}, null], "text_offset": [10, 12]})
    );
    assert_eq!(off, 14);
    let s = shape(Endpoint::Chat, true);
    let lp = serde_json::to_value(s.logprobs(&samples, &mut off)).expect("serializable");
    let entry = |t: &str, lp: f64| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()});
    let mut first = entry("t1", -0.5);
    first["top_logprobs"] = json!([entry("t1", -0.5), entry("t2", -1.0)]);
    let mut second = entry("t3", -9999.0);
    second["top_logprobs"] = json!([]);
    assert_eq!(lp, json!({"content": [first, second]}));
    assert!(shape(Endpoint::Chat, false)
        .logprobs(&samples, &mut off)
        .is_none());
}

#[test]
fn reasoning_fields_as_vllm_writes_them() {
    use crate::config::ReasoningParser;
    use crate::speculation::reasoning::{Reasoning, Split};
    let mut s = shape(Endpoint::Chat, false);
    s.reasoning = Some(Reasoning::with_ids(ReasoningParser::DeepseekR1, 6, 7));
    let finish = Finish::length();
    let full = to_value(&s.full("a b</think>", None, &finish, &stats(), Some(0)));
    assert_eq!(
        full["choices"][0]["message"],
        json!({"role": "assistant", "content": null, "reasoning": "a b", "tool_calls": []})
    );
    assert_eq!(
        full["usage"]["completion_tokens_details"],
        json!({"reasoning_tokens": 0})
    );
    let mut split = Split {
        reasoning: "r".into(),
        content: String::new(),
        closed: false,
        ..Split::default()
    };
    let chunk = to_value(&s.chunk("r", parsed(&split), None, None, false));
    assert_eq!(chunk["choices"][0]["delta"], json!({"reasoning": "r"}));
    // A last chunk with nothing to add (the EOS step) is an empty delta of its side.
    split.reasoning.clear();
    let last = |split: &Split| {
        to_value(&s.chunk("", parsed(split), None, Some(&finish), false))["choices"][0]["delta"]
            .clone()
    };
    assert_eq!(last(&split), json!({"reasoning": ""}));
    split.closed = true;
    assert_eq!(last(&split), json!({"content": ""}));
    // A grammar-engine parser whose last step added no delta: `{}`.
    split.bare = true;
    assert_eq!(last(&split), json!({}));
    let usage = to_value(&s.usage_chunk(&stats(), Some(2)));
    assert_eq!(
        usage["usage"]["completion_tokens_details"],
        json!({"reasoning_tokens": 2})
    );
    assert!(usage["usage"].get("prompt_tokens_details").is_none());
}

fn parsed(split: &Split) -> Parsed<'_> {
    Parsed {
        split: Some(split),
        calls: None,
    }
}

#[test]
fn tool_calls_as_vllm_writes_them() {
    use crate::config::ToolCallParser;
    use crate::speculation::generation::FinishReason;
    use crate::speculation::tools::{CallDelta, Choice, StreamDelta, ToolPiece, Tools};
    let mut s = shape(Endpoint::Chat, false);
    s.tools = Some(Tools::new(ToolCallParser::Hermes, Choice::Auto));
    let stop = Finish {
        reason: FinishReason::Stop,
        stop_reason: json!(3),
    };
    let text = " \n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call>";
    let full = to_value(&s.full(text, None, &stop, &stats(), None));
    let msg = &full["choices"][0]["message"];
    assert_eq!(full["choices"][0]["finish_reason"], "tool_calls");
    // Blank content beside calls is null; arguments are re-serialized as Python does.
    assert_eq!(msg["content"], Value::Null);
    assert_eq!(msg["tool_calls"][0]["type"], "function");
    assert_eq!(
        msg["tool_calls"][0]["function"],
        json!({"name": "f", "arguments": "{\"x\": 1}"})
    );
    assert!(msg["tool_calls"][0]["id"]
        .as_str()
        .is_some_and(|id| id.len() == "chatcmpl-tool-".len() + 16));
    // No calls: the text is content and the finish stays.
    let plain = to_value(&s.full("hi", None, &stop, &stats(), None));
    assert_eq!(plain["choices"][0]["finish_reason"], "stop");
    assert_eq!(plain["choices"][0]["message"]["content"], "hi");

    let piece = ToolPiece {
        delta: StreamDelta {
            content: None,
            calls: vec![
                CallDelta {
                    index: 0,
                    id: None,
                    name: Some("f".into()),
                    arguments: None,
                },
                CallDelta {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: Some("{\"x\"".into()),
                },
            ],
        },
        called: true,
    };
    let calls = Parsed {
        split: None,
        calls: Some(&piece),
    };
    let chunk = to_value(&s.chunk("", calls, None, None, false));
    let d = &chunk["choices"][0]["delta"];
    assert_eq!(d["content"], Value::Null);
    assert_eq!(d.as_object().map(|o| o.len()), Some(2), "{d}");
    assert_eq!(d["tool_calls"][0]["function"], json!({"name": "f"}));
    assert_eq!(
        d["tool_calls"][1],
        json!({"index": 0, "function": {"arguments": "{\"x\""}})
    );
    // The last chunk of a stream that sent a call: an empty delta, "tool_calls".
    let end = ToolPiece {
        delta: StreamDelta::default(),
        called: true,
    };
    let last = Parsed {
        split: None,
        calls: Some(&end),
    };
    let chunk = to_value(&s.chunk("", last, None, Some(&stop), false));
    assert_eq!(chunk["choices"][0]["delta"], json!({}));
    assert_eq!(chunk["choices"][0]["finish_reason"], "tool_calls");
    let chunk = to_value(&s.chunk("", last, None, Some(&Finish::length()), false));
    assert_eq!(chunk["choices"][0]["finish_reason"], "length");
}

#[test]
fn reasoning_with_tool_calls_as_vllm_writes_them() {
    use crate::config::{ReasoningParser, ToolCallParser};
    use crate::speculation::reasoning::{Reasoning, Split};
    use crate::speculation::tools::{Choice, StreamDelta, ToolPiece, Tools};
    let mut s = shape(Endpoint::Chat, false);
    s.reasoning = Some(Reasoning::with_ids(ReasoningParser::DeepseekR1, 6, 7));
    s.tools = Some(Tools::new(ToolCallParser::Hermes, Choice::Auto));
    let stop = Finish {
        reason: crate::speculation::generation::FinishReason::Stop,
        stop_reason: json!(3),
    };
    // Calls are read from the content after the reasoning only.
    let text = "r <tool_call>x</think>\n\n<tool_call>{\"name\": \"f\", \"arguments\": {}}";
    let full = to_value(&s.full(text, None, &stop, &stats(), Some(0)));
    let msg = &full["choices"][0]["message"];
    assert_eq!(msg["reasoning"], "r <tool_call>x");
    assert_eq!(msg["content"], Value::Null);
    assert_eq!(msg["tool_calls"][0]["function"]["arguments"], "{}");
    // Reasoning that never closed: content stays null, no calls.
    let open = to_value(&s.full("r", None, &stop, &stats(), Some(0)));
    assert_eq!(open["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(open["choices"][0]["finish_reason"], "stop");
    // A last chunk that adds nothing: an empty reasoning delta while open, else `{}`.
    let none = ToolPiece {
        delta: StreamDelta::default(),
        called: false,
    };
    let mut split = Split::default();
    let last = |split: &Split| {
        let parsed = Parsed {
            split: Some(split),
            calls: Some(&none),
        };
        to_value(&s.chunk("", parsed, None, Some(&stop), false))["choices"][0]["delta"].clone()
    };
    assert_eq!(last(&split), json!({"reasoning": ""}));
    // A grammar-engine reasoning parser whose last step added no delta: `{}`.
    split.bare = true;
    assert_eq!(last(&split), json!({}));
    split.bare = false;
    split.closed = true;
    assert_eq!(last(&split), json!({}));
}
