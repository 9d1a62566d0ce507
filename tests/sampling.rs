//! Sampled decoding through specd follows the target's distribution: a two-sample
//! chi-square test of the joint distribution of the first two tokens, direct vLLM vs
//! specd verifying a fixed draft. Significance level fixed in advance: alpha = 0.001, and a
//! rejection counts only when an independent second sample is rejected too.

mod common;
#[path = "sampling/fields.rs"]
mod fields;

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
        let mut sb = body.clone();
        sb["speculation"] = json!({"drafter": "oracle", "oracle_tokens": draft});
        // A rejection is replicated on fresh samples before it counts: for exact sampling
        // a single test at alpha fails one run in 1/alpha (two tests per run here), both
        // at alpha one in 1/alpha², while a real difference large enough to be rejected
        // once is rejected again.
        for attempt in 1..=2 {
            let direct = sample_pairs(&up, &body).await;
            let via = sample_pairs(&specd.url, &sb).await;
            let (stat, df) = chi2_two_sample(&direct, &via);
            let crit = chi2_critical(df);
            eprintln!("T={temp} top_p={top_p} (sample {attempt}): chi2={stat:.2} df={df} critical={crit:.2}");
            // Without several well-populated categories the test could not detect anything.
            assert!(
                df >= 3.0,
                "the target's distribution is too flat for a meaningful test (df {df})"
            );
            if stat < crit {
                break;
            }
            assert!(
                attempt < 2,
                "specd's samples differ from direct vLLM's in two independent samples (chi2 {stat:.2} > {crit:.2}, df {df})"
            );
        }
    }
}
