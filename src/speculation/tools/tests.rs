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

/// SGLang's own parser classes on fixed answers (`sglang_reference.json`, written by
/// scripts/sglang_parser_reference.py): the partial-JSON reader on every prefix of a few
/// calls, `hermes` whole and streamed (token-like pieces and one character at a time),
/// and the `deepseek-r1` reasoning split.
mod sglang_reference {
    use super::super::hermes_sglang;
    use super::super::partial_json::{self, Raised};
    use super::super::pyjson;
    use crate::speculation::reasoning::sglang as r1;
    use serde_json::Value;

    fn reference() -> Value {
        serde_json::from_str(include_str!("sglang_reference.json")).expect("reference json")
    }

    fn s(v: &Value) -> &str {
        v.as_str().unwrap_or("")
    }

    /// The name of the Python exception SGLang's wrapper lets out.
    fn python_name(e: Raised) -> &'static str {
        match e {
            Raised::EmptyPop => "IndexError",
            Raised::Assertion => "AssertionError",
            Raised::Malformed => "MalformedJSON",
            Raised::Partial => "PartialJSON",
            Raised::ExtraData | Raised::Decode => "JSONDecodeError",
        }
    }

    #[test]
    fn partial_json_equals_partial_json_parser() {
        let r = reference();
        let cases = r["partial"].as_array().expect("partial");
        let mut bad = Vec::new();
        // How often the library raised what SGLang's wrapper treats apart from vLLM's.
        let mut paths = [0; 3];
        for c in cases {
            let (text, strings) = (s(&c["text"]), c["strings"].as_bool().unwrap_or(true));
            let read = partial_json::sglang_loads(text, strings);
            let got = match &read {
                Ok((v, end)) => {
                    serde_json::json!({"value": pyjson::dumps(v), "end": end, "raised": null})
                }
                Err(e) => {
                    serde_json::json!({"value": null, "end": null, "raised": python_name(*e)})
                }
            };
            let want = serde_json::json!({
                "value": c["result"]["value"],
                "end": c["result"]["end"],
                "raised": c["raised"],
            });
            if got != want {
                bad.push(format!("{c}\n  specd {got}"));
            }
            match partial_json::vllm_loads(text, strings) {
                Err(Raised::EmptyPop) => paths[0] += 1,
                Err(Raised::Assertion) => paths[1] += 1,
                Err(Raised::Decode) if read.is_ok() => paths[2] += 1,
                _ => {}
            }
        }
        assert!(
            bad.is_empty(),
            "{} of {}:\n{}",
            bad.len(),
            cases.len(),
            bad.join("\n")
        );
        assert!(paths.iter().all(|&n| n > 0), "wrapper paths {paths:?}");
    }

    fn names(r: &Value) -> Vec<String> {
        let n = r["names"].as_array().expect("names");
        n.iter().map(|v| s(v).to_string()).collect()
    }

    #[test]
    fn hermes_equals_sglangs() {
        let r = reference();
        let names = names(&r);
        let mut bad = Vec::new();
        for case in r["hermes"].as_array().expect("hermes") {
            let text = s(&case["text"]);
            let e = hermes_sglang::extract(text, &names);
            let got: Value = match e {
                None => serde_json::json!({"content": text, "calls": []}),
                Some(e) => serde_json::json!({
                    "content": e.content,
                    "calls": e.calls.iter().map(|c| serde_json::json!(
                        [c.name, c.arguments])).collect::<Vec<_>>()}),
            };
            let w = &case["whole"];
            let want = serde_json::json!({"content": w["content"],
                "calls": w["calls"].as_array().into_iter().flatten().map(|c| serde_json::json!(
                    [c["name"], c["parameters"]])).collect::<Vec<_>>()});
            if got != want {
                bad.push(format!("whole {text:?}\n  sglang {want}\n  specd  {got}"));
            }
            let mut st = hermes_sglang::Stream::new(names.clone());
            let steps = case["stream"].as_array().expect("stream");
            for (i, step) in steps.iter().enumerate() {
                let mut d = st.step(s(&step["piece"]));
                if i + 1 == steps.len() {
                    d.calls.extend(st.remaining());
                }
                let got = serde_json::json!({
                    "content": d.content.unwrap_or_default(),
                    "calls": d.calls.iter().map(|c| serde_json::json!(
                        [c.index, c.name, c.arguments.clone().unwrap_or_default()]))
                        .collect::<Vec<_>>()});
                let want = serde_json::json!({"content": step["content"],
                    "calls": step["calls"].as_array().into_iter().flatten().map(|c| serde_json::json!(
                        [c["index"], c["name"], c["parameters"]])).collect::<Vec<_>>()});
                if got != want {
                    bad.push(format!(
                        "stream {text:?} step {i}\n  sglang {want}\n  specd  {got}"
                    ));
                    break;
                }
            }
        }
        assert!(bad.is_empty(), "{}:\n{}", bad.len(), bad.join("\n"));
    }

    #[test]
    fn deepseek_r1_equals_sglangs() {
        let r = reference();
        for case in r["r1"].as_array().expect("r1") {
            let text = s(&case["text"]);
            let (reasoning, content) = r1::split_full(text);
            assert_eq!(reasoning, s(&case["whole"]["reasoning"]), "{text:?}");
            assert_eq!(content, s(&case["whole"]["content"]), "{text:?}");
            let mut st = r1::Stream::default();
            let steps = case["stream"].as_array().expect("stream");
            for (i, step) in steps.iter().enumerate() {
                let (mut r, mut c) = st.step(s(&step["piece"]));
                if i + 1 == steps.len() {
                    let (er, ec) = st.finish();
                    r.push_str(&er);
                    c.push_str(&ec);
                }
                assert_eq!(
                    (r.as_str(), c.as_str()),
                    (s(&step["reasoning"]), s(&step["content"])),
                    "{text:?} step {i}"
                );
            }
        }
    }
}
