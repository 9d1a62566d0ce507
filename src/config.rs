//! Command-line and environment configuration. Every flag can also be set through an
//! environment variable named `SPECD_<FLAG>`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::draft::model::{DraftDevice, DraftDtype};
use crate::draft::DrafterChoice;
use crate::speculation::controller::K_TRACKED;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UpstreamKindArg {
    /// Detect from the upstream's endpoints.
    Auto,
    Vllm,
    Sglang,
}

/// How a request is served when it does not say itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize, serde::Serialize)]
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
    /// The name in flags, headers, `usage.speculation.mode` and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecMode::Off => "off",
            SpecMode::On => "on",
            SpecMode::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "false" | "0" => Some(Self::Off),
            "on" | "true" | "1" => Some(Self::On),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

/// A reasoning parser specd reproduces, by vLLM's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    DeepseekR1,
    /// vLLM's grammar-engine `qwen3` (`vllm/parser/qwen3.py`).
    Qwen3,
    /// vLLM's grammar-engine `kimi_k2` (`vllm/parser/kimi_k2.py`).
    KimiK2,
}

impl ReasoningParser {
    pub const ALL: [ReasoningParser; 3] = [
        ReasoningParser::DeepseekR1,
        ReasoningParser::Qwen3,
        ReasoningParser::KimiK2,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningParser::DeepseekR1 => "deepseek_r1",
            ReasoningParser::Qwen3 => "qwen3",
            ReasoningParser::KimiK2 => "kimi_k2",
        }
    }
}

/// `--reasoning-parser`: one specd implements, or another name (whose chat answers specd
/// cannot split, so they pass through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningParserArg {
    Known(ReasoningParser),
    Unimplemented(String),
}

fn reasoning_parser(s: &str) -> Result<ReasoningParserArg, String> {
    let name = s.trim();
    if name.is_empty() {
        return Err("the parser name is empty".into());
    }
    Ok(ReasoningParser::ALL
        .into_iter()
        .find(|p| p.as_str() == name)
        .map_or_else(
            || ReasoningParserArg::Unimplemented(name.to_string()),
            ReasoningParserArg::Known,
        ))
}

/// A tool-call parser specd reproduces, by vLLM's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallParser {
    Hermes,
    Llama3Json,
    /// vLLM's grammar engine with the kimi_k2 config (model-made call ids).
    KimiK2,
    /// vLLM's grammar engine with the qwen3 config (XML parameters, random ids).
    Qwen3Coder,
}

impl ToolCallParser {
    pub const ALL: [ToolCallParser; 4] = [
        ToolCallParser::Hermes,
        ToolCallParser::Llama3Json,
        ToolCallParser::KimiK2,
        ToolCallParser::Qwen3Coder,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallParser::Hermes => "hermes",
            ToolCallParser::Llama3Json => "llama3_json",
            ToolCallParser::KimiK2 => "kimi_k2",
            ToolCallParser::Qwen3Coder => "qwen3_coder",
        }
    }
}

/// `--tool-call-parser`: one specd implements, or another name (whose chat answers with
/// tools pass through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCallParserArg {
    Known(ToolCallParser),
    Unimplemented(String),
}

