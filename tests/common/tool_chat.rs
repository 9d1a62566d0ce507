//! Chat with tools through specd against a real vLLM, shared by the tool-call tests
//! (tests/tools.rs: hermes; tests/tools_kimi.rs: kimi_k2) and, for asking and comparing
//! answers, the reasoning tests (tests/reasoning.rs): deterministic conversations
//! (calls, questions no tool fits, earlier calls with their results, `tool_choice`
//! `none` and `auto`, budgets, stop strings, logprobs, a chat without tools), each
//! answered directly and through specd, streamed and not, in modes `on` and `auto`.

use crate::common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};

pub async fn served_model(up: &str) -> String {
    let v: Value = client()
        .get(format!("{up}/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("models json");
    v["data"][0]["id"].as_str().expect("model id").to_string()
}

pub fn tool(name: &str, description: &str, params: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "description": description,
           "parameters": {"type": "object", "properties": params}}})
}

pub fn tools() -> Value {
    json!([
        tool(
            "get_weather",
            "the weather in a city",
            json!({"city": {"type": "string"}})
        ),
        tool(
            "add",
            "the sum of two numbers",
            json!({"a": {"type": "number"}, "b": {"type": "number"}})
        ),
        tool(
            "search",
            "search the notes",
            json!({"query": {"type": "string"}})
        ),
    ])
}

pub fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// An earlier turn that called `name` and got `result` back (its id as Kimi-K2 writes
/// them; the hermes template renders none).
pub fn called(name: &str, args: Value, result: Value) -> Vec<Value> {
    let id = format!("functions.{name}:0");
    vec![
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
               "function": {"name": name, "arguments": args.to_string()}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": result.to_string()}),
    ]
}

/// Deterministic conversations: questions the model answers with calls (one or two,
/// seen cities and unseen ones), questions no tool fits, multi-turn ones that hand it a
/// tool's result to quote, `tool_choice: "none"`, a system message, token budgets that
/// end inside a call, logprobs, and a chat without tools in front of the tool parser.
pub fn conversations() -> Vec<(Vec<Value>, u32, Value)> {
    let cities = ["Oslo", "Paris", "Lima", "Tokyo", "Boston", "Nairobi"];
    let mut out = Vec::new();
    for i in 0..24usize {
        let c = cities[i % cities.len()];
        let q = match i % 6 {
            0 => format!("What is the weather in {c}?"),
            1 => format!("What is {} plus {}?", 3 + i, 11 + 2 * i),
            2 => format!(
                "Search my notes for {} river.",
                ["green", "quiet", "paper"][i % 3]
            ),
            3 => format!("Compare the weather in {c} and Rome."),
            4 => format!("Count to {}.", 3 + i % 5),
            _ => format!("Tell me about {c}."),
        };
        let mut msgs = Vec::new();
        if i % 8 == 5 {
            msgs.push(json!({"role": "system", "content": "You answer briefly."}));
        }
        msgs.push(user(&q));
        if i % 3 == 2 {
            // The tool's result is in: the model answers, quoting it.
            let (name, args, result) = match i % 4 {
                0 => ("add", json!({"a": 4, "b": i}), json!({"sum": 4 + i})),
                1 => (
                    "search",
                    json!({"query": "river"}),
                    json!({"results": ["stone bridge", "quiet garden"]}),
                ),
                _ => (
                    "get_weather",
                    json!({"city": c}),
                    json!({"city": c, "temperature": 10 + i, "sky": "sunny"}),
                ),
            };
            msgs.extend(called(name, args, result));
        }
        let max_tokens = match i % 5 {
            0 => 12,
            _ => 80,
        };
        let mut extra = match i % 7 {
            3 => json!({"tool_choice": "none"}),
            5 => json!({"logprobs": true, "top_logprobs": 1}),
            6 => json!({"tool_choice": "auto", "stop": ["zz"]}),
            _ => json!({}),
        };
        if i != 11 {
            extra["tools"] = tools();
        }
        out.push((msgs, max_tokens, extra));
    }
    out
}

