//! The fake upstream over HTTP, on both clocks, with a word-level tokenizer written here.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use specd_sim::fault::{Call, Fault};
use specd_sim::{continuation, Options, SimConfig, Timing, Tokens, Upstream};

/// A model directory whose tokenizer knows `w0`..`w4199`.
fn model_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specd-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let vocab: serde_json::Map<String, Value> =
        (0..4200).map(|i| (format!("w{i}"), json!(i))).collect();
    let tok = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).expect("write tokenizer");
    dir
}

async fn start(tokens: Tokens, timing: Timing) -> Upstream {
    Upstream::start(Options {
        listen: "127.0.0.1:0".parse().expect("address"),
        tokenizer: model_dir(),
        model: "m".into(),
        max_model_len: 2048,
        tokens,
        timing,
        tls: None,
    })
    .await
    .expect("start")
}

async fn post(up: &Upstream, body: Value) -> reqwest::Result<(u16, String)> {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", up.url))
        .json(&body)
        .send()
        .await?;
    let status = r.status().as_u16();
    Ok((status, r.text().await?))
}

fn ids(v: &Value) -> Vec<u32> {
    let toks = v
        .pointer("/choices/0/logprobs/tokens")
        .and_then(Value::as_array);
    toks.into_iter()
        .flatten()
        .filter_map(|t| t.as_str()?.strip_prefix("token_id:")?.parse().ok())
        .collect()
}

fn verify(prompt: &[u32]) -> Value {
    json!({"prompt": prompt, "max_tokens": 1, "logprobs": 0, "return_tokens_as_token_ids": true})
}

#[tokio::test]
async fn immediate_answers_follow_the_tokens_and_the_faults() {
    let up = start(Tokens::Cyclic, Timing::Immediate).await;
    let p = [300, 301, 302];
    let body =
        json!({"prompt": p, "max_tokens": 6, "logprobs": 1, "return_tokens_as_token_ids": true});
    let (s, t) = post(&up, body.clone()).await.expect("answer");
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(ids(&v), Tokens::Cyclic.continuation(&p, 6));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, t) = post(&up, streamed.clone()).await.expect("stream");
    let got: Vec<u32> = t
        .split("\n\n")
        .filter_map(|e| serde_json::from_str(e.strip_prefix("data: ")?).ok())
        .flat_map(|v: Value| ids(&v))
        .collect();
    assert_eq!(got, Tokens::Cyclic.continuation(&p, 6));
    assert!(t.ends_with("data: [DONE]\n\n"), "{t}");

    up.fail_times(Call::Verify, Fault::Status(503), 1);
    assert_eq!(post(&up, verify(&p)).await.expect("503").0, 503);
    assert_eq!(post(&up, verify(&p)).await.expect("200").0, 200);
    assert_eq!(up.calls(Call::Verify), 2);
    up.fail_marked(Call::Stream, Fault::Cut(2), 7);
    assert!(
        post(&up, streamed).await.is_ok(),
        "unmarked streams are whole"
    );
    let cut = json!({"prompt": [7, 8], "max_tokens": 6, "stream": true});
    assert!(
        post(&up, cut).await.is_err(),
        "the marked stream breaks off"
    );
    up.clear();

    up.down().await;
    assert!(post(&up, verify(&p)).await.is_err(), "refused while down");
    up.up().await;
    assert_eq!(post(&up, verify(&p)).await.expect("up again").0, 200);
    assert_eq!(up.running(), 0);
    assert!(up.seen().iter().all(|s| s.path == "/v1/completions"));
}

#[tokio::test]
async fn the_latency_model_answers_on_its_clock() {
    let cost = SimConfig {
        base_ms: 20.0,
        extend_ms: 0.0,
        api_ms: 0.0,
        ..SimConfig::default()
    };
    let up = start(Tokens::Hashed { vocab: 4096 }, Timing::Model(cost)).await;
    let p = [9, 8, 7, 6];
    let t = std::time::Instant::now();
    let body =
        json!({"prompt": p, "max_tokens": 5, "logprobs": 0, "return_tokens_as_token_ids": true});
    let (s, text) = post(&up, body).await.expect("answer");
    assert_eq!(s, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(ids(&v), continuation(&p, 5, 4096));
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "5 steps of 20 ms"
    );
    let (s, text) = post(&up, json!({"prompt": p, "max_tokens": 2048}))
        .await
        .expect("400");
    assert_eq!(s, 400, "past the context: {text}");
    let m = reqwest::get(format!("{}/metrics", up.url))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    // The gauge holds the batch size of the engine's last step (it is not reset when the
    // batch empties), so only its presence is checked.
    assert!(
        m.contains("vllm:num_requests_running{model_name=\"m\"} "),
        "{m}"
    );
}

