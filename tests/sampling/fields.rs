//! The sampling fields specd speculates on vLLM (`logit_bias`, `allowed_token_ids`,
//! `repetition_penalty`, `min_tokens`): vLLM's own generation equals the one made one token
//! per request, as a verify call asks; through specd every answer is speculated and
//! token-identical to direct vLLM. The fields that depend on the output so far keep
//! passing through, counted by reason.

use serde_json::{json, Value};

use crate::common::*;

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

/// Whether `id` ends a generation with `extra`: the target's EOS ids (1, and 3 from its
/// generation_config) unless `ignore_eos`, or a stop token id.
fn ends(id: u32, extra: &Value) -> bool {
    let ignore_eos = extra["ignore_eos"] == json!(true);
    let stop_ids = extra["stop_token_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    (!ignore_eos && (id == 1 || id == 3)) || stop_ids.contains(&json!(id))
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
    let min = extra["min_tokens"].as_u64().unwrap_or(0) as usize;
    for i in 0..n {
        let mut b = with(completion(json!(ctx), 1), extra);
        // `min_tokens` as it stands at output token i: masking, or not.
        b["min_tokens"] = json!(usize::from(i < min));
        if let Some(seed) = seed {
            b["seed"] = json!(specd::upstream::verify::position_seed(seed, ctx.len()));
        }
        let (s, v) = post(up, "/v1/completions", &b).await;
        assert_eq!(s, 200, "{v}");
        let id = token_ids(&v)[0];
        out.push(id);
        ctx.push(id);
        if ends(id, extra) {
            break;
        }
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
        for extra in per_step_cases(&truth)
            .into_iter()
            .chain(min_tokens_cases(&truth))
        {
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

/// Values that change greedy output through `min_tokens` (checked): the random-weight
/// target never ends by itself, so a bias makes an EOS id (1, or 3 from
/// generation_config) or a stop token id come first, and `min_tokens` holds it back.
fn min_tokens_cases(truth: &[u32]) -> Vec<Value> {
    let stop_id = truth[1];
    vec![
        json!({"min_tokens": 6, "logit_bias": {"1": 100}}),
        json!({"min_tokens": 5, "logit_bias": {"3": 100}}),
        json!({"min_tokens": 9, "logit_bias": {"1": 4}}),
        json!({"min_tokens": 4, "stop_token_ids": [stop_id], "logit_bias": { stop_id.to_string(): 100 }}),
        json!({"min_tokens": 7, "ignore_eos": true, "logit_bias": {"1": 100}}),
    ]
}

/// Each case on `prompts` prompts, streamed and not, through specd with a drafter that is
/// right and one that guesses, `on` and `auto` (switching every 5 tokens, so that it both
/// relays and verifies): every answer speculated (rounds > 0) and equal to direct vLLM.
/// Returns, per case, how many direct answers the case changed.
async fn speculated_equal_direct(
    up: &str,
    specd: &Specd,
    prompts: usize,
    cases: &dyn Fn(usize, &[u32]) -> Vec<Value>,
) -> Vec<usize> {
    let n = 20;
    let mut changed = Vec::new();
    let mut checked = 0;
    for i in 0..prompts {
        let (path, plain_body) = body_for(i, n);
        let truth = answer(up, path, &plain_body).await.1;
        for (c, extra) in cases(i, &truth).iter().enumerate() {
            changed.resize(changed.len().max(c + 1), 0);
            for stream in [false, true] {
                let body = with(with(plain_body.clone(), extra), &json!({"stream": stream}));
                let d = answer(up, path, &body).await;
                changed[c] += usize::from(d.1 != truth);
                for (drafter, mode) in [("oracle", "on"), ("ngram", "on"), ("oracle", "auto")] {
                    let mut spec = json!({"drafter": drafter, "oracle_tokens": d.1, "mode": mode});
                    if mode == "auto" {
                        spec["switch_every"] = json!(5);
                    }
                    let b = with(body.clone(), &json!({"speculation": spec}));
                    let v = answer(&specd.url, path, &b).await;
                    let what = format!("prompt {i} {extra} stream {stream} {drafter} {mode}");
                    assert_eq!((&v.0, &v.1, &v.2), (&d.0, &d.1, &d.2), "{what}");
                    let rounds = v.3.pointer("/speculation/rounds").and_then(Value::as_u64);
                    assert!(rounds.is_some_and(|r| r > 0), "{what}: {:?}", v.3);
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
    for reason in ["logit_bias", "penalty", "unsupported_param", "min_tokens"] {
        let sel = format!("specd_passthrough_total{{reason=\"{reason}\"}}");
        assert_eq!(metric_value(&m, &sel).unwrap_or(0.0), 0.0, "{reason}");
    }
    changed
}

async fn specd_on(up: &str, k: &str) -> Specd {
    let args = [
        "--speculation",
        "on",
        "--enable-test-drafters",
        "--max-draft-tokens",
        k,
    ];
    Specd::start_ready(up, &args).await
}

#[tokio::test]
async fn per_step_fields_are_speculated_and_match_direct() {
    let up = upstream();
    let specd = specd_on(&up, "4").await;
    speculated_equal_direct(&up, &specd, 6, &|_, t| per_step_cases(t)).await;
}

#[tokio::test]
async fn min_tokens_is_speculated_and_matches_direct() {
    let up = upstream();
    let specd = specd_on(&up, "4").await;
    speculated_equal_direct(&up, &specd, 6, &|_, t| min_tokens_cases(t)).await;
}

/// Words of the plain answer that are one token each (no leading space: vLLM strips it).
async fn one_token_words(up: &str, truth: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    for &id in truth {
        let (_, v) = post(
            up,
            "/detokenize",
            &json!({"model": model_name(), "tokens": [id]}),
        )
        .await;
        let w = v["prompt"].as_str().unwrap_or("").to_string();
        if w.is_empty() || w.starts_with(char::is_whitespace) || out.contains(&w) {
            continue;
        }
        let b = json!({"model": model_name(), "prompt": w, "add_special_tokens": false});
        let (_, t) = post(up, "/tokenize", &b).await;
        if t["tokens"] == json!([id]) {
            out.push(w);
        }
    }
    out
}

#[tokio::test]
async fn one_token_bad_words_are_speculated_and_match_direct() {
    let up = upstream();
    let specd = specd_on(&up, "4").await;
    let mut words = Vec::new();
    for i in 0..6 {
        let (path, plain) = body_for(i, 20);
        let truth = answer(&up, path, &plain).await.1;
        words.push(one_token_words(&up, &truth).await);
    }
    let with_words = words.iter().filter(|w| !w.is_empty()).count();
    assert!(
        with_words >= 4,
        "one-token words in too few answers: {words:?}"
    );
    let cases = |i: usize, _: &[u32]| match words[i].first() {
        Some(first) => vec![
            json!({"bad_words": [first]}),
            json!({"bad_words": words[i]}),
        ],
        None => Vec::new(),
    };
    speculated_equal_direct(&up, &specd, 6, &cases).await;
}

/// Seeded sampling: every token is the one vLLM samples at that position with specd's
/// per-position seed and the request's fields, whatever the drafts.
#[tokio::test]
async fn seeded_sampling_with_per_step_fields_is_vllms_own() {
    let up = upstream();
    let specd = specd_on(&up, "3").await;
    let n = 12;
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let (_, plain) = post(&up, "/v1/completions", &completion(json!(prompt), n)).await;
        let truth = token_ids(&plain);
        let ids = prompt_ids(&up, prompt).await;
        for extra in per_step_cases(&truth)
            .into_iter()
            .chain(min_tokens_cases(&truth))
        {
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
        // Several tokens: banned only after its prefix in the output so far.
        (
            json!({"bad_words": ["accumulate values"]}),
            "unsupported_param",
        ),
        (json!({"repetition_penalty": "1.2"}), "penalty"),
        (json!({"logit_bias": {"5": "1.0"}}), "logit_bias"),
        (json!({"min_tokens": 4, "stop": ["x"]}), "min_tokens"),
        // Outside the vocabulary: vLLM's own error, streamed or not.
        (json!({"logit_bias": {"99999": 1}}), "logit_bias"),
        (
            json!({"allowed_token_ids": [99999], "stream": true}),
            "unsupported_param",
        ),
        (json!({"min_tokens": 9}), "min_tokens"),
        (json!({"min_tokens": 4, "max_tokens": null}), "min_tokens"),
    ] {
        let sel = format!("specd_passthrough_total{{reason=\"{reason}\"}}");
        let before = metric_value(&specd.metrics().await, &sel).unwrap_or(0.0);
        let b = with(completion(json!(PROMPTS[1]), 8), &extra);
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        let (ds, dv) = post(&up, "/v1/completions", &b).await;
        assert_eq!((s, token_ids(&v)), (ds, token_ids(&dv)), "{extra}");
        if ds != 200 || b["stream"] == json!(true) {
            // Errors (vLLM streams one as an event) are the upstream's, byte for byte.
            assert_eq!(v, dv, "{extra}");
        }
        assert!(v["usage"].get("speculation").is_none(), "{extra}");
        let after = metric_value(&specd.metrics().await, &sel).unwrap_or(0.0);
        assert_eq!(after, before + 1.0, "{extra}");
    }
}
