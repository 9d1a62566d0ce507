use super::*;
use crate::config::SpecMode;
use crate::draft::Proposal;
use std::time::Instant;

pub(super) fn ctl() -> Arc<Controller> {
    Arc::new(Controller::new(
        ControllerConfig {
            probe_interval: Duration::from_secs(3600),
            explore: 0.0,
            watch_every: 1,
        },
        None,
    ))
}

/// A controller on a virtual clock, probing every 10 s.
pub(super) fn ctl_on(clock: &Arc<VirtualClock>) -> Arc<Controller> {
    Arc::new(
        Controller::new(
            ControllerConfig {
                probe_interval: Duration::from_secs(10),
                explore: 0.0,
                watch_every: 1,
            },
            None,
        )
        .with_clock(clock.clone()),
    )
}

pub(super) fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1000.0)
}

pub(super) fn proposal(k: usize, conf: f32) -> Proposal {
    Proposal {
        tokens: (0..k as u32).collect(),
        confidence: vec![conf; k],
    }
}

/// The field figures: 12.1 ms per decoded token, ≈30 ms per verify, growing with K.
fn field(c: &Controller) {
    for _ in 0..20 {
        c.record_decode(1, 0.0121);
        c.record_relay_start(1, ms(31.0));
        for k in [0, 2, 4, 8] {
            c.record_verify(k, 1, ms(29.5 + 0.6 * k as f64));
        }
    }
}

/// Teach the stream an acceptance rate `p` (conditional, every position).
pub(super) fn teach(c: &Controller, s: &mut StreamCtl, p: f64, conf: f32) {
    let mut rng = fastrand::Rng::with_seed(3);
    for _ in 0..400 {
        let n = (0..8).take_while(|_| rng.f64() < p).count();
        c.observe_acceptance(s, DrafterKind::Oracle, &[conf; 8], n);
    }
}

#[test]
fn expected_tokens_is_one_plus_cumulative_products() {
    assert_eq!(expected_tokens(&[], 0), 1.0);
    assert!((expected_tokens(&[0.5, 0.5, 0.5], 3) - 1.875).abs() < 1e-12);
    assert!((expected_tokens(&[0.5, 0.5, 0.5], 1) - 1.5).abs() < 1e-12);
    assert!((expected_tokens(&[1.0; 4], 4) - 5.0).abs() < 1e-12);
}

#[test]
fn verify_cost_is_interpolated_and_extrapolated() {
    let now = Instant::now();
    let mut l = costs::Level::default();
    assert_eq!(l.ver_at(3, 1), None);
    l.ver[2].add(0.030, 0.1, now);
    // One point: a mild 3 % per token slope, never below half.
    assert!((l.ver_at(4, 1).unwrap_or(0.0) - 0.030 * 1.06).abs() < 1e-9);
    l.ver[6].add(0.034, 0.1, now);
    assert!((l.ver_at(4, 1).unwrap_or(0.0) - 0.032).abs() < 1e-9);
    assert!((l.ver_at(8, 1).unwrap_or(0.0) - 0.036).abs() < 1e-9);
    assert!((l.ver_at(0, 1).unwrap_or(0.0) - 0.028).abs() < 1e-9);
}

#[test]
fn past_the_memory_bound_an_extrapolated_verify_cost_grows_with_its_tokens() {
    let now = Instant::now();
    let mut l = costs::Level::default();
    l.ver[3].add(0.065, 0.1, now);
    // 64 streams at K = 3 compute 256 tokens a step; at K = 12, 832: 3.25 times as many.
    assert!((l.ver_at(12, 64).unwrap_or(0.0) - 0.065 * 3.25).abs() < 1e-9);
    // Within the bound (one stream), the mild slope: 3 % a draft.
    assert!((l.ver_at(12, 1).unwrap_or(0.0) - 0.065 * 1.27).abs() < 1e-9);
    // Downwards, and between measured points, as before.
    assert!((l.ver_at(1, 64).unwrap_or(0.0) - 0.065 * 0.94).abs() < 1e-9);
}

