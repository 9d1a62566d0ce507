//! Drafter pacing: which drafters draft for a proposal. A proposal nobody expects to
//! verify — a shadow proposal while relaying, or a costly drafter's beside a cheaper
//! drafter's expected to win the round — is drafted only to keep that drafter's estimates
//! current, so it gets a small share of the stream's time: one proposal per `stride`
//! tokens, the stride set by the drafter's measured cost against the decode cost. A draft
//! model on the upstream's own CPU takes that time from the upstream's decoding, which no
//! estimate of specd's own cost sees; the share bounds it. A drafter expected to pay is
//! checked more often (its proposal may end a relay), and in a round it drafts whenever it
//! is expected to beat the best proposal drafted already.

use super::{Controller, StreamCtl};
use crate::draft::{DrafterKind, Proposal};

/// Share of the stream's decode time a drafter not expected to pay may spend drafting.
pub const SHADOW_SHARE: f64 = 0.03;
/// The same for a drafter expected to pay (relaying: its proposal may end the relay).
pub const PAYING_SHARE: f64 = 0.25;
/// Most tokens between two proposals of one drafter (its estimates must not go stale).
pub const MAX_STRIDE: u32 = 64;

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
    /// The stream's token count when the drafter last drafted (None: not yet).
    at: Option<u32>,
    /// Confidences of its last proposal: its next one is valued by them before it exists.
    shape: Vec<f32>,
}

impl StreamCtl {
    /// `n` more tokens of the stream were emitted (relayed or verified).
    pub fn advance(&mut self, n: u32) {
        self.tokens = self.tokens.saturating_add(n);
    }
}

impl Controller {
    /// `drafter` drafted `p` for this stream now.
    pub fn drafted(&self, s: &mut StreamCtl, drafter: DrafterKind, p: &Proposal) {
        let tokens = s.tokens;
        let pace = &mut s.pace[drafter.index()];
        pace.at = Some(tokens);
        pace.shape.clone_from(&p.confidence);
    }

    /// Tokens per second of the best round of a proposal with confidences `conf`, by this
    /// stream's estimates; None before a verify was timed. Unlike `proposal_value` it
    /// posts nothing to the batch verdict: it only ranks drafters.
    fn shape_rate(&self, s: &StreamCtl, drafter: DrafterKind, conf: &[f32]) -> Option<f64> {
        if conf.is_empty() {
            return Some(0.0);
        }
        let p = self
            .acceptance
            .per_position(s.residual(drafter), drafter, conf);
        let spec = self.load.speculating();
        let costs = self.costs.costs(self.load(), spec, conf.len(), self.now());
        let t_draft = self.costs.draft_cost_per_round(drafter);
        costs
            .best(&p, t_draft, 1, 0, spec)
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

    /// Tokens between proposals of `drafter` drafting `share` of the decode time; 1 while
    /// its cost or the decode cost is unknown.
    fn stride(&self, drafter: DrafterKind, share: f64) -> u32 {
        let cost = self.costs.draft_seconds(drafter).unwrap_or(0.0);
        let dec = self.decode_cost_estimate(self.load()).unwrap_or(0.0);
        if cost <= 0.0 || dec <= 0.0 {
            return 1;
        }
        // `as` saturates, so a huge ratio lands on the clamp.
        ((cost / (share * dec)).ceil() as u32).clamp(1, MAX_STRIDE)
    }

    /// Cheap enough to draft for every proposal: its shadow proposals fit the shadow share
    /// at a stride of one token (or it is not measured yet).
    pub fn drafts_cheaply(&self, drafter: DrafterKind) -> bool {
        self.stride(drafter, SHADOW_SHARE) <= 1
    }

    /// Should `drafter` draft for the stream's next proposal, competing with `rival`?
    /// Relaying: once its stride has passed (the paying share when expected to beat plain
    /// decoding, else the shadow share). In a round: at once when expected to beat the
    /// best proposal drafted already, else once its shadow stride has passed.
    pub fn draft_due(&self, s: &StreamCtl, drafter: DrafterKind, rival: Rival) -> bool {
        let Some(at) = s.pace[drafter.index()].at else {
            return true;
        };
        let Some(dec) = self.decode_cost_estimate(self.load()) else {
            return true;
        };
        if self.drafts_cheaply(drafter) {
            return true;
        }
        let wins = self.expected_to_win(s, drafter, rival, dec);
        let share = match (rival, wins) {
            (Rival::Rate(_), true) => return true,
            (Rival::Plain, true) => PAYING_SHARE,
            (_, false) => SHADOW_SHARE,
        };
        s.tokens.saturating_sub(at) >= self.stride(drafter, share)
    }
}

#[cfg(test)]
#[path = "pacing_tests.rs"]
mod tests;
