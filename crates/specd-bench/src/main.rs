use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// specd's benchmarks (tooling, not part of the proxy).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Replay workloads against specd and its upstream and report what speculation buys.
    Replay(specd_bench::replay::BenchArgs),
    /// The controller's field scenarios through specd against specd-sim: plain, static K
    /// and auto, side by side.
    Scenarios(specd_bench::scenarios::BenchArgs),
    /// Time and memory of the suffix drafter's proposals.
    Suffix(specd_bench::suffix::SuffixBenchArgs),
    /// Tokens per round of draft models with the target's vocabulary and another one,
    /// against a target model run here (greedy).
    Xvocab(specd_bench::xvocab::XvocabArgs),
    /// Check the draft model against a reference and time its decode steps (built with
    /// `--features cuda`, on a GPU too).
    Draft(specd_bench::draft_model::BenchArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_env("SPECD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Replay(args) => specd_bench::replay::run(args).await,
        Cmd::Scenarios(args) => specd_bench::scenarios::run(args).await,
        Cmd::Suffix(args) => specd_bench::suffix::run(args),
        Cmd::Xvocab(args) => specd_bench::xvocab::run(args).await,
        Cmd::Draft(args) => specd_bench::draft_model::bench(args).await,
    }
}
