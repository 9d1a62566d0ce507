//! The decision rule (module documentation of `controller`): what a speculating stream
//! does with its next proposal, and whether a relaying stream leaves relay.

use std::time::Duration;

use super::acceptance::AcceptanceModel;
use super::batch::{Gain, Weigh};
use super::costs::{first_round_k, Costs, Probe, DEC_HINGES, RATIO_MAX, STALE_TRUST};
use super::rounds::{expected_tokens, Best, Terms};
use super::{Controller, Decision, StreamCtl, K_TRACKED};
use crate::config::SpecMode;
use crate::draft::{DrafterKind, Proposal};

/// Rounds a state (speculation paying or not) is expected to last, when weighing a switch
/// against the cost of restarting a relay; fewer when the generation ends sooner.
pub(super) const SWITCH_HORIZON: f64 = 4.0;

/// Rounds the current state is expected to last: at least `SWITCH_HORIZON`, and as long
/// as it has lasted already (`streak` rounds of the same verdict: a state that has lasted
/// n rounds is expected to last about n more), never past the end of the generation.
fn horizon(remaining: usize, tokens_per_round: f64, streak: u32) -> f64 {
    let rounds_left = remaining as f64 / tokens_per_round.max(1.0);
    SWITCH_HORIZON
        .max(f64::from(streak))
        .min(rounds_left)
        .max(1.0)
}

/// Standard deviations of its residual's noise by which a stream alone lowers its
/// acceptance estimates to judge a switch into speculation (leaving, and K, use the
/// estimates as they are). A relaying stream re-checks at every shadow-drafted token, so
/// where speculation is near break-even the noisy estimate crosses into a gain by chance,
/// and the stream switched on that chance, lost its rounds and paid a relay restart to
/// leave again (docs/controller.md, "The rule"). In a batch of several streams each
/// residual is quieted already (`Residual::quieted`); lowered there too, the batch
/// entered too late where it wins by 10–20 %.
pub(super) const ENTRY_SIGMAS: f64 = 1.0;

/// Explore a K only while its estimated rate is at least this share of the best one's: a
/// K estimated far worse would need its verify cost to be far off to matter.
const EXPLORE_WITHIN: f64 = 0.9;

/// A K near `best` (within a quarter of `kp`, at least 1 away) to explore: measuring the
/// neighbours keeps the verify costs around the best current, and a round far from it
/// (K = 1 where 16 would be accepted) would cost much of what speculation gains.
fn neighbour(rng: &mut fastrand::Rng, best: usize, kp: usize) -> usize {
    let reach = (kp / 4).max(1);
    let d = rng.usize(1..=reach);
    let k = if best > d && (best + d > kp || rng.bool()) {
        best - d
    } else {
        best + d
    };
    k.clamp(1, kp)
}

/// What a decision is made from: the load, the acceptance estimates of the proposal and
/// the costs at that load, and what a round saves with the whole batch verifying.
struct Inputs {
    load: usize,
    terms: Terms,
    p: Vec<f64>,
    costs: Costs,
    /// Seconds the best round saves against plain decoding when every stream of the loop
    /// verifies in the same step (the stream's entry in the batch verdict).
    together: Option<Gain>,
    /// A stream alone: the acceptance a switch into speculation is judged by.
    entry_p: Option<Vec<f64>>,
    /// The batch speculates: this stream joins its verify steps (relaying beside them, a
    /// token would cost a verify step, and a round yields at least that token).
    joins: bool,
}

impl Controller {
    fn inputs(
        &self,
        s: &StreamCtl,
        drafter: DrafterKind,
        proposal: &Proposal,
        self_relaying: bool,
    ) -> Inputs {
        let now = self.now();
        let load = self.load();
        let kp = proposal.tokens.len();
        let p = self.acceptance.per_position(
            s.residual(drafter),
            drafter,
            &proposal.confidence,
            self.load.in_loop(),
        );
        let t_draft = self.costs.draft_cost_per_round(drafter);
        // The batch speculates or relays as one (`batch.rs`): when it speculates, the
        // streams of the loop share its verify steps and only the sequences outside the
        // loop pay for them; when it relays, every stream decoding beside a verify does.
        let in_loop = self.load.in_loop().max(1);
        let outside = self.load.outside(now);
        let all = self.costs.costs(load, in_loop, kp, now);
        let entry_p = (in_loop == 1).then(|| AcceptanceModel::lowered(&p, ENTRY_SIGMAS));
        let whole = Terms::together(t_draft, in_loop);
        let together = match (all.dec, all.best(&p, 1, whole)) {
            (Some(dec), Some(b)) => Some(Gain {
                saving: b.saving(dec),
                entry: all.saving_judged(entry_p.as_deref(), &b, dec, whole),
                step_loss: b.step_loss,
                tokens: b.tokens,
            }),
            _ => None,
        };
        let weigh = Weigh {
            own: together,
            outside,
            in_loop,
            restart: all.dec.map_or(0.0, |d| all.restart_extra(d)),
            // A relaying stream weighs the batch at every token it shadow-drafts.
            checks_per_round: if self_relaying {
                together.map_or(1.0, |g| g.tokens.max(1.0))
            } else {
                1.0
            },
        };
        let verdict = self.batch.speculates(s.batch.as_ref(), &weigh);
        let (others, spec) = if let Some(relayers) = verdict {
            (outside + relayers, in_loop.saturating_sub(relayers).max(1))
        } else {
            let others = self.load.others_decoding(self_relaying, outside);
            (others, load.saturating_sub(others).max(1))
        };
        Inputs {
            load,
            terms: Terms {
                t_draft,
                others,
                spec,
            },
            p,
            // With the whole loop verifying, these are the costs already at hand.
            costs: if spec == in_loop {
                all
            } else {
                self.costs.costs(load, spec, kp, now)
            },
            together,
            entry_p,
            joins: verdict.is_some() && together.is_some(),
        }
    }

