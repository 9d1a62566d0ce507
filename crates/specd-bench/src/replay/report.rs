//! The report: a terminal table, Markdown with a headline table, JSON, the raw per-request
//! records, and the SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

use super::plot;
use super::stats::{Cell, Summary};
use super::workloads::Workload;
use super::Mode;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Meta {
    pub command: String,
    pub specd_version: String,
    pub started_unix: u64,
    pub duration_s: f64,
    pub model: String,
    pub max_model_len: u32,
    pub specd: Option<String>,
    pub upstream: Option<String>,
    /// What specd detected upstream (labels of `specd_upstream_info`).
    pub upstream_info: Option<String>,
    pub modes: Vec<Mode>,
    pub concurrency: Vec<usize>,
    pub repeats: usize,
    pub temperature: f64,
    pub ignore_eos: bool,
    pub primed: bool,
    pub baseline: String,
    pub decode_reference: String,
    pub cpus: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub meta: Meta,
    pub workloads: Vec<Workload>,
    pub summaries: Vec<Summary>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.1}", x * 1000.0))
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{:.0}%", x * 100.0))
}

fn times(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.2}x"))
}

const HEADERS: &[&str] = &[
    "workload",
    "mode",
    "c",
    "req",
    "err",
    "tok/s/stream",
    "agg tok/s",
    "speedup",
    "TTFT p50/p95/p99 ms",
    "TPOT p50/p95/p99 ms",
    "tok/round",
    "tok/round (metrics)",
    "accept",
    "relay",
    "verify ms",
    "break-even",
];

fn row(s: &Summary) -> Vec<String> {
    vec![
        s.workload.clone(),
        s.mode.clone(),
        s.concurrency.to_string(),
        s.requests.to_string(),
        s.errors.to_string(),
        num(s.stream_tok_s, 1),
        num(s.aggregate_tok_s, 1),
        times(s.speedup),
        format!(
            "{}/{}/{}",
            ms(s.ttft_s.p50),
            ms(s.ttft_s.p95),
            ms(s.ttft_s.p99)
        ),
        format!(
            "{}/{}/{}",
            ms(s.tpot_s.p50),
            ms(s.tpot_s.p95),
            ms(s.tpot_s.p99)
        ),
        num(s.tokens_per_round, 2),
        num(s.metrics_tokens_per_round, 2),
        pct(s.acceptance),
        match s.passed_share.filter(|p| *p > 0.0) {
            Some(p) => format!("{} (+{} passed)", pct(s.relay_share), pct(Some(p))),
            None => pct(s.relay_share),
        },
        ms(s.verify_mean_s),
        num(s.break_even_tokens_per_round, 2),
    ]
}

fn sorted_rows(r: &Report) -> Vec<&Summary> {
    let order = |s: &Summary| {
        (
            r.workloads.iter().position(|w| w.name == s.workload),
            s.concurrency,
            r.meta.modes.iter().position(|m| m.label == s.mode),
        )
    };
    let mut v: Vec<&Summary> = r.summaries.iter().collect();
    v.sort_by_key(|s| order(s));
    v
}

