//! Chat in front of SGLang: the parsers its `/server_info` names shape the answer, in
//! SGLang's own way (`reasoning/sglang.rs`, `tools/hermes_sglang.rs`). Parsers specd does
//! not reproduce, and SGLang's own parsing switches, pass through.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::fields;
use crate::metrics::labels::PassthroughReason as Reason;
use crate::speculation::reasoning::Reasoning;
use crate::speculation::tools::{Choice, Tools};
use crate::tokens::ModelTokenizer;
use crate::upstream::detect::SglangParsers;

/// The parsers of a chat request to SGLang, or why it passes through.
pub fn chat_parsers(
    p: &SglangParsers,
    body: &Map<String, Value>,
    tok: &Arc<ModelTokenizer>,
) -> Result<(Option<Reasoning>, Option<Tools>), Reason> {
    if p.disagree {
        return Err(Reason::Parser);
    }
    if changes_parsing(body) {
        return Err(Reason::UnsupportedParam);
    }
    let reasoning = match p.reasoning.as_deref() {
        None => None,
        Some("deepseek-r1") => Some(Reasoning::sglang_r1(tok).ok_or(Reason::Parser)?),
        Some(_) => return Err(Reason::Parser),
    };
    let choice = fields::tool_choice(body);
    let tools = match (p.tools.as_deref(), choice) {
        (None, None) => None,
        // Tools without a parser: SGLang's answer is the reference.
        (None, Some(_)) => return Err(Reason::Tools),
        (Some("hermes"), None) => Some(Tools::sglang_hermes(Choice::None, Vec::new())),
        (Some("hermes"), Some(c)) => Some(Tools::sglang_hermes(c, tool_names(body))),
        (Some(_), _) => return Err(Reason::Parser),
    };
    Ok((reasoning, tools))
}

/// SGLang's own fields that change how an answer is parsed (reasoning kept in the
/// content, buffered, or forced into it; an answer continued; tools declared in
/// messages), which specd does not reproduce.
fn changes_parsing(body: &Map<String, Value>) -> bool {
    let not_true = |k: &str| body.get(k).is_some_and(|v| v != &Value::Bool(true));
    let truthy = |v: Option<&Value>| v.is_some_and(|v| !v.is_null() && v != &Value::Bool(false));
    let msgs = body.get("messages").and_then(Value::as_array);
    not_true("separate_reasoning")
        || not_true("stream_reasoning")
        || truthy(body.get("continue_final_message"))
        || truthy(
            body.get("chat_template_kwargs")
                .and_then(|k| k.get("force_nonempty_content")),
        )
        || msgs.is_some_and(|m| m.iter().any(|m| m.get("tools").is_some()))
}

/// The names of the request's tools (SGLang drops calls to any other).
fn tool_names(body: &Map<String, Value>) -> Vec<String> {
    let tools = body.get("tools").and_then(Value::as_array);
    tools
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn sglangs_parsing_switches_pass_through() {
        assert!(!changes_parsing(&obj(json!({"separate_reasoning": true}))));
        assert!(changes_parsing(&obj(json!({"separate_reasoning": false}))));
        assert!(changes_parsing(&obj(json!({"stream_reasoning": false}))));
        assert!(changes_parsing(&obj(
            json!({"continue_final_message": true})
        )));
        let force = json!({"chat_template_kwargs": {"force_nonempty_content": true}});
        assert!(changes_parsing(&obj(force)));
        let in_msg = json!({"messages": [{"role": "system", "content": "", "tools": []}]});
        assert!(changes_parsing(&obj(in_msg)));
        assert!(!changes_parsing(&obj(
            json!({"messages": [{"role": "user", "content": "x"}]})
        )));
    }

    #[test]
    fn tool_names_are_the_requests() {
        let body = obj(json!({"tools": [
            {"type": "function", "function": {"name": "a"}},
            {"type": "function", "function": {"name": ""}},
            {"type": "function", "function": {"name": "b"}}]}));
        assert_eq!(tool_names(&body), vec!["a".to_string(), "b".to_string()]);
    }
}
