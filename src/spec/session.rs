//! The per-stream loop: draft, verify, accept, emit — or relay a plain continuation when
//! speculation would not pay — until a stop condition. Events go to the client writer over
//! a bounded channel; when the client goes away the channel closes and the loop stops,
//! dropping any in-flight upstream call (which closes its connection, so the upstream
//! aborts the request).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::accept::accepted_len;
use super::controller::{Controller, Decision};
use super::generation::{Finish, Generation, Limits};
use crate::config::SpecMode;
use crate::draft::{drafter_label, DraftRequest, Drafter, Proposal, StreamId};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tokens::{Detokenizer, ModelTokenizer};
use crate::upstream::verify::{Backend, RelayRequest, Sample, Sampling, VerifyRequest};

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

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Stats {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub rounds: u32,
    pub draft_tokens: u32,
    pub accepted_tokens: u32,
    pub relay_tokens: u32,
    pub switches: u32,
    pub drafter: &'static str,
    pub mode: &'static str,
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
    /// Force a relay↔speculate switch every N tokens (tests of the hybrid).
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

struct Loop<'a> {
    p: &'a SessionParams,
    d: &'a SessionDeps,
    tx: &'a mpsc::Sender<Event>,
    ctx: Vec<u32>,
    stats: Stats,
    drafter_label: &'static str,
    /// Time spent waiting on the upstream and the drafter (excluded from proxy overhead).
    outside: Duration,
}

enum Step {
    Continue,
    Done(Finish),
}

