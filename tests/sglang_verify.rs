//! The SGLang verifier against a real SGLang, through the library: the single-sequence
//! greedy verify gives the same samples as the fan-out, out-of-vocabulary drafts never
//! reach the server, the load signal reads both servers' metrics, and the token work of
//! one verify round is measured for both strategies (printed, per K).

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::*;
use serde_json::json;
use specd::config::ServeArgs;
use specd::metrics::Metrics;
use specd::upstream::detect::UpstreamKind;
use specd::upstream::sglang::{ModelDefaults, SglangBackend, VerifyStrategy, VerifyWork};
use specd::upstream::verify::{Backend, Sample, Sampling, VerifyRequest};
use specd::upstream::Upstream;

async fn connect(base: &str) -> Arc<Upstream> {
    use clap::{Args, FromArgMatches};
    let m = ServeArgs::augment_args(clap::Command::new("t"))
        .try_get_matches_from(["t", "--upstream", base])
        .expect("args");
    let args = ServeArgs::from_arg_matches(&m).expect("args");
    let up = Arc::new(Upstream::new(&args, Arc::new(Metrics::new())).expect("client"));
    up.refresh_info().await.expect("detect");
    up
}

async fn backend(strategy: VerifyStrategy) -> (Arc<Upstream>, SglangBackend) {
    let up = connect(&sglang_upstream()).await;
    let info = up.info().expect("info");
    assert_eq!(info.kind, UpstreamKind::Sglang);
    let settings = info.sglang.clone().expect("SGLang settings");
    let b = SglangBackend::new(up.clone(), settings, ModelDefaults::default(), 4096)
        .with_strategy(strategy);
    (up, b)
}

fn greedy(logprobs: Option<u32>) -> Sampling {
    Sampling {
        temperature: Some(0.0),
        top_p: Some(1.0),
        top_k: Some(-1),
        min_p: Some(0.0),
        logprobs,
        ..Sampling::default()
    }
}

async fn verify(b: &SglangBackend, ctx: &[u32], drafts: &[u32], s: &Sampling) -> Vec<Sample> {
    b.verify(VerifyRequest {
        model: "specd-target",
        context: ctx,
        generated: 0,
        drafts,
        sampling: s,
    })
    .await
    .expect("verify")
}

fn random_context(rng: &mut fastrand::Rng, len: usize) -> Vec<u32> {
    std::iter::once(0)
        .chain((1..len).map(|_| rng.u32(4..4096)))
        .collect()
}

