use super::*;

fn hermes(choice: Choice) -> Tools {
    Tools::new(ToolCallParser::Hermes, choice)
}

#[test]
fn none_reads_text_as_content() {
    let t = hermes(Choice::None);
    let text = "a <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    assert_eq!(t.extract(text), Extracted::text(text));
    let mut s = t.stream();
    assert_eq!(s.step("", &[], false), None);
    assert_eq!(
        s.step("x", &[], false).and_then(|d| d.content),
        Some("x".into())
    );
    assert!(!s.called());
}

#[test]
fn merged_steps_join_argument_fragments() {
    let mut d = StreamDelta::default();
    let piece = |name: Option<&str>, args: Option<&str>| StreamDelta {
        content: None,
        calls: vec![CallDelta {
            index: 0,
            id: None,
            name: name.map(str::to_string),
            arguments: args.map(str::to_string),
        }],
    };
    d.append(piece(Some("f"), None));
    d.append(piece(None, Some("{\"a\"")));
    d.append(piece(None, Some(": 1}")));
    assert_eq!(d.calls.len(), 2);
    assert_eq!(d.calls[1].arguments.as_deref(), Some("{\"a\": 1}"));
    assert_eq!(d.content, None);
}

/// vLLM's own hermes parser on the texts of scripts/tool_parser_reference.py.
#[test]
fn hermes_equals_vllm() {
    use serde_json::Value;
    let cases: Value =
        serde_json::from_str(include_str!("hermes_vllm.json")).expect("reference json");
    for case in cases.as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let whole = &case["whole"];
        let e = hermes::extract(text);
        let calls: Vec<Value> = e
            .calls
            .iter()
            .map(|c| serde_json::json!([c.name, c.arguments]))
            .collect();
        assert_eq!(Value::from(e.content.clone()), whole["content"], "{text:?}");
        assert_eq!(Value::from(calls), whole["calls"], "{text:?}");
        let mut s = hermes::Stream::default();
        let mut cur = String::new();
        for (ch, want) in text.chars().zip(case["steps"].as_array().expect("steps")) {
            cur.push(ch);
            let got = s.step(&cur).map(|d| {
                let calls: Vec<Value> = d
                    .calls
                    .iter()
                    .map(|c| serde_json::json!([c.index, c.name, c.arguments]))
                    .collect();
                serde_json::json!({"content": d.content, "calls": calls})
            });
            assert_eq!(got.unwrap_or(Value::Null), *want, "{text:?} at {cur:?}");
        }
        assert_eq!(s.remaining_args(), case["remaining"], "{text:?}");
    }
}
