//! Drafter pacing: which drafters draft for a proposal. A proposal nobody expects to
//! verify — a shadow proposal while relaying, or a costly drafter's beside a cheaper
//! drafter's expected to win the round — is drafted only to keep that drafter's estimates
//! current, so it gets a small share of the stream's time: the drafter drafts again once
//! its measured cost is that share of the time since its last proposal. A draft model on
//! the upstream's own CPU takes that time from the upstream's decoding, which no estimate
//! of specd's own cost sees; the share bounds it. A drafter expected to pay is checked
//! more often (its proposal may end a relay), and in a round it drafts whenever it is
//! expected to beat the best proposal drafted already. A drafter whose cost is within the
//! shadow share of one decode step drafts every time.

use std::time::Instant;

use super::rounds::Terms;
use super::{Controller, StreamCtl};
use crate::draft::{DrafterKind, Proposal};

/// Share of the stream's time a drafter not expected to pay may spend drafting.
pub const SHADOW_SHARE: f64 = 0.03;
/// The same for a drafter expected to pay (relaying: its proposal may end the relay).
pub const PAYING_SHARE: f64 = 0.25;
/// Longest wait between two proposals of one drafter, in decode steps (its estimates must
/// not go stale).
pub const MAX_STRIDE: f64 = 64.0;

/// What a drafter's next proposal competes with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rival {
    /// Relaying: plain decoding.
    Plain,
    /// A round: the best proposal drafted for it already, at this many tokens per second.
    Rate(f64),
}

/// One drafter's pacing in one stream.
#[derive(Debug, Clone, Default)]
pub(super) struct Pace {
    /// When the drafter last drafted for the stream (None: not yet).
    at: Option<Instant>,
    /// Confidences of its last proposal: its next one is valued by them before it exists.
    shape: Vec<f32>,
}

impl Controller {
    /// `drafter` drafted `p` for this stream now.
    pub fn drafted(&self, s: &mut StreamCtl, drafter: DrafterKind, p: &Proposal) {
        let pace = &mut s.pace[drafter.index()];
        pace.at = Some(self.now());
        pace.shape.clone_from(&p.confidence);
    }

    /// Tokens per second of the best round of a proposal with confidences `conf`, by this
    /// stream's estimates; None before a verify was timed. Unlike `proposal_value` it
    /// posts nothing to the batch verdict: it only ranks drafters.
    fn shape_rate(&self, s: &StreamCtl, drafter: DrafterKind, conf: &[f32]) -> Option<f64> {
        if conf.is_empty() {
            return Some(0.0);
        }
        let p =
            self.acceptance
                .per_position(s.residual(drafter), drafter, conf, self.load.in_loop());
        let spec = self.load.speculating();
        let costs = self.costs.costs(self.load(), spec, conf.len(), self.now());
        let t_draft = self.costs.draft_cost_per_round(drafter);
        costs
            .best(&p, 1, Terms::together(t_draft, spec))
            .map(|b| b.tokens / b.time)
    }

    /// What a drafted proposal is worth against the proposals still to draft (tokens per
    /// second; 0 for an empty one, infinite before a verify was timed).
    pub fn proposal_rate(&self, s: &StreamCtl, drafter: DrafterKind, p: &Proposal) -> f64 {
        self.shape_rate(s, drafter, &p.confidence)
            .unwrap_or(f64::INFINITY)
    }

    /// Is `drafter`'s next proposal expected to beat `rival`? Valued by the shape of its
    /// last one; without one (or before costs are known), yes: it has to be measured.
    fn expected_to_win(&self, s: &StreamCtl, drafter: DrafterKind, rival: Rival, dec: f64) -> bool {
        let pace = &s.pace[drafter.index()];
        if pace.at.is_none() {
            return true;
        }
        let Some(rate) = self.shape_rate(s, drafter, &pace.shape) else {
            return true;
        };
        match rival {
            Rival::Plain => rate * dec > 1.0,
            Rival::Rate(r) => rate > r,
        }
    }

    /// What a costly drafter's proposal competes with, once the cheap drafters drafted
    /// `drafted`: relaying, plain decoding; in a round, the best of them.
    pub fn rival(
        &self,
        s: &StreamCtl,
        relaying: bool,
        drafted: &[(DrafterKind, Proposal)],
    ) -> Rival {
        if relaying {
            return Rival::Plain;
        }
        let best = drafted
            .iter()
            .map(|(d, p)| self.proposal_rate(s, *d, p))
            .fold(0.0, f64::max);
        Rival::Rate(best)
    }

    /// Cheap enough to draft for every proposal: its cost is within the shadow share of
    /// one decode step (or either is not measured yet).
    pub fn drafts_cheaply(&self, drafter: DrafterKind) -> bool {
        let cost = self.costs.draft_seconds(drafter);
        let dec = self.decode_cost_estimate(self.load());
        match (cost, dec) {
            (Some(cost), Some(dec)) => cost <= SHADOW_SHARE * dec,
            _ => true,
        }
    }

    /// Should `drafter` draft for the stream's next proposal, competing with `rival`? A
    /// cheap one always. Relaying: once its cost is its share of the time since its last
    /// proposal (the paying share when expected to beat plain decoding, else the shadow
    /// share). In a round: at once when expected to beat the best proposal drafted
    /// already, else at the shadow share.
    pub fn draft_due(&self, s: &StreamCtl, drafter: DrafterKind, rival: Rival) -> bool {
        let Some(at) = s.pace[drafter.index()].at else {
            return true;
        };
        let (Some(cost), Some(dec)) = (
            self.costs.draft_seconds(drafter),
            self.decode_cost_estimate(self.load()),
        ) else {
            return true;
        };
        if cost <= SHADOW_SHARE * dec {
            return true;
        }
        let share = match (rival, self.expected_to_win(s, drafter, rival, dec)) {
            (Rival::Rate(_), true) => return true,
            (Rival::Plain, true) => PAYING_SHARE,
            (_, false) => SHADOW_SHARE,
        };
        let wait = (cost / share).min(MAX_STRIDE * dec);
        self.now().saturating_duration_since(at).as_secs_f64() >= wait
    }
}

#[cfg(test)]
#[path = "pacing_tests.rs"]
mod tests;
