//! What one verify round costs against context length, measured against a running
//! upstream: `SPECD_BENCH_UPSTREAM=http://127.0.0.1:PORT cargo bench --bench verify_round`.
//!
//! Each round carries the context K+1 times. The table separates specd's own cost
//! (building and serialising the request body) from the upstream's (a verify call with K
//! drafts, a plain 1-token call, and the streamed inter-token gap of plain decoding).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};
use specd::config::ServeArgs;
use specd::metrics::Metrics;
use specd::upstream::verify::{Backend, Sampling, VerifyRequest};
use specd::upstream::vllm::VllmBackend;
use specd::upstream::Upstream;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Ok(base) = std::env::var("SPECD_BENCH_UPSTREAM") else {
        eprintln!(
            "set SPECD_BENCH_UPSTREAM to a running vLLM (e.g. from scripts/vllm-cpu-upstream.sh)"
        );
        return Ok(());
    };
    let reps: usize = std::env::var("SPECD_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let args = Wrap::parse_from(["bench", "--upstream", &base]).serve;
    let up = Arc::new(Upstream::new(&args, Arc::new(Metrics::new()))?);
    let info = up.refresh_info().await?;
    let backend = VllmBackend::new(up.clone());
    let model = info.model.clone();
    let max = info.max_model_len as usize;
    let k = 4usize;
    let sampling = Sampling {
        temperature: Some(0.0),
        ..Sampling::default()
    };
    println!(
        "upstream {} ({}), max_model_len {max}, K = {k}, {reps} reps, medians",
        info.model, info.kind
    );
    println!("| context | specd: build+serialise body | body size | verify K=4 | verify K=0 | plain 1-token call | streamed decode step |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for ctx_len in [256usize, 1024, max.saturating_sub(k + 2)] {
        // A context of real ids, varied so the prefix cache is exercised as in a stream.
        let ctx: Vec<u32> = (0..ctx_len).map(|i| 5 + (i as u32 * 7919) % 4000).collect();
        let drafts: Vec<u32> = (0..k as u32).map(|i| 10 + i).collect();
        let mut ser = Vec::new();
        let mut size = 0;
        for _ in 0..reps {
            let t = Instant::now();
            let prefixes: Vec<Vec<u32>> =
                (0..=k).map(|j| [&ctx[..], &drafts[..j]].concat()).collect();
            let body = json!({"model": model, "prompt": prefixes, "max_tokens": 1, "logprobs": 0, "return_tokens_as_token_ids": true});
            let bytes = serde_json::to_vec(&body)?;
            ser.push(t.elapsed().as_secs_f64());
            size = bytes.len();
        }
        let mut verify_k = Vec::new();
        let mut verify_0 = Vec::new();
        for r in 0..reps {
            // Advance the context by one token per repetition, as a live stream does.
            let mut c = ctx.clone();
            c.push(100 + r as u32);
            let t = Instant::now();
            backend
                .verify(VerifyRequest {
                    model: &model,
                    context: &c,
                    generated: 0,
                    drafts: &drafts,
                    sampling: &sampling,
                })
                .await?;
            verify_k.push(t.elapsed().as_secs_f64());
            c.push(7);
            let t = Instant::now();
            backend
                .verify(VerifyRequest {
                    model: &model,
                    context: &c,
                    generated: 0,
                    drafts: &[],
                    sampling: &sampling,
                })
                .await?;
            verify_0.push(t.elapsed().as_secs_f64());
        }
        let mut plain = Vec::new();
        for r in 0..reps {
            let mut c = ctx.clone();
            c.push(200 + r as u32);
            let t = Instant::now();
            up.post_json(
                "/v1/completions",
                &json!({"model": model, "prompt": c, "max_tokens": 1, "temperature": 0}),
                Duration::from_secs(60),
            )
            .await?;
            plain.push(t.elapsed().as_secs_f64());
        }
        let step = streamed_step(&up, &model, &ctx).await?;
        let ms = |x: f64| format!("{:.2} ms", x * 1e3);
        println!(
            "| {ctx_len} | {} | {} KiB | {} | {} | {} | {} |",
            ms(median(ser)),
            size / 1024,
            ms(median(verify_k)),
            ms(median(verify_0)),
            ms(median(plain)),
            ms(step)
        );
    }
    Ok(())
}

/// Median gap between streamed tokens of a plain continuation.
async fn streamed_step(up: &Upstream, model: &str, ctx: &[u32]) -> anyhow::Result<f64> {
    use futures_util::StreamExt;
    let body: Value = json!({"model": model, "prompt": ctx, "max_tokens": 32, "temperature": 0, "stream": true, "ignore_eos": true});
    let resp = up
        .client
        .post(up.url("/v1/completions"))
        .json(&body)
        .send()
        .await?;
    let mut s = resp.bytes_stream();
    let mut times = Vec::new();
    let mut parser = specd::upstream::sse::SseParser::new();
    while let Some(chunk) = s.next().await {
        let chunk = chunk?;
        for ev in parser.feed(&chunk) {
            if ev != "[DONE]" {
                times.push(Instant::now());
            }
        }
    }
    let gaps: Vec<f64> = times
        .windows(2)
        .skip(1)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    Ok(if gaps.is_empty() { 0.0 } else { median(gaps) })
}
