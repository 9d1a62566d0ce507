//! Sampled decoding through specd follows the target's distribution: a two-sample
//! chi-square test of the joint distribution of the first two tokens, direct vLLM vs
//! specd verifying a fixed draft. Significance level fixed in advance: alpha = 0.001.

mod common;

use std::collections::HashMap;

use common::*;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

const N: usize = 300;
const ALPHA_Z: f64 = 3.09; // upper 0.001 quantile of the standard normal

async fn sample_pairs(base: &str, body: &Value) -> Vec<(u32, u32)> {
    stream::iter(0..N)
        .map(|_| {
            let base = base.to_string();
            let body = body.clone();
            async move {
                let (s, v) = post(&base, "/v1/completions", &body).await;
                assert_eq!(s, 200, "{v}");
                let ids = token_ids(&v);
                (ids[0], ids.get(1).copied().unwrap_or(u32::MAX))
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

/// Chi-square critical value for `df` degrees of freedom (Wilson–Hilferty).
fn chi2_critical(df: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + ALPHA_Z * a.sqrt()).powi(3)
}

/// Two-sample homogeneity statistic over categories with enough mass; the rest pooled.
fn chi2_two_sample(a: &[(u32, u32)], b: &[(u32, u32)]) -> (f64, f64) {
    let mut counts: HashMap<(u32, u32), (f64, f64)> = HashMap::new();
    for p in a {
        counts.entry(*p).or_default().0 += 1.0;
    }
    for p in b {
        counts.entry(*p).or_default().1 += 1.0;
    }
    let mut cats: Vec<(f64, f64)> = Vec::new();
    let mut other = (0.0, 0.0);
    for (_, (x, y)) in counts {
        if x + y >= 10.0 {
            cats.push((x, y));
        } else {
            other.0 += x;
            other.1 += y;
        }
    }
    if other.0 + other.1 > 0.0 {
        cats.push(other);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let mut stat = 0.0;
    for (x, y) in &cats {
        let tot = x + y;
        let ea = tot * na / (na + nb);
        let eb = tot * nb / (na + nb);
        stat += (x - ea).powi(2) / ea + (y - eb).powi(2) / eb;
    }
    (stat, (cats.len().max(2) - 1) as f64)
}

#[test]
fn chi2_detects_a_real_difference() {
    let a: Vec<(u32, u32)> = (0..300).map(|i| (i % 3, 0)).collect();
    let b: Vec<(u32, u32)> = (0..300)
        .map(|i| (if i % 5 == 0 { 1 } else { 0 }, 0))
        .collect();
    let (s, df) = chi2_two_sample(&a, &b);
    assert!(s > chi2_critical(df));
    let (s, df) = chi2_two_sample(&a, &a);
    assert!(s < chi2_critical(df));
}

#[tokio::test]
async fn sampled_tokens_follow_the_targets_distribution() {
    let up = upstream();
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
    let (_, greedy) = post(&up, "/v1/completions", &completion(json!(prompt), 2)).await;
    let draft = token_ids(&greedy);
    // The random-weight test target has near-uniform logits: only at low temperature does
    // its distribution concentrate on few enough token pairs for 2x300 samples to have power.
    for (temp, top_p) in [(0.05, 1.0), (0.04, 0.8)] {
        let mut body = completion(json!(prompt), 2);
        body["temperature"] = json!(temp);
        body["top_p"] = json!(top_p);
        let direct = sample_pairs(&up, &body).await;
        let mut sb = body.clone();
        sb["speculation"] = json!({"drafter": "oracle", "oracle_tokens": draft});
        let via = sample_pairs(&specd.url, &sb).await;
        let (stat, df) = chi2_two_sample(&direct, &via);
        let crit = chi2_critical(df);
        eprintln!("T={temp} top_p={top_p}: chi2={stat:.2} df={df} critical={crit:.2}");
        // Without several well-populated categories the test could not detect anything.
        assert!(
            df >= 3.0,
            "the target's distribution is too flat for a meaningful test (df {df})"
        );
        assert!(
            stat < crit,
            "specd's samples differ from direct vLLM's (chi2 {stat:.2} > {crit:.2}, df {df})"
        );
    }
}

// ---- Per-step fields: logit_bias, allowed_token_ids, repetition_penalty ----

const PROMPTS: [&str; 4] = [
    "def accumulate(values, weight):\n    total = 0\n",
    "The verify call carries every prefix of the draft",
    "Item 3: apple Item 3: apple Item 3:",
    "Summarise: the river rose after the storm and the bridge closed\nSummary:",
];

/// A chat body or a completions body for prompt `i` (every third is chat).
fn body_for(i: usize, max_tokens: u32) -> (&'static str, Value) {
    let prompt = PROMPTS[i % PROMPTS.len()];
    if i % 3 == 2 {
        let b = json!({"model": model_name(), "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "logprobs": true, "top_logprobs": 0,
            "return_tokens_as_token_ids": true});
        ("/v1/chat/completions", b)
    } else {
        ("/v1/completions", completion(json!(prompt), max_tokens))
    }
}

fn with(mut b: Value, extra: &Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// Text, token ids, finish reason and usage of a response, streamed or not.
async fn answer(base: &str, path: &str, body: &Value) -> (String, Vec<u32>, Value, Value) {
    if body["stream"] == json!(true) {
        let b = with(
            body.clone(),
            &json!({"stream_options": {"include_usage": true}}),
        );
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
            })
            .cloned()
            .unwrap_or(Value::Null);
        let usage = ev.last().and_then(|e| e.get("usage")).cloned();
        (stream_text(&ev), ids, finish, usage.unwrap_or(Value::Null))
    } else {
        let (s, v) = post(base, path, body).await;
        assert_eq!(s, 200, "{v}");
        let c = &v["choices"][0];
        let text = c.get("text").or_else(|| c.pointer("/message/content"));
        let text = text.and_then(Value::as_str).unwrap_or("").to_string();
        (
            text,
            token_ids(&v),
            c["finish_reason"].clone(),
            v["usage"].clone(),
        )
    }
}

/// Values that change greedy output (checked): a ban on the third token of the plain
/// answer, a strong bias towards a token, a small allowed set, a repetition penalty.
fn per_step_cases(truth: &[u32]) -> Vec<Value> {
    let ban = json!({ truth[2].to_string(): -100 });
    let pull = json!({ ((truth[0] + 17) % 4096).to_string(): 8.0 });
    let mut allowed: Vec<u32> = truth.iter().take(4).copied().collect();
    allowed.extend([13, 262, 286, 318, 1000, 2000, 3000]);
    vec![
        json!({"logit_bias": ban}),
        json!({"logit_bias": pull}),
        json!({"allowed_token_ids": allowed}),
        json!({"repetition_penalty": 1.3}),
        json!({"repetition_penalty": 0.7, "logit_bias": ban}),
    ]
}

async fn prompt_ids(up: &str, prompt: &str) -> Vec<u32> {
    let (s, v) = post(
        up,
        "/tokenize",
        &json!({"model": model_name(), "prompt": prompt}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let toks = v["tokens"].as_array().expect("tokens");
    toks.iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect()
}

/// vLLM itself, one token per request, each prompt the previous output appended (what a
/// verify call asks): `seed` gives position `p` the seed specd gives it.
async fn step_by_step(
    up: &str,
    prompt: &[u32],
    extra: &Value,
    n: usize,
    seed: Option<u64>,
) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let mut b = with(completion(json!(ctx), 1), extra);
        if let Some(seed) = seed {
            b["seed"] = json!(specd::upstream::verify::position_seed(seed, ctx.len()));
        }
        let (s, v) = post(up, "/v1/completions", &b).await;
        assert_eq!(s, 200, "{v}");
        let id = token_ids(&v)[0];
        out.push(id);
        ctx.push(id);
    }
    out
}

/// The proof on vLLM itself that these fields depend on nothing a verify call changes:
/// a plain greedy generation equals the same generation made one token per request.
#[tokio::test]
async fn vllm_applies_per_step_fields_from_the_prompt_alone() {
    let up = upstream();
    let n = 16;
    for prompt in &PROMPTS[..3] {
        let (_, plain) = post(&up, "/v1/completions", &completion(json!(prompt), n)).await;
        let truth = token_ids(&plain);
        let ids = prompt_ids(&up, prompt).await;
        for extra in per_step_cases(&truth) {
            let (_, v) = post(
                &up,
                "/v1/completions",
                &with(completion(json!(prompt), n), &extra),
            )
            .await;
            let direct = token_ids(&v);
            let stepped = step_by_step(&up, &ids, &extra, direct.len(), None).await;
            assert_eq!(direct, stepped, "{prompt:?} {extra}");
        }
    }
}

/// Speculated (rounds > 0) and token-identical to direct vLLM, streamed and not, with
/// `on` and `auto`, on completions and chat, with a drafter that is right and one that
/// guesses.
#[tokio::test]
async fn per_step_fields_are_speculated_and_match_direct() {
    let up = upstream();
    let args = ["--enable-test-drafters", "--max-draft-tokens", "4"];
    let specd = Specd::start_ready(&up, &[&["--speculation", "on"][..], &args].concat()).await;
    let n = 20;
    let mut changed = vec![0usize; 5];
    let mut checked = 0;
    for i in 0..6 {
        let (path, plain_body) = body_for(i, n);
        let truth = answer(&up, path, &plain_body).await.1;
        for (c, extra) in per_step_cases(&truth).iter().enumerate() {
            for stream in [false, true] {
                let body = with(plain_body.clone(), extra);
                let body = with(body, &json!({"stream": stream}));
                let d = answer(&up, path, &body).await;
                changed[c] += usize::from(d.1 != truth);
                for (drafter, mode) in [("oracle", "on"), ("ngram", "on"), ("oracle", "auto")] {
                    // `auto` starts by relaying: switching every 5 tokens makes it both
                    // relay and verify under the fields.
                    let mut spec = json!({"drafter": drafter, "oracle_tokens": d.1, "mode": mode});
                    if mode == "auto" {
                        spec["switch_every"] = json!(5);
                    }
                    let v = answer(
                        &specd.url,
                        path,
                        &with(body.clone(), &json!({"speculation": spec})),
                    )
                    .await;
                    let what = format!("prompt {i} {extra} stream {stream} {drafter} {mode}");
                    assert_eq!((&v.0, &v.1, &v.2), (&d.0, &d.1, &d.2), "{what}");
                    let rounds = v.3.pointer("/speculation/rounds").and_then(Value::as_u64);
                    assert!(
                        rounds.is_some_and(|r| r > 0),
                        "{what}: speculated {:?}",
                        v.3
                    );
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} answers equal direct; changed outputs per case: {changed:?}");
    assert!(
        changed.iter().all(|&c| c > 0),
        "every case changes some output: {changed:?}"
    );
    let m = specd.metrics().await;
    for reason in ["logit_bias", "penalty", "unsupported_param"] {
        let sel = format!("specd_passthrough_total{{reason=\"{reason}\"}}");
        assert_eq!(metric_value(&m, &sel).unwrap_or(0.0), 0.0, "{reason}");
    }
}

/// Seeded sampling: every token is the one vLLM samples at that position with specd's
/// per-position seed and the request's fields, whatever the drafts.
#[tokio::test]
async fn seeded_sampling_with_per_step_fields_is_vllms_own() {
    let up = upstream();
    let specd = Specd::start_ready(
        &up,
        &[
            "--speculation",
            "on",
            "--enable-test-drafters",
            "--max-draft-tokens",
            "3",
        ],
    )
    .await;
    let n = 12;
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let (_, plain) = post(&up, "/v1/completions", &completion(json!(prompt), n)).await;
        let truth = token_ids(&plain);
        let ids = prompt_ids(&up, prompt).await;
        for extra in per_step_cases(&truth) {
            let extra = with(extra, &json!({"temperature": 0.8, "top_p": 0.95}));
            let seed = 11 + i as u64;
            let want = step_by_step(&up, &ids, &extra, n as usize, Some(seed)).await;
            for (drafter, stream) in [("oracle", false), ("ngram", true)] {
                let spec = json!({"drafter": drafter, "oracle_tokens": want});
                let b = with(completion(json!(prompt), n), &extra);
                let b = with(
                    b,
                    &json!({"seed": seed, "stream": stream, "speculation": spec}),
                );
                let v = answer(&specd.url, "/v1/completions", &b).await;
                assert_eq!(v.1, want, "{prompt:?} {extra} {drafter}");
                let rounds = v.3.pointer("/speculation/rounds").and_then(Value::as_u64);
                assert!(rounds.is_some_and(|r| r > 0), "{:?}", v.3);
            }
        }
    }
}

/// What the fan-out does not reproduce keeps passing through, counted by reason.
#[tokio::test]
async fn output_dependent_fields_pass_through_by_reason() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "on"]).await;
    for (extra, reason) in [
        (json!({"presence_penalty": 0.5}), "penalty"),
        (json!({"frequency_penalty": 0.5}), "penalty"),
        (json!({"bad_words": ["the"]}), "unsupported_param"),
        (json!({"repetition_penalty": "1.2"}), "penalty"),
        (json!({"logit_bias": {"5": "1.0"}}), "logit_bias"),
    ] {
        let sel = format!("specd_passthrough_total{{reason=\"{reason}\"}}");
        let before = metric_value(&specd.metrics().await, &sel).unwrap_or(0.0);
        let b = with(completion(json!(PROMPTS[1]), 8), &extra);
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        let (ds, dv) = post(&up, "/v1/completions", &b).await;
        assert_eq!((s, token_ids(&v)), (ds, token_ids(&dv)), "{extra}");
        assert!(v["usage"].get("speculation").is_none(), "{extra}");
        let after = metric_value(&specd.metrics().await, &sel).unwrap_or(0.0);
        assert_eq!(after, before + 1.0, "{extra}");
    }
}
