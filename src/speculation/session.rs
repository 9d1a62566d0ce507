//! The per-stream loop: draft, verify, accept, emit — or relay a plain continuation when
//! speculation would not pay — until a stop condition. The controller decides each round
//! (see `controller.rs`); relay segments live in `relay.rs`. Events go to the client
//! writer over a bounded channel; when the client goes away the channel closes and the
//! loop stops, dropping any in-flight upstream call (which closes its connection, so the
//! upstream aborts the request).
//!
//! Switching never loses or repeats a token: the context is exactly the tokens emitted so
//! far, a relay is cancelled by dropping its stream (tokens it had buffered but not yet
//! emitted are discarded), and the next verify round or relay starts from the context.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::accept::accepted_len;
use super::controller::{Controller, Decision, StreamCtl};
use super::generation::{Finish, Generation, Limits};
use super::relay::{RelayEnd, RelayPlan};
use crate::config::SpecMode;
use crate::draft::{DraftError, DraftRequest, Drafter, DrafterKind, Proposal, StreamId};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tokens::{Detokenizer, ModelTokenizer};
use crate::upstream::verify::{Backend, Sample, Sampling, VerifyRequest};

/// What the client writer receives.
#[derive(Debug)]
pub enum Event {
    Delta {
        text: String,
        tokens: Vec<Sample>,
    },
    /// The last text and tokens, sent together with the finish reason.
    Done {
        text: String,
        tokens: Vec<Sample>,
        finish: Finish,
        stats: Stats,
    },
    Error(ApiError),
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub rounds: u32,
    pub draft_tokens: u32,
    pub accepted_tokens: u32,
    pub relay_tokens: u32,
    pub switches: u32,
    pub drafter: DrafterKind,
    pub mode: SpecMode,
}

impl Stats {
    fn new(prompt_tokens: u32, drafter: DrafterKind, mode: SpecMode) -> Self {
        Stats {
            prompt_tokens,
            completion_tokens: 0,
            rounds: 0,
            draft_tokens: 0,
            accepted_tokens: 0,
            relay_tokens: 0,
            switches: 0,
            drafter,
            mode,
        }
    }
}

pub struct SessionParams {
    pub stream: StreamId,
    pub model: String,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    pub max_tokens: u32,
    pub max_model_len: u32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub include_stop_str: bool,
    pub mode: SpecMode,
    pub k_max: usize,
    /// Force a relay↔speculate switch every N tokens (tests of the hybrid). Rounds are
    /// cut at the boundaries, so segments start at fixed positions whatever K is chosen.
    pub switch_every: Option<usize>,
}

pub struct SessionDeps {
    pub backend: Arc<dyn Backend>,
    pub drafter: Arc<dyn Drafter>,
    pub tokenizer: Arc<ModelTokenizer>,
    pub metrics: Arc<Metrics>,
    pub controller: Arc<Controller>,
}

/// Start the loop on its own task; the receiver yields its events.
pub fn spawn(p: SessionParams, d: SessionDeps) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let drafter = d.drafter.clone();
        let stream = p.stream;
        let closed = tx.clone();
        tokio::select! {
            _ = run(p, d, tx) => {}
            _ = closed.closed() => {}
        }
        drafter.finish(stream);
    });
    rx
}

pub(super) struct Loop<'a> {
    pub(super) p: &'a SessionParams,
    pub(super) d: &'a SessionDeps,
    tx: &'a mpsc::Sender<Event>,
    pub(super) ctx: Vec<u32>,
    pub(super) stats: Stats,
    pub(super) drafter: DrafterKind,
    /// Time spent waiting on the upstream and the drafter (excluded from proxy overhead).
    pub(super) outside: Duration,
    pub(super) ctl: StreamCtl,
}

/// What a speculation round leads to.
enum Round {
    Done(Finish),
    /// Another round; with the next proposal when overlap drafted it already.
    Next(Option<Proposal>),
    Relay(RelayPlan),
}

enum State {
    /// The next round, with its proposal when there is one already; `true` when the
    /// controller already chose to verify it (a resume from relay).
    Speculate(Option<Proposal>, bool),
    Relay(RelayPlan),
}

