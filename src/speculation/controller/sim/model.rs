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

/// Disturbances of the upstream's speed and of the stream of relayed tokens. The
/// machine's are functions of virtual time (see `Draws`): rates per 12 ms of it, about one
/// decode step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noise {
    /// A step's cost is multiplied by a uniform factor in 1 ± jitter.
    pub jitter: f64,
    /// Stalls of 100–300 ms (a GC pause, a preemption) per 12 ms.
    pub stall: f64,
    /// Probability per relayed token that it is held back and arrives in a burst.
    pub burst: f64,
    /// Extra latency before a relay's first step (a slow proxy hop, queueing).
    pub slow_relay: Duration,
    /// A window of virtual time in which every step costs `factor` times as much.
    pub spike: Option<(Duration, Duration, f64)>,
    /// Requests of other clients decoding in every step, and how many of them start (a
    /// prefill in that step) per 12 ms.
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

/// What a random draw of the harness decides.
#[derive(Debug, Clone, Copy)]
pub enum Draw {
    Jitter,
    Stall,
    StallLength,
    OtherPrefill,
    Burst,
    Draft,
}

/// Common random numbers: every draw is a hash of the scenario's seed, what it decides
/// and where (a time slot of the machine, a position of a stream's request), never the
/// next number of a sequence. So every mode of a scenario runs on the same machine — the
/// same stalls at the same times, the same drafts right at the same positions — and two
/// modes' rates differ by their decisions, not by which steps the noise fell on.
#[derive(Debug, Clone, Copy)]
pub struct Draws {
    seed: u64,
}

/// Width of the machine's time slots: its speed, stalls and other clients' arrivals are
/// drawn per slot of virtual time.
pub const SLOT: std::time::Duration = std::time::Duration::from_millis(12);

impl Draws {
    pub fn new(seed: u64) -> Self {
        Draws { seed }
    }

    /// A uniform number in [0, 1) for `what` at `key`.
    pub fn unit(&self, what: Draw, key: &[u64]) -> f64 {
        let mut h = mix(self.seed ^ mix(what as u64));
        for &k in key {
            h = mix(h ^ k);
        }
        (h >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// splitmix64's finaliser: a well-mixed 64-bit hash of `z`.
fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
