//! The controller benchmark: scenarios replayed side by side — plain decoding (specd with
//! speculation off), static K, and `auto` — each mode behind its own specd process, trials
//! interleaved (the order of modes rotates every repeat) so drift hits all modes alike.
//! Reports tokens/s per stream. With `--upstream` it runs text workloads against a real
//! server instead of the sim's oracle scenarios. `--only agent` runs tool-calling agent
//! loops ([`agent`]) through specd with a tool-call parser: against the real server, or
//! against a sim whose answers quote the context.

pub mod agent;
mod table;
mod target;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::future::join_all;
use serde_json::{json, Value};

use specd_sim::{continuation, corrupt, SimConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Benchmark this running server (e.g. the real vLLM) with text workloads instead of
    /// the sim with oracle scenarios.
    #[arg(long)]
    pub upstream: Option<String>,
    /// Tokenizer directory for the sim (default ~/.cache/specd/models/target).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// specd binary (default: next to this one).
    #[arg(long)]
    pub specd: Option<PathBuf>,
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub concurrency: Vec<usize>,
    /// Measured trials per mode (after one warm-up trial).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 192)]
    pub tokens: u32,
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub static_k: Vec<usize>,
    /// K cap for `auto` (default: specd's own, `--auto-max-draft-tokens`).
    #[arg(long)]
    pub auto_k: Option<usize>,
    /// Drafter for text workloads (the sim scenarios use the oracle).
    #[arg(long, default_value = "suffix")]
    pub drafter: String,
    /// Only these scenarios (comma-separated names). `agent` runs only when named.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// `agent`: specd's (and the server's) tool-call parser.
    #[arg(long, default_value = "hermes")]
    pub tool_call_parser: String,
    /// `agent`: specd's reasoning parser, as the server was started with (none: no
    /// reasoning parser).
    #[arg(long)]
    pub reasoning_parser: Option<String>,
    /// `agent` on the sim: tokenizer directory with the tool-call tokens (default
    /// ~/.cache/specd/models/agent-tools).
    #[arg(long)]
    pub agent_tokenizer: Option<PathBuf>,
    /// `agent` on the sim: the probability, per token, that an answer's quote of the
    /// context goes on (specd-sim's `--quote`).
    #[arg(long, default_value_t = 0.85)]
    pub quote: f64,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Add a mode `watched`: `auto` on a specd that runs every request through its loop
    /// (`--controller-watch-every 1`), to compare with `auto`'s passthrough of requests
    /// where speculation is not paying.
    #[arg(long)]
    pub with_watched: bool,
    #[command(flatten)]
    pub cost: SimConfig,
}

#[derive(Clone, Copy)]
enum Work {
    /// Oracle drafts kept with probability `keep(position)`.
    Oracle(fn(usize) -> f64),
    Repetitive,
    OpenEnded,
    /// Tool-calling agent loops, chat ([`agent::episode`]).
    Agent,
}

struct Scenario {
    name: &'static str,
    what: &'static str,
    work: Work,
}

fn sim_scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "accept-1.5",
            what: "p=0.335 per position (1.5 tokens/round at K=4)",
            work: Work::Oracle(|_| 0.335),
        },
        Scenario {
            name: "accept-2.0",
            what: "p=0.519 per position (2.0 tokens/round at K=4)",
            work: Work::Oracle(|_| 0.519),
        },
        Scenario {
            name: "accept-3.4",
            what: "p=0.805 per position (3.4 tokens/round at K=4)",
            work: Work::Oracle(|_| 0.805),
        },
        Scenario {
            name: "mixed",
            what: "64-token phases alternating p=0.9 and p=0.1",
            work: Work::Oracle(|i| if (i / 64) % 2 == 0 { 0.9 } else { 0.1 }),
        },
    ]
}

fn agent_scenario() -> Scenario {
    Scenario {
        name: "agent",
        what: "agent loops: a question with tools, then its calls and results to quote",
        work: Work::Agent,
    }
}

fn text_scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "repetitive",
            what: "code-like prompts with repeated lines",
            work: Work::Repetitive,
        },
        Scenario {
            name: "open-ended",
            what: "prose from shuffled words",
            work: Work::OpenEnded,
        },
    ]
}

#[derive(Clone)]
struct Mode {
    label: String,
    spec: Value,
    /// Extra flags of this mode's specd.
    args: Vec<String>,
}

fn modes(a: &BenchArgs, drafter: &str) -> Vec<Mode> {
    let mut v = vec![Mode {
        label: "plain".into(),
        spec: json!("off"),
        args: vec![],
    }];
    for &k in &a.static_k {
        v.push(Mode {
            label: format!("K={k}"),
            spec: json!({"mode": "on", "max_draft_tokens": k, "drafter": drafter}),
            args: vec![],
        });
    }
    let mut auto = json!({"mode": "auto", "drafter": drafter});
    if let Some(k) = a.auto_k {
        auto["max_draft_tokens"] = json!(k);
    }
    if a.with_watched {
        v.push(Mode {
            label: "watched".into(),
            spec: auto.clone(),
            args: vec!["--controller-watch-every".into(), "1".into()],
        });
    }
    v.push(Mode {
        label: "auto".into(),
        spec: auto,
        args: vec![],
    });
    v
}