/// Make `ctx` cached, as it is in a running stream, and return the target's greedy
/// continuation of it.
async fn prefill(up: &str, ctx: &[u32], n: u32) -> Vec<u32> {
    let (s, v) = post(
        up,
        "/generate",
        &json!({"input_ids": ctx, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": true}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v["output_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[tokio::test]
async fn single_sequence_verify_samples_what_the_fan_out_samples() {
    let (_, single) = backend(VerifyStrategy::Auto).await;
    let (_, fan) = backend(VerifyStrategy::FanOut).await;
    let up = sglang_upstream();
    let mut rng = fastrand::Rng::with_seed(3);
    for case in 0..8 {
        let ctx = random_context(&mut rng, 20 + case * 7);
        let truth = prefill(&up, &ctx, 6).await;
        // Drafts that match the target for a while, then diverge (or never do).
        let keep = case % 6;
        let mut drafts: Vec<u32> = truth[..keep].to_vec();
        if keep < 5 {
            drafts.push((truth[keep] + 1) % 4096);
        }
        let s = greedy(Some(2));
        let a = verify(&single, &ctx, &drafts, &s).await;
        let b = verify(&fan, &ctx, &drafts, &s).await;
        let ids = |v: &[Sample]| v.iter().map(|x| x.id).collect::<Vec<_>>();
        assert_eq!(ids(&a), ids(&b), "case {case}: drafts {drafts:?}");
        assert_eq!(a[0].id, truth[0], "case {case}: s_0 is the greedy token");
        for (x, y) in a.iter().zip(&b) {
            let (lx, ly) = (x.logprob.expect("lp"), y.logprob.expect("lp"));
            assert!((lx - ly).abs() < 1e-3, "case {case}: logprob {lx} vs {ly}");
            assert_eq!(x.top.len(), 2, "case {case}: top logprobs");
            assert_eq!(
                x.top[0].0, x.id,
                "case {case}: the greedy token is the top one"
            );
        }
    }
}

#[tokio::test]
async fn out_of_vocabulary_drafts_never_reach_the_server() {
    let up = sglang_upstream();
    let mut rng = fastrand::Rng::with_seed(9);
    let ctx = random_context(&mut rng, 30);
    let truth = prefill(&up, &ctx, 3).await;
    for strategy in [VerifyStrategy::Auto, VerifyStrategy::FanOut] {
        let (_, b) = backend(strategy).await;
        let drafts = [truth[0], 99_999, truth[2]];
        let s = verify(&b, &ctx, &drafts, &greedy(None)).await;
        assert_eq!(s.len(), 4, "one sample per prefix");
        assert_eq!((s[0].id, s[1].id), (truth[0], truth[1]));
        let bad = b
            .verify(VerifyRequest {
                model: "specd-target",
                context: &[0, 5, 70_000],
                generated: 0,
                drafts: &[],
                sampling: &greedy(None),
            })
            .await;
        assert!(bad.is_err(), "an out-of-vocabulary context is refused");
    }
    let r = client()
        .get(format!("{up}/health"))
        .send()
        .await
        .expect("health");
    assert!(r.status().is_success(), "SGLang survived");
}

#[tokio::test]
async fn load_signal_reads_both_servers() {
    for base in [sglang_upstream(), upstream()] {
        let up = connect(&base).await;
        let l = up.refresh_load().await.expect("load from /metrics");
        assert!(l.running >= 0.0 && l.waiting >= 0.0, "{l:?}");
        assert!(
            l.kv_usage.is_some_and(|u| (0.0..=1.0).contains(&u)),
            "{l:?}"
        );
        assert_eq!(up.load(), Some(l));
    }
}

async fn server_counters(up: &str) -> (f64, f64) {
    let text = client()
        .get(format!("{up}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    (
        metric_sum(&text, "sglang:prompt_tokens_total"),
        metric_sum(&text, "sglang:cached_tokens_total"),
    )
}

fn diff(a: VerifyWork, b: VerifyWork) -> (u64, u64, u64) {
    (
        b.calls - a.calls,
        b.prompt_tokens - a.prompt_tokens,
        b.cached_tokens - a.cached_tokens,
    )
}

/// Token work of one verify round, per strategy and K: the tokens SGLang computes
/// (prompt − cached, from `meta_info` and, as a cross-check, from its counters, which other
/// tests running at the same time also move) and the wall time. The context is cached
/// first, as it is in a running stream. Numbers are printed; the assertions are about
/// cache reuse only.
#[tokio::test]
async fn verify_token_work_per_strategy() {
    let up = sglang_upstream();
    let (_, single) = backend(VerifyStrategy::Auto).await;
    let (_, fan) = backend(VerifyStrategy::FanOut).await;
    // Fresh contexts on every run: a context verified before would be cached past its
    // end and hide the work of a real round.
    let mut rng = fastrand::Rng::new();
    const L: usize = 200;
    const REPS: usize = 3;
    eprintln!("context {L} tokens, {REPS} rounds each; computed = prompt - cached");
    eprintln!("strategy  K  calls  prompt  cached  computed/round  server-counted/round  ms/round");
    for k in [1usize, 2, 4, 8] {
        for (name, b) in [("single", &single), ("fan-out", &fan)] {
            let (mut comp, mut server, mut ms) = (0u64, 0f64, 0f64);
            let (mut calls, mut prompt, mut cached) = (0, 0, 0);
            for _ in 0..REPS {
                let ctx = random_context(&mut rng, L);
                let truth = prefill(&up, &ctx, 1).await;
                // Drafts the target rejects at once: the round's work does not depend on
                // acceptance.
                let drafts: Vec<u32> = (0..k as u32).map(|i| (truth[0] + 1 + i) % 4096).collect();
                let (w0, c0) = (b.work(), server_counters(&up).await);
                let t = Instant::now();
                let s = verify(b, &ctx, &drafts, &greedy(None)).await;
                ms += t.elapsed().as_secs_f64() * 1e3;
                let (w1, c1) = (b.work(), server_counters(&up).await);
                assert_eq!(s.len(), k + 1);
                assert_eq!(s[0].id, truth[0]);
                let (n, p, c) = diff(w0, w1);
                calls += n;
                prompt += p;
                cached += c;
                comp += p - c;
                server += (c1.0 - c0.0) - (c1.1 - c0.1);
                if name == "single" {
                    // One call; the cache serves the context up to logprob_start_len.
                    assert_eq!(n, 1);
                    assert_eq!(p, (L + k) as u64);
                    assert!(c >= (L - 1) as u64, "cached {c} of {p}");
                } else {
                    assert_eq!(n, (k + 1) as u64);
                    assert!(c >= ((L - 1) * (k + 1)) as u64, "cached {c} of {p}");
                }
            }
            let r = REPS as f64;
            eprintln!(
                "{name:8} {k:2} {:6.1} {:7.1} {:7.1} {:15.1} {:20.1} {:9.1}",
                calls as f64 / r,
                prompt as f64 / r,
                cached as f64 / r,
                comp as f64 / r,
                server / r,
                ms / r
            );
        }
    }
}