/// Aligned plain-text table.
pub fn table(r: &Report) -> String {
    let rows: Vec<Vec<String>> = sorted_rows(r).into_iter().map(row).collect();
    let mut widths: Vec<usize> = HEADERS.iter().map(|h| h.len()).collect();
    for rw in &rows {
        for (w, c) in widths.iter_mut().zip(rw) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < 2 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(HEADERS.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    let mut last = String::new();
    for rw in rows {
        if rw[0] != last && !last.is_empty() {
            out.push('\n');
        }
        last = rw[0].clone();
        out.push_str(&line(rw));
        out.push('\n');
    }
    out.push_str(&format!(
        "\nspeedup: aggregate tokens/s vs `{}`; tok/round: tokens per verify round (accepted + 1); break-even: verify time / plain decode step (TPOT p50 of `{}`)\n",
        r.meta.baseline, r.meta.decode_reference
    ));
    out
}

fn md_table(headers: &[String], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n|", headers.join(" | "));
    for (i, _) in headers.iter().enumerate() {
        out.push_str(if i < 2 { " --- |" } else { " ---: |" });
    }
    out.push('\n');
    for rw in rows {
        let _ = writeln!(out, "| {} |", rw.join(" | "));
    }
    out
}

/// Speedup per workload, one column per speculating mode and concurrency.
pub fn headline(r: &Report) -> (Vec<String>, Vec<Vec<String>>) {
    let cols: Vec<(&str, usize)> = r
        .meta
        .modes
        .iter()
        .filter(|m| !m.direct && m.label != r.meta.baseline && m.label != "off")
        .flat_map(|m| {
            r.meta
                .concurrency
                .iter()
                .map(move |c| (m.label.as_str(), *c))
        })
        .collect();
    let mut headers = vec!["workload".to_string(), "tokens (prompt→output)".to_string()];
    headers.extend(cols.iter().map(|(m, c)| format!("{m} c={c}")));
    let rows = r
        .workloads
        .iter()
        .map(|w| {
            let mut rw = vec![
                w.name.clone(),
                format!("{}→{:.0}", num(w.prompt_tokens_mean, 0), w.max_tokens_mean),
            ];
            for (m, c) in &cols {
                let s = r
                    .summaries
                    .iter()
                    .find(|s| s.workload == w.name && s.mode == *m && s.concurrency == *c);
                rw.push(match s {
                    Some(s) => format!(
                        "{} (τ {} / {})",
                        times(s.speedup),
                        num(s.tokens_per_round, 2),
                        num(s.break_even_tokens_per_round, 2)
                    ),
                    None => "-".into(),
                });
            }
            rw
        })
        .collect();
    (headers, rows)
}

pub fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut out = String::from("# specd bench report\n\n");
    let _ = writeln!(out, "Command: `{}`\n", m.command);
    let _ = writeln!(
        out,
        "Model `{}` (max_model_len {}), modes {}, concurrency {:?}, {} repetition(s) interleaved, temperature {}, ignore_eos {}, prompts primed {}, {} CPUs on the bench host, {:.0} s.\n",
        m.model,
        m.max_model_len,
        m.modes.iter().map(|x| format!("`{}`", x.label)).collect::<Vec<_>>().join(", "),
        m.concurrency,
        m.repeats,
        m.temperature,
        m.ignore_eos,
        m.primed,
        m.cpus,
        m.duration_s
    );
    if let Some(u) = &m.upstream_info {
        let _ = writeln!(out, "Upstream as specd detected it: {u}.\n");
    }
    out.push_str("## Headline: speedup against `");
    out.push_str(&m.baseline);
    out.push_str("`\n\nAggregate output tokens/s relative to the baseline; in brackets τ = tokens per verify round (accepted drafts + 1) and the measured break-even τ (verify round time / plain decode step). Speculation pays when τ exceeds the break-even.\n\n");
    let (h, rows) = headline(r);
    out.push_str(&md_table(&h, &rows));
    out.push_str("\nModes: `direct` = the upstream itself; `off` = through specd, forwarded unchanged; `on:D` = specd speculates every round with drafter D; `auto` = specd's controller decides per round (relaying plain decoding when speculation would not pay; where recent `auto` requests show it not paying, most `auto` requests pass through untouched: \"passed\"). TTFT, TPOT and tokens/s are measured by the client on streamed responses; tokens per round and acceptance come from each response's `usage.speculation` and, independently, from the change of specd's `/metrics` counters over the same batches.\n");
    out.push_str("\n## Workloads\n\n");
    let wh: Vec<String> = [
        "workload",
        "about",
        "requests",
        "prompt tokens (mean)",
        "max_tokens (mean)",
        "note",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let wr: Vec<Vec<String>> = r
        .workloads
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                w.about.clone(),
                w.requests.len().to_string(),
                num(w.prompt_tokens_mean, 0),
                format!("{:.0}", w.max_tokens_mean),
                w.note.clone().unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&md_table(&wh, &wr));
    out.push_str("\n## All results\n\n");
    let headers: Vec<String> = HEADERS.iter().map(|s| s.to_string()).collect();
    let rows: Vec<Vec<String>> = sorted_rows(r).into_iter().map(row).collect();
    out.push_str(&md_table(&headers, &rows));
    let errors: Vec<&Summary> = r.summaries.iter().filter(|s| s.errors > 0).collect();
    if !errors.is_empty() {
        out.push_str("\n## Errors\n\n");
        for s in errors {
            let _ = writeln!(
                out,
                "- {} {} c={}: {} failed; first: {}",
                s.workload,
                s.mode,
                s.concurrency,
                s.errors,
                s.first_error.clone().unwrap_or_default()
            );
        }
    }
    out.push_str("\n## Plots\n\n![throughput](throughput.svg)\n\n![accepted length](accepted_length.svg)\n\n![TTFT](ttft_cdf.svg)\n\n![TPOT](tpot_cdf.svg)\n");
    out
}

/// Write report.json, report.md, requests.jsonl and the plots into `dir`.
pub fn write(dir: &Path, r: &Report, cells: &[Cell]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_string_pretty(r).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("report.json"), json + "\n")?;
    std::fs::write(dir.join("report.md"), markdown(r))?;
    let mut raw = String::new();
    for c in cells {
        for o in &c.outcomes {
            let line = json!({"workload": c.workload, "mode": c.mode, "concurrency": c.concurrency, "outcome": o});
            raw.push_str(&line.to_string());
            raw.push('\n');
        }
    }
    std::fs::write(dir.join("requests.jsonl"), raw)?;
    let workloads: Vec<String> = r.workloads.iter().map(|w| w.name.clone()).collect();
    let modes: Vec<String> = r.meta.modes.iter().map(|m| m.label.clone()).collect();
    let conc = &r.meta.concurrency;
    std::fs::write(
        dir.join("throughput.svg"),
        plot::throughput(&r.summaries, &workloads, &modes, conc),
    )?;
    std::fs::write(
        dir.join("accepted_length.svg"),
        plot::accepted_length(&r.summaries, &workloads, &modes),
    )?;
    std::fs::write(
        dir.join("ttft_cdf.svg"),
        plot::latency_cdf(cells, &workloads, &modes, conc, "TTFT", |o| o.ttft_s),
    )?;
    std::fs::write(
        dir.join("tpot_cdf.svg"),
        plot::latency_cdf(cells, &workloads, &modes, conc, "TPOT", |o| o.tpot_s),
    )?;
    Ok(())
}
