//! Executing the plan: build the built-in sets to size, prime the prefix cache, then run
//! batches — repetition × concurrency × workload × mode, the mode order rotating — while
//! scraping specd's counters around each batch.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::client;
use super::prom::{Scrape, SpecCounters};
use super::stats::Cell;
use super::workloads::{self, BenchRequest, Builtin, Endpoint, Workload};
use super::{body_for, BenchArgs, Mode};

pub struct Http {
    pub client: reqwest::Client,
    api_key: Option<String>,
}

impl Http {
    pub fn new(api_key: Option<String>) -> anyhow::Result<Http> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(256)
            // Below uvicorn's 5 s keep-alive, for endpoints served by vLLM or SGLang.
            .pool_idle_timeout(Duration::from_secs(3))
            .build()
            .context("building the HTTP client")?;
        Ok(Http { client, api_key })
    }

    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    pub async fn get_json(&self, url: &str) -> anyhow::Result<Value> {
        let r = self
            .auth(self.client.get(url))
            .timeout(Duration::from_secs(30))
            .send()
            .await?
            .error_for_status()?;
        Ok(r.json().await?)
    }

    pub async fn get_text(&self, url: &str) -> anyhow::Result<String> {
        let r = self
            .auth(self.client.get(url))
            .timeout(Duration::from_secs(30))
            .send()
            .await?
            .error_for_status()?;
        Ok(r.text().await?)
    }

    async fn post_json(&self, url: &str, body: &Value) -> anyhow::Result<Value> {
        let r = self
            .auth(self.client.post(url))
            .json(body)
            .timeout(Duration::from_secs(60))
            .send()
            .await?
            .error_for_status()?;
        Ok(r.json().await?)
    }
}

/// Counts prompt tokens with the server's `/tokenize` (vLLM), chat template included.
pub struct Tokenizer<'a> {
    pub http: &'a Http,
    pub base: &'a str,
    pub model: &'a str,
}

impl Tokenizer<'_> {
    pub async fn count(&self, req: &BenchRequest) -> Option<u32> {
        let mut body = json!({"model": self.model});
        match req.endpoint {
            Endpoint::Completions => body["prompt"] = req.body.get("prompt")?.clone(),
            Endpoint::Chat => {
                body["messages"] = req.body.get("messages")?.clone();
                body["add_generation_prompt"] = json!(true);
                body["add_special_tokens"] = json!(false);
            }
        }
        let v = self
            .http
            .post_json(&format!("{}/tokenize", self.base), &body)
            .await
            .ok()?;
        v.get("count")
            .and_then(Value::as_u64)
            .or_else(|| {
                v.get("tokens")
                    .and_then(Value::as_array)
                    .map(|a| a.len() as u64)
            })
            .map(|n| n as u32)
    }
}

/// Characters per token assumed before anything was measured (and when nothing can be).
const CHARS_PER_TOKEN: f64 = 3.0;

