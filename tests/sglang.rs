//! specd in front of a real SGLang (scripts/sglang-cpu-upstream.sh, or
//! `SPECD_TEST_SGLANG_UPSTREAM`): detection of both server kinds, a forced kind that does
//! not match, and greedy output through specd identical to asking SGLang directly on its
//! own OpenAI routes — whatever the drafter proposes, streamed or not, with stops, limits,
//! logprobs and relay segments.

mod common;

use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// Text, finish reason, usage counts and per-token logprobs of a completions or chat
/// answer (streamed answers are concatenated).
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    text: String,
    finish: Value,
    prompt_tokens: Value,
    completion_tokens: Value,
    logprobs: Vec<f64>,
}

fn logprobs_of(choice: &Value) -> Vec<f64> {
    let lp = &choice["logprobs"];
    if let Some(a) = lp["token_logprobs"].as_array() {
        return a.iter().filter_map(Value::as_f64).collect();
    }
    lp["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|t| t["logprob"].as_f64()).collect())
        .unwrap_or_default()
}

async fn ask(base: &str, path: &str, body: &Value) -> Answer {
    if body["stream"] == json!(true) {
        let mut b = body.clone();
        b["stream_options"] = json!({"include_usage": true});
        let (s, ev, done) = post_stream(base, path, &b).await;
        assert_eq!(s, 200, "{ev:?}");
        assert!(done, "stream must end with [DONE]");
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
            .iter()
            .rev()
            .find_map(|e| e.get("usage").filter(|u| !u.is_null()))
            .cloned()
            .unwrap_or(Value::Null);
        let logprobs = ev
            .iter()
            .filter_map(|e| e.pointer("/choices/0"))
            .flat_map(logprobs_of)
            .collect();
        Answer {
            text: stream_text(&ev),
            finish,
            prompt_tokens: usage["prompt_tokens"].clone(),
            completion_tokens: usage["completion_tokens"].clone(),
            logprobs,
        }
    } else {
        let (s, v) = post(base, path, body).await;
        assert_eq!(s, 200, "{v}");
        let c = &v["choices"][0];
        Answer {
            text: c
                .get("text")
                .or_else(|| c.pointer("/message/content"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            finish: c["finish_reason"].clone(),
            prompt_tokens: v["usage"]["prompt_tokens"].clone(),
            completion_tokens: v["usage"]["completion_tokens"].clone(),
            logprobs: logprobs_of(c),
        }
    }
}

/// Same answer, logprobs within float32 noise of a batched vs. single computation.
fn assert_same(direct: &Answer, via: &Answer, what: &str) {
    assert_eq!(direct.text, via.text, "{what}: text");
    assert_eq!(direct.finish, via.finish, "{what}: finish reason");
    assert_eq!(
        direct.prompt_tokens, via.prompt_tokens,
        "{what}: prompt tokens"
    );
    assert_eq!(
        direct.completion_tokens, via.completion_tokens,
        "{what}: completion tokens"
    );
    assert_eq!(
        direct.logprobs.len(),
        via.logprobs.len(),
        "{what}: logprob count"
    );
    for (a, b) in direct.logprobs.iter().zip(&via.logprobs) {
        assert!((a - b).abs() < 1e-3, "{what}: logprob {a} vs {b}");
    }
}

fn prompts() -> Vec<String> {
    let words = [
        "the", "proxy", "verifies", "draft", "tokens", "against", "a", "large", "model", "while",
        "clients", "stream", "answers",
    ];
    let mut rng = fastrand::Rng::with_seed(11);
    (0..16)
        .map(|i| match i % 4 {
            0 => "    total += values[3] * weight\n".repeat(2 + i % 3),
            1 => (0..(6 + i))
                .map(|_| words[rng.usize(..words.len())])
                .collect::<Vec<_>>()
                .join(" "),
            2 => format!("Item {i}: {}", words[i % words.len()]).repeat(3),
            _ => format!("Say something about {}.", words[i % words.len()]),
        })
        .collect()
}

fn body(i: usize, prompt: &str, max_tokens: u32) -> (&'static str, Value) {
    let chat = i % 4 == 3;
    let mut b = if chat {
        json!({"model": model_name(), "messages": [{"role": "user", "content": prompt}],
               "max_tokens": max_tokens, "temperature": 0})
    } else {
        json!({"model": model_name(), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    };
    if i % 2 == 1 {
        b["stream"] = json!(true);
    }
    if i % 3 == 0 {
        if chat {
            b["logprobs"] = json!(true);
        } else {
            b["logprobs"] = json!(0);
        }
    }
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    (path, b)
}

#[tokio::test]
async fn both_server_kinds_are_detected() {
    for (up, kind) in [(sglang_upstream(), "sglang"), (upstream(), "vllm")] {
        let specd = Specd::start_ready(&up, &["--speculation", "off"]).await;
        let m = specd.metrics().await;
        let line = m
            .lines()
            .find(|l| l.starts_with("specd_upstream_info{"))
            .unwrap_or_else(|| panic!("no specd_upstream_info in front of {kind}"));
        assert!(line.contains(&format!("kind=\"{kind}\"")), "{line}");
        assert!(line.contains("model=\"specd-target\""), "{line}");
        // SGLang: its input limit (context 2048 less 6 reserved), which bounds every call.
        let len = if kind == "sglang" { 2042 } else { 2048 };
        assert!(line.contains(&format!("max_model_len=\"{len}\"")), "{line}");
        assert!(!line.contains("version=\"unknown\""), "{line}");
    }
}

#[tokio::test]
async fn a_forced_kind_that_does_not_match_stops_start_up() {
    let (sg, vl) = (sglang_upstream(), upstream());
    for (up, forced, found) in [(&vl, "sglang", "vllm"), (&sg, "vllm", "sglang")] {
        let args = [
            "serve",
            "--upstream",
            up,
            "--listen",
            "127.0.0.1:0",
            "--upstream-kind",
            forced,
        ];
        let (code, err) = specd_fails(&args, Duration::from_secs(60));
        assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
        let want =
            format!("upstream kind forced to {forced} but the server at this address is {found}");
        assert!(err.contains(&want), "stderr lacks '{want}':\n{err}");
    }
    // The right forced kind starts as usual.
    let specd = Specd::start_ready(&sg, &["--upstream-kind", "sglang"]).await;
    assert!(specd.metrics().await.contains("kind=\"sglang\""));
}

#[tokio::test]
async fn greedy_output_is_identical_to_direct_sglang() {
    let up = sglang_upstream();
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
    for (c, group) in ps.chunks(4).enumerate() {
        let futs = group.iter().enumerate().map(|(j, p)| {
            let i = c * 4 + j;
            let (path, b) = body(i, p, 12 + (i as u32 * 7) % 24);
            let (up, url) = (up.clone(), specd.url.clone());
            async move {
                let direct = ask(&up, path, &b).await;
                let via = ask(&url, path, &b).await;
                (i, direct, via)
            }
        });
        for (i, d, v) in join_all(futs).await {
            assert!(!d.text.is_empty(), "direct answer {i} has text");
            assert_same(&d, &v, &format!("prompt {i}"));
        }
    }
    let m = specd.metrics().await;
    let drafted = metric_sum(&m, "specd_spec_decode_num_draft_tokens_total");
    let accepted = metric_sum(&m, "specd_spec_decode_num_accepted_tokens_total");
    assert!(drafted > 0.0, "the n-gram drafter proposed nothing");
    eprintln!("ngram on SGLang: {accepted} of {drafted} draft tokens accepted");
}

/// Greedy ids straight from SGLang's native API, for the test drafters' scripts.
async fn direct_ids(up: &str, prompt: &str, n: u32) -> Vec<u32> {
    let (s, v) = post(
        up,
        "/generate",
        &json!({"text": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": true}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v["output_ids"]
        .as_array()
        .expect("output_ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[tokio::test]
async fn oracle_and_adversarial_drafters_keep_output_identical() {
    let up = sglang_upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on", "--enable-test-drafters"]).await;
    let prompt = "The verify call carries every prefix of the draft";
    let n = 23u32;
    let truth = direct_ids(&up, prompt, n).await;
    let mut b = json!({"model": model_name(), "prompt": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": true, "logprobs": 0, "return_tokens_as_token_ids": true});
    let direct = ask(&up, "/v1/completions", &b).await;
    for (drafter, rate) in [("oracle", 1.0), ("adversarial", 0.0)] {
        b["speculation"] =
            json!({"drafter": drafter, "oracle_tokens": truth, "max_draft_tokens": 4});
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(token_ids(&v), truth, "{drafter}: ids");
        assert_eq!(
            v["choices"][0]["text"],
            json!(direct.text),
            "{drafter}: text"
        );
        let sp = &v["usage"]["speculation"];
        let drafted = sp["draft_tokens"].as_f64().expect("draft_tokens");
        let accepted = sp["accepted_tokens"].as_f64().expect("accepted_tokens");
        assert!(drafted > 0.0, "{sp}");
        assert_eq!(accepted / drafted, rate, "{drafter}: {sp}");
        let rounds = sp["rounds"].as_u64().expect("rounds");
        let want = if rate == 1.0 { n.div_ceil(5) } else { n };
        assert_eq!(rounds, u64::from(want), "{drafter}: {sp}");
    }
}

#[tokio::test]
async fn stops_limits_and_relay_match_direct() {
    let up = sglang_upstream();
    let specd = Specd::start_ready(
        &up,
        &[
            "--speculation",
            "on",
            "--enable-test-drafters",
            "--max-draft-tokens",
            "5",
        ],
    )
    .await;
    let prompt = "    total += values[3] * weight\n".repeat(4);
    let truth = direct_ids(&up, &prompt, 30).await;
    let base = json!({"model": model_name(), "prompt": prompt, "max_tokens": 30, "temperature": 0});
    let full = ask(&up, "/v1/completions", &base).await;
    let chars: Vec<char> = full.text.chars().collect();
    let mid = chars.len() / 2;
    let stop: String = chars[mid..(mid + 2).min(chars.len())].iter().collect();
    let cases = [
        json!({"stop": [stop.clone()]}),
        json!({"stop": [stop.clone()], "stream": true}),
        json!({"max_tokens": 7}),
        json!({"stop_token_ids": [truth[5]]}),
        json!({"stop": ["never appears"], "stream": true, "logprobs": 2}),
    ];
    for (i, extra) in cases.iter().enumerate() {
        let mut b = base.clone();
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        let d = ask(&up, "/v1/completions", &b).await;
        for spec in [
            json!({"drafter": "ngram"}),
            json!({"drafter": "oracle", "oracle_tokens": truth}),
            // Relay segments through SGLang's streamed /generate, every 4 tokens.
            json!({"drafter": "oracle", "oracle_tokens": truth, "switch_every": 4}),
        ] {
            let mut bs = b.clone();
            bs["speculation"] = spec.clone();
            let v = ask(&specd.url, "/v1/completions", &bs).await;
            assert_same(&d, &v, &format!("case {i} {spec}"));
        }
    }
}

#[tokio::test]
async fn sampled_tokens_follow_sglangs_own_distribution() {
    const N: usize = 300;
    let up = sglang_upstream();
    let specd = Specd::start_ready(
        &up,
        &[
            "--speculation",
            "on",
            "--enable-test-drafters",
            "--max-draft-tokens",
            "2",
        ],
    )
    .await;
    let prompt = "def accumulate(values, weight):\n    total = 0\n";
    let draft = direct_ids(&up, prompt, 2).await;
    // The test model's distribution is nearly flat over 4096 tokens: top_k and low
    // temperatures give categories with enough mass to compare. Unset temperature: SGLang's
    // completions route samples at 1.0, and so must specd.
    for extra in [
        json!({"top_k": 3}),
        json!({"temperature": 0.7, "top_k": 6, "top_p": 0.9, "min_p": 0.05}),
    ] {
        let mut body = json!({"model": model_name(), "prompt": prompt, "max_tokens": 2});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let mut via_body = body.clone();
        via_body["speculation"] = json!({"drafter": "oracle", "oracle_tokens": draft});
        let sample = |base: String, b: Value| async move {
            let texts: Vec<String> = futures_util::stream::iter(0..N)
                .map(|_| {
                    let (base, b) = (base.clone(), b.clone());
                    async move {
                        let (s, v) = post(&base, "/v1/completions", &b).await;
                        assert_eq!(s, 200, "{v}");
                        v["choices"][0]["text"].as_str().unwrap_or("").to_string()
                    }
                })
                .buffer_unordered(16)
                .collect()
                .await;
            texts
        };
        let direct = sample(up.clone(), body).await;
        let via = sample(specd.url.clone(), via_body).await;
        let (stat, df) = chi2_homogeneity(&direct, &via);
        let crit = chi2_critical_001(df);
        eprintln!("SGLang {extra}: chi2={stat:.2} df={df} critical={crit:.2}");
        assert!(df >= 3.0, "too few categories to compare (df {df})");
        assert!(
            stat < crit,
            "specd's samples differ from SGLang's (chi2 {stat:.2} > {crit:.2}, df {df})"
        );
    }
}

#[tokio::test]
async fn out_of_vocabulary_ids_never_reach_sglang() {
    let up = sglang_upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on"]).await;
    for extra in [json!({}), json!({"presence_penalty": 0.5}), json!({"n": 2})] {
        let mut b = json!({"model": model_name(), "prompt": [0, 5, 99_999], "max_tokens": 2});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        assert_eq!(s, 400, "{extra}: {v}");
        assert!(v.to_string().contains("99999"), "{v}");
    }
    let r = client()
        .get(format!("{up}/health"))
        .send()
        .await
        .expect("health");
    assert!(r.status().is_success(), "SGLang is still up");
}

#[tokio::test]
async fn generation_runs_up_to_sglangs_input_limit() {
    let up = sglang_upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on", "--drafter", "ngram"]).await;
    let mut rng = fastrand::Rng::with_seed(5);
    let prompt: Vec<u32> = std::iter::once(0)
        .chain((1..2030).map(|_| rng.u32(4..4096)))
        .collect();
    // 2030 + 12 = 2042: every call specd makes stays below SGLang's input limit.
    let b = json!({"model": model_name(), "prompt": prompt, "max_tokens": 12, "temperature": 0,
                   "ignore_eos": true});
    let d = ask(&up, "/v1/completions", &b).await;
    let v = ask(&specd.url, "/v1/completions", &b).await;
    assert_same(&d, &v, "up to the limit");
    // Without a limit of its own the request ends there, without an upstream error.
    let mut open = b.clone();
    open.as_object_mut().expect("object").remove("max_tokens");
    let (s, v) = post(&specd.url, "/v1/completions", &open).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
}

#[test]
fn the_homogeneity_test_sees_a_real_difference() {
    let a: Vec<u32> = (0..300).map(|i| i % 3).collect();
    let b: Vec<u32> = (0..300).map(|i| u32::from(i % 5 == 0)).collect();
    let (s, df) = chi2_homogeneity(&a, &b);
    assert!(s > chi2_critical_001(df));
    let (s, df) = chi2_homogeneity(&a, &a);
    assert!(s < chi2_critical_001(df));
}
