//! What a simulated scenario is made of: the upstream's latency model (a continuous
//! batching server whose step costs 12 ms + 0.1 ms per sequence, plus 17.5 ms when it
//! computes prompt tokens — a verify, a relay start — so decode ≈ 12.1 ms and a verify
//! ≈ 30 ms nearly flat in K, as in the field), the drafts' acceptance by position, and the
//! noise.

use std::time::Duration;

/// Acceptance of draft `i` (0-based) at generation position `g`, given drafts `0..i` were
/// accepted.
#[derive(Debug, Clone, Copy)]
pub enum Acceptance {
    Constant(f64),
    /// `a · d^i`: later drafts of a proposal are worse.
    Decay {
        a: f64,
        d: f64,
    },
    /// From `from` to `to` linearly over the first `over` tokens, then `to`.
    Ramp {
        from: f64,
        to: f64,
        over: u32,
    },
    /// `first` until position `at`, `then` after it (a phase change).
    Step {
        first: f64,
        then: f64,
        at: u32,
    },
    /// Phases of `len` tokens alternating between `hi` and `lo`.
    Alternating {
        hi: f64,
        lo: f64,
        len: u32,
    },
}

impl Acceptance {
    pub fn p(&self, g: u32, i: usize) -> f64 {
        match *self {
            Acceptance::Constant(a) => a,
            Acceptance::Decay { a, d } => a * d.powi(i as i32),
            Acceptance::Ramp { from, to, over } => {
                let t = (f64::from(g) / f64::from(over.max(1))).min(1.0);
                from + t * (to - from)
            }
            Acceptance::Step { first, then, at } => {
                if g < at {
                    first
                } else {
                    then
                }
            }
            Acceptance::Alternating { hi, lo, len } => {
                if (g / len.max(1)) % 2 == 0 {
                    hi
                } else {
                    lo
                }
            }
        }
    }

    /// The position of a single phase change, if the script has one.
    pub fn change_at(&self) -> Option<(u32, f64, f64)> {
        match *self {
            Acceptance::Step { first, then, at } => Some((at, first, then)),
            _ => None,
        }
    }
}

/// Disturbances of the upstream's speed and of the stream of relayed tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noise {
    /// Each step's cost is multiplied by a uniform factor in 1 ± jitter.
    pub jitter: f64,
    /// Probability per step of a stall of 100–300 ms (a GC pause, a preemption).
    pub stall: f64,
    /// Probability per step that relayed tokens are held back and arrive in a burst.
    pub burst: f64,
    /// Extra latency before a relay's first step (a slow proxy hop, queueing).
    pub slow_relay: Duration,
    /// A window of virtual time in which every step costs `factor` times as much.
    pub spike: Option<(Duration, Duration, f64)>,
    /// Requests of other clients decoding in every step, and the probability per step
    /// that one of them starts (a prefill in that step).
    pub others: u32,
    pub others_prefill: f64,
}

/// The upstream's step cost model.
#[derive(Debug, Clone, Copy)]
pub struct Upstream {
    pub step: f64,
    pub per_seq: f64,
    pub prefill: f64,
    pub per_draft: f64,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            step: 0.012,
            per_seq: 0.0001,
            prefill: 0.0175,
            per_draft: 0.00005,
        }
    }
}

impl Upstream {
    /// Seconds of one step before noise.
    pub fn step_cost(&self, seqs: usize, prefill: bool, drafts: usize) -> f64 {
        self.step
            + self.per_seq * seqs as f64
            + if prefill { self.prefill } else { 0.0 }
            + self.per_draft * drafts as f64
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub acceptance: Acceptance,
    pub noise: Noise,
    pub noise_name: &'static str,
    pub streams: usize,
    /// Requests each stream sends one after the other, and tokens per request.
    pub requests: u32,
    pub tokens: u32,
    pub seed: u64,
    /// Seconds a proposal takes, on the upstream's own time (a draft model on its CPU);
    /// zero: drafting is free.
    pub draft_cost: f64,
}

/// What a run measured.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// Mean over streams of tokens per second of virtual time.
    pub rate: f64,
    /// Most consecutive rounds with nothing accepted while the controller's own estimates
    /// said a decode step was cheaper than that verify.
    pub zero_streak: u32,
    /// Tokens after a phase change until the stream was in the mode the new phase wants
    /// (worst over requests; None without a phase change).
    pub switch_tokens: Option<u32>,
    /// Seconds after a load spike until speculation resumed (worst; where it resumed).
    pub resume_after_spike: Option<f64>,
    /// Seconds after a load spike until the decode estimate was within 25 % of the truth.
    pub decode_recovery: Option<f64>,
    pub rounds: u64,
    pub relayed: u64,
    /// Tokens generated, and requests passed through untouched (`auto` not watching).
    pub tokens: u64,
    pub passed: u32,
    /// Seconds spent drafting (a costly drafter's).
    pub draft_seconds: f64,
}
