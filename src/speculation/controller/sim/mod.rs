//! The deterministic simulation harness of the controller: seeded scenarios in virtual
//! time (no sleeping, no wall clock) against a latency model of the field's upstream, each
//! run under plain decoding, every static K and `auto`, and the controller's guarantees
//! (module documentation of `controller`) checked over all of them, the worst case of
//! each printed.

mod informed;
mod model;
mod run;

use std::time::Duration;

use model::{Acceptance, Noise, Outcome, Scenario};
use run::{Mode, Sim};

/// The static K compared with `auto` (the best of them in hindsight is the target).
const STATIC_K: [usize; 4] = [2, 4, 8, 16];
/// The draft cap `auto` runs with in the harness.
const AUTO_CAP: usize = 16;

fn acceptances() -> Vec<(&'static str, Acceptance)> {
    use Acceptance::*;
    vec![
        ("zero", Constant(0.0)),
        ("low-0.3", Constant(0.3)),
        ("mid-0.6", Constant(0.6)),
        ("high-0.8", Constant(0.8)),
        ("high-0.9", Constant(0.9)),
        ("perfect", Constant(1.0)),
        ("decay-0.95x0.85", Decay { a: 0.95, d: 0.85 }),
        ("decay-0.9x0.7", Decay { a: 0.9, d: 0.7 }),
        (
            "ramp-up",
            Ramp {
                from: 0.0,
                to: 0.95,
                over: 300,
            },
        ),
        (
            "ramp-down",
            Ramp {
                from: 0.95,
                to: 0.0,
                over: 300,
            },
        ),
        (
            "alternating-64",
            Alternating {
                hi: 0.95,
                lo: 0.05,
                len: 64,
            },
        ),
        (
            "alternating-160",
            Alternating {
                hi: 0.95,
                lo: 0.05,
                len: 160,
            },
        ),
        (
            "zero-to-perfect",
            Step {
                first: 0.0,
                then: 1.0,
                at: 160,
            },
        ),
        (
            "perfect-to-zero",
            Step {
                first: 1.0,
                then: 0.0,
                at: 160,
            },
        ),
    ]
}

fn noises() -> Vec<(&'static str, Noise)> {
    let quiet = Noise::default();
    vec![
        ("quiet", quiet),
        (
            "jitter-30%",
            Noise {
                jitter: 0.3,
                ..quiet
            },
        ),
        (
            "stalls",
            Noise {
                stall: 0.01,
                jitter: 0.1,
                ..quiet
            },
        ),
        (
            "bursts",
            Noise {
                burst: 0.3,
                jitter: 0.1,
                ..quiet
            },
        ),
        (
            "slow-relays",
            Noise {
                slow_relay: Duration::from_millis(40),
                ..quiet
            },
        ),
        (
            "load-spike",
            Noise {
                spike: Some((Duration::from_secs(1), Duration::from_secs(4), 3.0)),
                ..quiet
            },
        ),
        (
            "other-clients",
            Noise {
                others: 8,
                others_prefill: 0.05,
                ..quiet
            },
        ),
    ]
}

/// Streams, requests per stream, tokens per request, and seeds per combination: most
/// scenarios are small so that the whole set runs in seconds; a few load the upstream.
const SIZES: [(usize, u32, u32, usize); 6] = [
    (1, 3, 320, 4),
    (2, 2, 320, 2),
    (4, 2, 320, 1),
    (8, 1, 320, 1),
    (16, 1, 320, 1),
    (64, 1, 240, 1),
];

/// A number from the environment variable `name` (None when unset or not a number): the
/// harness's diagnostic settings.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn scenarios() -> Vec<Scenario> {
    let mut out = Vec::new();
    // SPECD_SIM_SEED0 draws another set of the same scenarios: a change tuned on this set
    // is checked on one it was not tuned on.
    let mut seed: u64 = env_number("SPECD_SIM_SEED0").unwrap_or(1);
    let (acc, noise_set) = (acceptances(), noises());
    for &(streams, requests, tokens, seeds) in &SIZES {
        for (i, &(name, acceptance)) in acc.iter().enumerate() {
            for (j, &(noise_name, noise)) in noise_set.iter().enumerate() {
                // Many streams: every acceptance script, under a rotating subset of noise.
                let every = if streams >= 64 {
                    noise_set.len()
                } else if streams >= 16 {
                    2
                } else {
                    1
                };
                if (i + j) % every != 0 {
                    continue;
                }
                for _ in 0..seeds {
                    seed += 1;
                    out.push(Scenario {
                        name,
                        acceptance,
                        noise,
                        noise_name,
                        streams,
                        requests,
                        tokens,
                        seed,
                        draft_cost: 0.0,
                    });
                }
            }
        }
    }
    out
}

