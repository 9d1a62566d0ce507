//! Shared test harness: the real vLLM upstream (started once per machine by
//! scripts/vllm-cpu-upstream.sh, reused across test processes) and specd processes on
//! port 0, whose bound address is read from their output.
#![allow(dead_code)]

pub mod fault;
mod upstreams;

pub use upstreams::*;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use specd::upstream::prom_text;

/// Run specd with `args` until it exits (it must fail at start-up); its status and stderr.
pub fn specd_fails(args: &[&str], timeout: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(args)
        .env("SPECD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn specd");
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("specd {args:?} was still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Chi-square critical value for `df` degrees of freedom at alpha = 0.001
/// (Wilson–Hilferty).
pub fn chi2_critical_001(df: f64) -> f64 {
    const Z: f64 = 3.09; // upper 0.001 quantile of the standard normal
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + Z * a.sqrt()).powi(3)
}

/// Two-sample chi-square homogeneity statistic and its degrees of freedom; categories
/// with fewer than 10 observations in all are pooled.
pub fn chi2_homogeneity<T: std::hash::Hash + Eq>(a: &[T], b: &[T]) -> (f64, f64) {
    let mut counts: std::collections::HashMap<&T, (f64, f64)> = Default::default();
    for x in a {
        counts.entry(x).or_default().0 += 1.0;
    }
    for y in b {
        counts.entry(y).or_default().1 += 1.0;
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

/// A binary of another crate of the workspace (specd-sim, specd-bench), built beside specd
/// by `cargo build` / `cargo nextest run` at the workspace root.
pub fn workspace_bin(name: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_BIN_EXE_specd")).with_file_name(name);
    assert!(
        p.exists(),
        "{} is missing: build the whole workspace",
        p.display()
    );
    p
}

/// The specd binary under test (`SPECD_BIN` overrides it, e.g. with a release build).
pub fn bin() -> String {
    std::env::var("SPECD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_specd").to_string())
}

/// How long a test waits for specd's `/readyz`: readiness checks the upstream and its
/// tokenizer, which a loaded 2-core machine (vLLM servers starting beside the test) can
/// hold up for minutes. Only a failing start waits this long.
pub const READY_TIMEOUT: Duration = Duration::from_secs(300);

pub struct Specd {
    pub child: Child,
    pub url: String,
    pub admin_url: Option<String>,
    /// Every line specd wrote to stderr so far.
    pub logs: Arc<Mutex<Vec<String>>>,
    /// The thread copying stderr into `logs`; it ends when specd's stderr closes.
    log_reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Specd {
    fn drop(&mut self) {
        // A failing test's report carries specd's last log lines (warnings and errors
        // unless SPECD_LOG asks for more).
        if std::thread::panicking() {
            if let Ok(logs) = self.logs.lock() {
                let tail = &logs[logs.len().saturating_sub(60)..];
                eprintln!("--- specd's last log lines:\n{}", tail.join("\n"));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Specd {
    /// Start specd in front of `upstream` with extra flags; wait until it listens.
    pub fn start(upstream: &str, extra: &[&str]) -> Specd {
        let level = std::env::var("SPECD_LOG").unwrap_or_else(|_| "warn".into());
        Specd::start_env(upstream, extra, &[("SPECD_LOG", &level)])
    }

    /// Start with extra environment variables (e.g. `SPECD_LOG`).
    pub fn start_env(upstream: &str, extra: &[&str], env: &[(&str, &str)]) -> Specd {
        Specd::spawn(Command::new(bin()), upstream, extra, env)
    }

    /// Start under a soft open-files limit of `nofile` (a systemd service's default is
    /// 1024), as its parent would leave it.
    pub fn start_nofile(upstream: &str, extra: &[&str], nofile: u32) -> Specd {
        let mut cmd = Command::new("bash");
        cmd.args([
            "-c",
            &format!("ulimit -Sn {nofile} && exec \"$0\" \"$@\""),
            &bin(),
        ]);
        let level = std::env::var("SPECD_LOG").unwrap_or_else(|_| "warn".into());
        Specd::spawn(cmd, upstream, extra, &[("SPECD_LOG", &level)])
    }

    fn spawn(mut cmd: Command, upstream: &str, extra: &[&str], env: &[(&str, &str)]) -> Specd {
        let mut child = cmd
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
            .env_remove("SPECD_LOG")
            // A verify or relay call to the CPU vLLM on a loaded 2-core machine (vLLM
            // servers starting beside the test) can outlast the 30 s meant for a GPU
            // server; a test that times out on purpose passes `--verify-timeout`.
            .env("SPECD_VERIFY_TIMEOUT", "300")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn specd");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let log_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = sink.lock() {
                    l.push(line.clone());
                }
                if line.contains("listening on http://") {
                    let _ = tx.send(line.clone());
                }
                if std::env::var("SPECD_TEST_VERBOSE").is_ok() {
                    eprintln!("[specd] {line}");
                }
            }
        });
        let mut url = None;
        let mut admin_url = None;
        let want_admin = extra.contains(&"--metrics-listen");
        let deadline = Instant::now() + Duration::from_secs(30);
        while url.is_none() || (want_admin && admin_url.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("specd did not report its address");
            let addr = line
                .split("listening on ")
                .nth(1)
                .expect("address")
                .trim()
                .to_string();
            if line.contains("admin") {
                admin_url = Some(addr);
            } else {
                url = Some(addr);
            }
        }
        Specd {
            child,
            url: url.unwrap_or_default(),
            admin_url,
            logs,
            log_reader: Some(log_reader),
        }
    }

    /// Everything specd logged so far.
    pub fn log_text(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Everything specd logged, once it has exited: waits for the reader to reach the end
    /// of stderr, so the last lines before exit are not lost to the race with the reader.
    pub fn final_log_text(&mut self) -> String {
        if let Some(reader) = self.log_reader.take() {
            let _ = reader.join();
        }
        self.log_text()
    }

    /// Send SIGTERM (graceful shutdown).
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success());
    }

    /// One metric's value (the first sample matching `selector`, as [`metric_value`]).
    pub async fn metric(&self, selector: &str) -> Option<f64> {
        metric_value(&self.metrics().await, selector)
    }

    /// Start and wait for `/readyz`.
    pub async fn start_ready(upstream: &str, extra: &[&str]) -> Specd {
        let s = Specd::start(upstream, extra);
        s.wait_ready(READY_TIMEOUT).await;
        s
    }

    pub fn admin(&self) -> &str {
        self.admin_url.as_deref().unwrap_or(&self.url)
    }

    pub async fn wait_ready(&self, timeout: Duration) {
        let c = client();
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = c.get(format!("{}/readyz", self.admin())).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "specd not ready in time");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        client()
            .get(format!("{}/metrics", self.admin()))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }
}

/// The first sample in Prometheus text matching `selector`: `name` or `name{k="v",…}`
/// (a sample of that name carrying at least those labels).
pub fn metric_value(text: &str, selector: &str) -> Option<f64> {
    samples(text, selector).next()
}

/// The sum of every sample matching `selector`.
pub fn metric_sum(text: &str, selector: &str) -> f64 {
    samples(text, selector).sum()
}

/// The sample lines whose metric name starts with one of `prefixes` (failure messages).
pub fn metric_lines<'a>(text: &'a str, prefixes: &[&str]) -> Vec<&'a str> {
    (text.lines())
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .collect()
}

