//! vLLM 0.32's `hermes` tool parser (`vllm/tool_parsers/hermes_tool_parser.py`),
//! reproduced step for step: calls are `<tool_call>{"name": …, "arguments": …}</tool_call>`.

use super::pyjson::{self, PyValue};
use super::{Call, CallDelta, Extracted, StreamDelta};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// `extract_tool_calls`: every `<tool_call>` region (closed, or open to the end) must be
/// a JSON object with a string `name` and some `arguments`, else no tool was called and
/// the whole text is content.
pub fn extract(text: &str) -> Extracted {
    let Some(first) = text.find(START) else {
        return Extracted::text(text);
    };
    let mut calls = Vec::new();
    for body in regions(text) {
        // Python: `json.loads(match[0] if match[0] else match[1])` — an empty closed
        // region reads the (empty) open capture, an error.
        let Some(call) = pyjson::loads(body).and_then(|v| call_of(&v)) else {
            return Extracted::text(text);
        };
        calls.push(call);
    }
    let content = &text[..first];
    Extracted {
        content: (!content.is_empty()).then(|| content.to_string()),
        calls,
    }
}

/// The bodies `re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", DOTALL)`
/// captures: closed regions in order, then at most one open to the end.
pub(super) fn regions(text: &str) -> Vec<&str> {
    scan(text).into_iter().map(|(body, _)| body).collect()
}

/// Each `<tool_call>` region's body and whether its end tag came: closed regions in
/// order, then at most one open to the end of `text`.
fn scan(text: &str) -> Vec<(&str, bool)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(s) = text[pos..].find(START) {
        let body = pos + s + START.len();
        match text[body..].find(END) {
            Some(e) => {
                out.push((&text[body..body + e], true));
                pos = body + e + END.len();
            }
            None => {
                out.push((&text[body..], false));
                break;
            }
        }
    }
    out
}

/// `ToolCall(function=FunctionCall(name=…, arguments=json.dumps(…)))`: pydantic wants a
/// string name; a missing key is a `KeyError`.
fn call_of(v: &PyValue) -> Option<Call> {
    let PyValue::Str(name) = v.get("name")? else {
        return None;
    };
    let arguments = pyjson::dumps(v.get("arguments")?);
    Some(Call {
        id: None,
        name: name.clone(),
        arguments,
    })
}

/// Python's `str.isspace` (what `\s`, `strip` and `rstrip` use on text).
pub(super) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub(super) fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `partial_tag_overlap`: the longest proper prefix of `tag` that ends `text`.
fn partial_overlap(text: &str, tag: &str) -> usize {
    let max = (tag.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&k| text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

/// The end of `"key"\s*:\s*` after its first match in `s`.
fn after_key(s: &str, key: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = s[from..].find(key) {
        let mut i = from + at + key.len();
        i += s[i..].len() - s[i..].trim_start_matches(is_space).len();
        if s[i..].starts_with(':') {
            i += 1;
            i += s[i..].len() - s[i..].trim_start_matches(is_space).len();
            return Some(i);
        }
        from += at + 1;
    }
    None
}

/// `_extract_tool_name`: the first `"name"\s*:\s*"([^"]+)"`, raw (not unescaped).
fn name_of(tc_json: &str) -> Option<&str> {
    let key = "\"name\"";
    let mut from = 0;
    while let Some(at) = tc_json[from..].find(key) {
        let here = &tc_json[from + at..];
        let value = after_key(here, key).and_then(|v| here[v..].strip_prefix('"'));
        if let Some(n) = value.and_then(|body| body.find('"').filter(|&n| n > 0)) {
            return value.map(|body| &body[..n]);
        }
        from += at + 1;
    }
    None
}

/// `_extract_tool_args`: the text after `"arguments": `, less the closing brace of a
/// complete call.
fn args_of(tc_json: &str, complete: bool) -> Option<&str> {
    let raw = &tc_json[after_key(tc_json, "\"arguments\"")?..];
    if !complete {
        return Some(raw);
    }
    let raw = raw.trim_end_matches(is_space);
    Some(match raw.strip_suffix('}') {
        Some(r) => r.trim_end_matches(is_space),
        None => raw,
    })
}

/// The streaming parser's state for one answer (`extract_tool_calls_streaming`).
#[derive(Debug, Default, Clone)]
pub struct Stream {
    sent_content: usize,
    /// Per call seen: its name once sent, and the arguments sent so far.
    names: Vec<Option<String>>,
    args: Vec<Option<String>>,
}

impl Stream {
    /// One step: the whole text so far; what this step adds (`None`: nothing to send).
    pub fn step(&mut self, current: &str) -> Option<StreamDelta> {
        let content = self.content(current);
        let mut calls = Vec::new();
        for (i, (tc_json, complete)) in call_jsons(current).into_iter().enumerate() {
            if i >= self.names.len() {
                self.names.push(None);
                self.args.push(None);
            }
            if self.names[i].is_none() {
                // The next call cannot start before this one's name is known.
                let Some(name) = name_of(tc_json) else { break };
                self.names[i] = Some(name.to_string());
                calls.push(CallDelta {
                    index: i as u32,
                    id: None,
                    name: Some(name.to_string()),
                    arguments: None,
                });
            }
            if let Some(diff) = self.args_diff(i, tc_json, complete) {
                calls.push(CallDelta {
                    index: i as u32,
                    id: None,
                    name: None,
                    arguments: Some(diff),
                });
            }
        }
        (content.is_some() || !calls.is_empty()).then_some(StreamDelta { content, calls })
    }

    /// `get_remaining_unstreamed_args` at the end of a stream whose last delta has
    /// calls: a last call whose arguments were never seen gets `{}`.
    pub fn remaining_args(&self) -> &'static str {
        match self.args.last() {
            Some(None) => "{}",
            _ => "",
        }
    }

    fn content(&mut self, current: &str) -> Option<String> {
        let sendable = match current.find(START) {
            Some(i) => i,
            None => current.len() - partial_overlap(current, START),
        };
        if sendable > self.sent_content {
            let c = current[self.sent_content..sendable].to_string();
            self.sent_content = sendable;
            return Some(c);
        }
        None
    }

    fn args_diff(&mut self, i: usize, tc_json: &str, complete: bool) -> Option<String> {
        let args = args_of(tc_json, complete)?;
        // Python compares and slices by characters, whether or not the text sent so far
        // is a prefix of this one.
        let sent = self.args[i].as_deref().map_or(0, |s| s.chars().count());
        if args.chars().count() <= sent {
            return None;
        }
        let diff: String = args.chars().skip(sent).collect();
        self.args[i] = Some(args.to_string());
        Some(diff)
    }
}

/// `_extract_tool_call_jsons`: each region's stripped JSON text and whether it is
/// complete (closed, or an open region that already parses).
fn call_jsons(text: &str) -> Vec<(&str, bool)> {
    scan(text)
        .into_iter()
        .map(|(body, closed)| {
            if closed {
                return (strip(body), true);
            }
            let raw = &body[..body.len() - partial_overlap(body, END)];
            let tc = strip(raw);
            (tc, !tc.is_empty() && pyjson::loads(tc).is_some())
        })
        .collect()
}
