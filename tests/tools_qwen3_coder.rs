//! qwen3_coder tool calls through specd, against a real vLLM started with
//! `--enable-auto-tool-choice --tool-call-parser qwen3_coder` (alone, then with
//! `--reasoning-parser qwen3`, then with `--reasoning-parser deepseek_r1`) serving the `agent-tools-qwen3coder` model (it really
//! reasons, writes `<tool_call><function=NAME><parameter=P>…` calls whose numbers the
//! tools' schemas type, and answers quoting the tool results it is given): speculated
//! chat answers must carry the same reasoning, content, tool calls (names, arguments,
//! ids of vLLM's random shape), finish reason and usage as vLLM's direct ones, streamed
//! and not, in modes `on` and `auto`. One server at a time, each stopped when its
//! conversations are done.

mod common;
#[path = "common/tool_chat.rs"]
mod tool_chat;

use common::*;

#[tokio::test]
async fn qwen3_coder_tool_calls_equal_direct_vllm() {
    let tools = [
        "--tool-call-parser",
        "qwen3_coder",
        "--enable-auto-tool-choice",
    ];
    for reasoning in [None, Some("qwen3"), Some("deepseek_r1")] {
        let server = qwen3_coder_tools_server(reasoning);
        let _stop = server.stop_on_drop();
        let up = server.upstream();
        let mut args = tools.to_vec();
        if let Some(r) = reasoning {
            args.extend(["--reasoning-parser", r]);
        }
        tool_chat::all_equal_direct(&up, &args).await;
    }
}
