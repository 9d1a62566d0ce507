//! The speculation engine against the real vLLM: output through specd with speculation on
//! must be token-for-token what vLLM itself produces at temperature 0, whatever the
//! drafter proposes; sampled output must be reproducible with a seed and follow the same
//! distribution as direct sampling.

mod common;

use common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "the",
    "proxy",
    "verifies",
    "draft",
    "tokens",
    "against",
    "a",
    "large",
    "model",
    "while",
    "clients",
    "stream",
    "answers",
    "from",
    "server",
    "in",
    "front",
    "of",
    "many",
    "GPUs",
    "speculation",
    "pays",
    "only",
    "when",
    "accepted",
];

/// Deterministic prompts: repetitive code-like text, plain prose, and long contexts.
fn prompts() -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut out = Vec::new();
    for i in 0..104 {
        let p = match i % 4 {
            0 => {
                let line = format!("    total += values[{}] * weight\n", i % 9);
                format!(
                    "def accumulate(values, weight):\n    total = 0\n{}",
                    line.repeat(3 + i % 5)
                )
            }
            1 => (0..(8 + i % 20))
                .map(|_| WORDS[rng.usize(..WORDS.len())])
                .collect::<Vec<_>>()
                .join(" "),
            2 => {
                let n = if i % 8 == 2 { 260 } else { 30 };
                let text: Vec<&str> = (0..n).map(|_| WORDS[rng.usize(..WORDS.len())]).collect();
                format!("Summarise: {}\nSummary:", text.join(" "))
            }
            _ => format!("Item {i}: {}", WORDS[i % WORDS.len()]).repeat(2 + i % 3),
        };
        out.push(p);
    }
    out
}

fn request(i: usize, prompt: &str, max_tokens: u32) -> (String, Value) {
    let chat = i % 4 == 3;
    let mut body = if chat {
        json!({"model": model_name(), "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
               "temperature": 0, "logprobs": true, "top_logprobs": 0, "return_tokens_as_token_ids": true})
    } else {
        completion(json!(prompt), max_tokens)
    };
    if i % 2 == 1 {
        body["stream"] = json!(true);
    }
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    (path.to_string(), body)
}

