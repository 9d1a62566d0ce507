//! Where a scenario's requests go: the real server given, or a sim started here (hashed
//! tokens for the oracle scenarios, quoting tokens and the tool-call tokenizer for `agent`),
//! and the flags each mode's specd gets for it.

use anyhow::Context;
use serde_json::Value;

use specd_sim::server::{self, ServeArgs};

use super::{BenchArgs, Scenario, Work};

/// Where a scenario's requests go: the server, its model, the drafter and specd's flags.
pub(super) struct Target {
    pub(super) url: String,
    pub(super) model: String,
    pub(super) drafter: String,
    pub(super) specd_args: Vec<String>,
    _sim: Option<Sim>,
}

/// A sim served by this process, stopped with the scenario.
struct Sim(tokio::task::JoinHandle<()>);

impl Drop for Sim {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn start_sim(
    a: &BenchArgs,
    tokenizer: &std::path::Path,
    quote: Option<f64>,
) -> anyhow::Result<(String, Sim)> {
    let (addr, task) = server::start(ServeArgs {
        listen: "127.0.0.1:0".parse()?,
        tokenizer: tokenizer.to_path_buf(),
        model: "specd-sim".into(),
        quote,
        vllm_version: specd_sim::upstream::DEFAULT_VERSION.into(),
        cost: a.cost.clone(),
    })
    .await?;
    Ok((format!("http://{addr}"), Sim(task)))
}

async fn served_model(c: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let info: Value = c
        .get(format!("{url}/v1/models"))
        .send()
        .await?
        .json()
        .await?;
    Ok(info
        .pointer("/data/0/id")
        .and_then(Value::as_str)
        .context("upstream serves no model")?
        .to_string())
}

pub(super) async fn target(
    a: &BenchArgs,
    sc: &Scenario,
    c: &reqwest::Client,
) -> anyhow::Result<Target> {
    let models = specd::config::cache_dir().join("models");
    let agent = matches!(sc.work, Work::Agent);
    let mut specd_args = Vec::new();
    if agent {
        specd_args.extend([
            "--enable-auto-tool-choice".to_string(),
            "--tool-call-parser".into(),
            a.tool_call_parser.clone(),
        ]);
        if let Some(r) = &a.reasoning_parser {
            specd_args.extend(["--reasoning-parser".into(), r.clone()]);
        }
    }
    let (url, sim, drafter) = match &a.upstream {
        Some(u) => (u.clone(), None, a.drafter.clone()),
        None => {
            let (tok, quote, drafter) = if agent {
                let tok = a
                    .agent_tokenizer
                    .clone()
                    .unwrap_or(models.join("agent-tools"));
                (tok, Some(a.quote), a.drafter.clone())
            } else {
                let tok = a.tokenizer.clone().unwrap_or(models.join("target"));
                (tok, None, "oracle".to_string())
            };
            let (url, sim) = start_sim(a, &tok, quote).await.with_context(|| {
                format!("starting the sim with the tokenizer in {}", tok.display())
            })?;
            specd_args.extend(["--tokenizer".into(), tok.display().to_string()]);
            (url, Some(sim), drafter)
        }
    };
    Ok(Target {
        model: served_model(c, &url).await?,
        url,
        drafter,
        specd_args,
        _sim: sim,
    })
}
