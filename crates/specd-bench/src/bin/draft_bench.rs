//! Stand-alone draft-model check and benchmark, handy for a CUDA build carried to a GPU
//! machine.
//!
//!     cargo run --release -p specd-bench --bin draft_bench -- --model DIR --device cpu --batch 1,4

use clap::Parser;

#[derive(Parser)]
#[command(about = "Check and time the draft model")]
struct Cli {
    #[command(flatten)]
    args: specd_bench::draft_model::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    specd_bench::draft_model::run_bench(Cli::parse().args)
}
