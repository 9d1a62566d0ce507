//! When plain decoding's cost is first measured: a stream relays to time it, unless the
//! round wins whatever it turns out to be, and then only later. Virtual time; nothing
//! sleeps.

use std::sync::Arc;
use std::time::Duration;

use super::tests::{ctl, ctl_on, ms, proposal, teach};
use super::{Clock, Controller, Decision, StreamCtl, VirtualClock};
use crate::config::SpecMode;
use crate::draft::DrafterKind;

#[test]
fn cold_start_measures_verify_then_decode() {
    let c = ctl();
    let _me = c.enter();
    let plan = |s: &mut StreamCtl, k: usize| {
        c.plan_round(
            s,
            SpecMode::Auto,
            DrafterKind::Ngram,
            &proposal(k, 0.5),
            100,
        )
    };
    let mut s = StreamCtl::new(true, 1);
    // Nothing known: verify what there is, relay when there is nothing.
    assert_eq!(plan(&mut s, 3), Decision::Speculate(3));
    assert_eq!(plan(&mut s, 0), Decision::Relay { probe: false });
    // Verify cost known, decode cost not: one stream probes plain decoding.
    c.record_verify(3, 1, ms(30.0));
    assert_eq!(plan(&mut s, 3), Decision::Relay { probe: true });
    assert_eq!(
        plan(&mut s, 3),
        Decision::Relay { probe: false },
        "the probe is claimed once per interval; without a decode cost the others relay"
    );
    // A seeded sampled stream may not relay: it verifies.
    let mut seeded = StreamCtl::new(false, 2);
    assert_eq!(plan(&mut seeded, 3), Decision::Speculate(3));
}

#[test]
fn a_round_that_wins_by_far_defers_the_first_decode_probe() {
    let clock = Arc::new(VirtualClock::default());
    let c = ctl_on(&clock);
    let _me = c.enter();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.99, 0.9);
    c.record_verify(16, 1, ms(30.0));
    let mut plan = |c: &Controller, remaining: usize| {
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(16, 0.9),
            remaining,
        )
    };
    // No decode cost yet, but more tokens a round than a verify costs decode steps.
    assert!(matches!(plan(&c, 1000), Decision::Speculate(k) if k > 6));
    let start = clock.now();
    // A quarter interval for each time the round's 15.7 tokens hold the 6 that break even.
    clock.advance_to(start + Duration::from_secs(6));
    assert!(matches!(plan(&c, 1000), Decision::Speculate(_)), "deferred");
    clock.advance_to(start + Duration::from_secs(9));
    // Near the end of a generation the round is short because the cap is: up to the
    // whole interval.
    assert!(
        matches!(plan(&c, 20), Decision::Speculate(_)),
        "deferred near the end"
    );
    assert_eq!(
        plan(&c, 1000),
        Decision::Relay { probe: true },
        "then measured"
    );

    // A step of 20 streams × 17 tokens may be compute-bound: no deferral there.
    let c = ctl();
    let _all: Vec<_> = (0..20).map(|_| c.enter()).collect();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.99, 0.9);
    c.record_verify(16, 20, ms(30.0));
    assert_eq!(
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(16, 0.9),
            1000
        ),
        Decision::Relay { probe: true }
    );
}

/// A generation's last round, cut short by the tokens left, that is expected to yield
/// most of them: verified as it is, not relayed to measure the decode cost first.
#[test]
fn the_last_round_of_a_generation_defers_the_first_decode_probe() {
    // Acceptance 0.9 learned, one verify timed, no decode cost yet.
    let plan = |k: usize, remaining: usize| {
        let c = ctl();
        let _me = c.enter();
        let mut s = StreamCtl::new(true, 1);
        teach(&c, &mut s, 0.9, 0.9);
        c.record_verify(k, 1, ms(30.0));
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(k, 0.9),
            remaining,
        )
    };
    // Four drafts yield about 4.1 tokens, under the 6 decode steps a verify may cost:
    // mid-generation, plain decoding is measured first.
    assert_eq!(plan(4, 1000), Decision::Relay { probe: true });
    // The same round with 5 tokens left ends the generation.
    assert_eq!(plan(4, 5), Decision::Speculate(4));
    // One expected to yield under half of what is left is no such round.
    assert_eq!(plan(4, 9), Decision::Relay { probe: true });
}

/// A level that deferred its first decode probe keeps deferring it through a round that
/// falls a little short of winning by far (an estimate's dip), but not through one that
/// falls far short.
#[test]
fn a_deferred_decode_probe_outlasts_a_dip() {
    let setup = || {
        let c = ctl();
        let mut s = StreamCtl::new(true, 1);
        teach(&c, &mut s, 0.99, 0.9);
        c.record_verify(16, 1, ms(30.0));
        (c, s)
    };
    let plan = |c: &Controller, s: &mut StreamCtl, k: usize| {
        c.plan_round(
            s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(k, 0.9),
            1000,
        )
    };
    // Five drafts yield about 5.9 tokens: under the 6 a verify may cost in decode steps.
    let (c, mut s) = setup();
    let _me = c.enter();
    assert_eq!(plan(&c, &mut s, 5), Decision::Relay { probe: true });
    let (c, mut s) = setup();
    let _me = c.enter();
    assert!(matches!(plan(&c, &mut s, 16), Decision::Speculate(k) if k > 6));
    assert_eq!(
        plan(&c, &mut s, 5),
        Decision::Speculate(5),
        "still deferred"
    );
    assert_eq!(
        plan(&c, &mut s, 2),
        Decision::Relay { probe: true },
        "3 tokens a round are no dip"
    );
}
