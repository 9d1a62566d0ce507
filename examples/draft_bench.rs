//! Stand-alone draft-model check and benchmark (the same code as the hidden
//! `specd draft-bench` command), handy for a CUDA build carried to a GPU machine.
//!
//!     cargo run --release --example draft_bench -- --model DIR --device cpu --batch 1,4

use clap::Parser;

#[derive(Parser)]
#[command(about = "Check and time the draft model")]
struct Cli {
    #[command(flatten)]
    args: specd::draft::model::bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    specd::draft::model::bench::run_bench(Cli::parse().args)
}
