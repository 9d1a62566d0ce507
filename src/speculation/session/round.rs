//! One speculation round, step by step: the proposal, the controller's decision, the
//! verify call (with the next draft overlapped), acceptance, emission, and the round's
//! measurements.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::driver::{cut, usable, Driver};
use super::relay::RelayPlan;
use crate::draft::Proposal;
use crate::error::ApiError;
use crate::speculation::accept::accepted_len;
use crate::speculation::controller::Decision;
use crate::speculation::generation::{Finish, Generation};
use crate::upstream::verify::{Sample, VerifyRequest};

/// What a speculation round leads to.
pub(super) enum Round {
    Done(Finish),
    /// Another round; with the next proposal when overlap drafted it already.
    Next(Option<Proposal>),
    Relay(RelayPlan),
}

/// A finished verify call.
struct Verified {
    samples: Vec<Sample>,
    /// The next round's proposal, drafted during the call (overlap), when still usable.
    pre: Option<Proposal>,
    took: Duration,
    /// Streams speculating when it was sent (this one included).
    spec: usize,
}

/// What a round did, for its metrics.
struct RoundRecord {
    k: usize,
    accepted: usize,
    emitted: u32,
    started: Instant,
    /// Time the round waited on the upstream and the drafter.
    outside: Duration,
}

/// One round from `pending` (the proposal already made for this context, if any);
/// `decided` when the controller already chose to verify it (a resume from relay).
pub(super) async fn speculate(
    l: &mut Driver<'_>,
    gen: &mut Generation<'_>,
    pending: Option<Proposal>,
    decided: bool,
) -> Result<Round, ApiError> {
    let started = l.d.controller.now();
    let outside_before = l.outside;
    let mut k_cap = l.k_cap(gen);
    if let Some(n) = l.p.switch_every {
        // Forced switching: rounds are cut at the boundaries, every other segment relays.
        let g = gen.generated as usize;
        if (g / n) % 2 == 1 {
            let plan = RelayPlan {
                probe: false,
                shadow: pending,
            };
            return Ok(Round::Relay(plan));
        }
        k_cap = k_cap.min(n - g % n - 1);
    }
    let proposal = match pending {
        Some(p) => cut(p, k_cap),
        None => l.propose(k_cap, false).await,
    };
    let k = match decide(l, gen, &proposal, decided) {
        Decision::Speculate(k) => k,
        Decision::Relay { probe } => {
            l.d.metrics
                .chosen_k
                .with_label_values(&[l.drafter.as_str()])
                .observe(0.0);
            let plan = RelayPlan {
                probe,
                shadow: Some(proposal),
            };
            return Ok(Round::Relay(plan));
        }
    };
    let proposal = cut(proposal, k);
    let v = verify(l, &proposal.tokens).await?;
    let n = accepted_len(&proposal.tokens, v.samples.iter().map(|s| s.id));
    tracing::debug!(
        k,
        accepted = n,
        verify_ms = v.took.as_secs_f64() * 1e3,
        spec = v.spec,
        "round"
    );
    let expected = l.d.controller.record_verify(k, v.spec, v.took);
    l.ctl.note_verify(v.took, expected);
    if k > 0 {
        l.d.controller
            .observe_acceptance(&mut l.ctl, l.drafter, &proposal.confidence, n);
    }
    if !l.alternatives.is_empty() {
        let ids: Vec<u32> = v.samples.iter().take(n + 1).map(|s| s.id).collect();
        l.score_alternatives(&ids);
    }
    let next = overlap_outcome(l, v.pre, k, n, v.samples[k].id);
    let before = gen.generated;
    let emitted: Vec<Sample> = v.samples.into_iter().take(n + 1).collect();
    let finish = l.emit(gen, emitted).await?;
    record_round(
        l,
        RoundRecord {
            k,
            accepted: n,
            emitted: gen.generated - before,
            started,
            outside: l.outside - outside_before,
        },
    );
    Ok(match finish {
        Some(f) => Round::Done(f),
        None => Round::Next(next),
    })
}

/// How many of the proposal's drafts to verify, or relay instead.
fn decide(
    l: &mut Driver<'_>,
    gen: &Generation<'_>,
    proposal: &Proposal,
    decided: bool,
) -> Decision {
    if l.p.switch_every.is_some() || decided {
        return Decision::Speculate(proposal.tokens.len());
    }
    let remaining = gen.remaining() as usize;
    l.d.controller
        .plan_round(&mut l.ctl, l.p.mode, l.drafter, proposal, remaining)
}

