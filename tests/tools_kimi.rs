//! kimi_k2 tool calls through specd, against a real vLLM started with
//! `--enable-auto-tool-choice --tool-call-parser kimi_k2` (alone, then with
//! `--reasoning-parser kimi_k2`) serving the `agent-tools-kimi` model (it really
//! reasons, writes kimi_k2 calls with their `functions.NAME:IDX` ids, and answers quoting
//! the tool results it is given): speculated chat answers must carry the same reasoning,
//! content, tool calls (names, arguments and the model's ids), finish reason and usage as
//! vLLM's direct ones, streamed and not, in modes `on` and `auto`. One server at a time,
//! each stopped when its conversations are done.

mod common;
#[path = "common/tool_chat.rs"]
mod tool_chat;

use common::*;

#[tokio::test]
async fn kimi_k2_tool_calls_equal_direct_vllm() {
    let tools = ["--tool-call-parser", "kimi_k2", "--enable-auto-tool-choice"];
    for reasoning in [false, true] {
        let server = kimi_tools_server(reasoning);
        let _stop = server.stop_on_drop();
        let up = server.upstream();
        let mut args = tools.to_vec();
        if reasoning {
            args.extend(["--reasoning-parser", "kimi_k2"]);
        }
        tool_chat::all_equal_direct(&up, &args).await;
    }
}
