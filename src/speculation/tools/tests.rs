use super::*;

fn hermes(choice: Choice) -> Tools {
    Tools {
        parser: ToolCallParser::Hermes,
        choice,
    }
}

#[test]
fn none_reads_text_as_content() {
    let t = hermes(Choice::None);
    let text = "a <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    assert_eq!(t.extract(text), Extracted::text(text));
    let mut s = t.stream();
    assert_eq!(s.step("", false), None);
    assert_eq!(s.step("x", false).and_then(|d| d.content), Some("x".into()));
    assert!(!s.called());
}

#[test]
fn merged_steps_join_argument_fragments() {
    let mut d = StreamDelta::default();
    let piece = |name: Option<&str>, args: Option<&str>| StreamDelta {
        content: None,
        calls: vec![CallDelta {
            index: 0,
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