    /// Record this stream's saving with the whole batch verifying, for the batch verdict.
    fn post(&self, s: &mut StreamCtl, x: &Inputs) {
        if let Some(g) = x.together {
            self.batch.post(&mut s.batch, g);
        }
    }

    /// Speculating: what this round does with `proposal` (already cut to the round's cap).
    pub fn plan_round(
        &self,
        s: &mut StreamCtl,
        mode: SpecMode,
        drafter: DrafterKind,
        proposal: &Proposal,
        remaining: usize,
    ) -> Decision {
        let kp = proposal.tokens.len();
        if mode != SpecMode::Auto {
            return Decision::Speculate(kp);
        }
        let x = self.inputs(s, drafter, proposal, false);
        self.post(s, &x);
        let lo = usize::from(s.may_relay);
        let best = x.costs.best(&x.p, lo, x.terms);
        // How far the round wins under the cheapest plausible decode cost; near the end of
        // a generation the round is short because the cap is, which says nothing of that.
        let margin = |b: &Best| {
            if remaining < 2 * K_TRACKED {
                f64::INFINITY
            } else {
                b.tokens / RATIO_MAX
            }
        };
        match (x.costs.dec, best) {
            // Never measured a verify round: measure one if there is anything to verify.
            (_, None) if kp > 0 => Decision::Speculate(first_round_k(x.load, kp)),
            (_, None) if !s.may_relay || (remaining <= 1 && x.costs.verify_ends_sooner()) => {
                Decision::Speculate(0)
            }
            (_, None) => Decision::Relay { probe: false },
            // Decode cost unknown, but the round wins under any plausible one: speculate,
            // and measure it later (`CostModel::defer_probe`).
            (None, Some(b))
                if s.may_relay
                    && !self.batch.probing()
                    && (b.wins_unmeasured(x.load, self.costs.probe_deferred(x.load))
                        || b.ends(remaining))
                    && self.costs.defer_probe(x.load, margin(&b), self.now()) =>
            {
                Decision::Speculate(b.k)
            }
            // Decode cost unknown: relay (plain decoding is never a loss) and measure it;
            // one stream per interval holds the probe, which keeps it relaying a while.
            (None, Some(_)) if s.may_relay => Decision::Relay {
                probe: self.costs.claim_probe(
                    x.load,
                    Probe::Decode(self.costs.decode_probe_every(false, false)),
                    self.now(),
                ),
            },
            (None, Some(b)) => Decision::Speculate(b.k),
            (Some(dec), Some(b)) => {
                self.publish_speedup(drafter, b.speedup(dec));
                let d = self.speculating_decision(s, &x, &b, dec, kp, remaining);
                tracing::debug!(
                    ?d,
                    k = b.k,
                    tokens = b.tokens,
                    round_ms = b.time * 1e3,
                    dec_ms = dec * 1e3,
                    restart_ms = x.costs.restart.map(|r| r * 1e3),
                    residual = s.residual(drafter).value(),
                    p = ?x.p,
                    load = x.load,
                    others = x.terms.others,
                    joins = x.joins,
                    "plan round"
                );
                d
            }
        }
    }

