//! Bad input: every malformed or out-of-range request gets an OpenAI-style error with the
//! status the real vLLM gives for the same bytes (specd validates before speculating, so
//! its rules must be vLLM's), and the per-request caps (body size, context length).

mod common;

use common::*;
use serde_json::{json, Value};

/// Send raw bytes as a JSON body; (status, body as JSON or string).
async fn raw(base: &str, path: &str, bytes: Vec<u8>) -> (u16, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(bytes)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let m = model_name();
    let c = |mut v: Value| {
        v["model"] = json!(m);
        if v.get("max_tokens").is_none() {
            v["max_tokens"] = json!(4);
        }
        ("/v1/completions", v.to_string().into_bytes())
    };
    let chat = |mut v: Value| {
        v["model"] = json!(m);
        ("/v1/chat/completions", v.to_string().into_bytes())
    };
    let long_prompt = "hi ".repeat(3000);
    let mut out: Vec<(&'static str, Vec<u8>)> = vec![
        ("/v1/completions", b"{".to_vec()),
        ("/v1/completions", b"[1,2]".to_vec()),
        ("/v1/completions", b"".to_vec()),
        ("/v1/completions", b"null".to_vec()),
        (
            "/v1/completions",
            format!(
                "{{\"model\":\"{m}\",\"prompt\":\"hi\",\"max_tokens\":99999999999999999999999}}"
            )
            .into_bytes(),
        ),
        (
            "/v1/completions",
            format!(
                "{{\"model\":\"{m}\",\"prompt\":\"hi\",\"max_tokens\":4,\"temperature\":1e400}}"
            )
            .into_bytes(),
        ),
    ];
    // Invalid UTF-8 inside a string.
    let mut bad_utf8 = format!("{{\"model\":\"{m}\",\"max_tokens\":4,\"prompt\":\"a").into_bytes();
    bad_utf8.extend_from_slice(&[0xff, 0xfe]);
    bad_utf8.extend_from_slice(b"\"}");
    out.push(("/v1/completions", bad_utf8));
    for v in [
        json!({"prompt": 5}),
        json!({"prompt": "hi", "max_tokens": "x"}),
        json!({"prompt": "hi", "max_tokens": "5"}),
        json!({"prompt": "hi", "max_tokens": -1}),
        json!({"prompt": "hi", "max_tokens": 0}),
        json!({"prompt": "hi", "max_tokens": 1e30}),
        json!({"prompt": "hi", "max_tokens": 4.5}),
        json!({"prompt": "hi", "max_tokens": 4.0}),
        json!({"prompt": "hi", "max_tokens": true}),
        json!({"prompt": (0..2040).map(|i| 10 + i % 1000).collect::<Vec<u32>>(), "max_tokens": null}),
        json!({"prompt": (0..2040).map(|i| 10 + i % 1000).collect::<Vec<u32>>(), "max_tokens": 2048}),
        json!({"prompt": (0..2048).map(|i| 10 + i % 1000).collect::<Vec<u32>>(), "max_tokens": 1}),
        json!({"prompt": "hi", "max_tokens": 2049}),
        json!({"prompt": "hi", "max_tokens": 5000}),
        json!({"prompt": "hi", "temperature": "hot"}),
        json!({"prompt": "hi", "temperature": -1}),
        json!({"prompt": "hi", "temperature": true}),
        json!({"prompt": "hi", "temperature": "0.5"}),
        json!({"prompt": "hi", "top_p": 0}),
        json!({"prompt": "hi", "top_p": 1.5}),
        json!({"prompt": "hi", "top_k": -5}),
        json!({"prompt": "hi", "top_k": 0}),
        json!({"prompt": "hi", "min_p": 2}),
        json!({"prompt": "hi", "stop": 5}),
        json!({"prompt": "hi", "stop": [1]}),
        json!({"prompt": "hi", "seed": "x"}),
        json!({"prompt": "hi", "seed": -1}),
        json!({"prompt": "hi", "seed": 18446744073709551615u64}),
        json!({"prompt": "hi", "logprobs": -1}),
        json!({"prompt": "hi", "logprobs": 100}),
        json!({"prompt": "hi", "logprobs": true}),
        json!({"prompt": ""}),
        json!({"prompt": []}),
        json!({"prompt": [[]]}),
        json!({"prompt": [1, -2]}),
        json!({"prompt": [1, 2, 3.5]}),
        json!({"prompt": [99999999]}),
        json!({"prompt": ["a", [1, 2]]}),
        json!({"prompt": null}),
        json!({}),
        json!({"prompt": "hi", "unknown_field": {"nested": [1, 2]}}),
        json!({"prompt": long_prompt}),
        json!({"prompt": "hi", "stream": "yes"}),
        json!({"prompt": "hi", "stream": "perhaps"}),
        json!({"prompt": "hi", "stream": 1}),
        json!({"prompt": "hi", "stream_options": {"include_usage": true}}),
        json!({"prompt": "hi", "model": 5}),
        json!({"prompt": "hi", "n": "x"}),
        json!({"prompt": "hi", "stop_token_ids": [-1]}),
        json!({"prompt": "hi", "stop_token_ids": [99999]}),
        json!({"prompt": "hi", "ignore_eos": "x"}),
        json!({"prompt": "hi", "ignore_eos": "true"}),
        json!({"prompt": "hi", "presence_penalty": 5}),
        json!({"prompt": "hi", "skip_special_tokens": 3}),
    ] {
        out.push(c(v));
    }
    let mut nonexistent = json!({"prompt": "hi", "max_tokens": 4});
    nonexistent["model"] = json!("nonexistent");
    out.push(("/v1/completions", nonexistent.to_string().into_bytes()));
    for v in [
        json!({"messages": "hi"}),
        json!({"messages": []}),
        json!({"messages": [{"role": "user"}], "max_tokens": 4}),
        json!({"messages": [{"role": "wizard", "content": "x"}], "max_tokens": 4}),
        json!({"messages": [{"role": "user", "content": 5}]}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": "x"}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "top_logprobs": 2}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "top_logprobs": 0}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2049}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": true, "top_logprobs": 50}),
        json!({"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 4}),
        json!({}),
    ] {
        out.push(chat(v));
    }
    out
}

#[tokio::test]
async fn bad_input_gets_vllms_status_and_an_openai_error() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on"]).await;
    let mut mismatches = Vec::new();
    for (path, bytes) in cases() {
        let (want, direct) = raw(&up, path, bytes.clone()).await;
        let (got, via) = raw(&specd.url, path, bytes.clone()).await;
        let shown = String::from_utf8_lossy(&bytes)
            .chars()
            .take(100)
            .collect::<String>();
        if want != got {
            mismatches.push(format!(
                "{path} {shown}: vLLM {want} ({direct}), specd {got} ({via})"
            ));
            continue;
        }
        if got >= 400 {
            let e = &via["error"];
            let shaped = e["message"].is_string()
                && e["type"].is_string()
                && e["code"].as_u64() == Some(u64::from(got));
            assert!(shaped, "{path} {shown}: not an OpenAI-style error: {via}");
        }
    }
    assert!(
        mismatches.is_empty(),
        "statuses differ from vLLM:\n{}",
        mismatches.join("\n")
    );
}

