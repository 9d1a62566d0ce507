//! Tool calls through specd, against a real vLLM started with `--enable-auto-tool-choice
//! --tool-call-parser hermes` (alone, and with `--reasoning-parser deepseek_r1`) serving
//! the `agent-tools` model (it really reasons, writes hermes calls, and answers quoting the
//! tool results it is given): speculated chat answers must carry the same reasoning,
//! content, tool calls (names and arguments; ids are random on both sides), finish reason
//! and usage as vLLM's direct ones, streamed and not, in modes `on` and `auto`.
//! Grammar-constrained tool choices and parsers specd does not implement pass through.

mod common;
#[path = "common/tool_chat.rs"]
mod tool_chat;

use common::*;
use serde_json::{json, Value};
use tool_chat::*;

const PARSER: &str = "hermes";
const REASONING: &str = "deepseek_r1";

#[tokio::test]
async fn tool_calls_equal_direct_vllm() {
    let up = tools_server(PARSER, None).upstream();
    all_equal_direct(
        &up,
        &["--tool-call-parser", PARSER, "--enable-auto-tool-choice"],
    )
    .await;
}

#[tokio::test]
async fn tool_calls_after_reasoning_equal_direct_vllm() {
    let up = tools_server(PARSER, Some(REASONING)).upstream();
    let args = [
        "--tool-call-parser",
        PARSER,
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        REASONING,
    ];
    all_equal_direct(&up, &args).await;
}

/// A chat through `specd` that must pass through under `reason`: its answer equals
/// vLLM's, carries no speculation usage, and the reason's count rises by one.
async fn passes_through(up: &str, specd: &Specd, body: &Value, reason: &str) {
    let sel = format!("specd_passthrough_total{{reason=\"{reason}\"}}");
    let before = specd.metric(&sel).await;
    assert!(before.is_some(), "no {reason} series");
    let (_, direct) = post(up, "/v1/chat/completions", body).await;
    let mut b = body.clone();
    b["speculation"] = json!({"mode": "on"});
    let (status, via) = post(&specd.url, "/v1/chat/completions", &b).await;
    assert_eq!(status, 200, "{via}");
    assert!(via["usage"].get("speculation").is_none(), "{reason}: {via}");
    assert_eq!(whole(&via), whole(&direct), "{reason}");
    let after = specd.metric(&sel).await;
    assert_eq!(after, before.map(|n| n + 1.0), "{reason}");
}

#[tokio::test]
async fn constrained_tool_choices_and_other_parsers_pass_through() {
    let up = tools_server(PARSER, None).upstream();
    let model = served_model(&up).await;
    let base = json!({"model": model, "messages": [user("What is the weather in Oslo?")],
                      "tools": tools(), "max_tokens": 40, "temperature": 0});
    let args = ["--tool-call-parser", PARSER, "--enable-auto-tool-choice"];
    let specd = Specd::start_ready(&up, &args).await;
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    // The server constrains these with a grammar: never speculated.
    passes_through(
        &up,
        &specd,
        &with("tool_choice", json!("required")),
        "tool_choice_required",
    )
    .await;
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    passes_through(
        &up,
        &specd,
        &with("tool_choice", named),
        "tool_choice_named",
    )
    .await;
    let mut strict = tools();
    strict[0]["function"]["strict"] = json!(true);
    passes_through(&up, &specd, &with("tools", strict), "strict_tools").await;
    passes_through(
        &up,
        &specd,
        &with("parallel_tool_calls", json!(false)),
        "single_tool_call",
    )
    .await;

    // A parser specd does not implement shapes every chat answer: all chat passes.
    let other = [
        "--tool-call-parser",
        "pythonic",
        "--enable-auto-tool-choice",
    ];
    let specd = Specd::start_ready(&up, &other).await;
    let plain = json!({"model": model, "messages": [user("Count to 4.")], "max_tokens": 16,
                       "temperature": 0});
    passes_through(&up, &specd, &base, "parser").await;
    passes_through(&up, &specd, &plain, "parser").await;

    // Without --enable-auto-tool-choice specd knows of no tool parser: chat with tools
    // is vLLM's to answer (an error for `auto` on a server without the flag).
    let specd = Specd::start_ready(&up, &["--tool-call-parser", PARSER]).await;
    passes_through(&up, &specd, &base, "tools").await;
}
