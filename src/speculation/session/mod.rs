//! The per-stream loop: draft, verify, accept, emit — or relay a plain continuation when
//! speculation would not pay — until a stop condition. The controller decides each round
//! (`speculation::controller`). Events go to the client writer over a bounded channel;
//! when the client goes away the channel closes and the loop stops, dropping any in-flight
//! upstream call (which closes its connection, so the upstream aborts the request).
//!
//! Switching never loses or repeats a token: the context is exactly the tokens emitted so
//! far, a relay is cancelled by dropping its stream (tokens it had buffered but not yet
//! emitted are discarded), and the next verify round or relay starts from the context.
//!
//! Layout: `api.rs` (what the request handler passes and receives), `driver.rs` (the
//! stream's state and the steps rounds and relays share), `round.rs` (one speculation
//! round), `relay.rs` (one relay segment); this file runs the loop between them.

use std::time::Instant;

mod api;
mod driver;
mod relay;
mod round;

pub use api::{Event, SessionDeps, SessionParams, Stats};

use driver::Driver;
use relay::{RelayEnd, RelayPlan};
use round::Round;

use crate::config::SpecMode;
use crate::draft::{DraftSet, Proposal};
use crate::error::ApiError;
use crate::inline::{Inline, Outbox};
use crate::speculation::controller::Watched;
use crate::speculation::generation::{Finish, Generation, Limits};
use crate::tokens::Detokenizer;

/// Start the loop; its events are read from the returned `Events`.
pub fn start(p: SessionParams, d: SessionDeps) -> Events {
    let finish = Some((d.drafters.clone(), p.stream));
    Events {
        inner: Inline::new(move |out| run(p, d, out)),
        finish,
    }
}

/// A running loop and its events. The loop has no task of its own: it runs while its
/// reader polls for the next event (the response body, polled by the client connection's
/// task; see `crate::inline`), so a relayed token is not handed from one task to another
/// on its way to the client. Dropping it (the client went away) drops the loop and any
/// upstream call in flight, which closes its connection: the upstream aborts the request.
pub struct Events {
    inner: Inline<Event>,
    finish: Option<(DraftSet, u64)>,
}

impl Events {
    /// The next event; `None` once the loop ended and every event was read.
    pub async fn recv(&mut self) -> Option<Event> {
        self.inner.next_item().await
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // The loop first: it may still hold the drafters' state of this stream.
        self.inner.stop();
        if let Some((drafters, stream)) = self.finish.take() {
            drafters.finish(stream);
        }
    }
}

enum State {
    /// The next round, with its proposal when there is one already; `true` when the
    /// controller already chose to verify it (a resume from relay).
    Speculate(Option<Proposal>, bool),
    Relay(RelayPlan),
}

fn limits(p: &SessionParams, d: &SessionDeps) -> Limits {
    let tok = &d.tokenizer;
    Limits {
        max_tokens: p.max_tokens,
        max_model_len: p.max_model_len,
        prompt_len: p.prompt.len() as u32,
        eos_id: tok.eos_id,
        extra_eos_ids: tok.extra_eos_ids.clone(),
        stop_token_ids: p.stop_token_ids.clone(),
        ignore_eos: p.ignore_eos,
        include_stop_str: p.include_stop_str,
    }
}

async fn run(p: SessionParams, d: SessionDeps, tx: Outbox<Event>) {
    let started = Instant::now();
    let _active = d.controller.enter();
    let detok = Detokenizer::for_model(&d.tokenizer, p.skip_special_tokens, &p.prompt);
    let mut gen = Generation::new(limits(&p, &d), detok, p.stop.clone());
    if let Some(r) = &p.reasoning {
        gen = gen.with_reasoning(r.stream(&p.prompt));
    }
    if let Some(t) = &p.tools {
        gen = gen.with_tools(t.stream());
    }
    let mut l = Driver::new(&p, &d, &tx);
    let result = drive(&mut l, &mut gen).await;
    record_request(&mut l, &gen, started);
    match result {
        Ok(finish) => {
            let piece = gen.take();
            l.stats.completion_tokens = gen.generated;
            let stats = l.stats.clone();
            tx.send(Event::Done {
                text: piece.text,
                tokens: piece.tokens,
                split: piece.split,
                calls: piece.calls,
                finish,
                stats,
            })
            .await;
        }
        Err(e) => {
            tx.send(Event::Error(e)).await;
        }
    }
}

/// Rounds and relay segments until the generation finishes.
async fn drive(l: &mut Driver<'_>, gen: &mut Generation<'_>) -> Result<Finish, ApiError> {
    let mut state = State::Speculate(None, false);
    loop {
        if gen.remaining() == 0 {
            return Ok(Finish::length());
        }
        state = match state {
            State::Speculate(pending, decided) => {
                match round::speculate(l, gen, pending, decided).await? {
                    Round::Done(f) => return Ok(f),
                    Round::Next(p) => State::Speculate(p, false),
                    Round::Relay(plan) => {
                        l.switched("speculate", "relay");
                        State::Relay(plan)
                    }
                }
            }
            State::Relay(plan) => match relay::relay(l, gen, plan).await? {
                RelayEnd::Done(f) => return Ok(f),
                RelayEnd::Ended => State::Relay(RelayPlan::default()),
                RelayEnd::Resume(p) => {
                    l.switched("relay", "speculate");
                    let decided = p.is_some();
                    State::Speculate(p, decided)
                }
            },
        };
    }
}

/// The request's own measurements, and its outcome for the `auto` watch.
fn record_request(l: &mut Driver<'_>, gen: &Generation<'_>, started: Instant) {
    let (p, d) = (l.p, l.d);
    d.metrics
        .rounds_per_request
        .with_label_values(&[l.drafter.as_str()])
        .observe(f64::from(l.stats.rounds));
    d.metrics.detokenize_errors.inc_by(gen.decode_errors());
    let overhead = started.elapsed().saturating_sub(l.outside);
    d.metrics
        .proxy_overhead
        .with_label_values(&["request"])
        .observe(overhead.as_secs_f64());
    if p.mode == SpecMode::Auto && p.switch_every.is_none() {
        d.controller.record_auto(Watched {
            tokens: gen.generated,
            speculated: gen.generated - l.stats.relay_tokens,
            seconds: started.elapsed().as_secs_f64(),
            plain_seconds: d.controller.plain_seconds(&l.ctl, gen.generated),
        });
    }
}

#[cfg(test)]
mod tests;
