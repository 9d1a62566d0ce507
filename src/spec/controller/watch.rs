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
//! load, a drafter whose confidence runs ahead of its acceptance). Tokens per second while
//! speculating against tokens per second while relaying, in the same streams, catch that.

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
/// Tokens each mode needs in the window before their speeds are compared.
const MIN_MODE_TOKENS: u64 = 64;

/// What a watched `auto` request did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watched {
    /// Tokens from verify rounds, and the time spent in rounds.
    pub speculated: u32,
    pub speculate_seconds: f64,
    /// Tokens from relay segments, and the time spent relaying (restarts included).
    pub relayed: u32,
    pub relay_seconds: f64,
}

#[derive(Default)]
struct Recent {
    window: VecDeque<Watched>,
    sum: Sums,
    last_watch: Option<Instant>,
}

#[derive(Default, Clone, Copy)]
struct Sums {
    speculated: u64,
    speculate_seconds: f64,
    relayed: u64,
    relay_seconds: f64,
}

impl Sums {
    fn add(&mut self, w: &Watched) {
        self.speculated += u64::from(w.speculated);
        self.relayed += u64::from(w.relayed);
        self.speculate_seconds += w.speculate_seconds;
        self.relay_seconds += w.relay_seconds;
    }

    fn remove(&mut self, w: &Watched) {
        self.speculated = self.speculated.saturating_sub(u64::from(w.speculated));
        self.relayed = self.relayed.saturating_sub(u64::from(w.relayed));
        self.speculate_seconds = (self.speculate_seconds - w.speculate_seconds).max(0.0);
        self.relay_seconds = (self.relay_seconds - w.relay_seconds).max(0.0);
    }

    fn total(&self) -> u64 {
        self.speculated + self.relayed
    }

    /// Share of tokens from verify rounds, once enough tokens were seen.
    fn share(&self) -> Option<f64> {
        (self.total() >= MIN_TOKENS).then(|| self.speculated as f64 / self.total() as f64)
    }

    /// Tokens/s while speculating over tokens/s while relaying, once both have enough.
    fn realized(&self) -> Option<f64> {
        let enough = self.speculated >= MIN_MODE_TOKENS && self.relayed >= MIN_MODE_TOKENS;
        (enough && self.speculate_seconds > 0.0 && self.relay_seconds > 0.0).then(|| {
            (self.speculated as f64 / self.speculate_seconds)
                / (self.relayed as f64 / self.relay_seconds)
        })
    }

    /// Watching buys nothing: speculation was (almost) never chosen, or it was slower.
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
    pub fn admit(&self) -> bool {
        let Ok(mut g) = self.recent.lock() else {
            return true;
        };
        let idle = self.every > 1 && g.sum.idle();
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let due = g.last_watch.is_none_or(|t| t.elapsed() >= self.interval);
        let watch = !idle || due || n % self.every == 0;
        if watch {
            g.last_watch = Some(Instant::now());
        }
        watch
    }

    /// A watched request ended.
    pub fn record(&self, w: Watched) {
        if w.speculated == 0 && w.relayed == 0 {
            return;
        }
        let Ok(mut g) = self.recent.lock() else {
            return;
        };
        g.sum.add(&w);
        g.window.push_back(w);
        if g.window.len() > WINDOW {
            if let Some(old) = g.window.pop_front() {
                g.sum.remove(&old);
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

    /// `spec` tokens at `spec_rate` tokens/s and `relay` tokens at 100 tokens/s.
    fn req(spec: u32, spec_rate: f64, relay: u32) -> Watched {
        Watched {
            speculated: spec,
            speculate_seconds: if spec > 0 { f64::from(spec) / spec_rate } else { 0.0 },
            relayed: relay,
            relay_seconds: f64::from(relay) / 100.0,
        }
    }

    #[test]
    fn watches_everything_until_enough_is_known() {
        let w = Watch::new(8, hour());
        for _ in 0..10 {
            assert!(w.admit());
        }
        w.record(req(0, 1.0, 500));
        assert!(w.admit(), "500 tokens are not enough to judge");
        assert_eq!(w.summary(), (None, None));
    }

    #[test]
    fn passes_most_through_while_speculation_is_idle() {
        let w = Watch::new(8, hour());
        w.record(req(5, 200.0, 995));
        let watched = (0..64).filter(|_| w.admit()).count();
        // The first call also claims the probe-interval watch.
        assert!((8..=9).contains(&watched), "{watched}");
        assert_eq!(w.summary().0, Some(0.005));
    }

    #[test]
    fn passes_most_through_while_speculation_is_slower_than_relaying() {
        let w = Watch::new(8, hour());
        w.record(req(400, 70.0, 600));
        let (share, realized) = w.summary();
        assert_eq!(share, Some(0.4));
        assert!((realized.unwrap_or(0.0) - 0.7).abs() < 1e-9);
        assert!((0..64).filter(|_| w.admit()).count() <= 9);
    }

    #[test]
    fn watches_everything_while_speculation_is_faster() {
        let w = Watch::new(8, hour());
        w.record(req(400, 150.0, 600));
        assert!((0..64).all(|_| w.admit()));
        // Too few relayed tokens to compare: speculation is given the benefit of the doubt.
        let w = Watch::new(8, hour());
        w.record(req(990, 50.0, 10));
        assert!((0..64).all(|_| w.admit()));
    }

    #[test]
    fn watches_everything_again_once_speculation_pays() {
        let w = Watch::new(8, hour());
        w.record(req(0, 1.0, 1000));
        assert!((0..16).filter(|_| w.admit()).count() < 16);
        w.record(req(200, 300.0, 800));
        assert!((0..16).all(|_| w.admit()));
    }

    #[test]
    fn old_requests_leave_the_window() {
        let w = Watch::new(8, hour());
        w.record(req(1000, 300.0, 0));
        for _ in 0..WINDOW {
            w.record(req(0, 1.0, 100));
        }
        assert_eq!(w.summary(), (Some(0.0), None));
    }

    #[test]
    fn one_request_per_interval_is_watched_even_when_idle() {
        let w = Watch::new(1_000_000, Duration::ZERO);
        w.record(req(0, 1.0, 1000));
        assert!((0..16).all(|_| w.admit()));
    }

    #[test]
    fn every_one_disables_passthrough() {
        let w = Watch::new(1, hour());
        w.record(req(0, 1.0, 10_000));
        assert!((0..16).all(|_| w.admit()));
    }
}