/// A scenario's rates under every mode (`evaluate`).
struct Result {
    sc: Scenario,
    plain: f64,
    best_static: (usize, f64),
    auto: Outcome,
}

/// One scenario under every mode. With `SPECD_SIM_DRAWS=N` (a diagnostic) each mode's rate
/// is its mean over N draws of the drafts' rightness (`Sim::salted`), the best static K
/// the best of those means, and (c), (d), (e) those of the first draw.
fn evaluate(sc: Scenario) -> Result {
    let draws: u64 = env_number("SPECD_SIM_DRAWS").unwrap_or(1).max(1);
    // The mean rate over the draws after the first, whose rate is given.
    let mean = |m: Mode, first: f64| {
        let rest: f64 = (1..draws)
            .map(|r| Sim::new(&sc, m).salted(r).run().rate)
            .sum();
        (first + rest) / draws as f64
    };
    let plain = Sim::new(&sc, Mode::Plain).run().rate;
    let best_static = STATIC_K
        .iter()
        .map(|&k| {
            (
                k,
                mean(Mode::Static(k), Sim::new(&sc, Mode::Static(k)).run().rate),
            )
        })
        .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let mut auto = Sim::new(&sc, Mode::Auto(AUTO_CAP)).run();
    auto.rate = mean(Mode::Auto(AUTO_CAP), auto.rate);
    Result {
        sc,
        plain,
        best_static,
        auto,
    }
}

/// Every scenario evaluated, in order (see `par_map`).
fn evaluate_all(set: Vec<Scenario>) -> Vec<Result> {
    par_map(&set, evaluate)
}

