//! What a relaying stream measures and decides, token by token: the decode cost (first
//! token latency, gaps between tokens), shadow checks of the drafter against the tokens
//! that arrive, and when to try leaving relay. Pure bookkeeping on timestamps handed in,
//! so the session's relay segment and the simulation harness run the same decisions.

use std::sync::Arc;
use std::time::Instant;

use super::batch::Probe;
use super::{Controller, Relaying, StreamCtl, PROBE_TOKENS};
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
    epoch: u64,
    window: (Instant, u32),
    relayed: u32,
    min_tokens: u32,
    stride: u32,
    since_draft: u32,
    /// The proposal being checked and how many of its tokens matched so far.
    shadow: Option<(Proposal, usize)>,
    /// Other drafters' proposals for the same context (a request drafting with several),
    /// checked alongside to keep their estimates current.
    others: Vec<(DrafterKind, Proposal, usize)>,
    /// Counts the stream as relaying at the upstream while the segment lives.
    _relaying: Relaying,
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
            epoch: ctl.verify_epoch(),
            window: (start, 0),
            relayed: 0,
            min_tokens: if probe { PROBE_TOKENS } else { 0 },
            stride: ctl.shadow_stride(drafter),
            since_draft: 0,
            shadow: shadow.filter(|p| !p.tokens.is_empty()).map(|p| (p, 0)),
            others: Vec::new(),
            _relaying: relaying,
            probe: probe.then(|| ctl.probing()),
        }
    }

    pub fn relayed(&self) -> u32 {
        self.relayed
    }

    /// The drafter whose proposals come next (a request drafting with several chooses
    /// per proposal), and the other drafters' proposals for the same context.
    pub fn drafted_by(&mut self, drafter: DrafterKind, others: Vec<(DrafterKind, Proposal)>) {
        self.drafter = drafter;
        // A fresh proposal of a drafter replaces the one of it still being checked.
        self.others
            .retain(|(d, ..)| *d != drafter && others.iter().all(|(o, _)| o != d));
        self.others.extend(
            others
                .into_iter()
                .filter(|(_, p)| !p.tokens.is_empty())
                .map(|(d, p)| (d, p, 0)),
        );
    }

    /// A token arrived at `now`: feed the decode-cost estimates. Gaps that overlapped a
    /// verify call of this server are not plain decoding (a verify step slows every
    /// sequence in the batch; that loss is charged to the round): such stretches are
    /// skipped, and measuring starts over.
    pub fn arrived(&mut self, ctl: &Controller, now: Instant) {
        self.relayed += 1;
        if self.relayed == 1 {
            ctl.record_relay_start(self.load, now.saturating_duration_since(self.start));
            self.restart_clean(ctl, now);
            return;
        }
        let epoch = ctl.verify_epoch();
        if epoch != self.epoch || ctl.verify_in_flight() {
            self.restart_clean(ctl, now);
            return;
        }
        self.clean += 1;
        if self.clean % SEGMENT_SAMPLE == 0 {
            let span = now.saturating_duration_since(self.first_at).as_secs_f64();
            ctl.record_decode_mean(self.load, span / f64::from(self.clean));
        }
        self.window.1 += 1;
        if self.window.1 >= DECODE_WINDOW {
            let span = now.saturating_duration_since(self.window.0).as_secs_f64();
            ctl.record_decode(self.load, span / f64::from(self.window.1));
            self.window = (now, 0);
        }
    }

    fn restart_clean(&mut self, ctl: &Controller, now: Instant) {
        self.first_at = now;
        self.clean = 0;
        self.epoch = ctl.verify_epoch();
        self.window = (now, 0);
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
        self.since_draft += 1;
        if self.since_draft < self.stride || self.relayed < self.min_tokens {
            return false;
        }
        // Drafts still matching are the best reason to leave relay: stop checking this
        // proposal (its matches so far count) and let a fresh one decide.
        if let Some((p, matched)) = self.shadow.take() {
            if matched == 0 {
                self.shadow = Some((p, matched));
                return false;
            }
            ctl.observe_matches(s, self.drafter, &p.confidence, matched);
        }
        self.since_draft = 0;
        true
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
