//! Command-line and environment configuration. Every flag can also be set through an
//! environment variable named `SPECD_<FLAG>`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UpstreamKindArg {
    /// Detect from the upstream's endpoints.
    Auto,
    Vllm,
    Sglang,
}

/// How a request is served when it does not say itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecMode {
    /// Never speculate: forward requests unchanged.
    Off,
    /// Always speculate with the configured draft length.
    On,
    /// Speculate only while the controller expects it to pay.
    Auto,
}

impl SpecMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "false" | "0" => Some(Self::Off),
            "on" | "true" | "1" => Some(Self::On),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Base URL of the vLLM or SGLang server (http or https).
    #[arg(long, env = "SPECD_UPSTREAM")]
    pub upstream: String,

    /// PEM file of CA certificates to trust for an https upstream, in addition to the
    /// built-in web roots (for upstreams behind a private CA).
    #[arg(long, env = "SPECD_UPSTREAM_CA_CERT")]
    pub upstream_ca_cert: Option<PathBuf>,

    /// Address clients connect to (port 0 picks a free port, reported on stderr).
    #[arg(long, env = "SPECD_LISTEN", default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,

    /// Optional separate address for /metrics, /livez and /readyz. When unset they are
    /// served on the main address.
    #[arg(long, env = "SPECD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Upstream server kind; `auto` detects it.
    #[arg(long, env = "SPECD_UPSTREAM_KIND", value_enum, default_value = "auto")]
    pub upstream_kind: UpstreamKindArg,

    /// Default speculation mode for requests that do not choose one.
    #[arg(long, env = "SPECD_SPECULATION", value_enum, default_value = "auto")]
    pub speculation: SpecMode,

    /// Default drafter: ngram, suffix or model.
    #[arg(long, env = "SPECD_DRAFTER", default_value = "ngram")]
    pub drafter: String,

    /// Maximum draft tokens per verify round.
    #[arg(long, env = "SPECD_MAX_DRAFT_TOKENS", default_value_t = 4)]
    pub max_draft_tokens: usize,

    /// Shortest suffix match the n-gram drafter acts on.
    #[arg(long, env = "SPECD_NGRAM_MIN", default_value_t = 2)]
    pub ngram_min: usize,

    /// Longest suffix the n-gram drafter tries to match.
    #[arg(long, env = "SPECD_NGRAM_MAX", default_value_t = 8)]
    pub ngram_max: usize,

    /// Suffix drafter: longest suffix of the context it matches, in tokens.
    #[arg(long, env = "SPECD_SUFFIX_MAX_DEPTH", default_value_t = 32)]
    pub suffix_max_depth: usize,

    /// Suffix drafter: stop a chain when its cumulative probability falls below this.
    #[arg(long, env = "SPECD_SUFFIX_MIN_PROB", default_value_t = 0.1)]
    pub suffix_min_prob: f32,

    /// Suffix drafter: a chain is at most this factor times the match length.
    #[arg(long, env = "SPECD_SUFFIX_SPEC_FACTOR", default_value_t = 1.0)]
    pub suffix_spec_factor: f32,

    /// Suffix drafter: tokens of recent outputs (all streams) kept for matching; oldest
    /// outputs are evicted first. 0 disables the global store.
    #[arg(long, env = "SPECD_SUFFIX_GLOBAL_TOKENS", default_value_t = 1 << 20)]
    pub suffix_global_tokens: usize,

    /// Controller: seconds after which a cost estimate counts as stale and one stream
    /// re-measures it (a short relay, or one verify round).
    #[arg(long, env = "SPECD_CONTROLLER_PROBE_INTERVAL", default_value_t = 10.0)]
    pub controller_probe_interval: f64,

    /// Controller: share of speculation rounds that try a draft length other than the
    /// best estimate, to keep the verify-cost estimates of neighbouring K fresh.
    #[arg(long, env = "SPECD_CONTROLLER_EXPLORE", default_value_t = 0.05)]
    pub controller_explore: f64,

    /// Controller: while recent `auto` requests got (almost) no tokens from speculation,
    /// only one in this many new `auto` requests runs through specd's loop (relaying and
    /// watching for a chance to speculate); the others pass through untouched, so that
    /// specd costs nothing where speculation does not pay. 1 watches every request.
    #[arg(long, env = "SPECD_CONTROLLER_WATCH_EVERY", default_value_t = 8)]
    pub controller_watch_every: usize,

    /// tokenizer.json (or a directory holding it) of the upstream's model. Default: the
    /// model directory the upstream reports, when it is readable here.
    #[arg(long, env = "SPECD_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,

    /// HF model directory of a draft model for the `model` drafter.
    #[arg(long, env = "SPECD_DRAFT_MODEL")]
    pub draft_model: Option<PathBuf>,

    /// Device for the draft model: cpu or cuda:N.
    #[arg(long, env = "SPECD_DRAFT_DEVICE", default_value = "cpu")]
    pub draft_device: String,

    /// Draft model weights dtype: f32, bf16 or f16 (default f32 on the CPU, bf16 on CUDA).
    #[arg(long, env = "SPECD_DRAFT_DTYPE")]
    pub draft_dtype: Option<String>,

    /// Streams with a draft-model KV cache slot (default 16 on the CPU, 32 on CUDA).
    #[arg(long, env = "SPECD_DRAFT_MAX_STREAMS")]
    pub draft_max_streams: Option<usize>,

    /// Longest context the draft model drafts for (longer contexts get no proposal).
    #[arg(long, env = "SPECD_DRAFT_MAX_LEN")]
    pub draft_max_len: Option<usize>,

    /// Timeout of one verify call, in seconds.
    #[arg(long, env = "SPECD_VERIFY_TIMEOUT", default_value_t = 30.0)]
    pub verify_timeout: f64,

    /// Connect timeout to the upstream, in seconds.
    #[arg(long, env = "SPECD_CONNECT_TIMEOUT", default_value_t = 5.0)]
    pub connect_timeout: f64,

    /// Close pooled upstream connections idle this long, in seconds. Keep it below the
    /// upstream's keep-alive timeout (uvicorn, under vLLM and SGLang: 5 s), so specd
    /// never sends a request on a connection the server is closing at that moment.
    #[arg(long, env = "SPECD_UPSTREAM_IDLE_TIMEOUT", default_value_t = 4.0)]
    pub upstream_idle_timeout: f64,

    /// Interval of the upstream health check, in seconds.
    #[arg(long, env = "SPECD_HEALTH_INTERVAL", default_value_t = 2.0)]
    pub health_interval: f64,

    /// How long in-flight requests may finish after SIGTERM, in seconds.
    #[arg(long, env = "SPECD_DRAIN_TIMEOUT", default_value_t = 30.0)]
    pub drain_timeout: f64,

    /// Maximum concurrently served generation requests (0 = unlimited).
    #[arg(long, env = "SPECD_MAX_CONCURRENT_STREAMS", default_value_t = 1024)]
    pub max_concurrent_streams: usize,

    /// Requests that may wait for a free stream slot before 429 is returned.
    #[arg(long, env = "SPECD_MAX_QUEUE", default_value_t = 1024)]
    pub max_queue: usize,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "SPECD_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Require `Authorization: Bearer <key>` from clients (the header is still forwarded).
    #[arg(long, env = "SPECD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Log format.
    #[arg(long, env = "SPECD_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Enable the `oracle` and `adversarial` drafters, which take the expected tokens from
    /// the request. For tests only.
    #[arg(long, env = "SPECD_ENABLE_TEST_DRAFTERS", default_value_t = false)]
    pub enable_test_drafters: bool,
}

impl ServeArgs {
    pub fn verify_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.verify_timeout.max(0.001))
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout.max(0.001))
    }
    pub fn upstream_idle_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.upstream_idle_timeout.max(0.001))
    }
    pub fn health_interval(&self) -> Duration {
        Duration::from_secs_f64(self.health_interval.max(0.05))
    }
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.drain_timeout.max(0.0))
    }
}

/// specd's cache root, as the scripts use it: `SPECD_CACHE_DIR`, else ~/.cache/specd.
pub fn cache_dir() -> std::path::PathBuf {
    std::env::var_os("SPECD_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/specd")
        })
}
