//! `specd bench`: replay workloads against OpenAI-compatible endpoints — specd with
//! speculation off, on (per drafter) and auto, and the upstream directly — at several
//! concurrency levels, interleaving the modes batch by batch so that machine noise hits
//! them alike. Reports throughput, latency percentiles, acceptance (from `usage` and from
//! specd's `/metrics`) and the measured break-even accepted length, as a terminal table,
//! JSON, Markdown and SVG plots.

pub mod client;
pub mod corpus;
pub mod plot;
pub mod prom;
pub mod report;
pub mod runner;
pub mod stats;
pub mod workloads;

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use workloads::{BenchRequest, Workload};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// specd's base URL (for the modes off, on, auto).
    #[arg(long, env = "SPECD_BENCH_SPECD")]
    pub specd: Option<String>,

    /// The upstream's base URL (for the mode `direct`).
    #[arg(long, env = "SPECD_BENCH_UPSTREAM")]
    pub upstream: Option<String>,

    /// specd's Prometheus endpoint. Default: <specd>/metrics.
    #[arg(long, env = "SPECD_BENCH_METRICS_URL")]
    pub metrics_url: Option<String>,

    /// Modes to compare: direct (the upstream itself), off, on[:DRAFTER[:K]],
    /// auto[:DRAFTER[:K]] (K = max draft tokens).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,off,on:ngram,auto"
    )]
    pub modes: Vec<String>,

    /// Workloads: built-in set names, `all`, or JSONL files (one request body per line).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub workloads: Vec<String>,

    /// Concurrency levels (simultaneous streams).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub concurrency: Vec<usize>,

    /// Requests per workload, mode and concurrency in each repetition. Default: twice the
    /// highest concurrency, at least 4 (files: all their requests).
    #[arg(long)]
    pub requests: Option<usize>,

    /// Repetitions of the whole interleaved schedule.
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,

    /// Mode the speedup is computed against. Default: off if measured, else direct.
    #[arg(long)]
    pub baseline: Option<String>,

    /// Model name sent in requests. Default: the first one of /v1/models.
    #[arg(long)]
    pub model: Option<String>,

    /// Context length to fit the built-in sets into. Default: what /v1/models reports.
    #[arg(long)]
    pub max_model_len: Option<u32>,

    /// Output length of the long built-in generations (scaled down to fit the context).
    #[arg(long, default_value_t = 2048)]
    pub long_tokens: u32,

    /// Cap every request's max_tokens (quick runs and tests).
    #[arg(long)]
    pub output_cap: Option<u32>,

    /// max_tokens for file requests that set none.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,

    /// Sampling temperature for requests that set none (0 = greedy: every mode yields the
    /// same tokens).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,

    /// Ask the server to ignore end-of-sequence tokens (vLLM's `ignore_eos`), so every
    /// request produces its full max_tokens.
    #[arg(long)]
    pub ignore_eos: bool,

    /// Seed of the built-in sets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Skip sending every prompt once (max_tokens 1) before measuring. Priming keeps the
    /// first mode from paying prefills that later modes get from the prefix cache.
    #[arg(long)]
    pub no_prime: bool,

    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 900.0)]
    pub timeout: f64,

    /// Bearer token for both endpoints.
    #[arg(long, env = "SPECD_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Directory for report.json, report.md, requests.jsonl and the SVG plots.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Write the workloads as JSONL to this file and exit without measuring.
    #[arg(long)]
    pub export_workloads: Option<PathBuf>,

    /// No progress bar on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// One way of sending the requests.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Mode {
    pub label: String,
    /// Straight to the upstream rather than through specd.
    pub direct: bool,
    /// specd's `speculation` body field.
    pub speculation: Option<Value>,
}

pub fn parse_mode(s: &str) -> Result<Mode, String> {
    let s = s.trim();
    let parts: Vec<&str> = s.split(':').collect();
    match parts[0] {
        "direct" | "upstream" if parts.len() == 1 => Ok(Mode {
            label: "direct".into(),
            direct: true,
            speculation: None,
        }),
        "off" if parts.len() == 1 => Ok(Mode {
            label: "off".into(),
            direct: false,
            speculation: Some(json!({"mode": "off"})),
        }),
        m @ ("on" | "auto") if parts.len() <= 3 => {
            let mut spec = json!({"mode": m});
            if let Some(d) = parts.get(1).filter(|d| !d.is_empty()) {
                spec["drafter"] = json!(d);
            }
            if let Some(k) = parts.get(2) {
                let k: u64 = k
                    .parse()
                    .map_err(|_| format!("mode '{s}': K must be an integer"))?;
                spec["max_draft_tokens"] = json!(k);
            }
            Ok(Mode {
                label: s.to_string(),
                direct: false,
                speculation: Some(spec),
            })
        }
        _ => Err(format!(
            "unknown mode '{s}': use direct, off, on[:DRAFTER[:K]] or auto[:DRAFTER[:K]]"
        )),
    }
}