/// What a stream's first round does with a proposal of 16, `streams` streams at the
/// upstream and no verify cost measured yet.
fn first_round(streams: usize) -> Decision {
    let c = ctl();
    let _streams: Vec<Active> = (0..streams).map(|_| c.enter()).collect();
    let mut s = StreamCtl::new(true, 1);
    let p = proposal(16, 0.9);
    c.plan_round(&mut s, SpecMode::Auto, DrafterKind::Oracle, &p, 200)
}

#[test]
fn a_first_round_in_a_large_batch_stays_within_the_memory_bound() {
    // The first round measures a verify cost, with K such that 64 streams compute at
    // most 256 tokens in its step; a few streams verify the whole proposal.
    assert_eq!(first_round(64), Decision::Speculate(3));
    assert_eq!(first_round(4), Decision::Speculate(16));
}

/// Mean of an estimate's values over the second half of 4000 jittered calls of 30 ms ± 30 %
/// (one in fifty caught in a 200 ms stall, with `stalls`).
fn settled(add: impl Fn(&mut ewma::Ewma, f64), stalls: bool) -> f64 {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut e = ewma::Ewma::default();
    let (n, mut sum) = (4000, 0.0);
    for i in 0..n {
        let x = if stalls && i % 50 == 49 {
            0.2
        } else {
            0.030 * (0.7 + 0.6 * rng.f64())
        };
        add(&mut e, x);
        if i >= n / 2 {
            sum += e.get().unwrap_or(0.0);
        }
    }
    sum / f64::from(n / 2)
}

#[test]
fn the_verify_estimate_sits_near_the_median_under_jitter_and_stalls() {
    let now = Instant::now();
    let quantile = |e: &mut ewma::Ewma, x| e.add_quantile(x, 0.45, now);
    // Near the jittered calls' median (30 ms), with stalls or without.
    for stalls in [false, true] {
        let v = settled(quantile, stalls);
        assert!((0.0285..0.0305).contains(&v), "{v}");
    }
    // A low envelope of the same calls sits near the fastest of them: under jitter alone,
    // 0.8 of their mean, and speculation looked a quarter better than it was.
    let low = settled(|e, x| e.add_low(x, now), false);
    assert!(low < 0.9 * 0.030, "{low}");
}

#[test]
fn speculates_when_it_pays_and_relays_when_not() {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let mut good = StreamCtl::new(true, 1);
    teach(&c, &mut good, 0.95, 0.5);
    // 0.95 per position: E(8) ≈ 7.4 tokens per ~34 ms against 12.1 ms per token.
    assert_eq!(
        c.plan_round(
            &mut good,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(8, 0.5),
            100
        ),
        Decision::Speculate(8)
    );
    // Short chain of accept length ~2.0: a loss on this server, so relay.
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let mut meh = StreamCtl::new(true, 2);
    teach(&c, &mut meh, 0.52, 0.5);
    assert_eq!(
        c.plan_round(
            &mut meh,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(4, 0.5),
            100
        ),
        Decision::Relay { probe: false }
    );
    // `on` verifies what was proposed; seeded sampling may not relay and picks K (0 allowed).
    assert_eq!(
        c.plan_round(
            &mut meh,
            SpecMode::On,
            DrafterKind::Oracle,
            &proposal(4, 0.5),
            100
        ),
        Decision::Speculate(4)
    );
    let mut seeded = StreamCtl::new(false, 3);
    teach(&c, &mut seeded, 0.0, 0.5);
    assert_eq!(
        c.plan_round(
            &mut seeded,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(4, 0.5),
            100
        ),
        Decision::Speculate(0)
    );
}

#[test]
fn the_stream_residual_tracks_changes_quickly() {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.1, 0.5);
    assert!(matches!(
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(8, 0.5),
            100
        ),
        Decision::Relay { .. }
    ));
    // The stream now accepts everything: a few observations turn the decision around.
    for _ in 0..3 {
        c.observe_acceptance(&mut s, DrafterKind::Oracle, &[0.5; 8], 8);
    }
    assert_eq!(
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(8, 0.5),
            100
        ),
        Decision::Speculate(8)
    );
}

