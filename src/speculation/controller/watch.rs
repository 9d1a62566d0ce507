//! Which `auto` requests specd watches. A watched request runs the session loop: it
//! relays or speculates as the controller decides, and a relaying stream costs specd
//! parsing, detokenising and shadow drafting per token. Where the recent watched requests
//! show that this buys nothing — they barely speculated, or their speculation was slower
//! than their own relaying — most new `auto` requests are passed through untouched, like
//! `off`; one in `every` (and at least one per probe interval) is still watched, so that
//! estimates stay fresh and a workload that starts paying is noticed.
//!
//! The second test looks at outcomes, not estimates: the controller speculates when its
//! estimates say a round pays, and estimates can be wrong (costs measured under other
//! load, a drafter whose confidence runs ahead of its acceptance). The requests that did
//! speculate (10 % of their tokens or more) are timed against what plain decoding of them
//! would have taken (first-token latency plus a decode step per token, both measured from
//! relays, plus what slowed the request's verify calls beyond their estimates), switches
//! included.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Watched requests remembered.
const WINDOW: usize = 32;
/// Tokens the window must hold before it can judge.
const MIN_TOKENS: u64 = 512;
/// Below this share of speculated tokens, speculation is not paying for the watching.
const IDLE_SHARE: f64 = 0.02;
/// Speculated tokens the window needs before judging the speed of speculating requests.
const MIN_SPEC_TOKENS: u64 = 64;

/// What a watched `auto` request did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watched {
    pub tokens: u32,
    /// Tokens that came from verify rounds.
    pub speculated: u32,
    /// How long the request took, and how long plain decoding would have taken by the
    /// controller's measurements of it (first-token latency plus a decode step per further
    /// token; `None` while unmeasured).
    pub seconds: f64,
    pub plain_seconds: Option<f64>,
}

#[derive(Default)]
struct Recent {
    window: VecDeque<Watched>,
    sum: Sums,
    last_watch: Option<Instant>,
}

#[derive(Default, Clone, Copy)]
struct Sums {
    tokens: u64,
    speculated: u64,
    /// Over the requests that speculated and have a plain-decoding estimate.
    seconds: f64,
    plain_seconds: f64,
}

impl Sums {
    fn apply(&mut self, w: &Watched, add: bool) {
        let f = |total: &mut u64, n: u32| {
            *total = if add {
                *total + u64::from(n)
            } else {
                total.saturating_sub(u64::from(n))
            }
        };
        f(&mut self.tokens, w.tokens);
        f(&mut self.speculated, w.speculated);
        // Only requests that speculated substantially say whether speculating pays; one
        // probe round in a relayed request would dilute the ratio towards 1.
        let substantial = u64::from(w.speculated) * 10 >= u64::from(w.tokens) && w.speculated > 0;
        if let (true, Some(plain)) = (substantial, w.plain_seconds) {
            let g = |total: &mut f64, x: f64| {
                *total = if add {
                    *total + x
                } else {
                    (*total - x).max(0.0)
                }
            };
            g(&mut self.seconds, w.seconds);
            g(&mut self.plain_seconds, plain);
        }
    }

    /// Share of tokens from verify rounds, once enough tokens were seen.
    fn share(&self) -> Option<f64> {
        (self.tokens >= MIN_TOKENS).then(|| self.speculated as f64 / self.tokens as f64)
    }

    /// How much faster the requests that speculated were than plain decoding of them,
    /// once the window holds enough tokens and enough of them were speculated.
    fn realized(&self) -> Option<f64> {
        let enough = self.tokens >= MIN_TOKENS && self.speculated >= MIN_SPEC_TOKENS;
        (enough && self.seconds > 0.0).then(|| self.plain_seconds / self.seconds)
    }

    /// Watching buys nothing: speculation was (almost) never chosen, or it did not win.
    fn idle(&self) -> bool {
        self.share().is_some_and(|s| s < IDLE_SHARE) || self.realized().is_some_and(|r| r < 1.0)
    }
}

pub struct Watch {
    every: usize,
    interval: Duration,
    recent: Mutex<Recent>,
    seen: AtomicUsize,
}

impl Watch {
    pub fn new(every: usize, interval: Duration) -> Self {
        Watch {
            every: every.max(1),
            interval,
            recent: Mutex::new(Recent::default()),
            seen: AtomicUsize::new(0),
        }
    }

    /// (share of speculated tokens, realized speedup) of the recent watched requests.
    pub fn summary(&self) -> (Option<f64>, Option<f64>) {
        self.recent
            .lock()
            .map_or((None, None), |g| (g.sum.share(), g.sum.realized()))
    }

    /// Should this `auto` request run the session loop (true) or pass through (false)?
    pub fn admit(&self, now: Instant) -> bool {
        let Ok(mut g) = self.recent.lock() else {
            return true;
        };
        let idle = self.every > 1 && g.sum.idle();
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let due = g
            .last_watch
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        let watch = !idle || due || n % self.every == 0;
        if watch {
            g.last_watch = Some(now);
        }
        watch
    }

