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
    epoch: u64,
    window: (Instant, u32),
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
            epoch: ctl.prompt_epoch(),
            window: (start, 0),
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

    /// A token arrived at `now`: feed the decode-cost estimates. Gaps that overlapped a
    /// verify call of this server, or another relay's start, are not plain decoding (a
    /// step that computes a prompt slows every sequence in the batch; a verify's loss is
    /// charged to its round): such stretches are skipped, and measuring starts over.
    pub fn arrived(&mut self, ctl: &Controller, now: Instant) {
        self.relayed += 1;
        if self.relayed == 1 {
            ctl.record_relay_start(self.load, now.saturating_duration_since(self.start));
            self.relaying.started();
            self.restart_clean(ctl, now);
            return;
        }
        let epoch = ctl.prompt_epoch();
        if epoch != self.epoch || ctl.prompt_in_flight() {
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
        self.epoch = ctl.prompt_epoch();
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