struct Specd {
    child: Child,
    url: String,
}

impl Drop for Specd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_specd(bin: &PathBuf, upstream: &str, extra: &[String]) -> anyhow::Result<Specd> {
    let mut child = Command::new(bin)
        .args([
            "serve",
            "--upstream",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "--health-interval",
            "0.2",
        ])
        .args(extra)
        .env(
            "SPECD_LOG",
            std::env::var("SPECD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stderr = child.stderr.take().context("specd stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_string());
            } else if std::env::var("SPECD_BENCH_VERBOSE").is_ok() {
                eprintln!("[specd] {line}");
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .context("specd did not start")?;
    Ok(Specd { child, url })
}

async fn wait_ready(c: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(r) = c.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("specd at {url} not ready")
}

const WORDS: &[&str] = &[
    "the",
    "proxy",
    "verifies",
    "draft",
    "tokens",
    "against",
    "a",
    "large",
    "model",
    "while",
    "clients",
    "stream",
    "answers",
    "from",
    "server",
    "in",
    "front",
    "of",
    "many",
    "GPUs",
    "speculation",
    "pays",
    "only",
    "when",
    "accepted",
    "river",
    "stone",
    "light",
    "window",
];

/// The requests stream `i` sends in repeat `r`, in order (same for every mode).
fn bodies(sc: &Scenario, model: &str, tokens: u32, r: usize, i: usize, vocab: u32) -> Vec<Value> {
    let seed = (r as u64) << 32 | i as u64;
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let one = match sc.work {
        Work::Agent => return agent::episode(model, tokens, seed),
        Work::Oracle(keep) => {
            let len = 120 + rng.usize(0..120);
            let prompt: Vec<u32> = (0..len).map(|_| rng.u32(4..vocab)).collect();
            let truth = continuation(&prompt, tokens as usize, vocab);
            let drafts = corrupt(&truth, keep, seed, vocab);
            json!({"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                   "speculation": {"drafter": "oracle", "oracle_tokens": drafts}})
        }
        Work::Repetitive => {
            let line = format!(
                "    total += values[{}] * weight_{}\n",
                rng.usize(0..9),
                rng.usize(0..5)
            );
            let prompt = format!(
                "def accumulate_{r}_{i}(values, weight):\n    total = 0\n{}",
                line.repeat(3 + rng.usize(0..4))
            );
            json!({"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": true})
        }
        Work::OpenEnded => {
            let text: Vec<&str> = (0..20 + rng.usize(0..30))
                .map(|_| WORDS[rng.usize(..WORDS.len())])
                .collect();
            json!({"model": model, "prompt": format!("Story {r}-{i}: {}", text.join(" ")), "max_tokens": tokens, "temperature": 0, "ignore_eos": true})
        }
    };
    vec![one]
}

#[derive(Default, Clone, serde::Serialize)]
struct Sample {
    tps: Vec<f64>,
    requests: u64,
    rounds: u64,
    drafted: u64,
    accepted: u64,
    /// Requests that ran no verify round (passed through, or relayed throughout).
    unspeculated: u64,
    relay_tokens: u64,
    /// Tokens of `auto` requests that specd passed through untouched.
    passed_tokens: u64,
    tokens: u64,
    /// CPU time of the mode's specd process during its trials.
    cpu_s: f64,
}

impl Sample {
    /// Add a measured trial.
    fn add(&mut self, s: &Sample) {
        self.tps.extend(&s.tps);
        self.requests += s.requests;
        self.rounds += s.rounds;
        self.drafted += s.drafted;
        self.accepted += s.accepted;
        self.unspeculated += s.unspeculated;
        self.relay_tokens += s.relay_tokens;
        self.passed_tokens += s.passed_tokens;
        self.tokens += s.tokens;
        self.cpu_s += s.cpu_s;
    }
}

/// CPU seconds used so far by all threads of a process (Linux: per-thread schedstat, in
/// nanoseconds; threads that exited are not counted, tokio's workers live as long as specd).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    for t in tasks.flatten() {
        let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        ns += s
            .split_whitespace()
            .next()
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(ns as f64 * 1e-9)
}

/// One request: its time and answer.
async fn send(c: &reqwest::Client, url: &str, b: Value) -> anyhow::Result<(Duration, Value)> {
    let path = if b.get("messages").is_some() {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let t = Instant::now();
    let r = c.post(format!("{url}{path}")).json(&b).send().await?;
    let status = r.status();
    let v: Value = r.json().await?;
    anyhow::ensure!(status.is_success(), "HTTP {status}: {v}");
    Ok((t.elapsed(), v))
}

/// Each stream sends its requests one after the other (an agent loop's turns); its rate
/// is all its tokens over all its time.
async fn trial(
    c: &reqwest::Client,
    url: &str,
    streams: &[Vec<Value>],
    mode: &Mode,
    s: &mut Sample,
) -> anyhow::Result<()> {
    let calls = streams.iter().map(|reqs| async move {
        let mut answers = Vec::with_capacity(reqs.len());
        for b in reqs {
            answers.push(send(c, url, with_mode(b, mode)).await?);
        }
        Ok::<_, anyhow::Error>(answers)
    });
    for r in join_all(calls).await {
        let answers = r?;
        let time: f64 = answers.iter().map(|(dt, _)| dt.as_secs_f64()).sum();
        let mut n_stream = 0;
        for (dt, v) in &answers {
            let n = v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            n_stream += n;
            count(s, mode, v, n, *dt);
        }
        s.tps.push(n_stream as f64 / time.max(1e-9));
    }
    Ok(())
}

/// The body with the mode's `speculation` (what the body itself asks for kept).
fn with_mode(b: &Value, mode: &Mode) -> Value {
    let mut b = b.clone();
    let mut spec = mode.spec.clone();
    if let (Some(o), Some(extra)) = (
        spec.as_object_mut(),
        b.get("speculation").and_then(Value::as_object),
    ) {
        for (k, v) in extra {
            o.entry(k.clone()).or_insert(v.clone());
        }
    }
    b["speculation"] = spec;
    b
}

/// Add one answer's `usage` to the sample.
fn count(s: &mut Sample, mode: &Mode, v: &Value, n: u64, dt: Duration) {
    s.tokens += n;
    s.requests += 1;
    let sp = |k: &str| {
        v.pointer(&format!("/usage/speculation/{k}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    if std::env::var_os("SPECD_BENCH_VERBOSE").is_some() {
        eprintln!(
            "   {:.0} ms {}",
            dt.as_secs_f64() * 1e3,
            v.pointer("/usage/speculation").unwrap_or(&Value::Null)
        );
    }
    s.rounds += sp("rounds");
    s.drafted += sp("draft_tokens");
    s.accepted += sp("accepted_tokens");
    s.relay_tokens += sp("relay_tokens");
    if sp("rounds") == 0 {
        s.unspeculated += 1;
    }
    if mode.spec["mode"] == "auto" && v.pointer("/usage/speculation").is_none() {
        s.passed_tokens += n;
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The scenarios to run: the sim's or the text ones, `agent` only when named.
fn chosen(a: &BenchArgs) -> Vec<Scenario> {
    let mut all = match a.upstream {
        Some(_) => text_scenarios(),
        None => sim_scenarios(),
    };
    all.push(agent_scenario());
    all.into_iter()
        .filter(|s| match a.only.is_empty() {
            true => !matches!(s.work, Work::Agent),
            false => a.only.iter().any(|o| o == s.name),
        })
        .collect()
}

pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    let bin = match &a.specd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("specd"),
    };
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .pool_idle_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(600))
        .build()?;
    let labels = modes(&a, &a.drafter);
    let mut rows = Vec::new();
    for sc in chosen(&a) {
        eprintln!("== {} ({})", sc.name, sc.what);
        let t = target::target(&a, &sc, &c).await?;
        let modes = modes(&a, &t.drafter);
        // One specd per mode: each learns only from its own traffic, and draft stores never
        // hold another mode's output for the same prompt.
        let mut procs = Vec::new();
        for m in &modes {
            let args: Vec<String> = ["--enable-test-drafters".to_string()]
                .iter()
                .chain(&t.specd_args)
                .chain(&m.args)
                .cloned()
                .collect();
            procs.push(start_specd(&bin, &t.url, &args)?);
        }
        for p in &procs {
            wait_ready(&c, &p.url).await?;
        }
        for &conc in &a.concurrency {
            let mut samples = vec![Sample::default(); modes.len()];
            for r in 0..=a.repeats {
                let streams: Vec<Vec<Value>> = (0..conc)
                    .map(|i| bodies(&sc, &t.model, a.tokens, r + conc * 1000, i, a.cost.vocab))
                    .collect();
                for j in 0..modes.len() {
                    let m = (j + r) % modes.len();
                    let mut s = Sample::default();
                    let pid = procs[m].child.id();
                    let cpu0 = cpu_seconds(pid);
                    trial(&c, &procs[m].url, &streams, &modes[m], &mut s).await?;
                    if let (Some(a), Some(b)) = (cpu0, cpu_seconds(pid)) {
                        s.cpu_s = b - a;
                    }
                    eprintln!(
                        "   streams={conc} repeat={r} {:>6}: {:7.1} tok/s per stream{}",
                        modes[m].label,
                        mean(&s.tps),
                        if r == 0 { " (warm-up)" } else { "" }
                    );
                    if r > 0 {
                        samples[m].add(&s);
                    }
                }
            }
            rows.push((sc.name, conc, samples));
        }
    }
    table::print(&labels, &rows);
    if let Some(p) = &a.json {
        let v: Vec<Value> = rows.iter().map(|(n, c, s)| json!({"scenario": n, "streams": c,
            "modes": labels.iter().zip(s).map(|(m, s)| json!({"mode": m.label, "tokens_per_s_per_stream": mean(&s.tps), "samples": s})).collect::<Vec<_>>()})).collect();
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
