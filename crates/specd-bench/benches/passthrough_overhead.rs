//! Passthrough overhead: the same streaming requests sent directly to the upstream and
//! through specd (speculation off), interleaved so both see the same machine noise.
//!
//!   SPECD_BENCH_UPSTREAM=http://127.0.0.1:PORT SPECD_BENCH_SPECD=http://127.0.0.1:PORT2 \
//!     cargo bench --bench passthrough_overhead
//!
//! Prints TTFT p50/p95 and per-stream tokens/s for both, and their ratio.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

struct Run {
    ttft: f64,
    tokens_per_s: f64,
}

async fn one(client: &reqwest::Client, base: &str, model: &str, i: usize) -> anyhow::Result<Run> {
    let body = json!({"model": model, "prompt": format!("Request {i}: the proxy forwards"), "max_tokens": 48,
                      "temperature": 0, "ignore_eos": true, "stream": true});
    let start = Instant::now();
    let resp = client
        .post(format!("{base}/v1/completions"))
        .header("x-speculation", "off")
        .json(&body)
        .send()
        .await?;
    let mut s = resp.bytes_stream();
    let mut parser = specd::upstream::sse::SseParser::new();
    let mut first = None;
    let mut last = start;
    let mut n = 0usize;
    while let Some(c) = s.next().await {
        for ev in parser.feed(&c?) {
            if ev == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(&ev)?;
            if v.pointer("/choices/0/text").is_some() {
                let now = Instant::now();
                first.get_or_insert(now);
                last = now;
                n += 1;
            }
        }
    }
    let first = first.ok_or_else(|| anyhow::anyhow!("no tokens from {base}"))?;
    let gen = (last - first).as_secs_f64();
    Ok(Run {
        ttft: (first - start).as_secs_f64(),
        tokens_per_s: if gen > 0.0 { (n - 1) as f64 / gen } else { 0.0 },
    })
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (Ok(up), Ok(sp)) = (
        std::env::var("SPECD_BENCH_UPSTREAM"),
        std::env::var("SPECD_BENCH_SPECD"),
    ) else {
        eprintln!("set SPECD_BENCH_UPSTREAM and SPECD_BENCH_SPECD");
        return Ok(());
    };
    let n: usize = std::env::var("SPECD_BENCH_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(3))
        .build()
        .expect("client");
    let models: Value = client
        .get(format!("{up}/v1/models"))
        .send()
        .await?
        .json()
        .await?;
    let model = models
        .pointer("/data/0/id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // Warm both paths (connections, prefix cache).
    one(&client, &up, &model, 0).await?;
    one(&client, &sp, &model, 0).await?;
    let (mut d, mut v) = (Vec::new(), Vec::new());
    for i in 0..n {
        // Alternate which goes first so neither always follows the other.
        if i % 2 == 0 {
            d.push(one(&client, &up, &model, i).await?);
            v.push(one(&client, &sp, &model, i).await?);
        } else {
            v.push(one(&client, &sp, &model, i).await?);
            d.push(one(&client, &up, &model, i).await?);
        }
    }
    let stats = |r: &[Run]| {
        let mut t: Vec<f64> = r.iter().map(|x| x.ttft * 1e3).collect();
        let mut s: Vec<f64> = r.iter().map(|x| x.tokens_per_s).collect();
        (pct(&mut t, 0.5), pct(&mut t, 0.95), pct(&mut s, 0.5))
    };
    let (dt50, dt95, ds) = stats(&d);
    let (vt50, vt95, vs) = stats(&v);
    println!("{n} streaming requests each, 48 tokens, interleaved");
    println!("| path | TTFT p50 | TTFT p95 | tokens/s per stream (p50) |");
    println!("|---|---:|---:|---:|");
    println!("| direct | {dt50:.2} ms | {dt95:.2} ms | {ds:.1} |");
    println!("| through specd | {vt50:.2} ms | {vt95:.2} ms | {vs:.1} |");
    println!(
        "| difference | {:+.2} ms | {:+.2} ms | {:.3}x |",
        vt50 - dt50,
        vt95 - dt95,
        vs / ds
    );
    Ok(())
}
