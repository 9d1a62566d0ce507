//! Pacing in virtual time: costs are recorded by hand, tokens are counted, nothing sleeps.

use std::sync::Arc;
use std::time::Duration;

use super::super::{Controller, ControllerConfig, RelayTracker, StreamCtl, VirtualClock};
use super::{Rival, MAX_STRIDE, PAYING_SHARE, SHADOW_SHARE};
use crate::draft::{DrafterKind, Proposal};

const DEC: f64 = 0.005;
const MODEL_COST: f64 = 0.005;
const SUFFIX_COST: f64 = 0.000_02;
const CHEAP: DrafterKind = DrafterKind::Suffix;
const COSTLY: DrafterKind = DrafterKind::Model;

fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1000.0)
}

/// A controller on a virtual clock with a decode step of 5 ms, verify rounds of
/// `verify_ms`, and a draft model as slow as a decode step beside a cheap drafter.
fn setup(verify_ms: f64) -> (Arc<Controller>, Arc<VirtualClock>) {
    let clock = Arc::new(VirtualClock::default());
    let cfg = ControllerConfig {
        probe_interval: Duration::from_secs(3600),
        explore: 0.0,
        watch_every: 1,
    };
    let c = Controller::new(cfg, None).with_clock(clock.clone());
    for _ in 0..20 {
        c.record_decode(1, DEC);
        c.record_relay_start(1, ms(10.0));
        for k in [0, 2, 4, 8] {
            c.record_verify(k, 1, ms(verify_ms + 0.2 * k as f64));
        }
        c.record_draft(COSTLY, Duration::from_secs_f64(MODEL_COST));
        c.record_draft(CHEAP, Duration::from_secs_f64(SUFFIX_COST));
    }
    (Arc::new(c), clock)
}

fn proposal(k: usize, conf: f32) -> Proposal {
    Proposal {
        tokens: (0..k as u32).collect(),
        confidence: vec![conf; k],
    }
}

/// Teach the stream that `d`'s drafts are accepted with probability `p`.
fn teach(c: &Controller, s: &mut StreamCtl, d: DrafterKind, p: f64) {
    let mut rng = fastrand::Rng::with_seed(5);
    for _ in 0..300 {
        let n = (0..4).take_while(|_| rng.f64() < p).count();
        c.observe_acceptance(s, d, &[0.8; 4], n);
    }
}

/// Relays tokens 0, 1, 2, …; returns how many proposals each drafter made. Proposals are
/// the next four tokens when `right`, else four wrong ones.
fn relay(
    c: &Arc<Controller>,
    clock: &VirtualClock,
    s: &mut StreamCtl,
    tokens: u32,
    right: bool,
) -> [u32; 2] {
    let mut t =
        RelayTracker::new(c, CHEAP, false, None, c.now()).drafting_with(vec![CHEAP, COSTLY]);
    let mut drafts = [0; 2];
    for id in 0..tokens {
        clock.advance(Duration::from_secs_f64(DEC));
        t.arrived(c, c.now(), false);
        if !t.check(c, s, id) {
            continue;
        }
        let mut fresh = Vec::new();
        for (i, d) in [CHEAP, COSTLY].into_iter().enumerate() {
            if c.drafts_cheaply(d) || c.draft_due(s, d, Rival::Plain) {
                let first = if right { id + 1 } else { tokens + id };
                let p = Proposal {
                    tokens: (first..first + 4).collect(),
                    confidence: vec![0.8; 4],
                };
                c.drafted(s, d, &p);
                drafts[i] += 1;
                fresh.push((d, p));
            }
        }
        let (d, p) = fresh.remove(0);
        t.drafted_by(c, s, d, fresh);
        // The test relays on whatever the controller would do.
        let _ = t.proposed(c, s, p, 1000);
    }
    drafts
}

#[test]
fn shadow_proposals_of_a_costly_drafter_keep_to_their_share() {
    // Verify rounds of 15 ms against 5 ms decode steps: speculation does not pay.
    let (c, clock) = setup(15.0);
    let mut s = StreamCtl::new(true, 1);
    assert!(c.drafts_cheaply(CHEAP));
    assert!(!c.drafts_cheaply(COSTLY));
    let [cheap, costly] = relay(&c, &clock, &mut s, 1000, false);
    assert_eq!(cheap, 1000, "a cheap drafter drafts at every token");
    let share = f64::from(costly) * MODEL_COST / (1000.0 * DEC);
    assert!(
        share <= SHADOW_SHARE * 1.1,
        "{costly} proposals of the draft model: {share:.3} of the relayed time"
    );
    assert!(
        f64::from(costly) >= 1000.0 / MAX_STRIDE,
        "its estimates must stay current: {costly} proposals"
    );
}

#[test]
fn a_costly_drafter_expected_to_pay_is_checked_more_often() {
    // Verify rounds of 6 ms and drafts mostly accepted: leaving relay would pay.
    let (c, clock) = setup(6.0);
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, COSTLY, 0.97);
    let [_, costly] = relay(&c, &clock, &mut s, 1000, true);
    let share = f64::from(costly) * MODEL_COST / (1000.0 * DEC);
    assert!(
        share > 2.0 * SHADOW_SHARE && share <= PAYING_SHARE * 1.1,
        "{costly} proposals: {share:.3} of the relayed time"
    );
}

/// Rounds of 10 ms with a cheap proposal of confidence 0.8 (empty when `cheap_empty`);
/// returns the rounds in which the costly drafter drafted.
fn rounds(
    c: &Controller,
    clock: &VirtualClock,
    s: &mut StreamCtl,
    n: u32,
    cheap_empty: bool,
) -> u32 {
    let mut costly = 0;
    for _ in 0..n {
        clock.advance(ms(10.0));
        let cheap = proposal(if cheap_empty { 0 } else { 4 }, 0.8);
        c.drafted(s, CHEAP, &cheap);
        let rival = c.rival(s, false, &[(CHEAP, cheap)]);
        if c.draft_due(s, COSTLY, rival) {
            c.drafted(s, COSTLY, &proposal(4, 0.8));
            costly += 1;
        }
    }
    costly
}

#[test]
fn in_a_round_a_costly_drafter_drafts_when_expected_to_beat_the_cheap_one() {
    let (c, clock) = setup(6.0);
    // The cheap drafter's proposals are accepted, the costly one's are not: it drafts
    // only within its shadow share.
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, CHEAP, 0.97);
    teach(&c, &mut s, COSTLY, 0.05);
    let costly = rounds(&c, &clock, &mut s, 200, false);
    let share = f64::from(costly) * MODEL_COST / 2.0;
    assert!(
        share <= SHADOW_SHARE * 1.1 && costly > 0,
        "{costly} of 200 rounds"
    );
    // Without a cheap proposal to verify, the costly drafter drafts every round.
    assert_eq!(rounds(&c, &clock, &mut s, 50, true), 50);
    // The other way round: the costly drafter is expected to win, every round.
    let mut s = StreamCtl::new(true, 2);
    teach(&c, &mut s, CHEAP, 0.05);
    teach(&c, &mut s, COSTLY, 0.97);
    assert_eq!(rounds(&c, &clock, &mut s, 200, false), 200);
}

#[test]
fn unmeasured_costs_draft_every_time() {
    let c = Controller::default();
    let s = StreamCtl::new(true, 1);
    // Nothing measured yet: every drafter is cheap and due (its cost must be measured).
    assert!(c.drafts_cheaply(COSTLY));
    assert!(c.draft_due(&s, COSTLY, Rival::Plain));
    assert!(c.draft_due(&s, COSTLY, Rival::Rate(1e9)));
}