fn tool_call_parser(s: &str) -> Result<ToolCallParserArg, String> {
    let name = s.trim();
    if name.is_empty() {
        return Err("the parser name is empty".into());
    }
    Ok(ToolCallParser::ALL
        .into_iter()
        .find(|p| p.as_str() == name)
        .map_or_else(
            || ToolCallParserArg::Unimplemented(name.to_string()),
            ToolCallParserArg::Known,
        ))
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

    /// Default drafter: `ngram`, `suffix`, `model`, or `auto` (each round verifies the
    /// proposal of whichever drafter is expected to yield the most tokens per second).
    /// `suffix` by default: it matched or beat `ngram` on every measured workload but one,
    /// and costs as little; `auto` drafts with every drafter each round, a draft model too.
    #[arg(long, env = "SPECD_DRAFTER", default_value = "suffix")]
    pub drafter: DrafterChoice,

    /// Draft tokens per verify round in mode `on` (every round verifies that many).
    #[arg(long, env = "SPECD_MAX_DRAFT_TOKENS", default_value_t = 4, value_parser = draft_tokens)]
    pub max_draft_tokens: usize,

    /// Most draft tokens per round that `auto` may choose (it picks K per round from its
    /// estimates; 16 is the most they track). With a verify cost nearly flat in K, a cap
    /// of 16 reached 2.23x plain where a cap of 4 reached 1.40x (docs/controller.md).
    #[arg(long, env = "SPECD_AUTO_MAX_DRAFT_TOKENS", default_value_t = K_TRACKED, value_parser = auto_draft_tokens)]
    pub auto_max_draft_tokens: usize,

    /// Shortest suffix match the n-gram drafter acts on.
    #[arg(long, env = "SPECD_NGRAM_MIN", default_value_t = 2)]
    pub ngram_min: usize,

    /// Longest suffix the n-gram drafter tries to match.
    #[arg(long, env = "SPECD_NGRAM_MAX", default_value_t = 8)]
    pub ngram_max: usize,

    /// Suffix drafter: longest suffix of the context it matches, in tokens.
    #[arg(long, env = "SPECD_SUFFIX_MAX_DEPTH", default_value_t = 32, value_parser = at_least_two)]
    pub suffix_max_depth: usize,

    /// Suffix drafter: stop a chain when its cumulative probability falls below this.
    #[arg(long, env = "SPECD_SUFFIX_MIN_PROB", default_value_t = 0.1, value_parser = fraction_f32)]
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
    #[arg(long, env = "SPECD_CONTROLLER_PROBE_INTERVAL", default_value_t = 10.0, value_parser = positive_seconds)]
    pub controller_probe_interval: f64,

    /// Controller: share of speculation rounds that try a draft length other than the
    /// best estimate, to keep the verify-cost estimates of neighbouring K fresh.
    #[arg(long, env = "SPECD_CONTROLLER_EXPLORE", default_value_t = 0.05, value_parser = fraction)]
    pub controller_explore: f64,

    /// Controller: while recent `auto` requests got (almost) no tokens from speculation,
    /// only one in this many new `auto` requests runs through specd's loop (relaying and
    /// watching for a chance to speculate); the others pass through untouched, so that
    /// specd costs nothing where speculation does not pay. 1 watches every request.
    #[arg(long, env = "SPECD_CONTROLLER_WATCH_EVERY", default_value_t = 8, value_parser = at_least_one)]
    pub controller_watch_every: usize,

    /// tokenizer.json or tiktoken.model (or a directory holding either) of the upstream's
    /// model. Default: the model directory the upstream reports, when it is readable here.
    #[arg(long, env = "SPECD_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,

    /// HF model directory of a draft model for the `model` drafter.
    #[arg(long, env = "SPECD_DRAFT_MODEL")]
    pub draft_model: Option<PathBuf>,

    /// Device for the draft model: cpu, cuda or cuda:N.
    #[arg(long, env = "SPECD_DRAFT_DEVICE", default_value = "cpu")]
    pub draft_device: DraftDevice,

    /// Draft model weights dtype: f32, bf16 or f16 (default f32 on the CPU, bf16 on CUDA).
    #[arg(long, env = "SPECD_DRAFT_DTYPE")]
    pub draft_dtype: Option<DraftDtype>,

    /// Streams with a draft-model KV cache slot (default 16 on the CPU, 32 on CUDA).
    #[arg(long, env = "SPECD_DRAFT_MAX_STREAMS")]
    pub draft_max_streams: Option<usize>,

    /// Longest context the draft model drafts for (longer contexts get no proposal).
    #[arg(long, env = "SPECD_DRAFT_MAX_LEN")]
    pub draft_max_len: Option<usize>,

    /// Timeout of one verify call, in seconds.
    #[arg(long, env = "SPECD_VERIFY_TIMEOUT", default_value_t = 30.0, value_parser = positive_seconds)]
    pub verify_timeout: f64,

    /// Connect timeout to the upstream, in seconds.
    #[arg(long, env = "SPECD_CONNECT_TIMEOUT", default_value_t = 5.0, value_parser = positive_seconds)]
    pub connect_timeout: f64,

    /// Close pooled upstream connections idle this long, in seconds. Keep it below the
    /// upstream's keep-alive timeout (uvicorn, under vLLM and SGLang: 5 s), so specd
    /// never sends a request on a connection the server is closing at that moment.
    #[arg(long, env = "SPECD_UPSTREAM_IDLE_TIMEOUT", default_value_t = 4.0, value_parser = positive_seconds)]
    pub upstream_idle_timeout: f64,

    /// Interval of the upstream health check, in seconds.
    #[arg(long, env = "SPECD_HEALTH_INTERVAL", default_value_t = 2.0, value_parser = health_interval)]
    pub health_interval: f64,

    /// How long in-flight requests may finish after SIGTERM, in seconds.
    #[arg(long, env = "SPECD_DRAIN_TIMEOUT", default_value_t = 30.0, value_parser = non_negative_seconds)]
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

    /// The upstream's `--reasoning-parser` (vLLM does not report it): chat answers are
    /// split into `reasoning` and `content` as that parser splits them. specd implements
    /// `deepseek_r1`, `qwen3` and `kimi_k2`; with any other name, chat completions pass
    /// through.
    #[arg(long, env = "SPECD_REASONING_PARSER", value_parser = reasoning_parser)]
    pub reasoning_parser: Option<ReasoningParserArg>,

    /// The upstream's `--tool-call-parser` (vLLM does not report it). With
    /// `--enable-auto-tool-choice`, chat answers are parsed for tool calls as that parser
    /// reads them, and requests with `tools` and `tool_choice` `auto` or `none` are
    /// speculated. specd implements `hermes`, `llama3_json`, `kimi_k2` and `qwen3_coder`; with any other
    /// name, chat completions pass through.
    #[arg(long, env = "SPECD_TOOL_CALL_PARSER", value_parser = tool_call_parser)]
    pub tool_call_parser: Option<ToolCallParserArg>,

    /// The upstream runs with `--enable-auto-tool-choice`: its tool-call parser is active
    /// (without it vLLM parses no tool calls, and requests with `tools` pass through).
    #[arg(long, env = "SPECD_ENABLE_AUTO_TOOL_CHOICE", default_value_t = false)]
    pub enable_auto_tool_choice: bool,

    /// Enable the `oracle` and `adversarial` drafters, which take the expected tokens from
    /// the request. For tests only.
    #[arg(long, env = "SPECD_ENABLE_TEST_DRAFTERS", default_value_t = false)]
    pub enable_test_drafters: bool,
}

