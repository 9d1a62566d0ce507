//! Chat prompts: `messages` (and `tools`) rendered as the test models' ChatML template
//! renders them, for `/tokenize` and `/v1/chat/completions` alike, so that specd's
//! speculated chat and a passed-through one start from the same tokens.

use serde_json::Value;

fn text(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or("")
}

/// The tools as a system turn, as `agent-tools`' template lists them.
fn tools_turn(tools: &[Value]) -> String {
    let mut out = String::from("<|im_start|>system\n# Tools\n");
    for t in tools {
        let f = t.get("function");
        out.push_str(&format!(
            "{}: {}\n",
            text(f.and_then(|f| f.get("name"))),
            text(f.and_then(|f| f.get("description")))
        ));
    }
    out.push_str(
        "Call a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\n",
    );
    out
}

/// An assistant turn's calls in the hermes format.
fn calls(list: &[Value]) -> String {
    let one = |c: &Value| {
        let f = c.get("function");
        let args = match f.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "{}".into(),
        };
        format!(
            "<tool_call>\n{{\"name\": \"{}\", \"arguments\": {args}}}\n</tool_call>",
            text(f.and_then(|f| f.get("name")))
        )
    };
    list.iter().map(one).collect::<Vec<_>>().join("\n")
}

/// The prompt text of a chat request body.
pub(crate) fn render(b: &Value) -> String {
    let mut out = String::from("<|begin_of_text|>");
    if let Some(tools) = b.get("tools").and_then(Value::as_array) {
        out.push_str(&tools_turn(tools));
    }
    for m in b
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = text(m.get("content"));
        match m.get("tool_calls").and_then(Value::as_array) {
            Some(list) if role == "assistant" => out.push_str(&format!(
                "<|im_start|>assistant\n{content}{}<|im_end|>\n",
                calls(list)
            )),
            _ => out.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n")),
        }
    }
    if b.get("add_generation_prompt").and_then(Value::as_bool) != Some(false) {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn tools_calls_and_results_are_rendered() {
        let b = json!({"messages": [
            {"role": "user", "content": "What is the weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "{\"temperature\": 3}"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                       "description": "the weather in a city"}}]});
        let t = super::render(&b);
        assert!(t.starts_with(
            "<|begin_of_text|><|im_start|>system\n# Tools\nget_weather: the weather in a city\n"
        ));
        assert!(t.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n"));
        assert!(t.ends_with(
            "<|im_start|>tool\n{\"temperature\": 3}<|im_end|>\n<|im_start|>assistant\n"
        ));
    }
}
