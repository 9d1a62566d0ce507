//! `specd-sim`: a latency-model stand-in for a vLLM server, used only by specd's
//! benchmarks and tests — not a product feature and never deployed.
//!
//! It speaks the subset of vLLM's HTTP API that specd uses (`/health`, `/v1/models`,
//! `/version`, `/tokenize`, `/metrics`, and `/v1/completions` with token-id prompts,
//! `logprobs` + `return_tokens_as_token_ids`, streaming). Its clock is a cost model with
//! continuous batching: every engine step costs
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
//! The next token is a deterministic function of the context (`next_token`), whatever
//! the sampling parameters say. Benchmarks compute the true continuation with the same
//! function and hand specd's `oracle` test drafter a copy in which each position is
//! corrupted with a chosen probability: that sets the acceptance per position exactly.

mod engine;
pub mod server;

pub use engine::Engine;

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

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The token the sim produces after a context of length `len` ending in `last3`
/// (oldest first; missing entries are 0).
pub fn next_after(last3: [u32; 3], len: usize, vocab: u32) -> u32 {
    let mut h = (len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for t in last3 {
        h = mix(h ^ u64::from(t).wrapping_add(0x632B_E59B_D9B4_E019));
    }
    4 + (h % u64::from(vocab.max(5) - 4)) as u32
}

/// The token the sim produces after `ctx`.
pub fn next_token(ctx: &[u32], vocab: u32) -> u32 {
    let n = ctx.len();
    let at = |back: usize| if n >= back { ctx[n - back] } else { 0 };
    next_after([at(3), at(2), at(1)], n, vocab)
}

/// The sim's continuation of `prompt`, `n` tokens long.
pub fn continuation(prompt: &[u32], n: usize, vocab: u32) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    for _ in 0..n {
        let t = next_token(&ctx, vocab);
        ctx.push(t);
    }
    ctx.split_off(prompt.len())
}

/// Copy of `truth` where position i is kept with probability `keep(i)` and otherwise
/// replaced by another token; deterministic in `seed`.
pub fn corrupt(truth: &[u32], keep: impl Fn(usize) -> f64, seed: u64, vocab: u32) -> Vec<u32> {
    let mut rng = fastrand::Rng::with_seed(seed);
    truth
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if rng.f64() < keep(i) {
                t
            } else {
                4 + (t - 4 + 1 + rng.u32(0..vocab.max(6) - 5)) % (vocab.max(6) - 4)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_deterministic_and_in_range() {
        let p = [5, 6, 7, 8];
        let a = continuation(&p, 50, 4096);
        assert_eq!(a, continuation(&p, 50, 4096));
        assert!(a.iter().all(|&t| (4..4096).contains(&t)));
        assert_ne!(a, continuation(&[5, 6, 7, 9], 50, 4096));
        let mut ctx = p.to_vec();
        ctx.extend(&a[..10]);
        assert_eq!(next_token(&ctx, 4096), a[10]);
    }

    #[test]
    fn corruption_follows_the_keep_probability() {
        let truth = continuation(&[1, 2, 3], 20_000, 4096);
        let c = corrupt(&truth, |_| 0.7, 9, 4096);
        let kept = truth.iter().zip(&c).filter(|(a, b)| a == b).count();
        assert!((13_600..14_400).contains(&kept), "{kept}");
        assert!(c.iter().all(|&t| (4..4096).contains(&t)));
        assert_eq!(corrupt(&truth[..5], |_| 0.0, 1, 4096).len(), 5);
        assert!(corrupt(&truth[..50], |_| 0.0, 1, 4096)
            .iter()
            .zip(&truth)
            .all(|(a, b)| a != b));
    }
}
