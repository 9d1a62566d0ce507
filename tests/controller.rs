//! The controller, the suffix drafter and relay↔speculate switching against the real
//! vLLM: greedy output through specd must be token-identical to vLLM's own, whatever the
//! controller decides and however often the stream switches between relay and rounds.

mod common;

use common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "the", "proxy", "verifies", "draft", "tokens", "against", "a", "large", "model", "while",
    "clients", "stream", "answers", "from", "server", "in", "front", "of", "many", "GPUs",
];

/// Repetitive code, prose, a long quoted document, and chat.
fn cases() -> Vec<(String, Value)> {
    let mut rng = fastrand::Rng::with_seed(11);
    let mut out = Vec::new();
    for i in 0..16usize {
        let max_tokens = 24 + (i as u32 * 5) % 32;
        let (path, body) = match i % 4 {
            0 => {
                let line = format!("    acc += xs[{}] * w\n", i % 7);
                let p = format!("def f(xs, w):\n    acc = 0\n{}", line.repeat(3 + i % 4));
                ("/v1/completions", completion(json!(p), max_tokens))
            }
            1 => {
                let p: Vec<&str> = (0..10 + i)
                    .map(|_| WORDS[rng.usize(..WORDS.len())])
                    .collect();
                (
                    "/v1/completions",
                    completion(json!(p.join(" ")), max_tokens),
                )
            }
            2 => {
                let doc: Vec<&str> = (0..120).map(|_| WORDS[rng.usize(..WORDS.len())]).collect();
                let p = format!("Quote the text.\n{}\nQuote:", doc.join(" "));
                ("/v1/completions", completion(json!(p), max_tokens))
            }
            _ => {
                let msg = format!("Item {i}: {}", WORDS[i % WORDS.len()]).repeat(3);
                let b = json!({"model": model_name(), "messages": [{"role": "user", "content": msg}],
                    "max_tokens": max_tokens, "temperature": 0, "logprobs": true, "top_logprobs": 0,
                    "return_tokens_as_token_ids": true});
                ("/v1/chat/completions", b)
            }
        };
        let mut body = body;
        if i % 2 == 1 {
            body["stream"] = json!(true);
        }
        out.push((path.to_string(), body));
    }
    out
}

async fn ids(base: &str, path: &str, body: &Value) -> (Vec<u32>, Value) {
    if body["stream"] == json!(true) {
        let mut b = body.clone();
        b["stream_options"] = json!({"include_usage": true});
        let (s, ev, done) = post_stream(base, path, &b).await;
        assert_eq!(s, 200, "{ev:?}");
        assert!(done);
        let usage = ev
            .last()
            .and_then(|e| e.get("usage"))
            .cloned()
            .unwrap_or(Value::Null);
        (ev.iter().flat_map(token_ids).collect(), usage)
    } else {
        let (s, v) = post(base, path, body).await;
        assert_eq!(s, 200, "{v}");
        (token_ids(&v), v["usage"].clone())
    }
}

/// Every case through specd with `spec` added must match direct vLLM token for token.
async fn assert_lossless(specd: &Specd, up: &str, spec: Value, what: &str) -> Vec<Value> {
    let cs = cases();
    let mut usages = Vec::new();
    for group in cs.chunks(4) {
        let futs = group.iter().map(|(path, body)| {
            let mut sb = body.clone();
            sb["speculation"] = spec.clone();
            async move {
                let direct = ids(up, path, body).await.0;
                let (via, usage) = ids(&specd.url, path, &sb).await;
                (direct, via, usage)
            }
        });
        for (i, (d, v, u)) in join_all(futs).await.into_iter().enumerate() {
            assert!(!d.is_empty());
            assert_eq!(d, v, "{what}: token ids differ (case {i} of its group)");
            usages.push(u);
        }
    }
    usages
}

fn total(usages: &[Value], key: &str) -> u64 {
    usages
        .iter()
        .filter_map(|u| u.pointer(&format!("/speculation/{key}"))?.as_u64())
        .sum()
}

#[tokio::test]
async fn auto_and_suffix_are_lossless() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--max-draft-tokens", "6"]).await;
    for drafter in ["ngram", "suffix", "auto"] {
        let u = assert_lossless(
            &specd,
            &up,
            json!({"mode": "auto", "drafter": drafter}),
            &format!("auto/{drafter}"),
        )
        .await;
        eprintln!(
            "auto/{drafter}: rounds {} accepted {} relayed {} switches {}",
            total(&u, "rounds"),
            total(&u, "accepted_tokens"),
            total(&u, "relay_tokens"),
            total(&u, "switches")
        );
    }
    for drafter in ["suffix", "auto"] {
        let u = assert_lossless(
            &specd,
            &up,
            json!({"mode": "on", "drafter": drafter}),
            &format!("on/{drafter}"),
        )
        .await;
        assert!(
            total(&u, "accepted_tokens") > 0,
            "{drafter} drafts were accepted on repetitive text"
        );
        assert!(u
            .iter()
            .all(|x| x.pointer("/speculation/drafter") == Some(&json!(drafter))));
    }
    let m = specd.metrics().await;
    for name in [
        "specd_controller_decode_cost_seconds",
        "specd_controller_verify_cost_seconds",
        "specd_mode_seconds_total",
    ] {
        assert!(
            specd::upstream::prom_text::samples(&m)
                .any(|s| s.name.starts_with(name) && s.value != 0.0),
            "{name} exported"
        );
    }
}

#[tokio::test]
async fn forced_switching_is_lossless() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--max-draft-tokens", "4"]).await;
    for every in [1, 2, 3, 5] {
        for drafter in ["ngram", "suffix"] {
            let u = assert_lossless(
                &specd,
                &up,
                json!({"mode": "auto", "drafter": drafter, "switch_every": every}),
                &format!("switch every {every}, {drafter}"),
            )
            .await;
            assert!(total(&u, "relay_tokens") > 0 && total(&u, "rounds") > 0);
            assert!(total(&u, "switches") > 0);
        }
    }
}

#[tokio::test]
async fn seeded_sampling_with_forced_switching_is_reproducible() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--max-draft-tokens", "3"]).await;
    let mut b = completion(json!("Once upon a time"), 30);
    b["temperature"] = json!(0.9);
    b["seed"] = json!(4321);
    for spec in [
        json!({"mode": "auto", "drafter": "suffix"}),
        json!({"mode": "auto", "drafter": "ngram", "switch_every": 4}),
    ] {
        b["speculation"] = spec.clone();
        let (_, first) = post(&specd.url, "/v1/completions", &b).await;
        for _ in 0..2 {
            let (_, again) = post(&specd.url, "/v1/completions", &b).await;
            assert_eq!(token_ids(&first), token_ids(&again), "{spec}");
        }
        if spec.get("switch_every").is_none() {
            let relayed = first.pointer("/usage/speculation/relay_tokens");
            assert_eq!(relayed, Some(&json!(0)), "seeded sampling never relays");
        }
    }
}