async fn run(p: SessionParams, d: SessionDeps, tx: mpsc::Sender<Event>) {
    let started = Instant::now();
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
    let drafter_label = drafter_label(d.drafter.name());
    let mut l = Loop {
        p: &p,
        d: &d,
        tx: &tx,
        ctx: p.prompt.clone(),
        stats: Stats {
            prompt_tokens: p.prompt.len() as u32,
            drafter: drafter_label,
            mode: match p.mode {
                SpecMode::On => "on",
                SpecMode::Auto => "auto",
                SpecMode::Off => "off",
            },
            ..Stats::default()
        },
        drafter_label,
        outside: Duration::ZERO,
    };
    let mut relaying = false;
    let result = loop {
        if gen.remaining() == 0 {
            break Ok(Finish {
                reason: "length",
                stop_reason: serde_json::Value::Null,
            });
        }
        let step = if relaying {
            l.relay(&mut gen).await
        } else {
            l.speculate_round(&mut gen).await
        };
        match step {
            Ok((Step::Done(f), _)) => break Ok(f),
            Ok((Step::Continue, switch)) => {
                if switch {
                    let (from, to) = if relaying {
                        ("relay", "speculate")
                    } else {
                        ("speculate", "relay")
                    };
                    d.metrics.mode_switches.with_label_values(&[from, to]).inc();
                    l.stats.switches += 1;
                    relaying = !relaying;
                }
            }
            Err(e) => break Err(e),
        }
    };
    d.metrics
        .rounds_per_request
        .with_label_values(&[drafter_label])
        .observe(f64::from(l.stats.rounds));
    let overhead = started.elapsed().saturating_sub(l.outside);
    d.metrics
        .proxy_overhead
        .with_label_values(&["request"])
        .observe(overhead.as_secs_f64());
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

impl Loop<'_> {
    async fn propose(&mut self, max_k: usize) -> Proposal {
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
        self.d
            .metrics
            .draft_duration
            .with_label_values(&[self.drafter_label])
            .observe(dt.as_secs_f64());
        match r {
            Ok(mut p) => {
                p.tokens.truncate(max_k);
                p.confidence.resize(p.tokens.len(), 0.0);
                p
            }
            Err(e) => {
                // A failing drafter degrades to plain decoding, it never fails the request.
                tracing::warn!(error = %e, "drafter failed; continuing without drafts");
                Proposal::default()
            }
        }
    }

    /// Emit samples through the generation state; returns a finish when one hits.
    async fn emit(
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
    ) -> Result<(Step, bool), ApiError> {
        let round_start = Instant::now();
        let outside_before = self.outside;
        let remaining = gen.remaining() as usize;
        // A round yields up to K+1 tokens, and its longest prompt must fit the context.
        let room = (self.p.max_model_len as usize).saturating_sub(self.ctx.len() + 1);
        let k_cap = self.p.k_max.min(remaining.saturating_sub(1)).min(room);
        let proposal = self.propose(k_cap).await;
        let k = match self.d.controller.decide(self.p.mode, k_cap, &proposal) {
            Decision::Speculate(k) => k,
            Decision::Relay if self.p.switch_every.is_none() => return Ok((Step::Continue, true)),
            Decision::Relay => 0,
        };
        let drafts = &proposal.tokens[..k];
        let t = Instant::now();
        let samples = self
            .d
            .backend
            .verify(VerifyRequest {
                model: &self.p.model,
                context: &self.ctx,
                drafts,
                sampling: &self.p.sampling,
            })
            .await?;
        let dt = t.elapsed();
        self.outside += dt;
        self.d
            .metrics
            .verify_duration
            .with_label_values(&[self.d.backend.kind()])
            .observe(dt.as_secs_f64());
        if samples.len() != k + 1 {
            return Err(ApiError::UpstreamProtocol(format!(
                "verify returned {} samples for {} prompts",
                samples.len(),
                k + 1
            )));
        }
        let n = accepted_len(drafts, samples.iter().map(|s| s.id));
        self.record_round(k, n);
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
        if let Some(f) = finish {
            return Ok((Step::Done(f), false));
        }
        let switch = self
            .p
            .switch_every
            .is_some_and(|n| (gen.generated as usize / n) % 2 == 1);
        Ok((Step::Continue, switch))
    }

    fn record_round(&mut self, k: usize, n: usize) {
        let m = &self.d.metrics;
        let l = self.drafter_label;
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

    /// Relay: stream a plain continuation and watch it; leave when the drafter becomes
    /// confident (or when a forced switch is due).
    async fn relay(&mut self, gen: &mut Generation<'_>) -> Result<(Step, bool), ApiError> {
        let start = Instant::now();
        let max_tokens = gen.remaining();
        let mut stream = self
            .d
            .backend
            .relay(RelayRequest {
                model: &self.p.model,
                context: &self.ctx,
                sampling: &self.p.sampling,
                max_tokens,
            })
            .await?;
        let result = loop {
            let t = Instant::now();
            let item = stream.next().await;
            self.outside += t.elapsed();
            let Some(item) = item else {
                // The upstream ended the continuation without a stop we recognise (e.g. its
                // own limit): keep going from the new context.
                break Ok((Step::Continue, false));
            };
            let s = item?;
            let before = gen.generated;
            let finish = self.emit(gen, vec![s]).await?;
            self.stats.relay_tokens += gen.generated - before;
            self.d
                .metrics
                .output_tokens
                .with_label_values(&["relay"])
                .inc_by(u64::from(gen.generated - before));
            if let Some(f) = finish {
                break Ok((Step::Done(f), false));
            }
            if let Some(n) = self.p.switch_every {
                if (gen.generated as usize / n) % 2 == 0 {
                    break Ok((Step::Continue, true));
                }
                continue;
            }
            let k_cap = self.p.k_max.min(gen.remaining().saturating_sub(1) as usize);
            let proposal = self.propose(k_cap).await;
            if self.d.controller.should_resume(&proposal) {
                break Ok((Step::Continue, true));
            }
        };
        drop(stream);
        self.d
            .metrics
            .mode_seconds
            .with_label_values(&["relay"])
            .inc_by(start.elapsed().as_secs_f64());
        result
    }
}

const POSITIONS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
];
