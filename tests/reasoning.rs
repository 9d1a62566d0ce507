//! Reasoning models through specd, against a real vLLM started with
//! `--reasoning-parser deepseek_r1` serving the `agent` model (it really writes
//! `reasoning</think>answer`): speculated chat answers must split into `reasoning` and
//! `content` exactly as vLLM's direct answers do, streamed and not, in modes `on` and
//! `auto`; plain completions stay speculated; parsers specd does not implement pass
//! through.

mod common;
#[path = "common/tool_chat.rs"]
#[allow(dead_code)]
mod tool_chat;

use common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};
use tool_chat::{
    ask, direct_again, request, rounds, served_model, usage_tokens, user, whole, Answer,
};

const PARSER: &str = "deepseek_r1";

/// Deterministic conversations: the model's training tasks, others it never saw,
/// multi-turn ones whose history holds an earlier answer's reasoning, a system message,
/// token budgets that end inside the reasoning or just after it, and extra request
/// fields: stop strings (whose held-back text vLLM streams with the `</think>` step, which
/// then drops it: its streamed split differs from its whole one, and specd's must follow),
/// logprobs, and a continued assistant message.
fn conversations() -> Vec<(Vec<Value>, u32, Value)> {
    let words = ["river", "garden", "candle", "winter", "silver", "forest"];
    let mut out = Vec::new();
    for i in 0..24usize {
        let w = words[i % words.len()];
        let q = match i % 6 {
            0 => format!("What is {} plus {}?", 3 + i, 11 + 2 * i),
            1 => format!("Spell {w} backwards."),
            2 => format!("Repeat after me: {w} quiet {w} light"),
            3 => format!("Count to {}.", 3 + i % 5),
            4 => format!("Tell me something about the {w} and why it matters."),
            _ => format!("{w}? {w}! ({i})"),
        };
        let mut msgs = Vec::new();
        if i % 8 == 5 {
            msgs.push(json!({"role": "system", "content": "You answer briefly."}));
        }
        if i % 4 == 1 {
            msgs.push(user("Count to 3."));
            msgs.push(json!({"role": "assistant",
                             "content": "I count from 1 to 3.\n</think>\n\n1, 2, 3."}));
        }
        msgs.push(user(&q));
        let max_tokens = match i % 5 {
            0 => 6,
            1 => 14,
            _ => 64,
        };
        let extra = match i % 7 {
            2 => json!({"stop": ["zz"]}),
            3 => json!({"stop": ["\n\n"]}),
            4 => json!({"stop": ["qqqq", "light"]}),
            5 => json!({"logprobs": true, "top_logprobs": 1}),
            _ => json!({}),
        };
        out.push((msgs, max_tokens, extra));
    }
    let cont = vec![
        user("Count to 5."),
        json!({"role": "assistant", "content": "I count"}),
    ];
    out.push((
        cont,
        64,
        json!({"continue_final_message": true, "add_generation_prompt": false}),
    ));
    out
}

/// Each conversation, streamed and not, in `on` and `auto`: mismatches (or answers
/// without rounds), speculated answers that equalled direct, and whether vLLM's own
/// streamed split differed from its whole one.
async fn compare(
    up: &str,
    specd: &str,
    conv: &(Vec<Value>, u32, Value),
) -> (Vec<String>, u32, bool) {
    let (msgs, max_tokens, extra) = conv;
    let body = request(up, conv).await;
    let mut bad = Vec::new();
    let mut equal = 0;
    let mut directs = Vec::new();
    for stream in [false, true] {
        let (direct, _) = ask(up, &body, stream).await;
        // `auto` switches between verify rounds and relayed decoding every 3 tokens, so
        // both paths carry reasoning and content (plain `auto` declines to speculate on
        // this CPU, which would prove nothing).
        for spec in [
            json!({"mode": "on"}),
            json!({"mode": "auto", "switch_every": 3}),
        ] {
            let mut b = body.clone();
            b["speculation"] = spec.clone();
            let (via, r) = ask(specd, &b, stream).await;
            let what = format!("{msgs:?} {max_tokens} {extra} stream {stream} {spec}");
            if via != direct
                && stream
                && extra.get("stop").is_some()
                && direct_again(up, &body, &via).await
            {
                // vLLM's own streamed split with stop strings depends on how many tokens
                // its output queue merged into one delta (more under load); specd's
                // answer is one vLLM gives for this request.
                equal += u32::from(r > 0);
                if r == 0 {
                    bad.push(format!("{what}: not speculated (rounds 0)"));
                }
            } else if via != direct {
                bad.push(format!("{what}\n direct {direct:?}\n specd  {via:?}"));
            } else if r == 0 {
                bad.push(format!("{what}: not speculated (rounds 0)"));
            } else {
                equal += 1;
            }
        }
        directs.push(direct);
    }
    // Null (whole) and absent (streamed) both read as "".
    let text = |a: &Answer| {
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        (s(&a.reasoning), s(&a.content))
    };
    let quirk = text(&directs[0]) != text(&directs[1]);
    (bad, equal, quirk)
}

#[tokio::test]
async fn chat_answers_split_like_direct_vllm() {
    split_like_direct(PARSER, conversations()).await;
}