/// Build `n` requests of a built-in set, each prompt grown or cut until it measures at
/// most (and close to) its token budget; max_tokens is then capped so that prompt and
/// output fit the context.
pub async fn build_builtin(
    b: &Builtin,
    n: usize,
    args: &BenchArgs,
    max_model_len: u32,
    tok: &Tokenizer<'_>,
) -> Workload {
    let nominal_out = if b.max_tokens == 0 {
        args.long_tokens
    } else {
        b.max_tokens
    };
    let (p, o) = workloads::fit_sizes(b.prompt_tokens, nominal_out, max_model_len);
    let mut ratio = CHARS_PER_TOKEN;
    let mut reqs = Vec::with_capacity(n);
    for i in 0..n {
        let mut chars = (f64::from(p) * ratio) as usize;
        let mut req = workloads::make(b, i, args.seed, chars, o);
        let mut last: Option<u32> = None;
        for _ in 0..8 {
            let Some(t) = tok.count(&req).await else {
                break;
            };
            ratio = (chars as f64 / f64::from(t.max(1))).clamp(1.0, 8.0);
            let close = t <= p && f64::from(t) >= 0.9 * f64::from(p);
            // The prompt no longer changes with the budget (short fixed prompts, whole corpus).
            let stuck = last == Some(t) && t <= p;
            last = Some(t);
            if close || stuck {
                break;
            }
            chars =
                ((chars as f64) * f64::from(p) / f64::from(t.max(1)) * 0.97).max(100.0) as usize;
            req = workloads::make(b, i, args.seed, chars, o);
        }
        req.prompt_tokens = last;
        let prompt = last.unwrap_or((chars as f64 / CHARS_PER_TOKEN) as u32);
        let room = max_model_len.saturating_sub(prompt + 1).max(1);
        if room < o {
            req.body.insert("max_tokens".into(), room.into());
        }
        reqs.push(req);
    }
    let measured: Vec<f64> = reqs
        .iter()
        .filter_map(|r| r.prompt_tokens.map(f64::from))
        .collect();
    let note = ((p, o) != (b.prompt_tokens, nominal_out)).then(|| {
        format!(
            "scaled from {} prompt + {} output tokens to {p} + {o} to fit max_model_len {max_model_len}",
            b.prompt_tokens, nominal_out
        )
    });
    Workload {
        name: b.name.to_string(),
        about: b.about.to_string(),
        nominal_prompt_tokens: Some(b.prompt_tokens),
        nominal_max_tokens: Some(nominal_out),
        prompt_tokens_mean: (!measured.is_empty())
            .then(|| measured.iter().sum::<f64>() / measured.len() as f64),
        max_tokens_mean: workloads::mean_max_tokens(&reqs),
        note,
        requests: reqs,
    }
}

pub struct Plan {
    pub modes: Vec<Mode>,
    pub workloads: Vec<Workload>,
    pub concurrency: Vec<usize>,
    pub repeats: usize,
    pub model: String,
    pub specd: Option<String>,
    pub upstream: Option<String>,
    pub metrics_url: Option<String>,
    pub temperature: f64,
    pub ignore_eos: bool,
    pub prime: bool,
    pub timeout: Duration,
    pub progress: bool,
}

pub struct Measured {
    pub cells: Vec<Cell>,
    pub started_unix: u64,
    pub duration_s: f64,
}

/// A one-line progress bar on stderr (redrawn in place on a terminal, one line per batch
/// otherwise).
struct Progress {
    on: bool,
    tty: bool,
    total: usize,
    done: usize,
    started: Instant,
    label: String,
}