#[tokio::test]
async fn body_size_limit_gives_413() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--max-body-bytes", "2048"]).await;
    let big = json!({"model": model_name(), "prompt": "word ".repeat(1000), "max_tokens": 4});
    let (s, v) = post(&specd.url, "/v1/completions", &big).await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["error"]["code"], 413);
    let small = json!({"model": model_name(), "prompt": "word ".repeat(100), "max_tokens": 4});
    let (s, v) = post(&specd.url, "/v1/completions", &small).await;
    assert_eq!(s, 200, "{v}");
    let m = specd.metrics().await;
    assert_eq!(
        metric_value(&m, "specd_rejected_requests_total{reason=\"too_large\"}"),
        Some(1.0)
    );
}

#[tokio::test]
async fn context_length_and_max_tokens_caps() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on"]).await;
    let model = model_name();
    // A prompt over the context and max_tokens over the whole context are refused; a
    // max_tokens past what the prompt leaves, or none, is capped there (vLLM's rules).
    let ids: Vec<u32> = (0..2100).map(|i| 10 + i % 1000).collect();
    for (b, want) in [
        (json!({"model": model, "prompt": ids, "max_tokens": 4}), 400),
        (
            json!({"model": model, "prompt": &ids[..100], "max_tokens": 2049}),
            400,
        ),
        (
            json!({"model": model, "prompt": &ids[..2040], "max_tokens": 8, "temperature": 0}),
            200,
        ),
        (
            json!({"model": model, "prompt": &ids[..2040], "max_tokens": 16, "temperature": 0}),
            200,
        ),
        (
            json!({"model": model, "prompt": &ids[..2040], "temperature": 0}),
            200,
        ),
    ] {
        let (d, dv) = post(&up, "/v1/completions", &b).await;
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        assert_eq!((d, s), (want, want), "vLLM {dv}\nspecd {v}");
        if want == 200 {
            assert_eq!(v["choices"][0]["text"], dv["choices"][0]["text"]);
            for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
                assert_eq!(v["usage"][k], dv["usage"][k], "{k}");
            }
        } else {
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains("context length") || msg.contains("max_model_len"),
                "{v}"
            );
        }
    }
}

/// Values specd reads but does not fully understand are forwarded: the client gets the
/// upstream's own answer (here vLLM's 400 and its error body), not specd's guess.
#[tokio::test]
async fn values_specd_does_not_understand_get_the_upstreams_answer() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on"]).await;
    let m = model_name();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let stops: Vec<String> = (0..500).map(|i| format!("stop{i}")).collect();
    let cases = [
        (
            "/v1/completions",
            json!({"model": m, "prompt": "hi", "max_tokens": 4, "stop": [""]}),
        ),
        (
            "/v1/completions",
            json!({"model": m, "prompt": "hi", "max_tokens": 4, "stop": stops}),
        ),
        (
            "/v1/completions",
            json!({"model": m, "prompt": "hi", "max_tokens": 4, "stream": true,
                   "stream_options": {"include_usage": "x"}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": m, "messages": msgs, "max_tokens": 4, "tools": "x"}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": m, "messages": msgs, "max_tokens": 4, "tools": []}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": m, "messages": msgs, "max_tokens": 4, "tool_choice": "auto"}),
        ),
        (
            "/v1/completions",
            json!({"model": m, "prompt": "hi", "max_tokens": 4, "temperature": 2.5}),
        ),
    ];
    for (path, body) in &cases {
        let (want, direct) = post(&up, path, body).await;
        let (got, via) = post(&specd.url, path, body).await;
        let shown = body.to_string().chars().take(100).collect::<String>();
        assert_eq!(got, want, "{path} {shown}: vLLM {direct}, specd {via}");
        assert!(want >= 400, "{path} {shown}: vLLM accepted it: {direct}");
        for k in ["message", "type", "code"] {
            assert_eq!(via["error"][k], direct["error"][k], "{path} {shown}: {k}");
        }
    }
    let metrics = specd.metrics().await;
    let forwarded = metric_value(
        &metrics,
        "specd_passthrough_total{reason=\"unsupported_param\"}",
    );
    assert_eq!(forwarded, Some(cases.len() as f64), "{metrics}");
}