/// What must match between a direct and a speculated answer (random tool-call ids
/// aside).
#[derive(Debug, PartialEq)]
pub struct Answer {
    pub reasoning: Value,
    pub content: Value,
    /// Per call: (name, arguments, the ids (`id_view`) of its pieces that start it).
    pub calls: Vec<(Value, Value, Vec<Value>)>,
    pub finish_reason: Value,
    pub stop_reason: Value,
    pub usage: Value,
}

impl Answer {
    /// SGLang writes `matched_stop` where specd writes vLLM's `stop_reason`.
    #[allow(dead_code)]
    pub fn clear_stop_reason(&mut self) {
        self.stop_reason = Value::Null;
    }
}

pub fn usage_tokens(u: &Value) -> Value {
    json!({"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
           "total_tokens": u["total_tokens"],
           "completion_tokens_details": u["completion_tokens_details"]})
}

/// A call's id and type as compared: vLLM's random ids (`chatcmpl-tool-` and hex
/// digits) read alike, ids the model made (kimi_k2) as they are.
pub fn id_view(t: &Value) -> Value {
    let id = match t["id"].as_str() {
        // vLLM's and SGLang's random ids.
        Some(s) if s.starts_with("chatcmpl-tool-") || s.starts_with("call_") => json!("random"),
        _ => t["id"].clone(),
    };
    json!([id, t["type"]])
}