/// The largest sample matching `selector`, 0 when none does.
pub fn metric_max(text: &str, selector: &str) -> f64 {
    samples(text, selector).fold(0.0, f64::max)
}

fn samples<'a>(text: &'a str, selector: &str) -> impl Iterator<Item = f64> + 'a {
    // A selector reads as a sample line without its value.
    let want = prom_text::parse_line(&format!("{selector} 0"))
        .unwrap_or_else(|| panic!("not a metric selector: {selector}"));
    prom_text::samples(text)
        .filter(move |s| {
            s.name == want.name && want.labels.iter().all(|(k, v)| s.label(k) == Some(v))
        })
        .map(|s| s.value)
}

/// Poll `check` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub async fn wait_for<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn client() -> reqwest::Client {
    static C: OnceLock<reqwest::Client> = OnceLock::new();
    C.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            // A new connection per request. uvicorn closes a connection 5 s after its last
            // response; a pooled one whose idle time the client counted from later (its
            // process starved of CPU while reading the body) can be closed just as a request
            // goes out on it, which fails with `IncompleteMessage` on a busy machine.
            .pool_max_idle_per_host(0)
            .build()
            .expect("client")
    })
    .clone()
}

pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// POST with `stream: true`; returns the decoded `data:` payloads (without `[DONE]`) and
/// whether `[DONE]` arrived.
pub async fn post_stream(base: &str, path: &str, body: &Value) -> (u16, Vec<Value>, bool) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let mut events = Vec::new();
    let mut done = false;
    for ev in text.split("\n\n") {
        for line in ev.lines() {
            if let Some(d) = line.strip_prefix("data: ") {
                if d == "[DONE]" {
                    done = true;
                } else if let Ok(v) = serde_json::from_str(d) {
                    events.push(v);
                }
            }
        }
    }
    (status, events, done)
}

