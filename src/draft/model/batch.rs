//! The drafting worker: one thread owns the model and runs one batched forward step at a
//! time for every stream that has a request in flight.
//!
//! Requests that arrive while a step runs join the next step. Each step feeds, per
//! stream, either its uncomputed context (prefill, chunked to a token budget) or its last
//! drafted token (decode), so streams with different lengths and phases share one
//! forward pass.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::kv::SlotTable;
use crate::draft::{DraftError, DraftRequest, Proposal, StreamId};

/// Tokens to feed for one cache slot in a step.
#[derive(Debug, Clone, Copy)]
pub struct RowStep<'a> {
    pub slot: usize,
    /// Position of `tokens[0]`; keys/values before it are in the slot.
    pub start: usize,
    pub tokens: &'a [u32],
}

/// Greedy choice after a row's last token and its softmax probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub token: u32,
    pub prob: f32,
}

/// A model forward over slot-addressed KV memory.
pub trait Engine {
    fn name(&self) -> &'static str;
    /// Write keys/values of each row's tokens at `start..` of its slot and return the
    /// greedy sample after each row's last token.
    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError>;
    /// Full logits after each row's last token of the latest step.
    fn last_logits(&mut self) -> Result<Vec<Vec<f32>>, DraftError>;
    fn max_slots(&self) -> usize;
    /// Positions per slot.
    fn max_len(&self) -> usize;
    /// Tokens one step may carry.
    fn max_step_tokens(&self) -> usize;
    /// Decode steps one `decode_while` call may run (1: the worker steps one at a time).
    fn max_chain(&self) -> usize {
        1
    }
    /// Decode steps of one-token rows, each feeding every row its own sample of the step
    /// before, at most `max_steps`, until `more` returns false. `more` takes every step's
    /// samples in order. An engine may have queued steps after the one for which `more`
    /// returned false (so that the device never waits for the host); it passes their
    /// samples too, and stops.
    fn decode_while(
        &mut self,
        rows: &[RowStep<'_>],
        max_steps: usize,
        more: &mut dyn FnMut(&[Sample]) -> bool,
    ) -> Result<(), DraftError> {
        decode_while_step_by_step(self, rows, max_steps, more)
    }
}

/// `Engine::decode_while` one step at a time.
pub fn decode_while_step_by_step<E: Engine + ?Sized>(
    engine: &mut E,
    rows: &[RowStep<'_>],
    max_steps: usize,
    more: &mut dyn FnMut(&[Sample]) -> bool,
) -> Result<(), DraftError> {
    let mut fed: Vec<[u32; 1]> = rows
        .iter()
        .map(|r| [r.tokens.last().copied().unwrap_or_default()])
        .collect();
    for j in 0..max_steps {
        let step: Vec<RowStep<'_>> = rows
            .iter()
            .zip(&fed)
            .map(|(r, t)| RowStep {
                slot: r.slot,
                start: r.start + j,
                tokens: t,
            })
            .collect();
        let samples = engine.step(&step)?;
        for (f, s) in fed.iter_mut().zip(&samples) {
            f[0] = s.token;
        }
        if !more(&samples) {
            break;
        }
    }
    Ok(())
}

type Reply<T> = oneshot::Sender<Result<T, DraftError>>;

pub enum Msg {
    Propose(DraftRequest, Reply<Proposal>),
    /// Logits after the last token of a context (for correctness checks).
    Logits(StreamId, Vec<u32>, Reply<Vec<f32>>),
    Finish(StreamId),
}

/// Counters of the worker, readable from any thread.
#[derive(Debug, Default)]
pub struct Stats {
    pub steps: AtomicU64,
    pub step_rows: AtomicU64,
    pub step_nanos: AtomicU64,
    pub requests: AtomicU64,
    pub draft_tokens: AtomicU64,
    pub prefill_tokens: AtomicU64,
    pub reused_tokens: AtomicU64,
    pub rolled_back_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    pub too_long: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
pub struct WorkerOptions {
    /// Stop a proposal once the product of its confidences falls below this.
    pub stop_below: f32,
    /// Token ids at or above this are never proposed (padding rows of the embedding).
    pub vocab_limit: u32,
}

enum Want {
    Proposal(Reply<Proposal>),
    Logits(Reply<Vec<f32>>),
    /// The proposal went out while its slot still rode along in a run of decode steps.
    Replied,
}

impl Want {
    fn is_closed(&self) -> bool {
        match self {
            Want::Proposal(r) => r.is_closed(),
            Want::Logits(r) => r.is_closed(),
            Want::Replied => false,
        }
    }
    fn fail(self, e: DraftError) {
        match self {
            Want::Proposal(r) => drop(r.send(Err(e))),
            Want::Logits(r) => drop(r.send(Err(e))),
            Want::Replied => {}
        }
    }
}

struct Job {
    stream: StreamId,
    context: Vec<u32>,
    max_k: usize,
    want: Want,
}

struct Active {
    stream: StreamId,
    slot: usize,
    /// Tokens still to feed; after prefill, the last drafted token.
    pending: Vec<u32>,
    out: Proposal,
    joint: f32,
    max_k: usize,
    want: Want,
}

pub fn run_worker(
    mut engine: Box<dyn Engine>,
    rx: mpsc::Receiver<Msg>,
    stats: Arc<Stats>,
    opts: WorkerOptions,
) {
    let mut table = SlotTable::new(engine.max_slots());
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut active: Vec<Active> = Vec::new();
    // Messages taken while a run of decode steps asked whether any had arrived.
    let mut stash: Vec<Msg> = Vec::new();
    let mut open = true;
    while open || !active.is_empty() || !waiting.is_empty() {
        for m in stash.drain(..) {
            handle(m, &mut waiting, &mut table, &*engine, &stats);
        }
        // Block only when there is nothing to compute.
        if active.is_empty() && waiting.is_empty() {
            match rx.recv() {
                Ok(m) => handle(m, &mut waiting, &mut table, &*engine, &stats),
                Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(m) => handle(m, &mut waiting, &mut table, &*engine, &stats),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // Drop cancelled jobs first: a stream whose pre-draft was abandoned must not keep
        // its next request waiting behind it (nothing else would wake the worker).
        active.retain(|a| {
            let keep = !a.want.is_closed();
            if !keep {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                table.release(a.slot);
            }
            keep
        });
        admit(&mut waiting, &mut active, &mut table, &stats);
        if active.is_empty() {
            if !open && waiting.is_empty() {
                break;
            }
            if waiting.is_empty() {
                continue;
            }
            // Waiting jobs whose slot is busy: nothing to run until a message arrives.
            match rx.recv() {
                Ok(m) => handle(m, &mut waiting, &mut table, &*engine, &stats),
                Err(_) => open = false,
            }
            continue;
        }
        let mut arrived = || {
            stash.extend(rx.try_iter());
            !stash.is_empty()
        };
        step(
            &mut *engine,
            &mut active,
            &mut table,
            &stats,
            opts,
            &mut arrived,
        );
    }
    for job in waiting {
        job.want.fail(DraftError::Closed);
    }
}

fn handle(
    m: Msg,
    waiting: &mut VecDeque<Job>,
    table: &mut SlotTable,
    engine: &dyn Engine,
    stats: &Stats,
) {
    match m {
        Msg::Propose(req, reply) => {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            // Never write past the slot's last position.
            let room = engine.max_len().saturating_sub(req.context.len());
            let max_k = req.max_k.min(room);
            if req.context.is_empty() || max_k == 0 {
                if req.max_k > 0 && !req.context.is_empty() {
                    stats.too_long.fetch_add(1, Ordering::Relaxed);
                }
                let _ = reply.send(Ok(Proposal::default()));
                return;
            }
            waiting.push_back(Job {
                stream: req.stream,
                context: Arc::unwrap_or_clone(req.context),
                max_k,
                want: Want::Proposal(reply),
            });
        }
        Msg::Logits(stream, context, reply) => {
            if context.is_empty() || context.len() > engine.max_len() {
                let _ = reply.send(Err(DraftError::Model(format!(
                    "context of {} tokens does not fit 1..={}",
                    context.len(),
                    engine.max_len()
                ))));
                return;
            }
            waiting.push_back(Job {
                stream,
                context,
                max_k: 0,
                want: Want::Logits(reply),
            });
        }
        Msg::Finish(stream) => table.finish(stream),
    }
}

/// Start waiting jobs, in arrival order, whose stream has no running job and a slot.
fn admit(
    waiting: &mut VecDeque<Job>,
    active: &mut Vec<Active>,
    table: &mut SlotTable,
    stats: &Stats,
) {
    let mut rest = VecDeque::with_capacity(waiting.len());
    while let Some(job) = waiting.pop_front() {
        if job.want.is_closed() {
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let stream_busy = active.iter().any(|a| a.stream == job.stream)
            || rest.iter().any(|j: &Job| j.stream == job.stream);
        let slot = if stream_busy {
            None
        } else {
            table.acquire(job.stream)
        };
        let Some(slot) = slot else {
            rest.push_back(job);
            continue;
        };
        let p = table.prepare(slot, &job.context);
        stats
            .reused_tokens
            .fetch_add(p.start as u64, Ordering::Relaxed);
        stats
            .rolled_back_tokens
            .fetch_add(p.rolled_back as u64, Ordering::Relaxed);
        let mut ctx = job.context;
        ctx.drain(..p.start);
        active.push(Active {
            stream: job.stream,
            slot,
            pending: ctx,
            out: Proposal::default(),
            joint: 1.0,
            max_k: job.max_k,
            want: job.want,
        });
    }
    *waiting = rest;
}

fn step(
    engine: &mut dyn Engine,
    active: &mut Vec<Active>,
    table: &mut SlotTable,
    stats: &Stats,
    opts: WorkerOptions,
    arrived: &mut dyn FnMut() -> bool,
) {
    if let Some(max_steps) = chain::run_len(engine, active, table) {
        return chain::step_run(engine, active, table, stats, opts, max_steps, arrived);
    }
    // Decode rows first (one token each), then prefill chunks within the budget.
    let mut budget = engine.max_step_tokens();
    let mut order: Vec<usize> = (0..active.len()).collect();
    order.sort_by_key(|&i| active[i].pending.len() > 1);
    let mut take = vec![0usize; active.len()];
    for &i in &order {
        let n = active[i].pending.len().min(budget);
        take[i] = n;
        budget -= n;
    }
    let rows: Vec<RowStep<'_>> = active
        .iter()
        .zip(&take)
        .filter(|(_, &n)| n > 0)
        .map(|(a, &n)| RowStep {
            slot: a.slot,
            start: table.len(a.slot),
            tokens: &a.pending[..n],
        })
        .collect();
    let fed: usize = take.iter().sum();
    let t0 = Instant::now();
    let result = engine.step(&rows);
    drop(rows);
    stats
        .step_nanos
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    stats.steps.fetch_add(1, Ordering::Relaxed);
    let samples = match result {
        Ok(s) => s,
        Err(e) => return fail_all(active, table, e),
    };
    stats
        .step_rows
        .fetch_add(samples.len() as u64, Ordering::Relaxed);
    let logits = if active
        .iter()
        .zip(&take)
        .any(|(a, &n)| n > 0 && n == a.pending.len() && matches!(a.want, Want::Logits(_)))
    {
        engine.last_logits().map_err(|e| e.to_string())
    } else {
        Ok(Vec::new())
    };

    let mut sample_iter = samples.into_iter().enumerate();
    let mut done = Vec::new();
    for (i, a) in active.iter_mut().enumerate() {
        let n = take[i];
        if n == 0 {
            continue;
        }
        let Some((row, sample)) = sample_iter.next() else {
            break;
        };
        table.commit(a.slot, &a.pending[..n]);
        if a.out.tokens.is_empty() {
            stats.prefill_tokens.fetch_add(n as u64, Ordering::Relaxed);
        }
        a.pending.drain(..n);
        if !a.pending.is_empty() {
            continue; // prefill continues next step
        }
        if let Want::Logits(_) = a.want {
            done.push((i, Some(row)));
            continue;
        }
        if push_sample(a, sample, opts, stats) {
            done.push((i, None));
        }
    }
    debug_assert!(fed > 0);
    finish(active, table, &done, &logits);
}

fn fail_all(active: &mut Vec<Active>, table: &mut SlotTable, e: DraftError) {
    tracing::error!(error = %e, "draft model step failed");
    for a in active.drain(..) {
        table.reset(a.slot);
        table.release(a.slot);
        a.want.fail(DraftError::Model(e.to_string()));
    }
}

/// Add a decoded sample to a proposal; true once the proposal is complete.
fn push_sample(a: &mut Active, sample: Sample, opts: WorkerOptions, stats: &Stats) -> bool {
    a.joint *= sample.prob;
    if sample.token >= opts.vocab_limit {
        return true;
    }
    a.out.tokens.push(sample.token);
    a.out.confidence.push(sample.prob);
    stats.draft_tokens.fetch_add(1, Ordering::Relaxed);
    if a.out.tokens.len() >= a.max_k || a.joint < opts.stop_below {
        true
    } else {
        a.pending.push(sample.token);
        false
    }
}

/// Reply to the jobs in `done` (indices into `active`, ascending, with the logits row of
/// a logits job) and free their slots.
fn finish(
    active: &mut Vec<Active>,
    table: &mut SlotTable,
    done: &[(usize, Option<usize>)],
    logits: &Result<Vec<Vec<f32>>, String>,
) {
    for &(i, row) in done.iter().rev() {
        let a = active.swap_remove(i);
        table.release(a.slot);
        match a.want {
            Want::Proposal(r) => {
                let _ = r.send(Ok(a.out));
            }
            Want::Replied => {}
            Want::Logits(r) => {
                let res = match (logits, row) {
                    (Ok(l), Some(row)) => l
                        .get(row)
                        .cloned()
                        .ok_or_else(|| DraftError::Model("missing logits row".into())),
                    (Err(e), _) => Err(DraftError::Model(e.clone())),
                    (Ok(_), None) => Err(DraftError::Model("missing logits row".into())),
                };
                let _ = r.send(res);
            }
        }
    }
}

#[path = "batch_chain.rs"]
mod chain;

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
