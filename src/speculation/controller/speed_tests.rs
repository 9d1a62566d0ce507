//! Verify costs and the decode cost timed at different speeds of the machine: a decision
//! compares them at the speed the decode cost was timed at. Virtual time; nothing sleeps.

use std::sync::Arc;
use std::time::Duration;

use super::tests::{ctl_on, ms};
use super::VirtualClock;

/// Relays at `per_token` a decode step for `secs` (windows 50 ms apart), as four streams.
fn relay(c: &super::Controller, clock: &VirtualClock, per_token: f64, secs: f64) {
    for _ in 0..(secs / 0.05) as usize {
        c.record_decode(4, per_token);
        clock.advance(ms(50.0));
    }
}

fn verify_at_k4(c: &super::Controller) -> f64 {
    c.costs.costs(4, 4, 4, c.now()).ver[4].unwrap_or(0.0)
}

/// A batch entered a 3× load spike on a verify cost timed before it against a decode cost
/// timed in it (docs/controller.md): the verify cost is now read at the decode cost's speed.
#[test]
fn a_verify_cost_timed_before_a_slowdown_is_read_at_the_new_speed() {
    let clock = Arc::new(VirtualClock::default());
    let c = ctl_on(&clock);
    relay(&c, &clock, 0.012, 1.0);
    c.record_verify(4, 4, ms(30.0));
    assert!((verify_at_k4(&c) - 0.030).abs() < 1e-9);
    relay(&c, &clock, 0.020, 3.0);
    let dec = c.decode_cost_estimate(4).unwrap_or(0.0);
    assert!(dec > 0.019, "the decode cost learnt the slowdown: {dec}");
    let ver = verify_at_k4(&c);
    assert!(
        (ver / dec - 0.030 / 0.012).abs() < 0.1,
        "verify {ver} against decode {dec}: the ratio timed together"
    );
    // Within a quarter of the speed it was timed at, a verify cost is read as timed.
    let c = ctl_on(&clock);
    relay(&c, &clock, 0.012, 1.0);
    c.record_verify(4, 4, ms(30.0));
    relay(&c, &clock, 0.014, 3.0);
    assert!((verify_at_k4(&c) - 0.030).abs() < 1e-9);
}

/// Streams that speculate do not sample the decode cost: a verify timed while it was
/// stale is dated by the next decode sample, not by the stale estimate.
#[test]
fn a_verify_cost_timed_beside_a_stale_decode_cost_is_dated_by_the_next_sample() {
    let clock = Arc::new(VirtualClock::default());
    let c = ctl_on(&clock);
    relay(&c, &clock, 0.020, 1.0);
    clock.advance(Duration::from_secs(5));
    // The machine sped up while the streams speculated: the verify is timed fast.
    c.record_verify(4, 4, ms(30.0));
    relay(&c, &clock, 0.012, 0.05);
    let ver = verify_at_k4(&c);
    assert!(
        (ver - 0.030).abs() < 1e-9,
        "dated by the sample after it, not by the 20 ms estimate: {ver}"
    );
    relay(&c, &clock, 0.020, 3.0);
    let (ver, dec) = (verify_at_k4(&c), c.decode_cost_estimate(4).unwrap_or(0.0));
    assert!(
        ver > 0.040,
        "read at the slower speed again: {ver} (decode {dec})"
    );
}