fn trim_base(u: &str) -> String {
    u.trim_end_matches('/').trim_end_matches("/v1").to_string()
}

/// Model name and context length from `/v1/models` (vLLM reports `max_model_len`).
async fn discover(c: &runner::Http, base: &str) -> anyhow::Result<(String, Option<u32>)> {
    let v = c
        .get_json(&format!("{base}/v1/models"))
        .await
        .with_context(|| format!("GET {base}/v1/models"))?;
    let first = v.pointer("/data/0").context("/v1/models lists no model")?;
    let id = first
        .get("id")
        .and_then(Value::as_str)
        .context("/v1/models: model without id")?
        .to_string();
    let len = first
        .get("max_model_len")
        .and_then(Value::as_u64)
        .map(|n| n as u32);
    Ok((id, len))
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let modes: Vec<Mode> = args
        .modes
        .iter()
        .map(|m| parse_mode(m))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    if modes.is_empty() {
        bail!("no modes to measure");
    }
    let specd = args.specd.as_deref().map(trim_base);
    let upstream = args.upstream.as_deref().map(trim_base);
    if modes.iter().any(|m| !m.direct) && specd.is_none() {
        bail!("modes other than direct need --specd");
    }
    if modes.iter().any(|m| m.direct) && upstream.is_none() {
        bail!("mode direct needs --upstream");
    }
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency needs positive levels");
    }
    let http = runner::Http::new(args.api_key.clone())?;
    let base = specd.clone().or(upstream.clone()).context("no endpoint")?;
    let (found_model, found_len) = discover(&http, &base).await?;
    let model = args.model.clone().unwrap_or(found_model);
    let max_model_len = args.max_model_len.or(found_len).unwrap_or(4096);
    let tokenize_base = upstream.clone().unwrap_or(base.clone());
    let c_max = args.concurrency.iter().copied().max().unwrap_or(1);
    let n_builtin = args.requests.unwrap_or((2 * c_max).max(4));
    let mut sets: Vec<Workload> = Vec::new();
    for w in &args.workloads {
        let names: Vec<&str> = if w == "all" {
            workloads::BUILTINS.iter().map(|b| b.name).collect()
        } else {
            vec![w.as_str()]
        };
        for name in names {
            if let Some(b) = workloads::builtin(name) {
                let counter = runner::Tokenizer {
                    http: &http,
                    base: &tokenize_base,
                    model: &model,
                };
                sets.push(
                    runner::build_builtin(b, n_builtin, &args, max_model_len, &counter).await,
                );
            } else if std::path::Path::new(name).is_file() {
                let mut loaded =
                    workloads::load_jsonl(std::path::Path::new(name), args.max_tokens)?;
                if let Some(n) = args.requests {
                    for l in &mut loaded {
                        l.requests.truncate(n);
                    }
                }
                sets.extend(loaded);
            } else {
                bail!(workloads::WorkloadError::Unknown(
                    name.to_string(),
                    workloads::builtin_names()
                ));
            }
        }
    }
    if let Some(cap) = args.output_cap {
        for w in &mut sets {
            for r in &mut w.requests {
                if workloads::max_tokens_of(&r.body).is_none_or(|n| n > u64::from(cap)) {
                    r.body.remove("max_completion_tokens");
                    r.body.insert("max_tokens".into(), cap.into());
                }
            }
            w.max_tokens_mean = workloads::mean_max_tokens(&w.requests);
            w.note = Some(format!(
                "{}max_tokens capped at {cap}",
                w.note
                    .as_ref()
                    .map(|n| format!("{n}; "))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(path) = &args.export_workloads {
        std::fs::write(path, workloads::to_jsonl(&sets))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} workloads to {}", sets.len(), path.display());
        return Ok(());
    }
    let plan = runner::Plan {
        modes: modes.clone(),
        workloads: sets.clone(),
        concurrency: args.concurrency.clone(),
        repeats: args.repeats.max(1),
        model: model.clone(),
        specd: specd.clone(),
        upstream: upstream.clone(),
        metrics_url: args
            .metrics_url
            .clone()
            .or_else(|| specd.as_ref().map(|s| format!("{s}/metrics"))),
        temperature: args.temperature,
        ignore_eos: args.ignore_eos,
        prime: !args.no_prime,
        timeout: std::time::Duration::from_secs_f64(args.timeout.max(1.0)),
        progress: !args.quiet,
    };
    let upstream_info = match &plan.metrics_url {
        Some(u) => http.get_text(u).await.ok().and_then(|t| {
            let s = prom::Scrape::parse(&t);
            s.labels_of("specd_upstream_info").map(|l| {
                l.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        }),
        None => None,
    };
    let measured = runner::execute(&http, &plan).await?;
    let has = |l: &str| modes.iter().any(|m| m.label == l);
    let baseline = args.baseline.clone().unwrap_or_else(|| {
        if has("off") {
            "off".into()
        } else if has("direct") {
            "direct".into()
        } else {
            modes[0].label.clone()
        }
    });
    let reference = if has("direct") { "direct" } else { "off" };
    let mut summaries: Vec<stats::Summary> =
        measured.cells.iter().map(stats::Cell::summarise).collect();
    stats::compare(&mut summaries, &baseline, reference);
    let meta = report::Meta {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        specd_version: env!("CARGO_PKG_VERSION").to_string(),
        started_unix: measured.started_unix,
        duration_s: measured.duration_s,
        model,
        max_model_len,
        specd: specd.clone(),
        upstream: upstream.clone(),
        upstream_info,
        modes,
        concurrency: args.concurrency.clone(),
        repeats: plan.repeats,
        temperature: args.temperature,
        ignore_eos: args.ignore_eos,
        primed: plan.prime,
        baseline,
        decode_reference: reference.to_string(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
    };
    let rep = report::Report {
        meta,
        workloads: sets,
        summaries,
    };
    println!("{}", report::table(&rep));
    if let Some(dir) = &args.out {
        report::write(dir, &rep, &measured.cells)
            .with_context(|| format!("writing the report to {}", dir.display()))?;
        eprintln!("report written to {}", dir.display());
    }
    Ok(())
}

/// The request body a mode sends.
pub fn body_for(
    req: &BenchRequest,
    mode: &Mode,
    model: &str,
    temperature: f64,
    ignore_eos: bool,
) -> serde_json::Map<String, Value> {
    let mut b = req.body.clone();
    b.insert("model".into(), model.into());
    b.entry("temperature").or_insert(json!(temperature));
    if ignore_eos {
        b.insert("ignore_eos".into(), true.into());
    }
    if let Some(s) = &mode.speculation {
        b.insert("speculation".into(), s.clone());
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        let m = parse_mode("on:ngram:8").expect("valid");
        assert_eq!(
            m.speculation,
            Some(json!({"mode": "on", "drafter": "ngram", "max_draft_tokens": 8}))
        );
        assert!(parse_mode("direct").expect("valid").direct);
        assert_eq!(
            parse_mode("auto").expect("valid").speculation,
            Some(json!({"mode": "auto"}))
        );
        assert_eq!(
            parse_mode("off").expect("valid").speculation,
            Some(json!({"mode": "off"}))
        );
        for bad in ["sometimes", "on:ngram:x", "off:ngram", "on:a:1:2"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bodies_carry_mode_and_defaults() {
        let req = workloads::make(
            workloads::builtin("open-short").expect("exists"),
            0,
            1,
            100,
            9,
        );
        let mode = parse_mode("on:ngram").expect("valid");
        let b = body_for(&req, &mode, "m", 0.0, true);
        assert_eq!(b["model"], json!("m"));
        assert_eq!(b["ignore_eos"], json!(true));
        assert_eq!(b["speculation"]["drafter"], json!("ngram"));
        assert_eq!(b["max_tokens"], json!(9));
        let d = body_for(&req, &parse_mode("direct").expect("valid"), "m", 0.5, false);
        assert!(!d.contains_key("speculation") && !d.contains_key("ignore_eos"));
        assert_eq!(d["temperature"], json!(0.5));
        assert_eq!(trim_base("http://h:1/v1/"), "http://h:1");
    }
}