    /// A speculating stream with every cost measured: stay at the best K, explore another,
    /// probe the decode cost, or relay.
    fn speculating_decision(
        &self,
        s: &mut StreamCtl,
        x: &Inputs,
        b: &Best,
        dec: f64,
        kp: usize,
        remaining: usize,
    ) -> Decision {
        if !s.may_relay {
            return Decision::Speculate(b.k);
        }
        if self.batch.probing() {
            return Decision::Relay { probe: true };
        }
        if b.speedup(dec) < 1.0 && !x.joins {
            // Leaving costs a relay restart; stay when a few such rounds lose less than
            // that (a small dip in the estimates must not cause flapping), but not for
            // long: the longer it has lost, the longer it is expected to go on losing.
            let loss = -b.saving(dec);
            s.streak += 1;
            if horizon(remaining, b.tokens, s.streak) * loss > x.costs.restart_extra(dec) {
                s.streak = 0;
                return Decision::Relay { probe: false };
            }
            return Decision::Speculate(b.k);
        }
        s.streak = 0;
        // Whether the decision hinges on T_dec is a question about the stream's recent
        // rounds, not this one: one round's estimate dips with every run of rejected
        // drafts, and each dip under `DEC_HINGES` cost a probe's relayed tokens.
        let trend = s.speedup_trend.update(b.speedup(dec));
        // Near the end of a generation the round is short because the cap is, not because
        // speculation is marginal: that does not make T_dec worth a probe.
        let hinges = (trend < DEC_HINGES || x.costs.dec_suspect) && remaining >= 2 * K_TRACKED;
        let every = self.costs.decode_probe_every(hinges, x.costs.dec_suspect);
        if x.costs.dec_age > every.as_secs_f64()
            && self
                .costs
                .claim_probe(x.load, Probe::Decode(every), self.now())
        {
            return Decision::Relay { probe: true };
        }
        if kp >= 2 {
            // The batch explores together (`Batch::explore`); only a K that could
            // plausibly be the best is worth a round to measure.
            let window = Duration::from_secs_f64(b.time / 2.0);
            let (rng, p) = (&mut s.rng, self.cfg.explore);
            let start = || (rng.f64() < p).then(|| neighbour(rng, b.k, kp) as isize - b.k as isize);
            if let Some(d) = self.batch.explore(self.now(), window, start) {
                let k = (b.k as isize + d).clamp(1, kp as isize) as usize;
                let rate = |r: &Best| r.tokens / r.time;
                let near = x.costs.round(&x.p, k, x.terms);
                if k != b.k && near.is_some_and(|n| rate(&n) >= EXPLORE_WITHIN * rate(b)) {
                    return Decision::Speculate(k);
                }
            }
        }
        Decision::Speculate(b.k)
    }

    /// What `proposal` is worth to this stream, to choose among drafters' proposals for
    /// one round: the expected tokens per second of its best round (its drafter's cost and
    /// acceptance), or, before any verify was timed, its expected tokens per round.
    pub fn proposal_value(&self, s: &StreamCtl, drafter: DrafterKind, proposal: &Proposal) -> f64 {
        if proposal.tokens.is_empty() {
            return 0.0;
        }
        let x = self.inputs(s, drafter, proposal, false);
        match x.costs.best(&x.p, 1, x.terms) {
            Some(b) => b.tokens / b.time,
            None => expected_tokens(&x.p, x.p.len()),
        }
    }

    /// Relaying: leave relay for a verify round of the returned K with this proposal?
    pub fn plan_resume(
        &self,
        s: &mut StreamCtl,
        drafter: DrafterKind,
        proposal: &Proposal,
        remaining: usize,
    ) -> Option<usize> {
        let kp = proposal.tokens.len();
        if kp == 0 {
            return None;
        }
        let x = self.inputs(s, drafter, proposal, true);
        self.post(s, &x);
        if self.batch.probing() {
            return None;
        }
        let Some(b) = x.costs.best(&x.p, 1, x.terms) else {
            // Verify cost never measured: measure it (one stream per interval).
            return self
                .costs
                .claim_probe(x.terms.spec, Probe::Verify, self.now())
                .then_some(kp);
        };
        let dec = x.costs.dec?;
        self.publish_speedup(drafter, b.speedup(dec));
        // Time the round saves, net of what it costs the others, against the extra cost
        // of restarting a relay when speculation stops paying again; a stream alone judges
        // the switch by its acceptance lowered by its noise (`ENTRY_SIGMAS`).
        let gain = b.saving(dec);
        let entry = x
            .costs
            .saving_judged(x.entry_p.as_deref(), &b, dec, x.terms);
        let switch_cost = x.costs.restart_extra(dec);
        if gain > 0.0 {
            s.streak += 1;
        } else {
            s.streak = 0;
        }
        let rounds = horizon(remaining, b.tokens, s.streak);
        tracing::debug!(
            k = b.k,
            tokens = b.tokens,
            round_ms = b.time * 1e3,
            dec_ms = dec * 1e3,
            switch_ms = switch_cost * 1e3,
            residual = s.residual(drafter).value(),
            p = ?x.p,
            load = x.load,
            others = x.terms.others,
            together_ms = x.together.map(|g| g.saving * 1e3),
            entry_ms = entry * 1e3,
            "plan resume"
        );
        if x.joins || (entry > 0.0 && entry * rounds > switch_cost) {
            s.streak = 0;
            return Some(b.k);
        }
        // A stale verify cost may hide a chance (it may have been measured in a load
        // spike): re-measure when an optimistic guess pays. The older the estimate, the
        // less it is trusted, so a high one cannot keep speculation off for good.
        // One that looks like a stall (`Costs::ver_suspect`) is re-measured whatever the
        // round is worth under it: it charges the round the stall, and the streams beside
        // it their own slowdown by the stall too.
        let trust = STALE_TRUST.powf(x.costs.ver_staleness);
        let optimistic = b.tokens * dec > x.terms.t_draft + trust * (b.time - x.terms.t_draft);
        let stale = x.costs.ver_staleness > 0.0;
        let probe = if x.costs.ver_suspect {
            Probe::SuspectVerify
        } else {
            Probe::Verify
        };
        (((stale && optimistic) || x.costs.ver_suspect)
            && self.costs.claim_probe(x.terms.spec, probe, self.now()))
        .then_some(b.k)
    }
}