async fn post_to(up: &Upstream, path: &str, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", up.url))
        .json(body)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.expect("json")
}

#[tokio::test]
async fn chat_answers_continue_the_rendered_prompt() {
    let up = start(Tokens::Cyclic, Timing::Immediate).await;
    let chat = json!({"messages": [
        {"role": "user", "content": "w300 w301"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "w7", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "w302 w303"}],
        "tools": [{"type": "function", "function": {"name": "w7", "description": "w8"}}],
        "max_tokens": 5});
    let t = post_to(&up, "/tokenize", &chat).await;
    let prompt = t["tokens"].clone();
    let whole = post_to(&up, "/v1/chat/completions", &chat).await;
    let text = post_to(
        &up,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 5}),
    )
    .await;
    assert_eq!(
        whole["choices"][0]["message"]["content"],
        text["choices"][0]["text"]
    );
    assert_eq!(whole["usage"]["prompt_tokens"], t["count"]);
    assert_eq!(whole["object"], "chat.completion");
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", up.url))
        .json(&streamed)
        .send()
        .await
        .expect("stream");
    let body = r.text().await.expect("body");
    // One token per delta; this word-level tokenizer joins words with spaces.
    let deltas: Vec<String> = body
        .split("\n\n")
        .filter_map(|e| serde_json::from_str::<Value>(e.strip_prefix("data: ")?).ok())
        .filter_map(|v| Some(v.pointer("/choices/0/delta/content")?.as_str()?.to_string()))
        .collect();
    assert_eq!(
        Some(deltas.join(" ").as_str()),
        text["choices"][0]["text"].as_str()
    );
}

#[tokio::test]
async fn a_newer_version_answers_return_token_ids_as_vllm_does() {
    let up = start(Tokens::Cyclic, Timing::Immediate).await;
    let version = || async {
        let r = reqwest::get(format!("{}/version", up.url))
            .await
            .expect("version");
        r.json::<Value>().await.expect("json")["version"].clone()
    };
    assert_eq!(version().await, json!(specd_sim::upstream::DEFAULT_VERSION));
    up.set_version("0.32.0");
    assert_eq!(version().await, json!("0.32.0"));

    let p = [300, 301, 302];
    let want = Tokens::Cyclic.continuation(&p, 3);
    // A verify-shaped call: the prompt's and the sampled ids in the choice, no logprobs.
    let body = json!({"prompt": [p], "max_tokens": 1, "return_token_ids": true});
    let (s, t) = post(&up, body).await.expect("answer");
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).expect("json");
    assert_eq!(v.pointer("/choices/0/prompt_token_ids"), Some(&json!(p)));
    assert_eq!(v.pointer("/choices/0/token_ids"), Some(&json!(want[..1])));
    assert_eq!(v.pointer("/choices/0/logprobs"), Some(&Value::Null));
    assert_eq!(up.calls(Call::Verify), 1);

    // Streamed: each chunk its token's id, the first one also the prompt's.
    let body = json!({"prompt": p, "max_tokens": 3, "stream": true, "return_token_ids": true});
    let (_, t) = post(&up, body).await.expect("stream");
    let chunks: Vec<Value> = t
        .split("\n\n")
        .filter_map(|e| serde_json::from_str(e.strip_prefix("data: ")?).ok())
        .collect();
    let prompts: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/prompt_token_ids"))
        .collect();
    assert_eq!(prompts, [&json!(p), &Value::Null, &Value::Null]);
    let got: Vec<u32> = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/token_ids")?
                .as_array()?
                .first()?
                .as_u64()
        })
        .map(|t| t as u32)
        .collect();
    assert_eq!(got, want);
}
