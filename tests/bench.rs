//! `specd-bench replay` against the real vLLM through a fresh specd: it must finish with a full
//! report, and its acceptance figures — summed from each response's `usage.speculation` —
//! must equal the ones computed from specd's own `/metrics` counters for the same run.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

#[tokio::test]
async fn bench_report_matches_specd_metrics() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &[]).await;
    let out = std::env::temp_dir().join(format!("specd-bench-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = Command::new(workspace_bin("specd-bench"))
        .args([
            "replay",
            "--specd",
            &specd.url,
            "--upstream",
            &up,
            "--modes",
            "direct,off,on:ngram,auto",
            "--workloads",
            "code-edit,agent,open-short",
            "--concurrency",
            "1,2",
            "--requests",
            "2",
            "--max-model-len",
            "640",
            "--output-cap",
            "40",
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .env("SPECD_LOG", "warn")
        .output()
        .expect("run specd-bench replay");
    assert!(
        run.status.success(),
        "specd-bench replay failed: {}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let table = String::from_utf8_lossy(&run.stdout);
    assert!(
        table.contains("tok/round") && table.contains("on:ngram"),
        "{table}"
    );

    for f in [
        "report.json",
        "report.md",
        "requests.jsonl",
        "throughput.svg",
        "accepted_length.svg",
        "ttft_cdf.svg",
        "tpot_cdf.svg",
    ] {
        let p = out.join(f);
        assert!(
            p.metadata().is_ok_and(|m| m.len() > 100),
            "{} missing or empty",
            p.display()
        );
    }
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("report.json")).expect("report.json"),
    )
    .expect("report.json is JSON");
    let summaries = report["summaries"].as_array().expect("summaries");
    assert_eq!(
        summaries.len(),
        3 * 2 * 4,
        "one summary per workload, concurrency and mode"
    );
    for s in summaries {
        assert_eq!(s["errors"], 0, "{s}");
        assert!(s["output_tokens"].as_u64().unwrap_or(0) > 0, "{s}");
    }

    // Totals over every speculating cell, from the responses' usage.
    let (mut rounds, mut drafts, mut accepted) = (0.0, 0.0, 0.0);
    for s in summaries.iter().filter(|s| s["usage"].is_object()) {
        rounds += f(&s["usage"], "rounds");
        drafts += f(&s["usage"], "draft_tokens");
        accepted += f(&s["usage"], "accepted_tokens");
        // Per cell, the bench's own scrape of the counters agrees with usage.
        assert_eq!(s["tokens_per_round"], s["metrics_tokens_per_round"], "{s}");
        assert_eq!(s["acceptance"], s["metrics_acceptance"], "{s}");
    }
    assert!(
        rounds > 0.0 && drafts > 0.0,
        "the run speculated ({rounds} rounds, {drafts} drafts)"
    );

    // The same figures from specd's counters, read independently after the run (this specd
    // served nothing else, so its totals are the run's).
    let m = specd.metrics().await;
    let m_rounds = metric_sum(&m, "specd_spec_rounds_per_request_sum");
    let m_emitted = metric_sum(&m, "specd_spec_decode_num_emitted_tokens_total");
    let m_drafts = metric_sum(&m, "specd_spec_decode_num_draft_tokens_total");
    let m_accepted = metric_sum(&m, "specd_spec_decode_num_accepted_tokens_total");
    let bench_len = (rounds + accepted) / rounds;
    let metrics_len = m_emitted / m_rounds;
    assert!(
        (bench_len - metrics_len).abs() < 1e-9,
        "mean accepted length: bench {bench_len}, /metrics {metrics_len}"
    );
    assert!(
        (accepted / drafts - m_accepted / m_drafts).abs() < 1e-9,
        "acceptance: bench {}, /metrics {}",
        accepted / drafts,
        m_accepted / m_drafts
    );

    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(
        md.contains("## Headline") && md.contains("on:ngram c=2"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
