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

/// An empty `SPECD_*` variable counts as unset, so that the flag takes its default: a
/// compose file's `${VAR:-}` or an empty chart value sets the variable to "". Called
/// before any thread starts (changing the environment is not thread-safe).
fn unset_empty_env() -> Vec<String> {
    let empty: Vec<String> = std::env::vars_os()
        .filter(|(_, v)| v.is_empty())
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("SPECD_"))
        .collect();
    for k in &empty {
        std::env::remove_var(k);
    }
    empty
}

fn main() -> anyhow::Result<()> {
    let empty = unset_empty_env();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve(args) => {
            init_logs(args.log_format);
            if !empty.is_empty() {
                tracing::info!(variables = ?empty, "empty variables count as unset");
            }
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(specd::serve::run(args))
        }
    }
}
