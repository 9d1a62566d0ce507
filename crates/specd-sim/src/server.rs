//! `specd-sim serve`: the fake upstream on the cost model's clock, with the hashed tokens
//! (or, with `--quote`, tokens that quote the context).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{Options, SimConfig, Timing, Tokens, Upstream};

/// How to run the sim server.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Model directory with tokenizer.json, reported as the model's `root`.
    #[arg(long, env = "SPECD_SIM_TOKENIZER")]
    pub tokenizer: PathBuf,
    /// Served model name.
    #[arg(long, default_value = "specd-sim")]
    pub model: String,
    /// Answers quote the context (as agents quote tool output): the probability, per
    /// token, that a quote goes on rather than jumping elsewhere. Unset: hashed tokens
    /// that only the oracle drafter predicts.
    #[arg(long, value_parser = probability)]
    pub quote: Option<f64>,
    /// The vLLM version `/version` reports (from 0.10.2 on, specd asks for
    /// `return_token_ids` instead of logprobs to read sampled ids).
    #[arg(long, env = "SPECD_SIM_VLLM_VERSION", default_value = super::upstream::DEFAULT_VERSION)]
    pub vllm_version: String,
    #[command(flatten)]
    pub cost: SimConfig,
}

/// Bind and serve until the process ends; returns the bound address once listening.
pub async fn start(args: ServeArgs) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let up = Upstream::start(Options {
        listen: args.listen,
        tokenizer: args.tokenizer,
        model: args.model,
        max_model_len: args.cost.max_model_len as usize,
        tokens: match args.quote {
            Some(p) => Tokens::Quoting {
                vocab: args.cost.vocab,
                keep_permille: (p * 1000.0).round() as u32,
            },
            None => Tokens::Hashed {
                vocab: args.cost.vocab,
            },
        },
        timing: Timing::Model(args.cost),
        tls: None,
    })
    .await?;
    up.set_version(&args.vllm_version);
    Ok((up.addr, up.detach()))
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("'{s}' is not a probability in 0..=1")),
    }
}
