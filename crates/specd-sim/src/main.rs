//! `specd-sim`: a latency-model vLLM stand-in for specd's benchmarks and tests (tooling,
//! not a product feature). The scenarios that replay through specd against it are
//! `specd-bench scenarios`.

use clap::Parser;

/// Serve the vLLM API subset specd uses, on the cost model's clock.
#[derive(Parser)]
#[command(
    version,
    about = "Latency-model vLLM stand-in (tooling, not a product feature)"
)]
enum Cli {
    /// Serve the vLLM API subset specd uses, on the cost model's clock.
    Serve(specd_sim::server::ServeArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli::Serve(args) = Cli::parse();
    let (addr, task) = specd_sim::server::start(args).await?;
    eprintln!("specd-sim listening on http://{addr}");
    task.await?;
    Ok(())
}