/// Text, token ids, finish reason and usage of a response, streamed or not.
async fn run(base: &str, path: &str, body: &Value) -> (String, Vec<u32>, Value, Value) {
    if body["stream"] == json!(true) {
        let mut b = body.clone();
        b["stream_options"] = json!({"include_usage": true});
        let (s, ev, done) = post_stream(base, path, &b).await;
        assert_eq!(s, 200, "{ev:?}");
        assert!(done, "stream must end with [DONE]");
        let ids: Vec<u32> = ev.iter().flat_map(token_ids).collect();
        let finish = ev
            .iter()
            .rev()
            .find_map(|e| {
                e.pointer("/choices/0/finish_reason")
                    .filter(|f| !f.is_null())
                    .cloned()
            })
            .unwrap_or(Value::Null);
        let usage = ev
            .last()
            .and_then(|e| e.get("usage"))
            .cloned()
            .unwrap_or(Value::Null);
        (stream_text(&ev), ids, finish, usage)
    } else {
        let (s, v) = post(base, path, body).await;
        assert_eq!(s, 200, "{v}");
        let c = &v["choices"][0];
        let text = c
            .get("text")
            .or_else(|| c.pointer("/message/content"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        (
            text,
            token_ids(&v),
            c["finish_reason"].clone(),
            v["usage"].clone(),
        )
    }
}

fn strip_spec(u: &Value) -> Value {
    let mut u = u.clone();
    if let Some(o) = u.as_object_mut() {
        o.remove("speculation");
        o.remove("prompt_tokens_details");
    }
    u
}

#[tokio::test]
async fn greedy_output_is_identical_to_direct_vllm() {
    let up = upstream();
    let specd = Specd::start_ready(
        &up,
        &[
            "--speculation",
            "on",
            "--drafter",
            "ngram",
            "--max-draft-tokens",
            "4",
        ],
    )
    .await;
    let ps = prompts();
    for chunk in ps.chunks(4).enumerate().collect::<Vec<_>>() {
        let (c, group) = chunk;
        let futs = group.iter().enumerate().map(|(j, p)| {
            let i = c * 4 + j;
            let (path, body) = request(i, p, 16 + (i as u32 * 7) % 40);
            let up = up.clone();
            let url = specd.url.clone();
            async move {
                let direct = run(&up, &path, &body).await;
                let via = run(&url, &path, &body).await;
                (i, direct, via)
            }
        });
        for (i, d, v) in join_all(futs).await {
            assert!(!d.1.is_empty(), "direct response {i} carries token ids");
            assert_eq!(d.1, v.1, "token ids differ for prompt {i}");
            assert_eq!(d.0, v.0, "text differs for prompt {i}");
            assert_eq!(d.2, v.2, "finish reason differs for prompt {i}");
            if !d.3.is_null() {
                assert_eq!(
                    strip_spec(&d.3),
                    strip_spec(&v.3),
                    "usage differs for prompt {i}"
                );
            }
        }
    }
    let m = specd.metrics().await;
    let accepted = metric_sum(&m, "specd_spec_decode_num_accepted_tokens_total");
    let drafted = metric_sum(&m, "specd_spec_decode_num_draft_tokens_total");
    assert!(
        drafted > 0.0,
        "the n-gram drafter proposed nothing on repetitive prompts"
    );
    eprintln!("ngram: {accepted} of {drafted} draft tokens accepted");
}

#[tokio::test]
async fn oracle_and_adversarial_drafters_keep_output_identical() {
    let up = upstream();
    let specd = Specd::start_ready(
        &up,
        &[
            "--speculation",
            "on",
            "--enable-test-drafters",
            "--max-draft-tokens",
            "4",
        ],
    )
    .await;
    let prompt = "The verify call carries every prefix of the draft";
    let n = 23u32;
    let body = completion(json!(prompt), n);
    let (_, direct) = post(&up, "/v1/completions", &body).await;
    let truth = token_ids(&direct);
    assert_eq!(truth.len(), n as usize);
    for (drafter, want_rate) in [("oracle", 1.0), ("adversarial", 0.0)] {
        let mut b = body.clone();
        b["speculation"] =
            json!({"drafter": drafter, "oracle_tokens": truth, "max_draft_tokens": 4});
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(token_ids(&v), truth, "{drafter}");
        assert_eq!(v["choices"][0]["text"], direct["choices"][0]["text"]);
        let sp = &v["usage"]["speculation"];
        let drafted = sp["draft_tokens"].as_f64().unwrap();
        let accepted = sp["accepted_tokens"].as_f64().unwrap();
        assert!(drafted > 0.0);
        assert_eq!(accepted / drafted, want_rate, "{drafter}: {sp}");
        if drafter == "oracle" {
            // Every round yields K+1 tokens: ceil(n / (K+1)) rounds.
            assert_eq!(
                sp["rounds"].as_u64().unwrap(),
                u64::from(n.div_ceil(5)),
                "{sp}"
            );
        } else {
            assert_eq!(sp["rounds"].as_u64().unwrap(), u64::from(n));
        }
    }
}

#[tokio::test]
async fn stops_eos_and_limits_match_direct() {
    let up = upstream();
    let specd = Specd::start_ready(
        &up,
        &[
            "--speculation",
            "on",
            "--enable-test-drafters",
            "--max-draft-tokens",
            "6",
        ],
    )
    .await;
    let prompt = "    total += values[3] * weight\n".repeat(6);
    let base = completion(json!(prompt), 40);
    let (_, direct) = post(&up, "/v1/completions", &base).await;
    let truth = token_ids(&direct);
    let text = direct["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string that starts inside the text: pick a 3-char window in the middle.
    let chars: Vec<char> = text.chars().collect();
    let mid = chars.len() / 2;
    let stop: String = chars[mid..(mid + 3).min(chars.len())].iter().collect();
    let cases = vec![
        json!({"stop": [stop.clone()]}),
        json!({"stop": [stop.clone()], "include_stop_str_in_output": true}),
        json!({"max_tokens": 7}),
        json!({"stop_token_ids": [truth[5]]}),
        json!({"stop": ["this string never appears"], "stream": true}),
        json!({"stop": [stop], "stream": true}),
    ];
    for (i, extra) in cases.into_iter().enumerate() {
        let mut b = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        for drafter in ["ngram", "oracle"] {
            let mut bs = b.clone();
            bs["speculation"] = json!({"drafter": drafter, "oracle_tokens": truth});
            let d = run(&up, "/v1/completions", &b).await;
            let v = run(&specd.url, "/v1/completions", &bs).await;
            assert_eq!(d.0, v.0, "case {i} {drafter}: text");
            assert_eq!(d.1, v.1, "case {i} {drafter}: tokens");
            assert_eq!(d.2, v.2, "case {i} {drafter}: finish");
        }
    }
}

#[tokio::test]
async fn unsupported_parameters_go_to_passthrough() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on"]).await;
    for (extra, reason) in [
        (json!({"n": 2, "temperature": 0.5}), "n"),
        (json!({"presence_penalty": 0.3}), "penalty"),
        // A value specd does not read itself (vLLM reads the string as a float).
        (json!({"logit_bias": {"5": "1.0"}}), "logit_bias"),
        (
            json!({"bad_words": ["accumulate values"]}),
            "unsupported_param",
        ),
        (json!({"echo": true}), "echo"),
    ] {
        let mut b = json!({"model": model_name(), "prompt": "hello there", "max_tokens": 5, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        assert_eq!(s, 200, "{v}");
        assert!(
            v["usage"].get("speculation").is_none(),
            "passthrough answers are the upstream's own"
        );
        let m = specd.metrics().await;
        assert!(
            m.contains(&format!("specd_passthrough_total{{reason=\"{reason}\"}}")),
            "{reason}"
        );
    }
}

#[tokio::test]
async fn seeded_sampling_is_reproducible() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on", "--max-draft-tokens", "3"]).await;
    let mut b = completion(json!("Once upon a time"), 24);
    b["temperature"] = json!(0.8);
    b["seed"] = json!(1234);
    let (_, a) = post(&specd.url, "/v1/completions", &b).await;
    let (_, c) = post(&specd.url, "/v1/completions", &b).await;
    assert_eq!(token_ids(&a), token_ids(&c));
    b["seed"] = json!(99);
    let (_, d) = post(&specd.url, "/v1/completions", &b).await;
    assert_ne!(
        token_ids(&a),
        token_ids(&d),
        "another seed samples differently"
    );
}

/// The `model` drafter (CPU): output stays identical to direct vLLM, and the target used
/// as its own draft is accepted almost always (a check of the draft forward against vLLM).
/// The bound is 0.8, not 1: the test target has random weights, 18 % of its greedy steps
/// have a top-two logit gap under 1e-2, and vLLM's CPU kernels round float32 differently
/// from candle's on some CPUs (0.90 measured on an AVX512-BF16 EPYC, over 0.95 on
/// others); the bound still fails a draft forward or context that disagrees with the
/// target on more than one drafted token in five.
#[tokio::test]
async fn model_drafter_is_lossless_and_target_as_draft_is_accepted() {
    let up = upstream();
    let models = models_dir().display().to_string();
    for (dir, min_rate) in [("target", 0.8), ("draft", 0.0)] {
        let path = format!("{models}/{dir}");
        let specd = Specd::start_ready(
            &up,
            &[
                "--speculation",
                "on",
                "--drafter",
                "model",
                "--draft-model",
                &path,
                "--max-draft-tokens",
                "4",
            ],
        )
        .await;
        let (mut drafted, mut accepted) = (0.0, 0.0);
        for (i, p) in prompts().iter().take(12).enumerate() {
            let (path, body) = request(i, p, 24);
            let d = run(&up, &path, &body).await;
            let v = run(&specd.url, &path, &body).await;
            assert_eq!(d.1, v.1, "{dir}: token ids differ for prompt {i}");
            assert_eq!(d.0, v.0, "{dir}: text differs for prompt {i}");
        }
        let m = specd.metrics().await;
        drafted += metric_sum(&m, "specd_spec_decode_num_draft_tokens_total");
        accepted += metric_sum(&m, "specd_spec_decode_num_accepted_tokens_total");
        let rate = accepted / drafted.max(1.0);
        eprintln!("model drafter {dir}: acceptance {rate:.3} ({accepted} of {drafted})");
        assert!(drafted > 0.0);
        assert!(
            rate >= min_rate,
            "{dir}: acceptance {rate:.3} below {min_rate}"
        );
    }
}

/// A draft model with another vocabulary (make_models.py's draft-xtok) drafts through
/// text: output stays identical to direct vLLM, and its proposals are verified (rounds
/// happen). The same-vocabulary draft of the same recipe drafts ids directly.
#[tokio::test]
async fn model_drafter_with_another_vocabulary_is_lossless() {
    let up = upstream();
    let models = models_dir();
    if !models.join("draft-xtok/config.json").exists() {
        assert!(
            std::env::var_os("SPECD_REQUIRE_TRAINED").is_none(),
            "no draft-xtok in {} (scripts/make_models.py --trained)",
            models.display()
        );
        eprintln!("skipping: no draft-xtok (scripts/make_models.py --trained)");
        return;
    }
    for (dir, mode) in [
        ("draft-trained", "drafting token ids directly"),
        ("draft-xtok", "drafting through text"),
    ] {
        let path = models.join(dir).display().to_string();
        let args = [
            "--speculation",
            "on",
            "--drafter",
            "model",
            "--draft-model",
            &path,
            "--max-draft-tokens",
            "4",
        ];
        let specd = Specd::start_env(&up, &args, &[("SPECD_LOG", "warn,specd::draft=info")]);
        specd.wait_ready(std::time::Duration::from_secs(120)).await;
        let (mut rounds, mut emitted) = (0, 0);
        for (i, p) in prompts().iter().take(12).enumerate() {
            let (path, body) = request(i, p, 24);
            let d = run(&up, &path, &body).await;
            let v = run(&specd.url, &path, &body).await;
            assert_eq!(d.1, v.1, "{dir}: token ids differ for prompt {i}");
            assert_eq!(d.0, v.0, "{dir}: text differs for prompt {i}");
            rounds += v.3["speculation"]["rounds"].as_u64().unwrap_or(0);
            emitted += v.1.len() as u64;
        }
        assert!(rounds > 0, "{dir}: no verify rounds");
        let m = specd.metrics().await;
        let translations = metric_sum(
            &m,
            "specd_draft_translation_seconds_count{step=\"context\"}",
        );
        eprintln!(
            "{dir}: {rounds} rounds, {:.2} tokens per round, {translations} translations",
            emitted as f64 / rounds as f64
        );
        assert_eq!(translations > 0.0, dir == "draft-xtok", "{dir}");
        // Logged at start, before specd listens.
        let log = specd.log_text();
        assert_eq!(log.matches(mode).count(), 1, "{dir}: {log}");
    }
}