impl ServeArgs {
    pub fn verify_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.verify_timeout)
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout)
    }
    pub fn upstream_idle_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.upstream_idle_timeout)
    }
    pub fn health_interval(&self) -> Duration {
        Duration::from_secs_f64(self.health_interval)
    }
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.drain_timeout)
    }
}

// Flag values are checked when parsed: a value out of range stops specd at start with a
// message naming the flag, instead of being silently clamped.

fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "`{s}` must be a finite number of seconds, at least 0"
        ));
    }
    Ok(v)
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match seconds(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err(format!("`{s}` must be more than 0 seconds")),
    }
}

fn non_negative_seconds(s: &str) -> Result<f64, String> {
    seconds(s)
}

fn health_interval(s: &str) -> Result<f64, String> {
    match seconds(s)? {
        v if v >= 0.05 => Ok(v),
        _ => Err(format!("`{s}` is too short: at least 0.05 seconds")),
    }
}

fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("`{s}` must be between 0 and 1"));
    }
    Ok(v)
}

fn fraction_f32(s: &str) -> Result<f32, String> {
    fraction(s).map(|v| v as f32)
}

fn at_least(s: &str, min: usize) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= min => Ok(v),
        _ => Err(format!("`{s}` must be a whole number, at least {min}")),
    }
}