    /// A watched request ended.
    pub fn record(&self, w: Watched) {
        if w.tokens == 0 {
            return;
        }
        let Ok(mut g) = self.recent.lock() else {
            return;
        };
        g.sum.apply(&w, true);
        g.window.push_back(w);
        if g.window.len() > WINDOW {
            if let Some(old) = g.window.pop_front() {
                g.sum.apply(&old, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hour() -> Duration {
        Duration::from_secs(3600)
    }

    /// `tokens` tokens of which `spec` speculated, taking `speed` times as long as plain
    /// decoding at 10 ms per token.
    fn req(tokens: u32, spec: u32, speedup: f64) -> Watched {
        let plain = f64::from(tokens) * 0.01;
        Watched {
            tokens,
            speculated: spec,
            seconds: plain / speedup,
            plain_seconds: Some(plain),
        }
    }

    #[test]
    fn watches_everything_until_enough_is_known() {
        let w = Watch::new(8, hour());
        for _ in 0..10 {
            assert!(w.admit(Instant::now()));
        }
        w.record(req(500, 0, 1.0));
        assert!(
            w.admit(Instant::now()),
            "500 tokens are not enough to judge"
        );
        assert_eq!(w.summary(), (None, None));
    }

    #[test]
    fn passes_most_through_while_speculation_is_idle() {
        let w = Watch::new(8, hour());
        w.record(req(1000, 5, 1.3));
        let watched = (0..64).filter(|_| w.admit(Instant::now())).count();
        // The first call also claims the probe-interval watch.
        assert!((8..=9).contains(&watched), "{watched}");
        assert_eq!(w.summary().0, Some(0.005));
    }

    #[test]
    fn passes_most_through_while_speculation_loses() {
        let w = Watch::new(8, hour());
        w.record(req(1000, 400, 0.7));
        let (share, realized) = w.summary();
        assert_eq!(share, Some(0.4));
        assert!((realized.unwrap_or(0.0) - 0.7).abs() < 1e-9);
        assert!((0..64).filter(|_| w.admit(Instant::now())).count() <= 9);
    }

    #[test]
    fn watches_everything_while_speculation_wins() {
        let w = Watch::new(8, hour());
        w.record(req(1000, 400, 1.2));
        // Requests that did not speculate, or only a probe round, do not dilute it.
        w.record(req(1000, 0, 1.0));
        w.record(req(1000, 5, 0.5));
        assert!((w.summary().1.unwrap_or(0.0) - 1.2).abs() < 1e-9);
        assert!((0..64).all(|_| w.admit(Instant::now())));
        // No plain-decoding estimate yet: speculation is given the benefit of the doubt.
        let w = Watch::new(8, hour());
        w.record(Watched {
            plain_seconds: None,
            ..req(1000, 900, 0.5)
        });
        assert!((0..64).all(|_| w.admit(Instant::now())));
    }

    #[test]
    fn watches_everything_again_once_speculation_pays() {
        let w = Watch::new(8, hour());
        w.record(req(1000, 0, 1.0));
        assert!((0..16).filter(|_| w.admit(Instant::now())).count() < 16);
        w.record(req(1000, 200, 1.3));
        assert!((0..16).all(|_| w.admit(Instant::now())));
    }

    #[test]
    fn old_requests_leave_the_window() {
        let w = Watch::new(8, hour());
        w.record(req(1000, 1000, 0.5));
        for _ in 0..WINDOW {
            w.record(req(100, 0, 1.0));
        }
        assert_eq!(w.summary(), (Some(0.0), None));
    }

    #[test]
    fn one_request_per_interval_is_watched_even_when_idle() {
        let w = Watch::new(1_000_000, Duration::ZERO);
        w.record(req(1000, 0, 1.0));
        assert!((0..16).all(|_| w.admit(Instant::now())));
    }

    /// A request that ran through a load spike is not judged: its verify calls took three
    /// times their estimates, and plain decoding would have slowed as much. One that ran
    /// through part of it is judged against plain decoding delayed as much.
    #[test]
    fn a_request_slowed_by_a_load_spike_is_not_judged() {
        use super::super::{Controller, StreamCtl};
        let c = Controller::default();
        c.record_decode(1, 0.012);
        for _ in 0..20 {
            c.record_verify(8, 1, Duration::from_millis(30));
        }
        let (mut calm, mut spiked) = (StreamCtl::new(true, 1), StreamCtl::new(true, 2));
        for took in [29, 31, 30, 32] {
            let expected = c.record_verify(8, 1, Duration::from_millis(took));
            calm.note_verify(Duration::from_millis(took), expected);
        }
        for took in [30, 90, 95, 88] {
            // What the estimate said before each call, as the session records it.
            let expected = c.verify_cost_estimate(8, 1);
            spiked.note_verify(Duration::from_millis(took), expected);
        }
        let plain = c.plain_seconds(&calm, 100).unwrap_or(0.0);
        assert!((plain - 100.0 * 0.012).abs() < 1e-9, "{plain}");
        assert_eq!(c.plain_seconds(&spiked, 100), None);
        // Slowed less than that (part of the request in a spike): judged against plain
        // decoding delayed by as much as the verify calls ran over 1.1x their estimates
        // (the calm request's 2 % over them is jitter, and counts nothing).
        let (mut slowed, mut over) = (StreamCtl::new(true, 3), 0.0);
        for took in [30u32, 40, 42, 38] {
            let expected = c.verify_cost_estimate(8, 1);
            over += 0.001 * f64::from(took) - 1.1 * expected.unwrap_or(0.0);
            slowed.note_verify(Duration::from_millis(took.into()), expected);
        }
        assert!(over > 0.015, "{over}");
        let plain = c.plain_seconds(&slowed, 100).unwrap_or(0.0);
        assert!((plain - (100.0 * 0.012 + over)).abs() < 1e-9, "{plain}");
    }

    #[test]
    fn every_one_disables_passthrough() {
        let w = Watch::new(1, hour());
        w.record(req(10_000, 0, 1.0));
        assert!((0..16).all(|_| w.admit(Instant::now())));
    }
}