async fn run(p: SessionParams, d: SessionDeps, tx: mpsc::Sender<Event>) {
    let started = Instant::now();
    let _active = d.controller.enter();
    let tok = d.tokenizer.clone();
    let detok = Detokenizer::new(&tok.tokenizer, p.skip_special_tokens, &p.prompt);
    let limits = Limits {
        max_tokens: p.max_tokens,
        max_model_len: p.max_model_len,
        prompt_len: p.prompt.len() as u32,
        eos_id: tok.eos_id,
        extra_eos_ids: tok.extra_eos_ids.clone(),
        stop_token_ids: p.stop_token_ids.clone(),
        ignore_eos: p.ignore_eos,
        include_stop_str: p.include_stop_str,
    };
    let mut gen = Generation::new(limits, detok, p.stop.clone());
    let drafter = d.drafter.kind();
    // A relay segment draws many positions from one random stream, so where it starts
    // would change a seeded sampled output: such requests never relay on the controller's
    // say (forced switching keeps fixed boundaries and stays reproducible).
    let may_relay = !p.sampling.is_seeded_sampled();
    let mut l = Loop {
        p: &p,
        d: &d,
        tx: &tx,
        ctx: p.prompt.clone(),
        stats: Stats::new(p.prompt.len() as u32, drafter, p.mode),
        drafter,
        outside: Duration::ZERO,
        ctl: StreamCtl::new(may_relay, p.stream),
    };
    let mut state = State::Speculate(None, false);
    let result = loop {
        if gen.remaining() == 0 {
            break Ok(Finish::length());
        }
        state = match state {
            State::Speculate(pending, decided) => {
                match l.speculate_round(&mut gen, pending, decided).await {
                    Ok(Round::Done(f)) => break Ok(f),
                    Ok(Round::Next(p)) => State::Speculate(p, false),
                    Ok(Round::Relay(plan)) => {
                        l.switched("speculate", "relay");
                        State::Relay(plan)
                    }
                    Err(e) => break Err(e),
                }
            }
            State::Relay(plan) => match l.relay(&mut gen, plan).await {
                Ok(RelayEnd::Done(f)) => break Ok(f),
                Ok(RelayEnd::Ended) => State::Relay(RelayPlan::default()),
                Ok(RelayEnd::Resume(p)) => {
                    l.switched("relay", "speculate");
                    let decided = p.is_some();
                    State::Speculate(p, decided)
                }
                Err(e) => break Err(e),
            },
        };
    };
    d.metrics
        .rounds_per_request
        .with_label_values(&[drafter.as_str()])
        .observe(f64::from(l.stats.rounds));
    d.metrics.detokenize_errors.inc_by(gen.decode_errors());
    let overhead = started.elapsed().saturating_sub(l.outside);
    d.metrics
        .proxy_overhead
        .with_label_values(&["request"])
        .observe(overhead.as_secs_f64());
    if p.mode == SpecMode::Auto && p.switch_every.is_none() {
        d.controller.record_auto(super::controller::Watched {
            tokens: gen.generated,
            speculated: gen.generated - l.stats.relay_tokens,
            seconds: started.elapsed().as_secs_f64(),
            plain_seconds: d.controller.plain_seconds(gen.generated),
        });
    }
    match result {
        Ok(finish) => {
            let (text, tokens) = gen.take();
            l.stats.completion_tokens = gen.generated;
            let _ = tx
                .send(Event::Done {
                    text,
                    tokens,
                    finish,
                    stats: l.stats,
                })
                .await;
        }
        Err(e) => {
            let _ = tx.send(Event::Error(e)).await;
        }
    }
}

/// A proposal cut to `k` tokens (confidences padded or cut to match).
fn cut(mut p: Proposal, k: usize) -> Proposal {
    p.tokens.truncate(k);
    p.confidence.resize(p.tokens.len(), 0.0);
    p
}

