use super::*;
use serde_json::json;

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn passthrough_reason(endpoint: Endpoint, b: Value) -> Option<&'static str> {
    match parse(endpoint, obj(b), None) {
        Ok(Intake::Passthrough { reason, .. }) => Some(reason.as_str()),
        _ => None,
    }
}

#[test]
fn parses_completion_and_strips_spec_field() {
    let b = obj(
        json!({"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0,
        "stop": "x", "speculation": {"mode": "on", "max_draft_tokens": 3, "drafter": "ngram"}, "foo": 1}),
    );
    let Ok(Intake::Speculate(r)) = parse(Endpoint::Completions, b, None) else {
        panic!("expected a speculable request");
    };
    assert_eq!(r.max_tokens, Some(5));
    assert!(r.sampling.is_greedy());
    assert_eq!(r.stop, vec!["x"]);
    assert_eq!(r.spec.max_draft_tokens, Some(3));
    assert!(!r.body.contains_key("speculation"));
    assert!(r.body.contains_key("foo"));
}

#[test]
fn passthrough_reasons() {
    for (b, reason) in [
        (json!({"prompt": "a", "n": 2}), "n"),
        (json!({"prompt": "a", "presence_penalty": 0.5}), "penalty"),
        (json!({"prompt": "a", "logit_bias": {"a": 2}}), "logit_bias"),
        (json!({"prompt": "a", "repetition_penalty": -1}), "penalty"),
        (
            json!({"prompt": "a", "bad_words": [" x"]}),
            "unsupported_param",
        ),
        (
            json!({"prompt": "a", "min_tokens": 2, "stop": "x", "max_tokens": 4}),
            "min_tokens",
        ),
        (json!({"prompt": ["a", "b"]}), "multiple_prompts"),
        (
            json!({"prompt": ["a", "b"], "max_tokens": "x"}),
            "multiple_prompts",
        ),
        (json!({"prompt": "a", "echo": true}), "echo"),
        (json!({"prompt": "a", "echo": "yes"}), "echo"),
    ] {
        assert_eq!(
            passthrough_reason(Endpoint::Completions, b.clone()),
            Some(reason),
            "{b}"
        );
    }
    let ok = parse(
        Endpoint::Completions,
        obj(json!({"prompt": "a", "n": 1, "presence_penalty": 0, "echo": false})),
        None,
    );
    assert!(matches!(ok, Ok(Intake::Speculate(_))));
    let b = json!({"prompt": "a", "logit_bias": {"7": -100}, "allowed_token_ids": [7, 8],
        "repetition_penalty": 1.3});
    let Ok(Intake::Speculate(gen)) = parse(Endpoint::Completions, obj(b), None) else {
        panic!("per-step fields are speculated");
    };
    let s = &gen.sampling.per_step;
    assert_eq!(s.logit_bias, Some(vec![(7, -100.0)]));
    assert_eq!(s.allowed_token_ids, Some(vec![7, 8]));
    assert_eq!(s.repetition_penalty, Some(1.3));
}

#[test]
fn values_specd_does_not_understand_are_forwarded() {
    let many: Vec<String> = (0..500).map(|i| format!("s{i}")).collect();
    for b in [
        json!({"prompt": "a", "stop": [""]}),
        json!({"prompt": "a", "stop": ""}),
        json!({"prompt": "a", "stop": many}),
        json!({"prompt": "a", "stream": true, "stream_options": {"include_usage": "x"}}),
        json!({"prompt": "a", "stream": true, "stream_options": {"continuous_usage_stats": true}}),
        json!({"prompt": "a", "temperature": 2.5}),
    ] {
        assert_eq!(
            passthrough_reason(Endpoint::Completions, b.clone()),
            Some("unsupported_param"),
            "{b}"
        );
    }
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let f = json!({"type": "function", "function": {"name": "f"}});
    let strict = json!({"type": "function", "function": {"name": "f", "strict": true}});
    for (b, reason) in [
        (json!({"messages": msgs, "tools": "x"}), "unsupported_param"),
        (json!({"messages": msgs, "tools": []}), "unsupported_param"),
        (
            json!({"messages": msgs, "tool_choice": "auto"}),
            "unsupported_param",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "function"}]}),
            "unsupported_param",
        ),
        (
            json!({"messages": msgs, "tools": [{"type": "custom", "function": {"name": "f"}}]}),
            "unsupported_param",
        ),
        (
            json!({"messages": msgs, "tools": [f.clone()], "tool_choice": null}),
            "unsupported_param",
        ),
        (
            json!({"messages": msgs, "tools": [f.clone()], "tool_choice": "required"}),
            "tool_choice_required",
        ),
        (
            json!({"messages": msgs, "tools": [f.clone()],
                   "tool_choice": {"type": "function", "function": {"name": "f"}}}),
            "tool_choice_named",
        ),
        (
            json!({"messages": msgs, "tools": [strict.clone()]}),
            "strict_tools",
        ),
        (
            json!({"messages": msgs, "tools": [f.clone()], "parallel_tool_calls": false}),
            "single_tool_call",
        ),
    ] {
        assert_eq!(
            passthrough_reason(Endpoint::Chat, b.clone()),
            Some(reason),
            "{b}"
        );
    }
    for b in [
        json!({"messages": msgs, "tool_choice": "none"}),
        // Speculated where the upstream's tool parser is one specd implements.
        json!({"messages": msgs, "tools": [f.clone()]}),
        json!({"messages": msgs, "tools": [f.clone()], "tool_choice": "auto"}),
        json!({"messages": msgs, "tools": [strict.clone()], "tool_choice": "none"}),
        json!({"messages": msgs, "tools": null, "stop": ["a", "b", "c", "d"]}),
        json!({"messages": msgs, "stream": true, "stream_options": {"include_usage": "true"}}),
    ] {
        let r = parse(Endpoint::Chat, obj(b.clone()), None);
        assert!(matches!(r, Ok(Intake::Speculate(_))), "{b}: {r:?}");
    }
}

#[test]
fn rejects_bad_input() {
    for b in [
        json!({"prompt": "a", "max_tokens": -1}),
        json!({"prompt": "a", "max_tokens": "x"}),
        json!({"prompt": ""}),
        json!({"prompt": []}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": "a", "temperature": -1}),
        json!({"prompt": "a", "top_p": 0}),
        json!({"prompt": "a", "stop": 5}),
        json!({"prompt": "a", "speculation": {"mode": "maybe"}}),
    ] {
        assert!(
            parse(Endpoint::Completions, obj(b.clone()), None).is_err(),
            "{b}"
        );
    }
    assert!(parse(Endpoint::Chat, obj(json!({"messages": []})), None).is_err());
    assert!(parse(
        Endpoint::Completions,
        obj(json!({"prompt": "a"})),
        Some("sometimes")
    )
    .is_err());
}

#[test]
fn errors_name_the_field() {
    let e = parse(
        Endpoint::Completions,
        obj(json!({"prompt": "a", "max_tokens": "x"})),
        None,
    )
    .err()
    .map(|e| e.to_string());
    assert_eq!(e.as_deref(), Some("'max_tokens' must be an integer"));
}