#[test]
fn confidence_is_calibrated_per_drafter() {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    // This drafter's 0.9-confidence tokens are always right, its 0.2 ones never.
    let mut s = StreamCtl::new(true, 1);
    for _ in 0..200 {
        c.observe_acceptance(&mut s, DrafterKind::Suffix, &[0.9, 0.9, 0.9, 0.2], 3);
    }
    let hi = c.acceptance_estimate(&StreamCtl::new(true, 2), DrafterKind::Suffix, &[0.95]);
    let lo = c.acceptance_estimate(
        &StreamCtl::new(true, 2),
        DrafterKind::Suffix,
        &[0.25, 0.25, 0.25, 0.25],
    );
    assert!(hi[0] > 0.95, "{hi:?}");
    assert!(lo[3] < 0.1, "{lo:?}");
    // Other drafters are not affected.
    let other = c.acceptance_estimate(&StreamCtl::new(true, 2), DrafterKind::Ngram, &[0.2]);
    assert!((other[0] - 0.2).abs() < 1e-6);
}

#[test]
fn the_loss_imposed_on_decoding_streams_is_charged() {
    let c = ctl();
    // 16 streams: decoding costs 13.6 ms, one verify in the batch ≈ 36 ms.
    for _ in 0..20 {
        c.record_decode(16, 0.0136);
        c.record_relay_start(16, ms(36.0));
        for k in [2, 4, 8] {
            c.record_verify(k, 1, ms(31.0 + 0.7 * k as f64));
        }
    }
    let guards: Vec<_> = (0..16).map(|_| c.enter()).collect();
    let relays: Vec<_> = (0..15).map(|_| c.relaying()).collect();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.8, 0.5);
    // Alone it would pay (E(8) ≈ 4.4 per ~37 ms vs 13.6 ms), but 15 decoding streams
    // would each lose ~23 ms per verify step.
    assert_eq!(
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(8, 0.5),
            100
        ),
        Decision::Relay { probe: false }
    );
    drop(relays);
    assert!(matches!(
        c.plan_round(&mut s, SpecMode::Auto, DrafterKind::Oracle, &proposal(8, 0.5), 100),
        Decision::Speculate(k) if k >= 4
    ));
    drop(guards);
}

#[test]
fn resume_needs_the_saving_to_cover_the_switch() {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let _r = c.relaying();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.98, 0.5);
    assert_eq!(
        c.plan_resume(&mut s, DrafterKind::Oracle, &proposal(8, 0.5), 100),
        Some(8)
    );
    assert_eq!(
        c.plan_resume(&mut s, DrafterKind::Oracle, &proposal(0, 0.5), 100),
        None
    );
    // Beside `s` the batch speculates, and every stream joins a speculating batch (relaying
    // beside its verify steps, a token costs a verify step)...
    let mut joining = StreamCtl::new(true, 3);
    teach(&c, &mut joining, 0.3, 0.5);
    assert!(c
        .plan_resume(&mut joining, DrafterKind::Oracle, &proposal(8, 0.5), 100)
        .is_some());
    drop((s, joining));
    // ...but alone, weak drafts do not pay for the switch.
    let mut weak = StreamCtl::new(true, 2);
    teach(&c, &mut weak, 0.3, 0.5);
    assert_eq!(
        c.plan_resume(&mut weak, DrafterKind::Oracle, &proposal(8, 0.5), 100),
        None
    );
}

/// What `plan_resume` says to a proposal of 8 from a lone relaying stream taught
/// acceptance `p`, on the field's costs.
fn resume_alone(p: f64) -> Option<usize> {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let _r = c.relaying();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, p, 0.5);
    c.plan_resume(&mut s, DrafterKind::Oracle, &proposal(8, 0.5), 100)
}

