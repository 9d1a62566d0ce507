//! Relay segments: the upstream decodes a plain streaming continuation of the context and
//! specd forwards its tokens. Meanwhile the controller's `RelayTracker` measures plain
//! decoding and checks the drafter against the tokens that arrive (shadow proposals);
//! when a fresh proposal is expected to pay, the stream is dropped (the upstream aborts
//! the request) and speculation resumes from exactly the tokens emitted so far.

use futures_util::{FutureExt, StreamExt};

use super::driver::Driver;
use crate::draft::Proposal;
use crate::error::ApiError;
use crate::speculation::controller::RelayTracker;
use crate::speculation::generation::{Finish, Generation};
use crate::upstream::verify::RelayRequest;

/// How a relay segment starts.
#[derive(Default)]
pub struct RelayPlan {
    /// A decode-cost probe: relay at least `PROBE_TOKENS` tokens before leaving.
    pub probe: bool,
    /// The proposal made for the current context, checked against the first tokens.
    pub shadow: Option<Proposal>,
}

pub enum RelayEnd {
    Done(Finish),
    /// Go back to speculation; with the proposal the controller chose to verify first.
    Resume(Option<Proposal>),
    /// The upstream ended the continuation on its own; relay again from the context.
    Ended,
}

pub(super) async fn relay(
    l: &mut Driver<'_>,
    gen: &mut Generation<'_>,
    plan: RelayPlan,
) -> Result<RelayEnd, ApiError> {
    let ctl = l.d.controller.clone();
    let start = ctl.now();
    let mut tracker = RelayTracker::new(&ctl, l.drafter, plan.probe, plan.shadow, start)
        .drafting_with(l.drafter_kinds())
        .alongside(std::mem::take(&mut l.alternatives));
    let mut stream =
        l.d.backend
            .relay(RelayRequest {
                model: &l.p.model,
                context: &l.ctx,
                generated: gen.generated as usize,
                sampling: &l.p.sampling,
                max_tokens: gen.remaining(),
            })
            .await?
            .peekable();
    // The counter is looked up once per segment, not per token.
    let relay_tokens = l.d.metrics.output_tokens.with_label_values(&["relay"]);
    let result = loop {
        let t = ctl.now();
        let item = stream.next().await;
        let now = ctl.now();
        l.outside += now.saturating_duration_since(t);
        let Some(item) = item else {
            if tracker.relayed() == 0 {
                break Err(ApiError::UpstreamProtocol(
                    "relay continuation ended without a token".into(),
                ));
            }
            break Ok(RelayEnd::Ended);
        };
        let s = item?;
        let id = s.id;
        // Tokens already waiting behind this one came in the same delivery (a chunk of
        // several, or chunks read together): the decode-cost windows end after them.
        let more_waiting = std::pin::Pin::new(&mut stream)
            .peek()
            .now_or_never()
            .is_some_and(|next| next.is_some());
        tracker.arrived(&ctl, now, more_waiting);
        let before = gen.generated;
        let finish = l.emit(gen, std::iter::once(s)).await?;
        let relayed = gen.generated - before;
        l.stats.relay_tokens += relayed;
        relay_tokens.inc_by(u64::from(relayed));
        if let Some(f) = finish {
            break Ok(RelayEnd::Done(f));
        }
        if let Some(n) = l.p.switch_every {
            if (gen.generated as usize / n) % 2 == 0 {
                break Ok(RelayEnd::Resume(None));
            }
            continue;
        }
        if !tracker.check(&ctl, &mut l.ctl, id) {
            continue;
        }
        let p = l.propose(l.k_cap(gen), true).await;
        let others = std::mem::take(&mut l.alternatives);
        tracker.drafted_by(&ctl, &mut l.ctl, l.drafter, others);
        let remaining = gen.remaining() as usize;
        if let Some(p) = tracker.proposed(&ctl, &mut l.ctl, p, remaining) {
            break Ok(RelayEnd::Resume(Some(p)));
        }
    };
    drop(stream);
    let took = ctl.now().saturating_duration_since(start);
    tracing::debug!(
        relayed = tracker.relayed(),
        ms = took.as_secs_f64() * 1e3,
        probe = plan.probe,
        "relay segment"
    );
    l.d.metrics
        .mode_seconds
        .with_label_values(&["relay"])
        .inc_by(took.as_secs_f64());
    result
}
