//! vLLM 0.32's `llama3_json` tool parser (`vllm/tool_parsers/llama_tool_parser.py`):
//! calls are JSON objects `{"name": …, "arguments" | "parameters": …}` anywhere in a
//! whole answer; a stream reads them only from a text that starts with one (or with
//! `<|python_tag|>`), `;`-separated, as partial JSON (`stream.rs`).

pub mod stream;

use super::pyjson::{self, PyValue};
use super::{Call, Extracted};

/// The token a Llama model may start its calls with.
pub const BOT_TOKEN: &str = "<|python_tag|>";

/// `extract_tool_calls`: every `{` not inside an object read before starts one; each
/// must decode and name a function, else no tool was called and the whole text is
/// content. With calls, content is null (the text around them is dropped).
pub fn extract(text: &str) -> Extracted {
    if !text.contains(BOT_TOKEN) && !text.contains('{') {
        return Extracted::text(text);
    }
    let mut calls = Vec::new();
    // The end of the last object read: a `{` at or before it is skipped (the one right
    // after an object, too, as vLLM compares with `<=`).
    let mut end: Option<usize> = None;
    for (start, _) in text.match_indices('{') {
        if end.is_some_and(|e| start <= e) {
            continue;
        }
        let Some((obj, len)) = pyjson::raw_decode(&text[start..]) else {
            return Extracted::text(text);
        };
        end = Some(start + len);
        let Some(call) = call_of(&obj) else {
            return Extracted::text(text);
        };
        calls.push(call);
    }
    if calls.is_empty() {
        return Extracted::text(text);
    }
    Extracted {
        content: None,
        calls,
    }
}

/// `obj["name"]` and `obj["arguments"]` (or `obj["parameters"]`); pydantic wants a
/// string name.
fn call_of(obj: &PyValue) -> Option<Call> {
    let PyValue::Str(name) = obj.get("name")? else {
        return None;
    };
    let args = match obj.get("arguments") {
        Some(a) => a,
        None => obj.get("parameters")?,
    };
    Some(Call {
        id: None,
        name: name.clone(),
        arguments: pyjson::dumps(args),
    })
}

#[cfg(test)]
mod tests;
