//! Which `auto` requests specd watches. A watched request runs the session loop: it
//! relays or speculates as the controller decides, and a relaying stream costs specd
//! parsing, detokenising and shadow drafting per token. When the recent watched requests
//! barely speculated, that work buys nothing: most new `auto` requests are then passed
//! through untouched, like `off`, and one in `watch_every` (and at least one per probe
//! interval) is still watched, so that estimates stay fresh and a workload that starts
//! paying is noticed.

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

#[derive(Default)]
struct Recent {
    /// (speculated tokens, all tokens) of the last watched requests.
    window: VecDeque<(u32, u32)>,
    speculated: u64,
    total: u64,
    last_watch: Option<Instant>,
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
            every,
            interval,
            recent: Mutex::new(Recent::default()),
            seen: AtomicUsize::new(0),
        }
    }

    /// Speculation's share of the tokens of recent watched requests, when enough is known.
    pub fn share(&self) -> Option<f64> {
        let g = self.recent.lock().ok()?;
        (g.total >= MIN_TOKENS).then(|| g.speculated as f64 / g.total as f64)
    }

    /// Should this `auto` request run the session loop (true) or pass through (false)?
    pub fn admit(&self) -> bool {
        let Ok(mut g) = self.recent.lock() else {
            return true;
        };
        let idle = self.every > 1
            && g.total >= MIN_TOKENS
            && (g.speculated as f64) < IDLE_SHARE * g.total as f64;
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        let due = g.last_watch.is_none_or(|t| t.elapsed() >= self.interval);
        let watch = !idle || due || n % self.every == 0;
        if watch {
            g.last_watch = Some(Instant::now());
        }
        watch
    }

    /// A watched request ended with `speculated` of its `total` tokens from verify rounds.
    pub fn record(&self, speculated: u32, total: u32) {
        if total == 0 {
            return;
        }
        let Ok(mut g) = self.recent.lock() else {
            return;
        };
        g.window.push_back((speculated, total));
        g.speculated += u64::from(speculated);
        g.total += u64::from(total);
        if g.window.len() > WINDOW {
            if let Some((s, t)) = g.window.pop_front() {
                g.speculated -= u64::from(s);
                g.total -= u64::from(t);
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

    #[test]
    fn watches_everything_until_enough_is_known() {
        let w = Watch::new(8, hour());
        for _ in 0..10 {
            assert!(w.admit());
        }
        w.record(0, 500);
        assert!(w.admit(), "500 tokens are not enough to judge");
        assert_eq!(w.share(), None);
    }

    #[test]
    fn passes_most_through_while_speculation_is_idle() {
        let w = Watch::new(8, hour());
        w.record(5, 1000);
        let watched = (0..64).filter(|_| w.admit()).count();
        // The first call also claims the probe-interval watch.
        assert!((8..=9).contains(&watched), "{watched}");
        assert_eq!(w.share(), Some(0.005));
    }

    #[test]
    fn watches_everything_again_once_speculation_pays() {
        let w = Watch::new(8, hour());
        w.record(0, 1000);
        assert!((0..16).filter(|_| w.admit()).count() < 16);
        w.record(200, 1000);
        assert!((0..16).all(|_| w.admit()));
    }

    #[test]
    fn old_requests_leave_the_window() {
        let w = Watch::new(8, hour());
        w.record(1000, 1000);
        for _ in 0..WINDOW {
            w.record(0, 100);
        }
        assert_eq!(w.share(), Some(0.0));
    }

    #[test]
    fn one_request_per_interval_is_watched_even_when_idle() {
        let w = Watch::new(1_000_000, Duration::ZERO);
        w.record(0, 1000);
        assert!((0..16).all(|_| w.admit()));
    }

    #[test]
    fn every_one_disables_passthrough() {
        let w = Watch::new(1, hour());
        w.record(0, 10_000);
        assert!((0..16).all(|_| w.admit()));
    }
}
