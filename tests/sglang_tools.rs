//! Reasoning and tool calls through specd in front of a real SGLang started with
//! `--tool-call-parser hermes` (with `--reasoning-parser deepseek-r1`, and alone), serving
//! the `agent-tools`
//! model (it reasons, writes hermes calls, and answers quoting the tool results it is
//! given). specd reads the parsers from SGLang's `/server_info`: speculated chat answers
//! must carry the same `reasoning_content`, content, tool calls (names and arguments;
//! ids are random on both sides), finish reason and usage as SGLang's direct ones,
//! streamed and not, in modes `on` and `auto`. specd flags naming other parsers make
//! chat pass through.

mod common;
#[path = "common/tool_chat.rs"]
mod tool_chat;

use common::*;
use serde_json::{json, Value};
use tool_chat::*;

#[tokio::test]
async fn tool_calls_and_reasoning_equal_direct_sglang() {
    let up = sglang_tools_server(true).upstream();
    all_equal_direct_of(&up, &[], true).await;
}

#[tokio::test]
async fn tool_calls_alone_equal_direct_sglang() {
    let up = sglang_tools_server(false).upstream();
    all_equal_direct_of(&up, &[], true).await;
}

/// A chat through `specd` under `mode: on`: its `usage.speculation.rounds` (0 when
/// passed through) and whether the `parser` passthrough count rose by one.
async fn through(up: &str, specd: &Specd, body: &Value) -> (u64, bool) {
    let sel = "specd_passthrough_total{reason=\"parser\"}";
    let before = specd.metric(sel).await.unwrap_or(0.0);
    let (_, direct) = post(up, "/v1/chat/completions", body).await;
    let mut b = body.clone();
    b["speculation"] = json!({"mode": "on"});
    let (status, via) = post(&specd.url, "/v1/chat/completions", &b).await;
    assert_eq!(status, 200, "{via}");
    let mut want = whole(&direct);
    let mut got = whole(&via);
    // Answers equal either way (the stop field's name aside).
    for a in [&mut want, &mut got] {
        a.clear_stop_reason();
    }
    assert_eq!(got, want);
    let after = specd.metric(sel).await.unwrap_or(0.0);
    (rounds(&via["usage"]), after == before + 1.0)
}

#[tokio::test]
async fn specd_flags_must_agree_with_sglangs_parsers() {
    let up = sglang_tools_server(true).upstream();
    let model = served_model(&up).await;
    let body = json!({"model": model, "messages": [user("What is the weather in Oslo?")],
                      "tools": tools(), "max_tokens": 40, "temperature": 0});
    // The same parsers by vLLM's names: speculated.
    let same = [
        "--reasoning-parser",
        "deepseek_r1",
        "--tool-call-parser",
        "hermes",
        "--enable-auto-tool-choice",
    ];
    let specd = Specd::start_ready(&up, &same).await;
    let (r, passed) = through(&up, &specd, &body).await;
    assert!(r > 0 && !passed, "rounds {r}");
    // Others: all chat passes through under `parser`.
    let specd = Specd::start_ready(&up, &["--reasoning-parser", "qwen3"]).await;
    let (r, passed) = through(&up, &specd, &body).await;
    assert!(r == 0 && passed, "rounds {r}");
    let plain = json!({"model": model, "messages": [user("Count to 4.")], "max_tokens": 16,
                       "temperature": 0});
    let specd = Specd::start_ready(&up, &["--tool-call-parser", "llama3_json"]).await;
    let (r, passed) = through(&up, &specd, &plain).await;
    assert!(r == 0 && passed, "rounds {r}");
}
