//! `specd-sim`: a latency-model vLLM stand-in and the controller benchmark that replays
//! scenarios through specd against it. Benchmark and test tooling only, not a product
//! feature (see `specd::sim`).

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Latency-model vLLM stand-in and controller benchmark (tooling, not a product feature)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the vLLM API subset specd uses, on the cost model's clock.
    Serve(specd::sim::server::ServeArgs),
    /// Replay the scenarios through specd: plain, static K and auto, side by side.
    Bench(specd::sim::bench::BenchArgs),
    /// Time and memory of the suffix drafter's proposals.
    SuffixBench(specd::sim::suffix_bench::SuffixBenchArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve(args) => {
            let (addr, task) = specd::sim::server::start(args).await?;
            eprintln!("specd-sim listening on http://{addr}");
            task.await?;
            Ok(())
        }
        Cmd::Bench(args) => specd::sim::bench::run(args).await,
        Cmd::SuffixBench(args) => specd::sim::suffix_bench::run(args),
    }
}
