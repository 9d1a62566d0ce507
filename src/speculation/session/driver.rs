//! The state one stream's loop carries between rounds and relay segments — the context,
//! its statistics, the controller's per-stream state — and the steps both share: drafting,
//! emitting tokens to the client, the draft cap.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::api::{Event, SessionDeps, SessionParams, Stats};
use crate::draft::{DraftError, DraftRequest, Drafter, DrafterKind, Proposal};
use crate::error::ApiError;
use crate::inline::Outbox;
use crate::speculation::controller::StreamCtl;
use crate::speculation::generation::{Finish, Generation};
use crate::upstream::verify::Sample;

pub(super) struct Driver<'a> {
    pub(super) p: &'a SessionParams,
    pub(super) d: &'a SessionDeps,
    tx: &'a Outbox<Event>,
    /// The context: shared with drafters while they draft (see `DraftRequest::context`).
    pub(super) ctx: Arc<Vec<u32>>,
    pub(super) stats: Stats,
    /// The drafter of the current proposal.
    pub(super) drafter: DrafterKind,
    /// The other drafters' proposals for the same context (a request drafting with
    /// several): scored against the tokens that follow, never verified.
    pub(super) alternatives: Vec<(DrafterKind, Proposal)>,
    /// Time spent waiting on the upstream and the drafter (excluded from proxy overhead).
    pub(super) outside: Duration,
    pub(super) ctl: StreamCtl,
}

/// A proposal cut to `k` tokens (confidences padded or cut to match).
pub(super) fn cut(mut p: Proposal, k: usize) -> Proposal {
    p.tokens.truncate(k);
    p.confidence.resize(p.tokens.len(), 0.0);
    p
}

impl<'a> Driver<'a> {
    pub(super) fn new(p: &'a SessionParams, d: &'a SessionDeps, tx: &'a Outbox<Event>) -> Self {
        let drafter = d.drafters.first().kind();
        // A relay segment draws many positions from one random stream, so where it starts
        // would change a seeded sampled output: such requests never relay on the
        // controller's say (forced switching keeps fixed boundaries and stays reproducible).
        let may_relay = !p.sampling.is_seeded_sampled();
        Driver {
            p,
            d,
            tx,
            ctx: Arc::new(p.prompt.clone()),
            stats: Stats::new(p.prompt.len() as u32, d.drafters.choice(), p.mode),
            drafter,
            alternatives: Vec::new(),
            outside: Duration::ZERO,
            ctl: StreamCtl::new(may_relay, p.stream),
        }
    }

    /// Count a mode switch (the first decision of a stream is not a switch).
    pub(super) fn switched(&mut self, from: &'static str, to: &'static str) {
        if self.stats.rounds == 0 && self.stats.relay_tokens == 0 {
            return;
        }
        self.d
            .metrics
            .mode_switches
            .with_label_values(&[from, to])
            .inc();
        self.stats.switches += 1;
    }

    /// Draft cap for the next round: K+1 tokens must fit the limits and the context.
    pub(super) fn k_cap(&self, gen: &Generation<'_>) -> usize {
        let remaining = gen.remaining() as usize;
        let room = (self.p.max_model_len as usize).saturating_sub(self.ctx.len() + 1);
        self.p.k_max.min(remaining.saturating_sub(1)).min(room)
    }

    /// A draft request for `context` (the stream's context, or it plus pending drafts).
    pub(super) fn draft_request(&self, context: Arc<Vec<u32>>, max_k: usize) -> DraftRequest {
        DraftRequest {
            stream: self.p.stream,
            context,
            prompt_len: self.p.prompt.len(),
            max_k,
        }
    }

    /// Every drafter of the stream.
    pub(super) fn drafter_kinds(&self) -> Vec<DrafterKind> {
        self.d.drafters.all().iter().map(|d| d.kind()).collect()
    }

    /// A proposal for the context (`relaying`: a shadow proposal, which may end the
    /// relay). With several drafters, those the controller's pacing calls for draft (the
    /// cheap ones always, a costly one only when due: see `controller/pacing.rs`), and
    /// the proposal it values most is kept; the others become `alternatives`.
    pub(super) async fn propose(&mut self, max_k: usize, relaying: bool) -> Proposal {
        self.alternatives.clear();
        if max_k == 0 {
            return Proposal::default();
        }
        let t = self.d.controller.now();
        let req = self.draft_request(self.ctx.clone(), max_k);
        let deps = self.d;
        let mut all = match deps.drafters.all() {
            // One drafter (the usual case) takes the request as it is: no copy of the context.
            [only] => vec![(only.kind(), self.draft_with(only, req).await)],
            set => self.draft_paced(set, req, relaying).await,
        };
        self.outside += self.d.controller.now().saturating_duration_since(t);
        for (kind, p) in &all {
            self.d.controller.drafted(&mut self.ctl, *kind, p);
        }
        if all.len() <= 1 {
            let Some((kind, proposal)) = all.pop() else {
                return Proposal::default();
            };
            self.drafter = kind;
            return proposal;
        }
        let best = all
            .iter()
            .map(|(k, p)| self.d.controller.proposal_value(&self.ctl, *k, p))
            .enumerate()
            .fold((0, f64::MIN), |b, (i, v)| if v > b.1 { (i, v) } else { b })
            .0;
        let (kind, proposal) = all.swap_remove(best);
        self.drafter = kind;
        all.retain(|(_, p)| !p.tokens.is_empty());
        self.alternatives = all;
        proposal
    }