/// `f` over every scenario, in order, on as many threads as the machine has (each run
/// is independent and deterministic, so the results do not depend on the split).
fn par_map<T: Send>(set: &[Scenario], f: impl Fn(Scenario) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let f = &f;
    let mut out: Vec<(usize, T)> = std::thread::scope(|s| {
        // Round robin: the large scenarios come last in the set.
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t..set.len())
                        .step_by(threads)
                        .map(|i| (i, f(set[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// The worst case of one guarantee.
struct Worst {
    value: f64,
    at: String,
}

impl Worst {
    fn new(start: f64) -> Self {
        Worst {
            value: start,
            at: "none".into(),
        }
    }
    fn min(&mut self, v: f64, r: &Result) {
        if v < self.value {
            self.value = v;
            self.at = describe(r);
        }
    }
    fn max(&mut self, v: f64, r: &Result) {
        if v > self.value {
            self.value = v;
            self.at = describe(r);
        }
    }
}

fn describe(r: &Result) -> String {
    let sc = &r.sc;
    format!(
        "{} / {} / {} streams / seed {} (plain {:.1}, best static K={} {:.1}, auto {:.1} tok/s{})",
        sc.name,
        sc.noise_name,
        sc.streams,
        sc.seed,
        r.plain,
        r.best_static.0,
        r.best_static.1,
        r.auto.rate,
        match r.auto.passed {
            0 => String::new(),
            n => format!(", {n} passed through"),
        }
    )
}

/// The bounds as measured over this scenario set (see the controller's module
/// documentation); the run is deterministic, so a change that makes any worse fails here.
const BOUND_LOSE: f64 = 0.89;
const BOUND_WIN: f64 = 0.80;
const BOUND_SWITCH_TOKENS: f64 = 60.0;
const BOUND_ZERO_STREAK: f64 = 48.0;
const BOUND_RESUME_S: f64 = 0.25;
/// (e)'s resumption is timed where the best static K beats plain decoding by this much.
const RESUME_GAIN: f64 = 1.1;
const BOUND_DECODE_S: f64 = 11.0;

#[test]
fn the_controller_keeps_its_guarantees_in_every_scenario() {
    let t = std::time::Instant::now();
    let results = evaluate_all(scenarios());
    let (mut lose, mut win) = (Worst::new(f64::INFINITY), Worst::new(f64::INFINITY));
    let (mut switch, mut streak) = (Worst::new(0.0), Worst::new(0.0));
    let (mut resume, mut decode) = (Worst::new(0.0), Worst::new(0.0));
    // Scenarios of each kind, and those meeting the target (0.97 of plain, 0.95 of best).
    let (mut n_lose, mut ok_lose, mut n_win, mut ok_win) = (0, 0, 0, 0);
    // Sums of log ratios, for the geometric means: a change's effect over the whole set,
    // beside the counts at the targets, which a few scenarios near a target can sway.
    let (mut ln_lose, mut ln_win) = (0.0, 0.0);
    for r in &results {
        if r.best_static.1 <= r.plain {
            let x = r.auto.rate / r.plain;
            n_lose += 1;
            ln_lose += x.ln();
            ok_lose += usize::from(x >= 0.97);
            lose.min(x, r);
            if x < 0.97 && std::env::var_os("SPECD_SIM_LIST").is_some() {
                println!("A {x:.3} {}", describe(r));
            }
        } else {
            let x = r.auto.rate / r.best_static.1;
            n_win += 1;
            ln_win += x.ln();
            ok_win += usize::from(x >= 0.95);
            win.min(x, r);
            if x < 0.95 && std::env::var_os("SPECD_SIM_LIST").is_some() {
                println!("B {x:.3} {}", describe(r));
            }
            // Where the best round gains less than a relay restart per few rounds, relaying
            // on after the spike is a sound decision, not an estimate stuck in the spike.
            let gains = r.best_static.1 >= RESUME_GAIN * r.plain;
            if let Some(s) = r.auto.resume_after_spike.filter(|_| gains) {
                resume.max(s, r);
            }
        }
        if let Some(s) = r.auto.switch_tokens {
            switch.max(f64::from(s), r);
        }
        streak.max(f64::from(r.auto.zero_streak), r);
        if let Some(s) = r.auto.decode_recovery {
            decode.max(s, r);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{} scenarios × {} modes in {secs:.1} s",
        results.len(),
        STATIC_K.len() + 2
    );
    println!(
        "(a) speculation loses ({ok_lose} of {n_lose} at ≥ 0.97, geometric mean {:.4}): \
         auto/plain ≥ {:.3} at {}",
        (ln_lose / f64::from(n_lose.max(1))).exp(),
        lose.value,
        lose.at
    );
    println!(
        "(b) speculation wins ({ok_win} of {n_win} at ≥ 0.95, geometric mean {:.4}): \
         auto/best static ≥ {:.3} at {}",
        (ln_win / f64::from(n_win.max(1))).exp(),
        win.value,
        win.at
    );
    println!(
        "(c) switch after a phase change ≤ {} tokens at {}",
        switch.value, switch.at
    );
    println!(
        "(d) zero-accept rounds in a row ≤ {} at {}",
        streak.value, streak.at
    );
    println!(
        "(e) speculation resumed ≤ {:.2} s after a load spike at {}",
        resume.value, resume.at
    );
    println!(
        "(e) decode estimate within 25 % ≤ {:.2} s after a load spike at {}",
        decode.value, decode.at
    );
    assert!(lose.value >= BOUND_LOSE, "(a) {}", lose.at);
    assert!(win.value >= BOUND_WIN, "(b) {}", win.at);
    assert!(switch.value <= BOUND_SWITCH_TOKENS, "(c) {}", switch.at);
    assert!(streak.value <= BOUND_ZERO_STREAK, "(d) {}", streak.at);
    assert!(resume.value <= BOUND_RESUME_S, "(e) {}", resume.at);
    assert!(decode.value <= BOUND_DECODE_S, "(e) {}", decode.at);
}

fn one(acceptance: Acceptance, requests: u32) -> Scenario {
    Scenario {
        name: "case",
        acceptance,
        noise: Noise {
            jitter: 0.3,
            ..Noise::default()
        },
        noise_name: "jitter-30%",
        streams: 1,
        requests,
        tokens: 96,
        seed: 7,
        draft_cost: 0.0,
    }
}

#[test]
fn auto_speculates_when_it_pays_and_relays_when_it_does_not() {
    let good = Sim::new(&one(Acceptance::Constant(1.0), 4), Mode::Auto(AUTO_CAP)).run();
    assert!(
        good.relayed * 4 < good.tokens,
        "perfect drafts mostly relayed: {good:?}"
    );
    let bad = Sim::new(&one(Acceptance::Constant(0.0), 4), Mode::Auto(AUTO_CAP)).run();
    assert!(
        bad.relayed * 10 > bad.tokens * 7,
        "hopeless drafts speculated: {bad:?}"
    );
}

#[test]
fn auto_passes_through_while_speculation_does_not_pay() {
    // Hopeless drafts: once 512 watched tokens show it, most requests pass through (one in
    // 8 is still watched, and one per probe interval).
    let bad = Sim::new(&one(Acceptance::Constant(0.0), 40), Mode::Auto(AUTO_CAP)).run();
    assert!(
        bad.passed >= 25,
        "{} of 40 passed through: {bad:?}",
        bad.passed
    );
    // Perfect drafts: nothing passes through.
    let good = Sim::new(&one(Acceptance::Constant(1.0), 40), Mode::Auto(AUTO_CAP)).run();
    assert_eq!(good.passed, 0, "{good:?}");
}

#[test]
fn a_costly_drafter_drafts_within_its_share_of_the_upstreams_time() {
    // A drafter as slow as a decode step, drafting on the upstream's own time (a draft
    // model on its CPU). Hopeless drafts: `auto` relays, and its shadow proposals take
    // only their share of the time.
    // One long request: every token runs the loop (none is passed through).
    let bad = Scenario {
        draft_cost: 0.012,
        tokens: 1200,
        ..one(Acceptance::Constant(0.0), 1)
    };
    let plain = Sim::new(&bad, Mode::Plain).run();
    let auto = Sim::new(&bad, Mode::Auto(AUTO_CAP)).run();
    let share = auto.draft_seconds * auto.rate / auto.tokens as f64;
    println!(
        "hopeless: auto/plain {:.3}, drafting {:.3} of the time, {auto:?}",
        auto.rate / plain.rate,
        share
    );
    assert_eq!(auto.passed, 0);
    assert!(auto.rate >= 0.9 * plain.rate, "{auto:?} against {plain:?}");
    assert!(share <= 0.05, "drafting took {share:.3} of the time");
    // Perfect drafts: the cost is worth paying, and `auto` speculates.
    let good = Scenario {
        acceptance: Acceptance::Constant(1.0),
        ..bad
    };
    let plain = Sim::new(&good, Mode::Plain).run();
    let auto = Sim::new(&good, Mode::Auto(AUTO_CAP)).run();
    println!("perfect: auto/plain {:.3}", auto.rate / plain.rate);
    assert!(auto.relayed * 4 < auto.tokens, "{auto:?}");
    assert!(auto.rate > 2.0 * plain.rate, "{auto:?} against {plain:?}");
}

/// The draft cap `auto` should default to: mean `auto`/plain over the scenarios where
/// speculation wins, per cap (`cargo nextest run -p specd --lib --run-ignored only
/// auto_cap --no-capture`).
#[test]
#[ignore = "a measurement, not a check"]
fn auto_cap_measurement() {
    let set: Vec<Scenario> = scenarios().into_iter().filter(|s| s.streams <= 8).collect();
    for cap in [4, 8, 16] {
        let (mut sum, mut n, mut vs_best) = (0.0, 0, 0.0);
        for sc in &set {
            let plain = Sim::new(sc, Mode::Plain).run().rate;
            let best = STATIC_K
                .iter()
                .map(|&k| Sim::new(sc, Mode::Static(k)).run().rate)
                .fold(0.0, f64::max);
            if best <= plain {
                continue;
            }
            let auto = Sim::new(sc, Mode::Auto(cap)).run().rate;
            sum += auto / plain;
            vs_best += auto / best;
            n += 1;
        }
        let n = f64::from(n.max(1) as u32);
        println!(
            "cap {cap}: auto/plain {:.3}, auto/best static {:.3} (mean over {n} winning scenarios)",
            sum / n,
            vs_best / n
        );
    }
}

/// One scenario of the set, traced (`SPECD_SIM_SEED=N SPECD_SIM_TRACE=1 cargo nextest run
/// -p specd --lib --run-ignored only sim_trace --no-capture`).
#[test]
#[ignore = "a diagnostic, not a check"]
fn sim_trace() {
    let seed: u64 = env_number("SPECD_SIM_SEED").unwrap_or(142);
    let _ = tracing_subscriber::fmt()
        .with_env_filter("specd=debug")
        .with_test_writer()
        .without_time()
        .try_init();
    let Some(sc) = scenarios().into_iter().find(|s| s.seed == seed) else {
        return;
    };
    let r = evaluate(sc);
    println!("{}", describe(&r));
}
