//! Runs of decode steps in one engine call, which stop as soon as the batch changes.

use super::*;

/// Steps a run of decode steps may take (None: no run): while every job in flight is a
/// proposal feeding one token, as many as fit every slot's positions and the engine's
/// chain, and no more than the proposal wanting the most still wants.
pub(super) fn run_len(engine: &dyn Engine, active: &[Active], table: &SlotTable) -> Option<usize> {
    let decoding = |a: &Active| a.pending.len() == 1 && matches!(a.want, Want::Proposal(_));
    if active.is_empty() || !active.iter().all(decoding) {
        return None;
    }
    let room = active
        .iter()
        .map(|a| engine.max_len().saturating_sub(table.len(a.slot)))
        .min()?;
    let wanted = active
        .iter()
        .map(|a| a.max_k.saturating_sub(a.out.tokens.len()))
        .max()?;
    let k = engine.max_chain().min(room).min(wanted);
    (k >= 2).then_some(k)
}

/// Decode steps for the proposals in flight, back to back: the engine keeps the next step
/// queued while the host takes a step's samples, so the device does not wait for the
/// host between tokens. A proposal that completes is answered at once; the run stops at
/// the first completion, cancellation or arriving message (the step already queued then
/// still counts), so that the next step is planned for the batch as it now is. A request
/// that arrives meanwhile waits at most one step more than between single steps.
pub(super) fn step_run(
    engine: &mut dyn Engine,
    active: &mut Vec<Active>,
    table: &mut SlotTable,
    stats: &Stats,
    opts: WorkerOptions,
    max_steps: usize,
    arrived: &mut dyn FnMut() -> bool,
) {
    let fed: Vec<[u32; 1]> = active.iter().map(|a| [a.pending[0]]).collect();
    let rows: Vec<RowStep<'_>> = active
        .iter()
        .zip(&fed)
        .map(|(a, t)| RowStep {
            slot: a.slot,
            start: table.len(a.slot),
            tokens: t,
        })
        .collect();
    let mut live = vec![true; active.len()];
    let t0 = Instant::now();
    let mut more = |samples: &[Sample]| {
        stats.steps.fetch_add(1, Ordering::Relaxed);
        stats
            .step_rows
            .fetch_add(samples.len() as u64, Ordering::Relaxed);
        for ((a, &s), l) in active.iter_mut().zip(samples).zip(live.iter_mut()) {
            if *l {
                *l = take_sample(a, s, table, opts, stats);
            }
        }
        live.iter().all(|&l| l) && !arrived()
    };
    let result = engine.decode_while(&rows, max_steps, &mut more);
    stats
        .step_nanos
        .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    if let Err(e) = result {
        return fail_all(active, table, e);
    }
    let done: Vec<(usize, Option<usize>)> = live
        .iter()
        .enumerate()
        .filter(|(_, &l)| !l)
        .map(|(i, _)| (i, None))
        .collect();
    finish(active, table, &done, &Ok(Vec::new()));
}

/// Commit the token a step fed and add its sample; answer a proposal that completes.
/// False once the job needs no more steps (answered or cancelled).
fn take_sample(
    a: &mut Active,
    s: Sample,
    table: &mut SlotTable,
    opts: WorkerOptions,
    stats: &Stats,
) -> bool {
    table.commit(a.slot, &a.pending);
    if a.out.tokens.is_empty() {
        stats.prefill_tokens.fetch_add(1, Ordering::Relaxed);
    }
    a.pending.clear();
    if push_sample(a, s, opts, stats) {
        if let Want::Proposal(r) = std::mem::replace(&mut a.want, Want::Replied) {
            let _ = r.send(Ok(std::mem::take(&mut a.out)));
        }
        return false;
    }
    if a.want.is_closed() {
        stats.cancelled.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    true
}
