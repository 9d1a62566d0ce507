use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use specd::config::{LogFormat, ServeArgs};

/// specd: speculative decoding in front of an unmodified vLLM or SGLang server.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the proxy.
    Serve(ServeArgs),
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_env("SPECD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => b.json().init(),
        LogFormat::Text => b.init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve(args) => {
            init_logs(args.log_format);
            specd::serve::run(args).await
        }
    }
}