/// The range a request's `speculation.max_draft_tokens` accepts.
fn draft_tokens(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v <= 64 => Ok(v),
        _ => Err(format!("`{s}` must be a whole number in 0..=64")),
    }
}

fn auto_draft_tokens(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if (1..=K_TRACKED).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` must be a whole number in 1..={K_TRACKED}")),
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    at_least(s, 1)
}

fn at_least_two(s: &str) -> Result<usize, String> {
    at_least(s, 2)
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::ServeArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(extra: &[&str]) -> Result<ServeArgs, String> {
        let mut argv = vec!["specd", "--upstream", "http://x"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv)
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn out_of_range_values_are_rejected_not_clamped() {
        for bad in [
            ["--verify-timeout", "0"],
            ["--verify-timeout", "-1"],
            ["--drain-timeout", "nan"],
            ["--health-interval", "0.001"],
            ["--controller-explore", "1.5"],
            ["--controller-watch-every", "0"],
            ["--suffix-max-depth", "1"],
            ["--draft-device", "tpu"],
            ["--draft-dtype", "int3"],
            ["--drafter", "magic"],
        ] {
            let arg = format!("{}={}", bad[0], bad[1]);
            let e = parse(&[&arg])
                .err()
                .unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(e.contains(bad[0]), "{bad:?}: {e}");
        }
        let ok = parse(&["--verify-timeout", "2.5", "--drain-timeout", "0"]).expect("valid");
        assert_eq!(ok.reasoning_parser, None);
        assert_eq!(ok.tool_call_parser, None);
        assert!(!ok.enable_auto_tool_choice);
        assert_eq!(ok.verify_timeout().as_secs_f64(), 2.5);
    }

    #[test]
    fn reasoning_parser_names() {
        use super::{ReasoningParser, ReasoningParserArg};
        let p = |v: &str| parse(&["--reasoning-parser", v]).map(|a| a.reasoning_parser);
        assert_eq!(
            p("deepseek_r1"),
            Ok(Some(ReasoningParserArg::Known(ReasoningParser::DeepseekR1)))
        );
        assert_eq!(
            p("qwen3"),
            Ok(Some(ReasoningParserArg::Known(ReasoningParser::Qwen3)))
        );
        assert_eq!(
            p("kimi_k2"),
            Ok(Some(ReasoningParserArg::Known(ReasoningParser::KimiK2)))
        );
        assert_eq!(
            p("gptoss"),
            Ok(Some(ReasoningParserArg::Unimplemented("gptoss".into())))
        );
    }

    #[test]
    fn tool_call_parser_names() {
        use super::{ToolCallParser, ToolCallParserArg};
        let p = |v: &[&str]| parse(v).map(|a| (a.tool_call_parser, a.enable_auto_tool_choice));
        assert_eq!(
            p(&["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]),
            Ok((Some(ToolCallParserArg::Known(ToolCallParser::Hermes)), true))
        );
        assert_eq!(
            p(&["--tool-call-parser", "llama3_json"]),
            Ok((
                Some(ToolCallParserArg::Known(ToolCallParser::Llama3Json)),
                false
            ))
        );
        assert_eq!(
            p(&["--tool-call-parser", "kimi_k2"]),
            Ok((
                Some(ToolCallParserArg::Known(ToolCallParser::KimiK2)),
                false
            ))
        );
        assert_eq!(
            p(&["--tool-call-parser", "pythonic"]),
            Ok((
                Some(ToolCallParserArg::Unimplemented("pythonic".into())),
                false
            ))
        );
        assert!(p(&["--tool-call-parser", " "]).is_err());
    }
}
