//! Estimates that caught a stall: the first verify steps or decode window of a level,
//! timed while the machine stood still, are re-measured soon instead of keeping every
//! stream in the wrong mode until the probe interval. Virtual time; nothing sleeps.

use std::sync::Arc;
use std::time::Duration;

use super::{Clock, Controller, ControllerConfig, Decision, StreamCtl, VirtualClock};
use crate::config::SpecMode;
use crate::draft::{DrafterKind, Proposal};

fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1000.0)
}

/// A controller on a virtual clock probing every 10 s.
fn controller() -> (Arc<Controller>, Arc<VirtualClock>) {
    let clock = Arc::new(VirtualClock::default());
    let cfg = ControllerConfig {
        probe_interval: Duration::from_secs(10),
        explore: 0.0,
        watch_every: 1,
    };
    (
        Arc::new(Controller::new(cfg, None).with_clock(clock.clone())),
        clock,
    )
}

/// `controller()` with plain decoding measured at 12.1 ms a token.
fn setup() -> (Arc<Controller>, Arc<VirtualClock>) {
    let (c, clock) = controller();
    for _ in 0..20 {
        c.record_decode(1, 0.0121);
        c.record_relay_start(1, ms(31.0));
    }
    (c, clock)
}

fn proposal(k: usize) -> Proposal {
    Proposal {
        tokens: (0..k as u32).collect(),
        confidence: vec![0.5; k],
    }
}

/// A stream whose drafts are accepted at `p` per position.
fn stream(c: &Controller, p: f64) -> StreamCtl {
    let mut s = StreamCtl::new(true, 1);
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..400 {
        let n = (0..16).take_while(|_| rng.f64() < p).count();
        c.observe_acceptance(&mut s, DrafterKind::Oracle, &[0.5; 16], n);
    }
    s
}

fn later(clock: &VirtualClock, by: Duration) {
    clock.advance_to(clock.now() + by);
}

/// The first verify step caught a 322 ms stall: the relaying stream re-measures it at
/// once (one probe per sixteenth of the interval), and the next call, a tenth of it,
/// replaces the estimate instead of moving it 5 % down. Before, the stream relayed
/// through three requests of good drafts.
#[test]
fn a_first_verify_step_that_caught_a_stall_is_re_measured_and_replaced() {
    let (c, clock) = setup();
    let _me = c.enter();
    let _r = c.relaying();
    let mut s = stream(&c, 0.95);
    c.record_verify(16, 1, ms(322.0));
    let resume = |s: &mut StreamCtl| c.plan_resume(s, DrafterKind::Oracle, &proposal(16), 1000);
    assert_eq!(resume(&mut s), Some(16), "re-measured at once");
    assert_eq!(resume(&mut s), None, "one probe at a time");
    later(&clock, ms(700.0));
    assert_eq!(
        resume(&mut s),
        Some(16),
        "again a sixteenth of the interval later"
    );
    later(&clock, ms(30.0));
    c.record_verify(16, 1, ms(30.0));
    let v = c.verify_cost_estimate(16, 1).unwrap_or(1.0);
    assert!((v - 0.030).abs() < 1e-9, "replaced: {v}");
}

/// Calls of streams verifying in one step count as one step: sixteen 200 ms calls that
/// ended together are still one step that may have caught a stall, while three steps one
/// after another at that cost are a load that really went up, and believed.
#[test]
fn calls_of_one_step_are_one_step_and_three_steps_are_a_load() {
    let (c, _) = setup();
    let _me = c.enter();
    let _r = c.relaying();
    let mut s = stream(&c, 0.95);
    for _ in 0..16 {
        c.record_verify(16, 1, ms(200.0));
    }
    let resume = |c: &Controller, s: &mut StreamCtl| {
        c.plan_resume(s, DrafterKind::Oracle, &proposal(16), 1000)
    };
    assert_eq!(resume(&c, &mut s), Some(16), "one step: re-measured");

    let (c, clock) = setup();
    let _me = c.enter();
    let _r = c.relaying();
    let mut s = stream(&c, 0.95);
    for _ in 0..3 {
        later(&clock, ms(200.0));
        c.record_verify(16, 1, ms(200.0));
    }
    assert_eq!(resume(&c, &mut s), None, "three steps: believed");
}

/// A decode cost near a verify's, from a first relay window that caught a stall, is
/// re-measured a sixteenth of the probe interval later (not a quarter): with drafts
/// that are never accepted, every round until then is lost.
#[test]
fn a_decode_cost_as_high_as_a_verify_is_re_measured_soon() {
    let (c, clock) = controller();
    c.record_decode(1, 0.0467);
    c.record_relay_start(1, ms(40.0));
    c.record_verify(1, 1, ms(34.0));
    let _me = c.enter();
    let mut s = stream(&c, 0.0);
    let plan = |s: &mut StreamCtl| {
        c.plan_round(s, SpecMode::Auto, DrafterKind::Oracle, &proposal(1), 1000)
    };
    assert!(matches!(plan(&mut s), Decision::Speculate(_)));
    later(&clock, ms(300.0));
    assert!(matches!(plan(&mut s), Decision::Speculate(_)));
    later(&clock, ms(400.0));
    assert_eq!(plan(&mut s), Decision::Relay { probe: true });
}

/// Eight streams' one step together caught a stall; one stream's probe since measured the
/// cost alone. Decisions for the eight verifying together use that, not the stall: the
/// batch's verdict rests on that level, and it never verified together again (0.73 of
/// static K = 8 in the harness, every stream relaying).
#[test]
fn a_level_whose_verify_cost_looks_like_a_stall_borrows_a_trusted_one() {
    let (c, clock) = setup();
    for _ in 0..8 {
        c.record_verify(16, 8, ms(232.0));
    }
    assert!(
        c.verify_cost_estimate(16, 8).unwrap_or(0.0) > 0.2,
        "nothing else measured"
    );
    later(&clock, ms(100.0));
    c.record_verify(16, 1, ms(30.0));
    let v = c.verify_cost_estimate(16, 8).unwrap_or(1.0);
    assert!((v - 0.030).abs() < 1e-9, "{v}");
}