/// vLLM's grammar-engine parsers on the same model, with thinking switched off by
/// `chat_template_kwargs` as well.
#[tokio::test]
async fn engine_parsers_split_like_direct_vllm() {
    for (parser, off) in [("qwen3", "enable_thinking"), ("kimi_k2", "thinking")] {
        let mut convs = conversations();
        for c in conversations().into_iter().step_by(6) {
            let mut extra = c.2.clone();
            extra["chat_template_kwargs"] = json!({ off: false });
            convs.push((c.0, c.1, extra));
        }
        split_like_direct(parser, convs).await;
        reasoning_server(parser).stop();
    }
}

/// Every conversation, streamed and not, in `on` and `auto`, through specd started with
/// `--reasoning-parser parser` in front of a vLLM running it: equal to direct vLLM.
async fn split_like_direct(parser: &str, convs: Vec<(Vec<Value>, u32, Value)>) {
    let up = reasoning_server(parser).upstream();
    let specd = Specd::start_ready(&up, &["--reasoning-parser", parser]).await;
    let mut bad = Vec::new();
    let mut equal = 0;
    let mut with_content = 0;
    let mut quirks = 0;
    for batch in convs.chunks(4) {
        let runs = batch.iter().map(|c| compare(&up, &specd.url, c));
        for (b, e, q) in join_all(runs).await {
            bad.extend(b);
            equal += e;
            quirks += u32::from(q);
        }
    }
    // The model must really close its reasoning in most answers, or the test would
    // only ever see reasoning.
    for c in &convs {
        let (a, _) = ask(&up, &request(&up, c).await, false).await;
        with_content += u32::from(a.content.as_str().is_some_and(|c| !c.is_empty()));
    }
    eprintln!(
        "{parser}: {equal} of {} speculated answers equalled direct vLLM ({} conversations, \
         {with_content} with content, {quirks} whose streamed split differs from the whole)",
        convs.len() * 4,
        convs.len()
    );
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert_eq!(equal as usize, convs.len() * 4);
    assert!(with_content as usize >= convs.len() / 2, "{with_content}");
}

#[tokio::test]
async fn completions_stay_speculated_and_unparsed() {
    let up = reasoning_server(PARSER).upstream();
    let specd = Specd::start_ready(&up, &["--reasoning-parser", PARSER]).await;
    let model = served_model(&up).await;
    // The chat prompt, written out: the answer holds `</think>`, which vLLM leaves in.
    let prompt = "<|begin_of_text|><|im_start|>user\nCount to 4.<|im_end|>\n\
                  <|im_start|>assistant\n<think>\n";
    let body = json!({"model": model, "prompt": prompt, "max_tokens": 40, "temperature": 0});
    let (_, direct) = post(&up, "/v1/completions", &body).await;
    let mut b = body.clone();
    b["speculation"] = json!({"mode": "on"});
    let (_, via) = post(&specd.url, "/v1/completions", &b).await;
    let text = direct["choices"][0]["text"].as_str().unwrap_or("");
    assert!(text.contains("</think>"), "{direct}");
    assert_eq!(via["choices"][0]["text"], direct["choices"][0]["text"]);
    assert_eq!(usage_tokens(&via["usage"]), usage_tokens(&direct["usage"]));
    assert!(rounds(&via["usage"]) > 0, "{via}");
}

#[tokio::test]
async fn unimplemented_parsers_and_hidden_reasoning_pass_through() {
    let up = reasoning_server(PARSER).upstream();
    let model = served_model(&up).await;
    let body = json!({"model": model, "messages": [user("Count to 4.")], "max_tokens": 32,
                      "temperature": 0, "speculation": {"mode": "on"}});
    let mut direct_body = body.clone();
    direct_body.as_object_mut().map(|o| o.remove("speculation"));
    let (_, direct) = post(&up, "/v1/chat/completions", &direct_body).await;
    // Names specd does not implement: chat passes through, untouched.
    for name in ["gptoss", "granite"] {
        let specd = Specd::start_ready(&up, &["--reasoning-parser", name]).await;
        // The series exists from start (the dashboard reads every reason).
        let m = specd.metrics().await;
        assert_eq!(
            metric_value(&m, "specd_passthrough_total{reason=\"parser\"}"),
            Some(0.0)
        );
        let (_, via) = post(&specd.url, "/v1/chat/completions", &body).await;
        assert_eq!(whole(&via), whole(&direct), "{name}");
        assert!(via["usage"].get("speculation").is_none(), "{via}");
        let m = specd.metrics().await;
        assert_eq!(
            metric_value(&m, "specd_passthrough_total{reason=\"parser\"}"),
            Some(1.0),
            "{m}"
        );
        // Plain completions are not parsed: still speculated.
        let comp = json!({"model": model, "prompt": "Count to 4.", "max_tokens": 8,
                          "temperature": 0, "speculation": {"mode": "on"}});
        let (_, c) = post(&specd.url, "/v1/completions", &comp).await;
        assert!(rounds(&c["usage"]) > 0, "{name}: {c}");
    }

    // An implemented parser, but the request hides reasoning: vLLM's to answer.
    let specd = Specd::start_ready(&up, &["--reasoning-parser", PARSER]).await;
    let mut hidden = body.clone();
    hidden["include_reasoning"] = json!(false);
    let (_, via) = post(&specd.url, "/v1/chat/completions", &hidden).await;
    assert!(via["usage"].get("speculation").is_none(), "{via}");
    assert!(via["choices"][0]["message"]["reasoning"].is_null(), "{via}");
    let m = specd.metrics().await;
    assert_eq!(
        metric_value(&m, "specd_passthrough_total{reason=\"parser\"}"),
        Some(1.0)
    );
}
