//! `specd-sim`: a fake vLLM server for specd's benchmarks and tests — not a product
//! feature and never deployed.
//!
//! One server ([`Upstream`]) speaks the subset of vLLM's HTTP API that specd uses
//! (`/health`, `/v1/models`, `/version`, `/tokenize`, `/detokenize`, `/metrics`, and
//! `/v1/completions` with text or token-id prompts, `logprobs` +
//! `return_tokens_as_token_ids`, streaming; `/v1/chat/completions` with its prompt rendered
//! in ChatML, `tools` included). Its tokens follow one rule ([`Tokens`]) and its
//! clock is pluggable ([`Timing`]): immediate, for tests, or a cost model with continuous
//! batching, for `specd-sim serve` and the scenario benchmarks. Every engine step costs
//!
//! ```text
//! base + per_seq × decoding sequences + per_prefill_token × new prompt tokens
//!      + (extend, when the step computes any prompt tokens)
//! ```
//!
//! where new prompt tokens are those past the cached full blocks of a prefix cache, as in
//! vLLM. A verify call (K+1 prompts, `max_tokens: 1`) is therefore one extend pass; a
//! streamed continuation is one extend pass then one decode step per token. Each request
//! also waits `api` before it joins a step (HTTP, tokenization, scheduling).
//!
//! Benchmarks compute the true continuation with the same rule and hand specd's `oracle`
//! test drafter a copy in which each position is corrupted with a chosen probability: that
//! sets the acceptance per position exactly. Tests inject faults ([`fault`]): refused
//! connections, delays, 5xx answers, malformed JSON, cut responses, requests never answered.

mod engine;
pub mod fault;
pub mod server;
mod tokens;
pub mod upstream;

pub use engine::Engine;
pub use tokens::{continuation, corrupt, next_token, Tokens};
pub use upstream::{Options, Timing, Upstream};

/// The cost model, in milliseconds. Defaults: the field figures of a communication-bound
/// 8-GPU server — a decode step of 12.1 ms for one stream, an extend (verify) pass of a
/// few tokens ≈ 30 ms.
#[derive(Debug, Clone, clap::Args)]
pub struct SimConfig {
    /// Fixed cost of every engine step.
    #[arg(long, default_value_t = 12.0)]
    pub base_ms: f64,
    /// Cost per decoding sequence in a step.
    #[arg(long, default_value_t = 0.1)]
    pub per_seq_ms: f64,
    /// Cost per prompt token computed in a step (past the prefix cache).
    #[arg(long, default_value_t = 0.05)]
    pub per_prefill_token_ms: f64,
    /// Extra cost of a step that computes prompt tokens (the non-graph extend path).
    #[arg(long, default_value_t = 17.5)]
    pub extend_ms: f64,
    /// Delay before a request joins the batch.
    #[arg(long, default_value_t = 0.5)]
    pub api_ms: f64,
    /// Prefix-cache block size in tokens.
    #[arg(long, default_value_t = 16)]
    pub block: usize,
    /// Token ids produced are in 4..vocab (0..3 are the test models' special tokens).
    #[arg(long, default_value_t = 4096)]
    pub vocab: u32,
    /// Context length reported in `/v1/models`.
    #[arg(long, default_value_t = 8192)]
    pub max_model_len: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            base_ms: 12.0,
            per_seq_ms: 0.1,
            per_prefill_token_ms: 0.05,
            extend_ms: 17.5,
            api_ms: 0.5,
            block: 16,
            vocab: 4096,
            max_model_len: 8192,
        }
    }
}