#[test]
fn a_stream_alone_resumes_only_where_the_gain_exceeds_its_estimate_noise() {
    // Estimated at about 0.73 a position, a round of 8 saves 8 ms against plain decoding:
    // four such rounds cover the 19 ms relay restart. Lowered by one standard deviation of
    // the residual's noise (about 0.07), it saves under 1 ms: a lone stream stays relaying.
    assert_eq!(resume_alone(0.82), None);
    assert!(resume_alone(0.9).is_some());
}

#[test]
fn no_relay_restart_for_the_last_few_tokens() {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.52, 0.5);
    assert_eq!(
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(1, 0.5),
            2
        ),
        Decision::Speculate(1)
    );
    assert_eq!(
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(1, 0.5),
            100
        ),
        Decision::Relay { probe: false }
    );
}

/// The last token with nothing drafted: a verify call without drafts where it costs no
/// more than starting a relay (whose start would be all it relays); a relay otherwise,
/// and wherever more tokens are left.
#[test]
fn the_last_token_is_verified_where_a_relay_start_costs_more() {
    let c = ctl();
    field(&c);
    let _me = c.enter();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.9, 0.5);
    let mut plan = |remaining| {
        c.plan_round(
            &mut s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(0, 0.5),
            remaining,
        )
    };
    // A verify without drafts 29.5 ms, a relay start 31 ms.
    assert_eq!(plan(1), Decision::Speculate(0));
    assert_eq!(plan(5), Decision::Relay { probe: false });
    // Relay starts at 20 ms: the relay.
    for _ in 0..20 {
        c.record_relay_start(1, ms(20.0));
    }
    assert_eq!(plan(1), Decision::Relay { probe: false });
}

#[test]
fn clients_that_bypass_specd_count_as_decoding_streams() {
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = running.clone();
    let c = Arc::new(
        Controller::new(
            ControllerConfig {
                probe_interval: Duration::from_secs(3600),
                explore: 0.0,
                watch_every: 1,
            },
            None,
        )
        .with_upstream_running(Box::new(move || {
            Some((
                r.load(std::sync::atomic::Ordering::Relaxed) as f64,
                Instant::now(),
            ))
        })),
    );
    for _ in 0..20 {
        c.record_decode(1, 0.0121);
        c.record_relay_start(1, ms(31.0));
        for k in [2, 4, 8] {
            c.record_verify(k, 1, ms(31.0 + 0.7 * k as f64));
        }
    }
    let _me = c.enter();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.8, 0.5);
    let plan = |s: &mut StreamCtl| {
        c.plan_round(
            s,
            SpecMode::Auto,
            DrafterKind::Oracle,
            &proposal(8, 0.5),
            100,
        )
    };
    // The upstream counts only this stream's own verify prompts: no one else decodes.
    running.store(9, std::sync::atomic::Ordering::Relaxed);
    {
        let _v = c.verifying(9);
    }
    assert!(matches!(plan(&mut s), Decision::Speculate(_)));
    // Fifteen more requests from elsewhere: a verify pass would slow all of them.
    running.store(24, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(plan(&mut s), Decision::Relay { probe: false });
}

#[test]
fn an_old_verify_cost_is_trusted_less_and_less() {
    let clock = Arc::new(VirtualClock::default());
    let c = ctl_on(&clock);
    // Verify rounds measured in a load spike: 200 ms, where 8 good drafts are worth
    // about 100 ms of plain decoding; one step after another (a cost that high on one
    // or two steps would look like a stall).
    for _ in 0..20 {
        c.record_decode(1, 0.0121);
        c.record_relay_start(1, ms(31.0));
        for k in [0, 2, 4, 8] {
            clock.advance_to(clock.now() + ms(200.0));
            c.record_verify(k, 1, ms(200.0));
        }
    }
    let _me = c.enter();
    let _r = c.relaying();
    let mut s = StreamCtl::new(true, 1);
    teach(&c, &mut s, 0.98, 0.5);
    let measured_at = clock.now();
    let measured_ago = |intervals: u64| {
        clock.advance_to(measured_at + Duration::from_secs(10 * intervals) + ms(1.0));
    };
    let mut resume = || c.plan_resume(&mut s, DrafterKind::Oracle, &proposal(8, 0.5), 100);
    assert_eq!(resume(), None, "fresh: the round does not pay");
    measured_ago(1);
    assert_eq!(resume(), None, "one interval old: still trusted enough");
    measured_ago(8);
    assert_eq!(resume(), Some(8), "eight intervals old: re-measured");
    assert_eq!(resume(), None, "one probe per interval");
}