impl Progress {
    fn draw(&self) {
        if !self.on {
            return;
        }
        let frac = self.done as f64 / self.total.max(1) as f64;
        let width = 30;
        let filled = (frac * width as f64).round() as usize;
        let el = self.started.elapsed().as_secs_f64();
        let eta = if self.done > 0 { el / frac - el } else { 0.0 };
        let line = format!(
            "[{}{}] {}/{} requests, {:.0}s elapsed, ~{:.0}s left  {}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.done,
            self.total,
            el,
            eta,
            self.label
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.on && self.tty {
            eprintln!();
        }
    }
}

async fn counters(http: &Http, url: &Option<String>) -> Option<SpecCounters> {
    let url = url.as_ref()?;
    match http.get_text(url).await {
        Ok(t) => Some(SpecCounters::from_scrape(&Scrape::parse(&t))),
        Err(e) => {
            tracing::warn!(error = %e, %url, "could not read specd's metrics");
            None
        }
    }
}

fn url_for(plan: &Plan, mode: &Mode, ep: Endpoint) -> String {
    let base = if mode.direct {
        &plan.upstream
    } else {
        &plan.specd
    };
    format!("{}{}", base.as_deref().unwrap_or(""), ep.path())
}

pub async fn execute(http: &Http, plan: &Plan) -> anyhow::Result<Measured> {
    let epoch = Instant::now();
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if plan.prime {
        // Prefill every prompt once, straight to the server that will serve it all.
        let m = plan
            .modes
            .iter()
            .find(|m| m.direct)
            .or_else(|| plan.modes.iter().find(|m| m.label == "off"))
            .unwrap_or(&plan.modes[0]);
        let all: Vec<&BenchRequest> = plan.workloads.iter().flat_map(|w| &w.requests).collect();
        if plan.progress {
            eprintln!("priming the prefix cache with {} prompts", all.len());
        }
        stream::iter(all)
            .for_each_concurrent(4, |r| async move {
                let mut b = body_for(r, m, &plan.model, plan.temperature, false);
                b.insert("max_tokens".into(), 1.into());
                b.remove("max_completion_tokens");
                let o = client::run(
                    &http.client,
                    &url_for(plan, m, r.endpoint),
                    http.api_key.as_deref(),
                    b,
                    epoch,
                    plan.timeout,
                )
                .await;
                if !o.ok {
                    tracing::warn!(error = ?o.error, "priming request failed");
                }
            })
            .await;
    }
    let mut cells: Vec<Cell> = Vec::new();
    for w in &plan.workloads {
        for &c in &plan.concurrency {
            for m in &plan.modes {
                cells.push(Cell {
                    workload: w.name.clone(),
                    mode: m.label.clone(),
                    concurrency: c,
                    ..Cell::default()
                });
            }
        }
    }
    let per_rep: usize = plan
        .workloads
        .iter()
        .map(|w| w.requests.len())
        .sum::<usize>()
        * plan.concurrency.len()
        * plan.modes.len();
    let mut progress = Progress {
        on: plan.progress,
        tty: std::io::stderr().is_terminal(),
        total: per_rep * plan.repeats,
        done: 0,
        started: Instant::now(),
        label: String::new(),
    };
    let run_start = Instant::now();
    for rep in 0..plan.repeats {
        for (ci, &c) in plan.concurrency.iter().enumerate() {
            for (wi, w) in plan.workloads.iter().enumerate() {
                // Rotate the mode order so no mode always runs first (or right after another).
                let nm = plan.modes.len();
                let shift = (rep + ci + wi) % nm;
                for k in 0..nm {
                    let m = &plan.modes[(shift + k) % nm];
                    progress.label = format!(
                        "rep {}/{} {} c={} {}",
                        rep + 1,
                        plan.repeats,
                        w.name,
                        c,
                        m.label
                    );
                    progress.draw();
                    let before = if m.direct {
                        None
                    } else {
                        counters(http, &plan.metrics_url).await
                    };
                    let t = Instant::now();
                    let mut outcomes = Vec::with_capacity(w.requests.len());
                    let mut results = stream::iter(w.requests.iter())
                        .map(|r| {
                            let body =
                                body_for(r, m, &plan.model, plan.temperature, plan.ignore_eos);
                            let url = url_for(plan, m, r.endpoint);
                            async move {
                                client::run(
                                    &http.client,
                                    &url,
                                    http.api_key.as_deref(),
                                    body,
                                    epoch,
                                    plan.timeout,
                                )
                                .await
                            }
                        })
                        .buffer_unordered(c);
                    while let Some(o) = results.next().await {
                        outcomes.push(o);
                        progress.done += 1;
                        if progress.tty {
                            progress.draw();
                        }
                    }
                    let wall = t.elapsed().as_secs_f64();
                    let after = if m.direct {
                        None
                    } else {
                        counters(http, &plan.metrics_url).await
                    };
                    let cell = cells
                        .iter_mut()
                        .find(|x| x.workload == w.name && x.mode == m.label && x.concurrency == c)
                        .context("cell exists")?;
                    cell.batch_tokens.push(
                        outcomes
                            .iter()
                            .filter(|o| o.ok)
                            .map(|o| o.completion_tokens)
                            .sum(),
                    );
                    cell.batch_wall_s.push(wall);
                    cell.outcomes.extend(outcomes);
                    if let (Some(b), Some(a)) = (before, after) {
                        cell.counters
                            .get_or_insert_with(SpecCounters::default)
                            .add(&a.since(&b));
                    }
                }
            }
        }
    }
    progress.label = "done".into();
    progress.draw();
    progress.finish();
    Ok(Measured {
        cells,
        started_unix,
        duration_s: run_start.elapsed().as_secs_f64(),
    })
}
