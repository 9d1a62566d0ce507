//! specd against the latency-model upstream (`specd-sim`), whose tokens are a known
//! function of the context: switching keeps the output exact, and `auto` stays exact with
//! consistent usage whatever it chooses. Behaviour is asserted, never speed or which mode
//! was chosen (that follows measured costs; the virtual-time harness in
//! `speculation::controller::sim` checks the decisions).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};
use specd_sim::{continuation, corrupt};

const VOCAB: u32 = 4096;

struct Sim {
    child: Child,
    url: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim() -> Sim {
    let tok = std::env::var("SPECD_SIM_TOKENIZER")
        .unwrap_or_else(|_| models_dir().join("target").display().to_string());
    let mut child = Command::new(workspace_bin("specd-sim"))
        .args(["serve", "--tokenizer", &tok])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn specd-sim");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = line.split("listening on ").nth(1) {
                let _ = tx.send(a.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("specd-sim did not start");
    Sim { child, url }
}

/// A request whose oracle drafts keep each true token with probability `keep`.
fn request(seed: u64, n: u32, keep: f64) -> (Value, Vec<u32>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let prompt: Vec<u32> = (0..60 + rng.u32(0..40))
        .map(|_| rng.u32(4..VOCAB))
        .collect();
    let truth = continuation(&prompt, n as usize, VOCAB);
    let drafts = corrupt(&truth, |_| keep, seed, VOCAB);
    let body = json!({"model": "specd-sim", "prompt": prompt, "max_tokens": n, "temperature": 0,
        "logprobs": 0, "return_tokens_as_token_ids": true,
        "speculation": {"drafter": "oracle", "oracle_tokens": drafts, "max_draft_tokens": 6}});
    (body, truth)
}

async fn specd_for(sim: &Sim) -> Specd {
    Specd::start_ready(&sim.url, &["--enable-test-drafters"]).await
}

#[tokio::test]
async fn switching_keeps_every_token() {
    let sim = start_sim();
    let specd = specd_for(&sim).await;
    let mut calls = Vec::new();
    for (i, every) in [1usize, 2, 3, 5, 8].into_iter().enumerate() {
        for (j, keep) in [1.0, 0.7, 0.0].into_iter().enumerate() {
            let (mut b, truth) = request((i * 10 + j) as u64, 40, keep);
            b["speculation"]["switch_every"] = json!(every);
            b["speculation"]["mode"] = json!("auto");
            if j == 1 {
                b["stream"] = json!(true);
            }
            calls.push((b, truth, every, keep));
        }
    }
    let url = specd.url.clone();
    let futs = calls.into_iter().map(|(b, truth, every, keep)| {
        let url = url.clone();
        async move {
            let got: Vec<u32> = if b["stream"] == json!(true) {
                let (s, ev, done) = post_stream(&url, "/v1/completions", &b).await;
                assert!(s == 200 && done, "{ev:?}");
                ev.iter().flat_map(token_ids).collect()
            } else {
                let (s, v) = post(&url, "/v1/completions", &b).await;
                assert_eq!(s, 200, "{v}");
                assert!(v["usage"]["speculation"]["switches"].as_u64() > Some(0));
                token_ids(&v)
            };
            assert_eq!(got, truth, "switch every {every}, keep {keep}");
        }
    });
    join_all(futs).await;
}

/// One `auto` request of `n` tokens: its output must be the sim's continuation and its
/// usage consistent, whichever path specd chose. Returns the speculation usage, absent
/// when the request was passed through untouched.
async fn auto_request(url: &str, seed: u64, n: u32, keep: f64) -> Option<Value> {
    let (mut b, truth) = request(seed, n, keep);
    b["speculation"]["mode"] = json!("auto");
    let (s, v) = post(url, "/v1/completions", &b).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(token_ids(&v), truth, "seed {seed}, keep {keep}");
    assert_eq!(v["usage"]["completion_tokens"], json!(n), "{v}");
    let sp = v["usage"]
        .get("speculation")
        .filter(|s| s.is_object())?
        .clone();
    let num = |k: &str| sp[k].as_u64().unwrap_or(0);
    assert!(num("accepted_tokens") <= num("draft_tokens"), "{sp}");
    assert!(num("relay_tokens") <= u64::from(n), "{sp}");
    // Every token not relayed came from a verify round: at most accepted + 1 per round.
    let from_rounds = u64::from(n) - num("relay_tokens");
    assert!(
        from_rounds <= num("accepted_tokens") + num("rounds"),
        "{sp}"
    );
    Some(sp)
}

/// Which path `auto` takes depends on measured costs, which follow the machine's load;
/// the deterministic harness (`speculation::controller::sim`) checks the decisions. Here:
/// whatever it chose, every output is exact and every count consistent.
#[tokio::test]
async fn auto_output_is_exact_and_usage_consistent_whatever_it_chooses() {
    let sim = start_sim();
    let specd = specd_for(&sim).await;
    let mut passed = 0;
    for (i, keep) in [0.9, 1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        .into_iter()
        .enumerate()
    {
        if auto_request(&specd.url, 100 + i as u64, 96, keep)
            .await
            .is_none()
        {
            passed += 1;
        }
    }
    let m = specd.metrics().await;
    let not_paying = metric_sum(&m, "specd_passthrough_total{reason=\"not_paying\"}");
    assert_eq!(not_paying as usize, passed, "passthrough count");
    for name in [
        "specd_controller_decode_cost_seconds",
        "specd_controller_estimated_speedup",
        "specd_mode_seconds_total",
        "specd_controller_chosen_k",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }
}

/// Seeded sampled requests never relay, however bad the drafts (a relay would draw many
/// positions from one random stream and change the output).
#[tokio::test]
async fn seeded_sampling_never_relays() {
    let sim = start_sim();
    let specd = specd_for(&sim).await;
    let (mut b, _) = request(9, 48, 0.0);
    b["speculation"]["mode"] = json!("auto");
    b["temperature"] = json!(0.8);
    b["seed"] = json!(5);
    let (s, v) = post(&specd.url, "/v1/completions", &b).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["speculation"]["relay_tokens"], json!(0), "{v}");
}
