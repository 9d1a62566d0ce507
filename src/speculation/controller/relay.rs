//! What a relaying stream measures and decides, token by token: the decode cost (first
//! token latency, gaps between tokens), shadow checks of the drafter against the tokens
//! that arrive, and when to try leaving relay. Pure bookkeeping on timestamps handed in,
//! so the session's relay segment and the simulation harness run the same decisions.

use std::sync::Arc;
use std::time::Instant;

use super::batch::Probe;
use super::{Controller, Relaying, Rival, StreamCtl, PROBE_TOKENS};
use crate::draft::{DrafterKind, Proposal};

/// Tokens averaged per decode-cost sample (streamed tokens may arrive in bursts).
pub(super) const DECODE_WINDOW: u32 = 4;
/// Tokens between samples of the segment's mean gap so far (for the low envelope: a mean
/// over the whole segment, which a burst of buffered tokens barely moves).
pub(super) const SEGMENT_SAMPLE: u32 = 16;

pub struct RelayTracker {
    drafter: DrafterKind,
    /// Load when the segment started (the level its costs are recorded at).
    load: usize,
    start: Instant,
    /// Start of the current clean stretch (no verify of this server at the upstream), the
    /// tokens relayed in it, and the verify epoch it began in.
    first_at: Instant,
    clean: u32,
    /// `clean` at which the segment's mean gap is sampled next.
    next_sample: u32,
    epoch: u64,
    window: (Instant, u32),
    /// When the delivery of the last token arrived, whether more of it is still to come,
    /// and whether the rest of it is skipped (it was decoded before a clean stretch began).
    delivered_at: Instant,
    in_delivery: bool,
    skip_rest: bool,
    relayed: u32,
    min_tokens: u32,
    /// Every drafter of the stream (each drafts when its pace says so, see `pacing.rs`).
    drafters: Vec<DrafterKind>,
    /// The proposal being checked and how many of its tokens matched so far.
    shadow: Option<(Proposal, usize)>,
    /// Other drafters' proposals for the same context (a request drafting with several),
    /// checked alongside to keep their estimates current.
    others: Vec<(DrafterKind, Proposal, usize)>,
    /// Counts the stream as relaying at the upstream while the segment lives.
    relaying: Relaying,
    /// Held by a decode-cost probe until it has relayed `PROBE_TOKENS`.
    probe: Option<Probe>,
}

impl RelayTracker {
    /// A segment requested at `start`; a probe relays `PROBE_TOKENS` before it may leave.
    pub fn new(
        ctl: &Arc<Controller>,
        drafter: DrafterKind,
        probe: bool,
        shadow: Option<Proposal>,
        start: Instant,
    ) -> Self {
        let relaying = ctl.relaying();
        RelayTracker {
            drafter,
            load: ctl.load(),
            start,
            first_at: start,
            clean: 0,
            next_sample: SEGMENT_SAMPLE,
            epoch: ctl.prompt_epoch(),
            window: (start, 0),
            delivered_at: start,
            in_delivery: false,
            skip_rest: false,
            relayed: 0,
            min_tokens: if probe { PROBE_TOKENS } else { 0 },
            drafters: vec![drafter],
            shadow: shadow.filter(|p| !p.tokens.is_empty()).map(|p| (p, 0)),
            others: Vec::new(),
            relaying,
            probe: probe.then(|| ctl.probing()),
        }
    }

    pub fn relayed(&self) -> u32 {
        self.relayed
    }

    /// The stream drafts with these drafters (the one of the shadow among them).
    pub fn drafting_with(mut self, drafters: Vec<DrafterKind>) -> Self {
        if !drafters.is_empty() {
            self.drafters = drafters;
        }
        self
    }

    /// The other drafters' proposals for the shadow's context (a request drafting with
    /// several), checked alongside to keep their estimates current.
    pub fn alongside(mut self, others: Vec<(DrafterKind, Proposal)>) -> Self {
        self.add_others(others);
        self
    }

    fn add_others(&mut self, others: Vec<(DrafterKind, Proposal)>) {
        self.others.extend(
            others
                .into_iter()
                .filter(|(_, p)| !p.tokens.is_empty())
                .map(|(d, p)| (d, p, 0)),
        );
    }

    /// Fresh proposals were drafted: `drafter`'s comes next (`proposed`), `others` are
    /// checked alongside. A fresh proposal of a drafter replaces the one of it still being
    /// checked (the matches so far count); the proposals of drafters that did not draft
    /// now stay checked.
    pub fn drafted_by(
        &mut self,
        ctl: &Controller,
        s: &mut StreamCtl,
        drafter: DrafterKind,
        others: Vec<(DrafterKind, Proposal)>,
    ) {
        let fresh = |d: DrafterKind| d == drafter || others.iter().any(|(o, _)| *o == d);
        if let Some((p, matched)) = self.shadow.take() {
            self.others.push((self.drafter, p, matched));
        }
        self.others.retain(|(d, p, matched)| {
            if fresh(*d) {
                ctl.observe_matches(s, *d, &p.confidence, *matched);
            }
            !fresh(*d)
        });
        self.drafter = drafter;
        self.add_others(others);
    }