pub fn whole(v: &Value) -> Answer {
    let c = &v["choices"][0];
    let calls = c["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // SGLang names the reasoning `reasoning_content`.
    let reasoning = match &c["message"]["reasoning"] {
        Value::Null => c["message"]["reasoning_content"].clone(),
        r => r.clone(),
    };
    Answer {
        reasoning,
        content: c["message"]["content"].clone(),
        calls: calls
            .iter()
            .map(|t| {
                (
                    t["function"]["name"].clone(),
                    t["function"]["arguments"].clone(),
                    vec![id_view(t)],
                )
            })
            .collect(),
        finish_reason: c["finish_reason"].clone(),
        stop_reason: c["stop_reason"].clone(),
        usage: usage_tokens(&v["usage"]),
    }
}

/// A stream's concatenated content, its calls put together by index, finish and usage.
pub fn streamed(events: &[Value]) -> Answer {
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut calls: Vec<(Value, String, Vec<Value>)> = Vec::new();
    let (mut last, mut usage) = (&Value::Null, &Value::Null);
    for e in events {
        if let Some(c) = e.pointer("/choices/0") {
            let d = &c["delta"];
            reasoning.push_str(d["reasoning"].as_str().unwrap_or(""));
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(d["content"].as_str().unwrap_or(""));
            for t in d["tool_calls"].as_array().into_iter().flatten() {
                let i = t["index"].as_u64().unwrap_or(0) as usize;
                while calls.len() <= i {
                    calls.push((Value::Null, String::new(), Vec::new()));
                }
                let f = &t["function"];
                if !f["name"].is_null() {
                    calls[i].0 = f["name"].clone();
                }
                calls[i].1.push_str(f["arguments"].as_str().unwrap_or(""));
                if !f["name"].is_null() {
                    calls[i].2.push(id_view(t));
                }
            }
            if !c["finish_reason"].is_null() {
                last = c;
            }
        }
        if !e["usage"].is_null() {
            usage = &e["usage"];
        }
    }
    Answer {
        reasoning: reasoning.into(),
        content: content.into(),
        calls: calls
            .into_iter()
            .map(|(n, a, k)| (n, a.into(), k))
            .collect(),
        finish_reason: last["finish_reason"].clone(),
        stop_reason: last["stop_reason"].clone(),
        usage: usage_tokens(usage),
    }
}

pub async fn request(up: &str, conv: &(Vec<Value>, u32, Value)) -> Value {
    let model = served_model(up).await;
    let mut body = json!({"model": model, "messages": conv.0, "max_tokens": conv.1,
                          "temperature": 0});
    let extra = conv.2.as_object().cloned().unwrap_or_default();
    body.as_object_mut().expect("object").extend(extra);
    body
}

pub fn rounds(usage: &Value) -> u64 {
    usage["speculation"]["rounds"].as_u64().unwrap_or(0)
}

/// One answer through `base`; its comparable part and `usage.speculation.rounds`.
pub async fn ask(base: &str, body: &Value, stream: bool) -> (Answer, u64) {
    let mut body = body.clone();
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (status, events, done) = post_stream(base, "/v1/chat/completions", &body).await;
        assert!(status == 200 && done, "{status} {events:?}");
        let usage = events.iter().rev().find(|e| !e["usage"].is_null());
        let r = usage.map_or(0, |e| rounds(&e["usage"]));
        (streamed(&events), r)
    } else {
        let (status, v) = post(base, "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        (whole(&v), rounds(&v["usage"]))
    }
}

/// Whether a quiet repeat of the direct streamed request gives `want` (a few tries).
pub async fn direct_again(up: &str, body: &Value, want: &Answer) -> bool {
    for _ in 0..3 {
        if ask(up, body, true).await.0 == *want {
            return true;
        }
    }
    false
}

/// Each conversation, streamed and not, in `on` and `auto`: mismatches (or answers
/// without rounds), speculated answers that equalled direct, and whether the direct
/// answer called a tool.
pub async fn compare(
    up: &str,
    specd: &str,
    conv: &(Vec<Value>, u32, Value),
    sglang: bool,
) -> (Vec<String>, u32, bool) {
    let body = request(up, conv).await;
    let mut bad = Vec::new();
    let mut equal = 0;
    let mut calls = false;
    for stream in [false, true] {
        let (mut direct, _) = ask(up, &body, stream).await;
        // SGLang writes `matched_stop`, specd vLLM's `stop_reason`: not compared.
        if sglang {
            direct.stop_reason = Value::Null;
        }
        calls |= !direct.calls.is_empty();
        // `auto` switches between verify rounds and relayed decoding every 3 tokens, so
        // both paths carry content and calls.
        for spec in [
            json!({"mode": "on"}),
            json!({"mode": "auto", "switch_every": 3}),
        ] {
            let mut b = body.clone();
            b["speculation"] = spec.clone();
            let (mut via, r) = ask(specd, &b, stream).await;
            if sglang {
                via.stop_reason = Value::Null;
            }
            let what = format!("{:?} {} {} stream {stream} {spec}", conv.0, conv.1, conv.2);
            // A streamed parse depends on how many tokens the server's busy front end
            // merged into one delta; specd steps the parsers once per token, as a quiet
            // server does. vLLM: the split around stop strings (tests/reasoning.rs), and
            // a call cut by `max_tokens` right after its name, whose `{}` vLLM's
            // `finalize_generation` appends only when the name went out in the last
            // delta. SGLang: text after a call's JSON in the last chunk is never
            // flushed. specd's answer counts as equal where the server itself gives it
            // on a repeat.
            let quirk = || async { stream && direct_again(up, &body, &via).await };
            if via != direct && !quirk().await {
                bad.push(format!("{what}\n direct {direct:?}\n specd  {via:?}"));
            } else if r == 0 {
                bad.push(format!("{what}: not speculated (rounds 0)"));
            } else {
                equal += 1;
            }
        }
    }
    (bad, equal, calls)
}

/// Every conversation against `up`, through a specd started with `args`.
#[allow(dead_code)]
pub async fn all_equal_direct(up: &str, args: &[&str]) {
    all_equal_direct_of(up, args, false).await;
}

/// Every conversation against `up` (an SGLang server when `sglang`).
pub async fn all_equal_direct_of(up: &str, args: &[&str], sglang: bool) {
    let specd = Specd::start_ready(up, args).await;
    let convs = conversations();
    let (mut bad, mut equal, mut with_calls) = (Vec::new(), 0, 0);
    for batch in convs.chunks(4) {
        let runs = batch.iter().map(|c| compare(up, &specd.url, c, sglang));
        for (b, e, c) in join_all(runs).await {
            bad.extend(b);
            equal += e;
            with_calls += u32::from(c);
        }
    }
    eprintln!(
        "{args:?}: {equal} of {} speculated answers equalled direct {} ({} conversations, \
         {with_calls} with tool calls)",
        convs.len() * 4,
        if sglang { "SGLang" } else { "vLLM" },
        convs.len()
    );
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert_eq!(equal as usize, convs.len() * 4);
    // The model must really call tools in many answers, or the test proves little.
    assert!(with_calls as usize >= convs.len() / 3, "{with_calls}");
}
