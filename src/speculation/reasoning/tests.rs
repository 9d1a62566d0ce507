//! The split against cases read off vLLM 0.32's `deepseek_r1` parser (its code, and
//! answers of a real server started with `--reasoning-parser deepseek_r1`).

use super::*;

const START: u32 = 100;
const END: u32 = 101;
const EOS: u32 = 3;

fn r1() -> Reasoning {
    Reasoning::with_ids(ReasoningParser::DeepseekR1, START, END)
}

fn full(text: &str) -> (String, Option<String>) {
    let (r, c) = r1().split_full(text);
    (r.expect("deepseek_r1 always writes reasoning"), c)
}

/// Feed `(id, text)` steps; the concatenated reasoning and content.
fn stream(prompt: &[u32], steps: &[(u32, &str)]) -> Split {
    let mut s = r1().stream(prompt);
    let mut out = Split::default();
    for &(id, text) in steps {
        let mut piece = Split::default();
        s.step(id, text, false, &mut piece);
        out.append(piece);
    }
    out
}

fn owned(r: &str, c: Option<&str>) -> (String, Option<String>) {
    (r.to_string(), c.map(str::to_string))
}

#[test]
fn whole_answers_split_on_the_first_end_marker() {
    // Measured: "59 plus 7 makes 59.\n</think>\n\nThe answer is 59." from a real server.
    assert_eq!(
        full("59 plus 7 makes 59.\n</think>\n\nThe answer is 59."),
        owned("59 plus 7 makes 59.\n", Some("\n\nThe answer is 59."))
    );
    // max_tokens before the end marker: all reasoning, content null (measured).
    assert_eq!(full("59 pl"), owned("59 pl", None));
    // Generation stops right after the end marker: content null, not "".
    assert_eq!(full("abc</think>"), owned("abc", None));
    // Text up to and including a leading start marker is dropped.
    assert_eq!(full("x<think>abc</think>d"), owned("abc", Some("d")));
    // A later start marker drops everything before it, reasoning included.
    assert_eq!(
        full("abc</think>xy<think>z"),
        owned("z", None),
        "partition on the first <think>, then no </think>"
    );
    // Only the first end marker splits; later ones stay in the content.
    assert_eq!(full("a</think>b</think>c"), owned("a", Some("b</think>c")));
    assert_eq!(full(""), owned("", None));
}

#[test]
fn streamed_steps_follow_token_ids() {
    let steps = [
        (1, "59"),
        (2, " plus"),
        (4, "\n"),
        (END, "</think>"),
        (5, "\n\n"),
        (6, "The"),
        (EOS, ""),
    ];
    let s = stream(&[0, START, 9], &steps);
    assert_eq!(s.reasoning, "59 plus\n");
    assert_eq!(s.content, "\n\nThe");
    // A lone start marker emits nothing and reasoning goes on.
    let s = stream(
        &[0],
        &[(START, "<think>"), (1, "a"), (END, "</think>"), (2, "b")],
    );
    assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("a", "b"));
    // After the end, markers are plain content (vLLM no longer runs the parser).
    let s = stream(
        &[0],
        &[(END, "</think>"), (START, "<think>"), (END, "</think>")],
    );
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str()),
        ("", "<think></think>")
    );
    // Text that merely reads "</think>" is not the end token.
    let s = stream(&[0], &[(1, "</"), (2, "think>"), (3, "x")]);
    assert_eq!(s.reasoning, "</think>x");
}

#[test]
fn the_prompt_decides_whether_reasoning_is_open() {
    // Closed by the prompt's last marker: everything is content.
    let s = stream(
        &[START, 7, END, 8],
        &[(1, "a"), (END, "</think>"), (2, "b")],
    );
    assert_eq!(
        (s.reasoning.as_str(), s.content.as_str()),
        ("", "a</think>b")
    );
    // Reopened after an earlier block, or no marker at all: open.
    let s = stream(
        &[START, END, START],
        &[(1, "a"), (END, "</think>"), (2, "b")],
    );
    assert_eq!((s.reasoning.as_str(), s.content.as_str()), ("a", "b"));
    let s = stream(&[5, 6], &[(1, "a")]);
    assert_eq!(s.reasoning, "a");
}

#[test]
fn reasoning_tokens_count_inside_markers_only() {
    let r = r1();
    // The template opens the block in the prompt: the output has no start, counts 0
    // (measured: reasoning_tokens 0 for such answers).
    assert_eq!(r.reasoning_tokens(&[1, 2, END, 3]), 0);
    assert_eq!(r.reasoning_tokens(&[START, 1, 2, END, 3]), 2);
    assert_eq!(
        r.reasoning_tokens(&[END, START, 1, START, 2, END, 3, END, 4]),
        3
    );
}

#[test]
fn held_text_goes_where_the_stream_stands() {
    let mut s = r1().stream(&[]);
    let mut out = Split::default();
    s.held("a", &mut out);
    s.step(END, "</think>", false, &mut out);
    s.held("b", &mut out);
    assert_eq!((out.reasoning.as_str(), out.content.as_str()), ("a", "b"));
}

#[test]
fn chat_template_kwargs_switch_thinking_as_each_parser_reads_them() {
    use serde_json::json;
    let on = |p, v: serde_json::Value| super::thinking(p, Some(&v));
    let (q, k) = (ReasoningParser::Qwen3, ReasoningParser::KimiK2);
    assert_eq!(super::thinking(q, None), Some(true));
    assert_eq!(on(q, json!({})), Some(true));
    assert_eq!(on(q, json!({"enable_thinking": false})), Some(false));
    assert_eq!(on(q, json!({"thinking": false})), Some(true));
    // kimi_k2: on unless a switch is given, then on if either is true.
    assert_eq!(on(k, json!({"thinking": false})), Some(false));
    assert_eq!(on(k, json!({"enable_thinking": false})), Some(false));
    assert_eq!(
        on(k, json!({"thinking": false, "enable_thinking": true})),
        Some(true)
    );
    // Shapes specd does not read: the chat passes through.
    assert_eq!(on(q, json!({"enable_thinking": "no"})), None);
    assert_eq!(on(k, json!([1])), None);
}