    /// A token arrived at `now`; `more_waiting`: more tokens of the same delivery are
    /// already there behind it. Feeds the decode-cost estimates.
    ///
    /// Tokens that arrive together (a burst that the upstream's output queue or the
    /// network held back) were all decoded before their delivery arrived: time is measured
    /// from delivery to delivery, and a window or sample closes only at the end of one.
    /// Counting the rest of a delivery after a measuring start made windows that began in a
    /// burst look a quarter as long as plain decoding (3 ms for 12 in the harness), and
    /// such windows were the ones that completed before the next verify interrupted them.
    ///
    /// Gaps that overlapped a verify call of this server, or another relay's start, are
    /// not plain decoding (a step that computes a prompt slows every sequence in the batch;
    /// a verify's loss is charged to its round): such stretches are skipped, and measuring
    /// starts over.
    pub fn arrived(&mut self, ctl: &Controller, now: Instant, more_waiting: bool) {
        self.relayed += 1;
        let first = !self.in_delivery;
        self.in_delivery = more_waiting;
        if first {
            self.delivered_at = now;
            self.skip_rest = false;
        }
        if self.relayed == 1 {
            ctl.record_relay_start(self.load, now.saturating_duration_since(self.start));
            self.relaying.started();
            self.restart_clean(ctl);
            return;
        }
        if self.skip_rest {
            return;
        }
        let epoch = ctl.prompt_epoch();
        if epoch != self.epoch || ctl.prompt_in_flight() {
            self.restart_clean(ctl);
            return;
        }
        self.clean += 1;
        self.window.1 += 1;
        if more_waiting {
            return;
        }
        let at = self.delivered_at;
        if self.clean >= self.next_sample {
            let span = at.saturating_duration_since(self.first_at).as_secs_f64();
            ctl.record_decode_mean(self.load, span / f64::from(self.clean));
            self.next_sample = self.clean + SEGMENT_SAMPLE;
        }
        if self.window.1 >= DECODE_WINDOW {
            let span = at.saturating_duration_since(self.window.0).as_secs_f64();
            ctl.record_decode(self.load, span / f64::from(self.window.1));
            self.window = (at, 0);
        }
    }

    /// A clean stretch starts at the last delivery; the rest of it is not counted.
    fn restart_clean(&mut self, ctl: &Controller) {
        self.first_at = self.delivered_at;
        self.clean = 0;
        self.next_sample = SEGMENT_SAMPLE;
        self.epoch = ctl.prompt_epoch();
        self.window = (self.delivered_at, 0);
        self.skip_rest = true;
    }

    /// The arrived token was `id` (and emitted): check the shadow proposal against it.
    /// True when the stream should draft a fresh proposal now.
    pub fn check(&mut self, ctl: &Controller, s: &mut StreamCtl, id: u32) -> bool {
        self.others.retain_mut(|(d, p, matched)| {
            let same = p.tokens.get(*matched) == Some(&id);
            if same {
                *matched += 1;
            }
            let resolved = !same || *matched == p.tokens.len();
            if resolved {
                ctl.observe_acceptance(s, *d, &p.confidence, *matched);
            }
            !resolved
        });
        if let Some((p, matched)) = &mut self.shadow {
            let same = p.tokens.get(*matched) == Some(&id);
            if same {
                *matched += 1;
            }
            // Resolved at the first differing token, or when every draft matched.
            if !same || *matched == p.tokens.len() {
                ctl.observe_acceptance(s, self.drafter, &p.confidence, *matched);
                self.shadow = None;
            }
        }
        // Drafts still matching are the best reason to leave relay: a fresh proposal
        // decides then (`drafted_by` ends this one's check with its matches so far).
        self.relayed >= self.min_tokens
            && self
                .drafters
                .iter()
                .any(|&d| ctl.draft_due(s, d, Rival::Plain))
    }

    /// A fresh proposal for the context so far: returns it cut to the K to verify when the
    /// stream should leave relay, else keeps it as the next shadow check.
    pub fn proposed(
        &mut self,
        ctl: &Controller,
        s: &mut StreamCtl,
        p: Proposal,
        remaining: usize,
    ) -> Option<Proposal> {
        if self.relayed >= self.min_tokens {
            self.probe = None;
            if let Some(k) = ctl.plan_resume(s, self.drafter, &p, remaining) {
                let mut p = p;
                p.tokens.truncate(k);
                p.confidence.truncate(k);
                return Some(p);
            }
        }
        if !p.tokens.is_empty() {
            self.shadow = Some((p, 0));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculation::controller::{ControllerConfig, VirtualClock};
    use std::time::Duration;

    /// Tokens decoded 12 ms apart arrive in deliveries of three, while another stream's
    /// verify calls keep restarting the clean stretches: the decode cost is 12 ms, not the
    /// gaps inside the deliveries (counted token by token, it came out at 9 ms).
    #[test]
    fn tokens_delivered_together_are_timed_from_delivery_to_delivery() {
        for told in [true, false] {
            let clock = Arc::new(VirtualClock::default());
            let config = ControllerConfig {
                probe_interval: Duration::from_secs(10),
                explore: 0.0,
                watch_every: 1,
            };
            let c = Arc::new(Controller::new(config, None).with_clock(clock.clone()));
            let _me = c.enter();
            let mut t = RelayTracker::new(&c, DrafterKind::Oracle, false, None, c.now());
            for delivery in 0..60 {
                clock.advance(Duration::from_millis(36));
                if delivery % 3 == 0 {
                    drop(c.verifying(1));
                }
                for i in 0..3 {
                    t.arrived(&c, c.now(), told && i < 2);
                }
            }
            let d = c.decode_cost_estimate(c.load()).unwrap_or(0.0);
            if told {
                assert!((d - 0.012).abs() < 0.001, "{d}");
            } else {
                assert!(d < 0.0105, "{d}");
            }
        }
    }
}
