//! Relay segments: the upstream decodes a plain streaming continuation of the context and
//! specd forwards its tokens. Meanwhile specd measures plain decoding (first-token latency
//! and the gap between tokens, for the controller's T_dec) and keeps checking the drafter:
//! a shadow proposal is compared with the tokens that actually arrive, which tells the
//! controller how well the drafter would do without paying for a verify call. When a
//! fresh proposal is expected to pay, the stream is dropped (the upstream aborts the
//! request) and speculation resumes from exactly the tokens emitted so far.

use std::time::Instant;

use futures_util::StreamExt;

use super::controller::PROBE_TOKENS;
use super::generation::{Finish, Generation};
use super::session::Loop;
use crate::draft::Proposal;
use crate::error::ApiError;
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

/// Tokens averaged per decode-cost sample (streamed tokens may arrive in bursts).
const DECODE_WINDOW: u32 = 4;
/// Tokens between samples of the segment's mean gap so far (for the low envelope: a mean
/// over the whole segment, which a burst of buffered tokens barely moves).
const SEGMENT_SAMPLE: u32 = 16;

impl Loop<'_> {
    pub(super) async fn relay(
        &mut self,
        gen: &mut Generation<'_>,
        plan: RelayPlan,
    ) -> Result<RelayEnd, ApiError> {
        let start = Instant::now();
        let ctl = self.d.controller.clone();
        let load = ctl.load();
        let _relaying = ctl.relaying();
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
        let min_tokens = if plan.probe { PROBE_TOKENS } else { 0 };
        let stride = ctl.shadow_stride(self.drafter);
        // The proposal being checked and how many of its tokens matched so far.
        let mut shadow = plan.shadow.filter(|p| !p.tokens.is_empty()).map(|p| (p, 0));
        let mut relayed = 0u32;
        let mut since_draft = 0u32;
        let mut window = (start, 0u32);
        let mut first_at = start;
        let result = loop {
            let t = Instant::now();
            let item = stream.next().await;
            let now = Instant::now();
            self.outside += now - t;
            let Some(item) = item else {
                if relayed == 0 {
                    break Err(ApiError::UpstreamProtocol(
                        "relay continuation ended without a token".into(),
                    ));
                }
                break Ok(RelayEnd::Ended);
            };
            let s = item?;
            let id = s.id;
            relayed += 1;
            if relayed == 1 {
                ctl.record_relay_start(load, now - start);
                window = (now, 0);
                first_at = now;
            } else {
                if (relayed - 1) % SEGMENT_SAMPLE == 0 {
                    let mean = (now - first_at).as_secs_f64() / f64::from(relayed - 1);
                    ctl.record_decode_mean(load, mean);
                }
                window.1 += 1;
                if window.1 >= DECODE_WINDOW {
                    let per_token = (now - window.0).as_secs_f64() / f64::from(window.1);
                    ctl.record_decode(load, per_token);
                    window = (now, 0);
                }
            }
            let before = gen.generated;
            let finish = self.emit(gen, vec![s]).await?;
            self.stats.relay_tokens += gen.generated - before;
            self.d
                .metrics
                .output_tokens
                .with_label_values(&["relay"])
                .inc_by(u64::from(gen.generated - before));
            if let Some(f) = finish {
                break Ok(RelayEnd::Done(f));
            }
            if let Some(n) = self.p.switch_every {
                if (gen.generated as usize / n) % 2 == 0 {
                    break Ok(RelayEnd::Resume(None));
                }
                continue;
            }
            if let Some((p, matched)) = &mut shadow {
                let same = p.tokens.get(*matched) == Some(&id);
                if same {
                    *matched += 1;
                }
                // Resolved at the first differing token, or when every draft matched.
                if !same || *matched == p.tokens.len() {
                    ctl.observe_acceptance(&mut self.ctl, self.drafter, &p.confidence, *matched);
                    shadow = None;
                }
            }
            since_draft += 1;
            if shadow.is_some() || since_draft < stride {
                continue;
            }
            since_draft = 0;
            let k_cap = self.k_cap(gen);
            let p = self.propose(k_cap).await;
            if relayed >= min_tokens {
                let left = gen.remaining() as usize;
                if let Some(k) = ctl.plan_resume(&mut self.ctl, self.drafter, &p, left) {
                    let mut p = p;
                    p.tokens.truncate(k);
                    p.confidence.truncate(k);
                    break Ok(RelayEnd::Resume(Some(p)));
                }
            }
            if !p.tokens.is_empty() {
                shadow = Some((p, 0));
            }
        };
        drop(stream);
        tracing::debug!(
            relayed,
            ms = start.elapsed().as_secs_f64() * 1e3,
            probe = plan.probe,
            "relay segment"
        );
        self.d
            .metrics
            .mode_seconds
            .with_label_values(&["relay"])
            .inc_by(start.elapsed().as_secs_f64());
        result
    }
}