impl Loop<'_> {
    /// Count a mode switch (the first decision of a stream is not a switch).
    fn switched(&mut self, from: &'static str, to: &'static str) {
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

    pub(super) async fn propose(&mut self, max_k: usize) -> Proposal {
        if max_k == 0 {
            return Proposal::default();
        }
        let t = Instant::now();
        let req = DraftRequest {
            stream: self.p.stream,
            context: self.ctx.clone(),
            prompt_len: self.p.prompt.len(),
            max_k,
        };
        let r = self.d.drafter.propose(req).await;
        let dt = t.elapsed();
        self.outside += dt;
        self.draft_done(dt);
        self.usable(r, max_k)
    }

    fn draft_done(&self, dt: Duration) {
        self.d
            .metrics
            .draft_duration
            .with_label_values(&[self.drafter.as_str()])
            .observe(dt.as_secs_f64());
        self.d.controller.record_draft(self.drafter, dt);
    }

    fn usable(&self, r: Result<Proposal, DraftError>, max_k: usize) -> Proposal {
        match r {
            Ok(p) => cut(p, max_k),
            Err(e) => {
                // A failing drafter degrades to plain decoding, it never fails the request.
                tracing::warn!(error = %e, "drafter failed; continuing without drafts");
                Proposal::default()
            }
        }
    }

    /// Emit samples through the generation state; returns a finish when one hits.
    pub(super) async fn emit(
        &mut self,
        gen: &mut Generation<'_>,
        samples: Vec<Sample>,
    ) -> Result<Option<Finish>, ApiError> {
        let mut finish = None;
        for s in samples {
            self.ctx.push(s.id);
            if let Some(f) = gen.push(s) {
                finish = Some(f);
                break;
            }
        }
        let (text, tokens) = gen.take();
        if finish.is_none() && (!text.is_empty() || !tokens.is_empty()) {
            self.tx
                .send(Event::Delta { text, tokens })
                .await
                .map_err(|_| ApiError::Internal("client gone".into()))?;
        } else if finish.is_some() {
            // Keep them for the final event, sent with the finish reason.
            gen.restore(text, tokens);
        }
        self.d
            .drafter
            .observe(self.p.stream, &self.ctx, self.p.prompt.len());
        Ok(finish)
    }

    async fn speculate_round(
        &mut self,
        gen: &mut Generation<'_>,
        pending: Option<Proposal>,
        decided: bool,
    ) -> Result<Round, ApiError> {
        let round_start = Instant::now();
        let outside_before = self.outside;
        let mut k_cap = self.k_cap(gen);
        if let Some(n) = self.p.switch_every {
            let g = gen.generated as usize;
            if (g / n) % 2 == 1 {
                return Ok(Round::Relay(RelayPlan {
                    probe: false,
                    shadow: pending,
                }));
            }
            k_cap = k_cap.min(n - g % n - 1);
        }
        let proposal = match pending {
            Some(p) => cut(p, k_cap),
            None => self.propose(k_cap).await,
        };
        let decision = if self.p.switch_every.is_some() || decided {
            Decision::Speculate(proposal.tokens.len())
        } else {
            self.d.controller.plan_round(
                &mut self.ctl,
                self.p.mode,
                self.drafter,
                &proposal,
                gen.remaining() as usize,
            )
        };
        let k = match decision {
            Decision::Speculate(k) => k,
            Decision::Relay { probe } => {
                self.d
                    .metrics
                    .chosen_k
                    .with_label_values(&[self.drafter.as_str()])
                    .observe(0.0);
                return Ok(Round::Relay(RelayPlan {
                    probe,
                    shadow: Some(proposal),
                }));
            }
        };
        let proposal = cut(proposal, k);
        let spec = self.d.controller.speculating();
        let overlap = k > 0 && self.d.drafter.wants_overlap();
        let t = Instant::now();
        let in_flight = self.d.controller.verifying(k + 1);
        let (res, pre) = self.verify(&proposal.tokens, overlap).await;
        drop(in_flight);
        let dt = t.elapsed();
        self.outside += dt;
        self.d
            .metrics
            .verify_duration
            .with_label_values(&[self.d.backend.kind()])
            .observe(dt.as_secs_f64());
        let samples = res?;
        self.d.controller.record_verify(k, spec, dt);
        if samples.len() != k + 1 {
            return Err(ApiError::UpstreamProtocol(format!(
                "verify returned {} samples for {} prompts",
                samples.len(),
                k + 1
            )));
        }
        let n = accepted_len(&proposal.tokens, samples.iter().map(|s| s.id));
        tracing::debug!(
            k,
            accepted = n,
            verify_ms = dt.as_secs_f64() * 1e3,
            spec,
            "round"
        );
        if k > 0 {
            self.d.controller.observe_acceptance(
                &mut self.ctl,
                self.drafter,
                &proposal.confidence,
                n,
            );
        }
        self.record_round(k, n);
        let next = if overlap {
            self.overlap_outcome(pre, n == k, samples[k].id)
        } else {
            None
        };
        let emitted: Vec<Sample> = samples.into_iter().take(n + 1).collect();
        let before = gen.generated;
        let finish = self.emit(gen, emitted).await?;
        self.d
            .metrics
            .output_tokens
            .with_label_values(&["speculate"])
            .inc_by(u64::from(gen.generated - before));
        let overhead = round_start
            .elapsed()
            .saturating_sub(self.outside - outside_before);
        self.d
            .metrics
            .proxy_overhead
            .with_label_values(&["round"])
            .observe(overhead.as_secs_f64());
        self.d
            .metrics
            .mode_seconds
            .with_label_values(&["speculate"])
            .inc_by(round_start.elapsed().as_secs_f64());
        Ok(match finish {
            Some(f) => Round::Done(f),
            None => Round::Next(next),
        })
    }

    /// The verify call; with `overlap`, the next round is drafted meanwhile for the context
    /// plus all drafts (PEARL-style). That draft is awaited only while it can still be
    /// used — every draft accepted — and dropped otherwise.
    async fn verify(
        &self,
        drafts: &[u32],
        overlap: bool,
    ) -> (Result<Vec<Sample>, ApiError>, Option<Proposal>) {
        let verify = self.d.backend.verify(VerifyRequest {
            model: &self.p.model,
            context: &self.ctx,
            drafts,
            sampling: &self.p.sampling,
        });
        if !overlap {
            return (verify.await, None);
        }
        let mut next_ctx = self.ctx.clone();
        next_ctx.extend_from_slice(drafts);
        let req = DraftRequest {
            stream: self.p.stream,
            context: next_ctx,
            prompt_len: self.p.prompt.len(),
            max_k: self.p.k_max,
        };
        let drafter = &self.d.drafter;
        let pre = async move {
            let t = Instant::now();
            let r = drafter.propose(req).await;
            (r, t.elapsed())
        };
        tokio::pin!(verify);
        tokio::pin!(pre);
        let mut drafted = None;
        let res = loop {
            tokio::select! {
                r = &mut verify => break r,
                p = &mut pre, if drafted.is_none() => drafted = Some(p),
            }
        };
        let all_accepted = res.as_ref().is_ok_and(|s| {
            s.len() == drafts.len() + 1
                && accepted_len(drafts, s.iter().map(|x| x.id)) == drafts.len()
        });
        if !all_accepted {
            return (res, None);
        }
        let (r, dt) = match drafted {
            Some(d) => d,
            None => pre.await,
        };
        self.draft_done(dt);
        (res, Some(self.usable(r, self.p.k_max)))
    }

    /// Keep the pre-drafted proposal when the bonus token is its first token.
    fn overlap_outcome(
        &self,
        pre: Option<Proposal>,
        all_accepted: bool,
        bonus: u32,
    ) -> Option<Proposal> {
        let next = pre.filter(|p| all_accepted && p.tokens.first() == Some(&bonus));
        let hit = next.is_some();
        self.d
            .metrics
            .draft_overlap
            .with_label_values(&[if hit { "hit" } else { "miss" }])
            .inc();
        self.d.controller.record_overlap(self.drafter, hit);
        next.map(|mut p| {
            p.tokens.remove(0);
            p.confidence.remove(0);
            p
        })
        .filter(|p| !p.tokens.is_empty())
    }

    fn record_round(&mut self, k: usize, n: usize) {
        let m = &self.d.metrics;
        let l = self.drafter.as_str();
        self.stats.rounds += 1;
        self.stats.draft_tokens += k as u32;
        self.stats.accepted_tokens += n as u32;
        m.chosen_k.with_label_values(&[l]).observe(k as f64);
        if k > 0 {
            m.num_drafts.with_label_values(&[l]).inc();
            m.num_draft_tokens.with_label_values(&[l]).inc_by(k as u64);
            m.num_accepted_tokens
                .with_label_values(&[l])
                .inc_by(n as u64);
            m.accepted_length.with_label_values(&[l]).observe(n as f64);
            for pos in POSITIONS.iter().take(n) {
                m.accepted_per_pos.with_label_values(&[l, pos]).inc();
            }
        }
        m.num_emitted_tokens
            .with_label_values(&[l])
            .inc_by(n as u64 + 1);
    }
}

const POSITIONS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
];

#[cfg(test)]
mod tests;
