//! Chat answers shaped as SGLang's OpenAI route writes them with its parsers
//! (`serving_chat.py`): `reasoning_content` (null when empty), content always text (""
//! where none), numbered tool calls with `call_` ids, and streamed deltas that carry only
//! what they add.

use std::borrow::Cow;

use super::{read_whole, Parsed, Shape};
use crate::protocol::response::{
    Delta, FunctionCall, FunctionDelta, Message, ToolCall, ToolCallDelta,
};
use crate::speculation::tools;

/// A whole answer's message.
pub(super) fn message<'a>(shape: &Shape, text: &'a str) -> Message<'a> {
    let (reasoning, content, calls) = match (&shape.tools, &shape.reasoning) {
        (Some(t), r) => {
            let (reasoning, e) = read_whole(r.as_ref(), t, text);
            (reasoning, e.content, e.calls)
        }
        (None, Some(r)) => {
            let (reasoning, content) = r.split_full(text);
            (reasoning, content, Vec::new())
        }
        (None, None) => (None, Some(text.to_string()), Vec::new()),
    };
    let tool_calls = calls
        .into_iter()
        .enumerate()
        .map(|(i, c)| ToolCall {
            id: tools::sglang_call_id(),
            index: Some(i as u32),
            kind: "function",
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    Message {
        role: "assistant",
        content: Some(Cow::Owned(content.unwrap_or_default())),
        tool_calls,
        reasoning: None,
        reasoning_content: Some(reasoning.filter(|r| !r.is_empty())),
    }
}

/// A streamed chunk: the reasoning, content and call pieces it adds (the first chunk
/// names the role, with "" content).
pub(super) fn delta<'a>(text: &'a str, parsed: Parsed<'a>, first: bool) -> Delta<'a> {
    let some = |t: &'a str| (!t.is_empty()).then_some(t);
    let reasoning = parsed.split.and_then(|s| some(&s.reasoning));
    let (content, calls) = match (parsed.calls, parsed.split) {
        (Some(c), _) => (c.delta.content.as_deref().and_then(some), pieces(&c.delta)),
        (None, Some(s)) => (some(&s.content), Vec::new()),
        (None, None) => (some(text), Vec::new()),
    };
    let content = content.or(first.then_some(""));
    Delta {
        role: first.then_some("assistant"),
        content: content.map(Some),
        reasoning: None,
        reasoning_content: reasoning,
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

fn pieces(d: &tools::StreamDelta) -> Vec<ToolCallDelta> {
    d.calls
        .iter()
        .map(|c| ToolCallDelta {
            id: c.name.as_ref().map(|_| tools::sglang_call_id()),
            kind: Some("function"),
            index: c.index,
            function: FunctionDelta {
                name: c.name.clone(),
                arguments: Some(c.arguments.clone().unwrap_or_default()),
            },
        })
        .collect()
}
