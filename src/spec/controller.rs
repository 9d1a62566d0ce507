//! Decides, per round, how many draft tokens to verify (K), and when a stream should
//! relay (let the upstream decode plainly) instead of speculating.

use crate::config::SpecMode;
use crate::draft::Proposal;

/// What a stream does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Verify the first K proposed tokens (K may be 0: one plain token by verify call).
    Speculate(usize),
    /// Continue with a streamed plain continuation.
    Relay,
}

#[derive(Default)]
pub struct Controller {}

impl Controller {
    pub fn new() -> Self {
        Controller {}
    }

    /// `on`: always speculate with what the drafter proposed. `auto`: speculate when the
    /// drafter has something, relay otherwise.
    pub fn decide(&self, mode: SpecMode, k_max: usize, proposal: &Proposal) -> Decision {
        let k = proposal.tokens.len().min(k_max);
        match mode {
            SpecMode::Auto if k == 0 => Decision::Relay,
            _ => Decision::Speculate(k),
        }
    }

    /// While relaying: is this proposal worth leaving the relay for?
    pub fn should_resume(&self, proposal: &Proposal) -> bool {
        proposal.tokens.len() >= 2
    }
}