    /// Several drafters: the cheap ones draft; then each costly one that is due against
    /// plain decoding (relaying) or against the best proposal so far (a round). A round
    /// without a cheap drafter drafts with every one.
    async fn draft_paced(
        &self,
        set: &[Arc<dyn Drafter>],
        req: DraftRequest,
        relaying: bool,
    ) -> Vec<(DrafterKind, Proposal)> {
        let ctl = &self.d.controller;
        let (cheap, costly): (Vec<_>, Vec<_>) =
            set.iter().partition(|d| ctl.drafts_cheaply(d.kind()));
        let mut all = self.draft_all(&cheap, &req).await;
        let rival = ctl.rival(&self.ctl, relaying, &all);
        let due: Vec<_> = costly
            .into_iter()
            .filter(|d| {
                (cheap.is_empty() && !relaying) || ctl.draft_due(&self.ctl, d.kind(), rival)
            })
            .collect();
        all.extend(self.draft_all(&due, &req).await);
        all.sort_by_key(|(k, _)| *k);
        all
    }

    async fn draft_all(
        &self,
        set: &[&Arc<dyn Drafter>],
        req: &DraftRequest,
    ) -> Vec<(DrafterKind, Proposal)> {
        let drafted = join_all(set.iter().map(|d| self.draft_with(d, req.clone()))).await;
        set.iter().map(|d| d.kind()).zip(drafted).collect()
    }

    /// The drafter of the current proposal.
    pub(super) fn chosen(&self) -> &'a Arc<dyn Drafter> {
        let deps = self.d;
        deps.drafters
            .get(self.drafter)
            .unwrap_or_else(|| deps.drafters.first())
    }

    async fn draft_with(&self, d: &Arc<dyn Drafter>, req: DraftRequest) -> Proposal {
        let max_k = req.max_k;
        let t = self.d.controller.now();
        let r = d.propose(req).await;
        self.draft_done(
            d.kind(),
            self.d.controller.now().saturating_duration_since(t),
        );
        usable(r, max_k)
    }

    pub(super) fn draft_done(&self, drafter: DrafterKind, dt: Duration) {
        self.d
            .metrics
            .draft_duration
            .with_label_values(&[drafter.as_str()])
            .observe(dt.as_secs_f64());
        self.d.controller.record_draft(drafter, dt);
    }

    /// The alternatives against the tokens emitted after their context: each drafter's
    /// estimates learn what its proposal would have had accepted.
    pub(super) fn score_alternatives(&mut self, emitted: &[u32]) {
        for (kind, p) in std::mem::take(&mut self.alternatives) {
            let matched = p
                .tokens
                .iter()
                .zip(emitted)
                .take_while(|(a, b)| a == b)
                .count();
            // Past the emitted tokens nothing is known: a longer proposal that matched all
            // of them counts as a proposal of that many, all accepted.
            let conf = if matched == emitted.len() {
                &p.confidence[..matched.min(p.confidence.len())]
            } else {
                &p.confidence[..]
            };
            self.d
                .controller
                .observe_acceptance(&mut self.ctl, kind, conf, matched);
        }
    }

    /// Emit samples through the generation state; returns a finish when one hits.
    pub(super) async fn emit(
        &mut self,
        gen: &mut Generation<'_>,
        samples: impl IntoIterator<Item = Sample>,
    ) -> Result<Option<Finish>, ApiError> {
        let mut finish = None;
        let ctx = Arc::make_mut(&mut self.ctx);
        for s in samples {
            ctx.push(s.id);
            if let Some(f) = gen.push(s) {
                finish = Some(f);
                break;
            }
        }
        let piece = gen.take();
        if finish.is_none() && (!piece.text.is_empty() || !piece.tokens.is_empty()) {
            self.tx
                .send(Event::Delta {
                    text: piece.text,
                    tokens: piece.tokens,
                    split: piece.split,
                    calls: piece.calls,
                })
                .await;
        } else if finish.is_some() {
            // Keep them for the final event, sent with the finish reason.
            gen.restore(piece);
        }
        self.d
            .drafters
            .observe(self.p.stream, &self.ctx, self.p.prompt.len());
        Ok(finish)
    }
}

/// A drafter's answer as a proposal of at most `max_k` tokens.
pub(super) fn usable(r: Result<Proposal, DraftError>, max_k: usize) -> Proposal {
    match r {
        Ok(p) => cut(p, max_k),
        Err(e) => {
            // A failing drafter degrades to plain decoding, it never fails the request.
            tracing::warn!(error = %e, "drafter failed; continuing without drafts");
            Proposal::default()
        }
    }
}
