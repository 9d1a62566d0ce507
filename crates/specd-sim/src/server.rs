//! `specd-sim serve`: the fake upstream on the cost model's clock, with the hashed tokens.

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
        tokens: Tokens::Hashed {
            vocab: args.cost.vocab,
        },
        timing: Timing::Model(args.cost),
        tls: None,
    })
    .await?;
    Ok((up.addr, up.detach()))
}