#[test]
fn a_decode_cost_as_high_as_a_verify_is_not_believed() {
    let c = ctl();
    c.record_verify(4, 1, ms(30.0));
    // A first window that caught a stall: capped below the verify cost, and flagged.
    c.record_decode(1, 0.049);
    let d = c.decode_cost_estimate(1).unwrap_or(0.0);
    assert!(d <= 0.8 * 0.030 + 1e-9, "{d}");
    // The next window replaces it instead of being averaged with it.
    c.record_decode(1, 0.012);
    let d = c.decode_cost_estimate(1).unwrap_or(0.0);
    assert!((d - 0.012).abs() < 1e-9, "{d}");
}

/// A decode cost measured in a load spike, then unsampled for seconds while streams
/// speculated: the first cheaper window after the spike brings it most of the way down.
/// A dearer one does not raise it faster than before (it may have caught a stall).
#[test]
fn an_old_decode_cost_gives_way_to_a_cheaper_window() {
    let clock = Arc::new(VirtualClock::default());
    let c = ctl_on(&clock);
    for _ in 0..20 {
        c.record_decode(4, 0.036);
        clock.advance(ms(150.0));
    }
    clock.advance(Duration::from_secs(5));
    c.record_decode(4, 0.012);
    let d = c.decode_cost_estimate(4).unwrap_or(0.0);
    assert!(d < 0.020, "{d}");
    clock.advance(Duration::from_secs(5));
    c.record_decode(4, 0.024);
    let up = c.decode_cost_estimate(4).unwrap_or(0.0);
    assert!(up < d + 0.1 * (0.024 - d) + 1e-9, "{d} -> {up}");
}

#[test]
fn the_decode_cost_alone_is_the_one_the_full_cost_table_holds() {
    let c = ctl();
    let now = Instant::now();
    for load in [1, 3, 16, 64] {
        assert_eq!(c.costs.decode_cost(load), None);
    }
    c.record_decode(4, 0.0125);
    c.record_verify(4, 1, ms(30.0));
    c.record_decode(32, 0.0151);
    for load in [1, 2, 4, 8, 16, 24, 32, 64, 200] {
        let whole = c.costs.costs(load, 1, 4, now).dec;
        assert_eq!(c.costs.decode_cost(load), whole, "at {load} streams");
        assert!(whole.is_some());
    }
}

/// Another stream's relay start is a prompt the upstream computes in this stream's steps,
/// as a verify call is: the gaps it stretches are not plain decoding.
#[test]
fn a_relay_start_beside_a_relay_is_not_plain_decoding() {
    for others_start in [false, true] {
        let clock = Arc::new(VirtualClock::default());
        let c = ctl_on(&clock);
        let _me = c.enter();
        let _other = c.enter();
        let mut t = RelayTracker::new(&c, DrafterKind::Oracle, false, None, c.now());
        let mut token = |gap_ms: f64| {
            clock.advance(ms(gap_ms));
            t.arrived(&c, c.now(), false);
        };
        token(30.0);
        token(12.0);
        // The other stream's relay is sent; the step that computes its prompt takes 30 ms.
        let mut other = others_start.then(|| c.relaying());
        token(30.0);
        if let Some(r) = other.as_mut() {
            r.started();
        }
        for _ in 0..8 {
            token(12.0);
        }
        let d = c.decode_cost_estimate(c.load()).unwrap_or(0.0);
        if others_start {
            assert!(
                (d - 0.012).abs() < 1e-6,
                "the prefill's gap was skipped: {d}"
            );
        } else {
            assert!(d > 0.013, "a slow gap of its own is plain decoding: {d}");
        }
    }
}