/// Concatenated text of streamed chunks (completions `text` or chat `delta.content`).
pub fn stream_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e.pointer("/choices/0"))
        .map(|c| {
            c.get("text")
                .and_then(Value::as_str)
                .or_else(|| c.pointer("/delta/content").and_then(Value::as_str))
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// Token ids from a response made with `return_tokens_as_token_ids` (completions logprobs
/// `tokens`, or chat `logprobs.content[].token`), streamed or not.
pub fn token_ids(v: &Value) -> Vec<u32> {
    let mut out = Vec::new();
    let choice = v.pointer("/choices/0").cloned().unwrap_or(Value::Null);
    if let Some(toks) = choice.pointer("/logprobs/tokens").and_then(Value::as_array) {
        out.extend(
            toks.iter()
                .filter_map(|t| t.as_str()?.strip_prefix("token_id:")?.parse::<u32>().ok()),
        );
    }
    if let Some(content) = choice
        .pointer("/logprobs/content")
        .and_then(Value::as_array)
    {
        out.extend(content.iter().filter_map(|t| {
            t.get("token")?
                .as_str()?
                .strip_prefix("token_id:")?
                .parse::<u32>()
                .ok()
        }));
    }
    out
}

pub fn model_name() -> String {
    std::env::var("SPECD_TEST_MODEL").unwrap_or_else(|_| "specd-target".into())
}

pub fn completion(prompt: Value, max_tokens: u32) -> Value {
    json!({"model": model_name(), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "logprobs": 0, "return_tokens_as_token_ids": true})
}

/// Reads a streamed response event by event, as a client would.
pub struct SseReader {
    pub status: u16,
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    parser: specd::upstream::sse::SseParser,
    queue: std::collections::VecDeque<String>,
    /// The connection broke (instead of ending cleanly).
    pub broken: bool,
}

impl SseReader {
    pub async fn open(base: &str, path: &str, body: &Value) -> SseReader {
        Self::open_with(client().post(format!("{base}{path}")).json(body)).await
    }

    pub async fn open_with(req: reqwest::RequestBuilder) -> SseReader {
        use futures_util::StreamExt;
        let r = req.send().await.expect("request");
        SseReader {
            status: r.status().as_u16(),
            body: r.bytes_stream().boxed(),
            parser: specd::upstream::sse::SseParser::new(),
            queue: Default::default(),
            broken: false,
        }
    }

    /// The next `data:` payload; `None` at the end of the body.
    pub async fn next(&mut self) -> Option<String> {
        use futures_util::StreamExt;
        loop {
            if let Some(d) = self.queue.pop_front() {
                return Some(d);
            }
            match self.body.next().await {
                Some(Ok(b)) => self.queue.extend(self.parser.feed(&b)),
                Some(Err(_)) => {
                    self.broken = true;
                    return None;
                }
                None => return None,
            }
        }
    }

    /// Read to the end: (JSON events before `[DONE]`, whether `[DONE]` came).
    pub async fn rest(&mut self) -> (Vec<Value>, bool) {
        let mut events = Vec::new();
        while let Some(d) = self.next().await {
            if d == "[DONE]" {
                return (events, true);
            }
            events.push(serde_json::from_str(&d).unwrap_or(Value::String(d)));
        }
        (events, false)
    }
}

/// Token ids of every chunk of a streamed response, in order.
pub fn stream_token_ids(events: &[Value]) -> Vec<u32> {
    events.iter().flat_map(token_ids).collect()
}

/// The error object of an error event, if `v` is one.
pub fn error_of(v: &Value) -> Option<&Value> {
    v.get("error")
}