/// The verify call of `drafts`, counted as in flight at the upstream and timed.
async fn verify(l: &mut Driver<'_>, drafts: &[u32]) -> Result<Verified, ApiError> {
    let k = drafts.len();
    let spec = l.d.controller.speculating();
    let overlap = k > 0 && l.chosen().wants_overlap();
    let t = l.d.controller.now();
    let in_flight = l.d.controller.verifying(k + 1);
    let (res, pre) = verify_overlapped(l, drafts, overlap).await;
    drop(in_flight);
    let took = l.d.controller.now().saturating_duration_since(t);
    l.outside += took;
    l.d.metrics
        .verify_duration
        .with_label_values(&[l.d.backend.kind()])
        .observe(took.as_secs_f64());
    let samples = res?;
    if samples.len() != k + 1 {
        return Err(ApiError::UpstreamProtocol(format!(
            "verify returned {} samples for {} prompts",
            samples.len(),
            k + 1
        )));
    }
    Ok(Verified {
        samples,
        pre,
        took,
        spec,
    })
}

/// The verify call; with `overlap`, the next round is drafted meanwhile for the context
/// plus all drafts (PEARL-style). That draft is awaited only while it can still be used —
/// every draft accepted — and dropped otherwise.
async fn verify_overlapped(
    l: &Driver<'_>,
    drafts: &[u32],
    overlap: bool,
) -> (Result<Vec<Sample>, ApiError>, Option<Proposal>) {
    let verify = l.d.backend.verify(VerifyRequest {
        model: &l.p.model,
        context: &l.ctx,
        generated: l.ctx.len().saturating_sub(l.p.prompt.len()),
        drafts,
        sampling: &l.p.sampling,
    });
    if !overlap {
        return (verify.await, None);
    }
    let mut next_ctx = Vec::with_capacity(l.ctx.len() + drafts.len());
    next_ctx.extend_from_slice(&l.ctx);
    next_ctx.extend_from_slice(drafts);
    let req = l.draft_request(Arc::new(next_ctx), l.p.k_max);
    let (drafter, ctl) = (l.chosen(), &l.d.controller);
    let pre = async move {
        let t = ctl.now();
        let r = drafter.propose(req).await;
        (r, ctl.now().saturating_duration_since(t))
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
        s.len() == drafts.len() + 1 && accepted_len(drafts, s.iter().map(|x| x.id)) == drafts.len()
    });
    if !all_accepted {
        return (res, None);
    }
    let (r, dt) = match drafted {
        Some(d) => d,
        None => pre.await,
    };
    l.draft_done(l.drafter, dt);
    (res, Some(usable(r, l.p.k_max)))
}

/// Keep the pre-drafted proposal when every draft was accepted and the bonus token is its
/// first token; without overlap (no pre-draft was made) nothing is counted.
fn overlap_outcome(
    l: &Driver<'_>,
    pre: Option<Proposal>,
    k: usize,
    accepted: usize,
    bonus: u32,
) -> Option<Proposal> {
    if k == 0 || !l.chosen().wants_overlap() {
        return None;
    }
    let next = pre.filter(|p| accepted == k && p.tokens.first() == Some(&bonus));
    let hit = next.is_some();
    l.d.metrics
        .draft_overlap
        .with_label_values(&[if hit { "hit" } else { "miss" }])
        .inc();
    l.d.controller.record_overlap(l.drafter, hit);
    next.map(|mut p| {
        p.tokens.remove(0);
        p.confidence.remove(0);
        p
    })
    .filter(|p| !p.tokens.is_empty())
}

/// Every measurement of one round: the stream's statistics and the round's metrics.
fn record_round(l: &mut Driver<'_>, r: RoundRecord) {
    let m = &l.d.metrics;
    let label = l.drafter.as_str();
    let (k, n) = (r.k, r.accepted);
    l.stats.rounds += 1;
    l.stats.draft_tokens += k as u32;
    l.stats.accepted_tokens += n as u32;
    m.chosen_k.with_label_values(&[label]).observe(k as f64);
    if k > 0 {
        m.num_drafts.with_label_values(&[label]).inc();
        m.num_draft_tokens
            .with_label_values(&[label])
            .inc_by(k as u64);
        m.num_accepted_tokens
            .with_label_values(&[label])
            .inc_by(n as u64);
        m.accepted_length
            .with_label_values(&[label])
            .observe(n as f64);
        for pos in POSITIONS.iter().take(n) {
            m.accepted_per_pos.with_label_values(&[label, pos]).inc();
        }
    }
    m.num_emitted_tokens
        .with_label_values(&[label])
        .inc_by(n as u64 + 1);
    m.output_tokens
        .with_label_values(&["speculate"])
        .inc_by(u64::from(r.emitted));
    let elapsed = l.d.controller.now().saturating_duration_since(r.started);
    m.proxy_overhead
        .with_label_values(&["round"])
        .observe(elapsed.saturating_sub(r.outside).as_secs_f64());
    m.mode_seconds
        .with_label_values(&["speculate"])
        .inc_by(elapsed.as_secs_f64());
}

const POSITIONS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
];
