//! llama3_json tool calls through specd, against a real vLLM started with
//! `--enable-auto-tool-choice --tool-call-parser llama3_json` serving the
//! `agent-tools-llama3` model (it writes `<|python_tag|>` and `;`-separated JSON calls,
//! and answers quoting the tool results it is given): speculated chat answers must carry
//! the same content, tool calls (names and arguments; vLLM's ids are random), finish
//! reason and usage as vLLM's direct ones, streamed and not, in modes `on` and `auto`.
//! The server is stopped when its conversations are done.

mod common;
#[path = "common/tool_chat.rs"]
mod tool_chat;

use common::*;

#[tokio::test]
async fn llama3_json_tool_calls_equal_direct_vllm() {
    let server = llama3_tools_server();
    let _stop = server.stop_on_drop();
    let up = server.upstream();
    let args = [
        "--tool-call-parser",
        "llama3_json",
        "--enable-auto-tool-choice",
    ];
    tool_chat::all_equal_direct(&up, &args).await;
}
