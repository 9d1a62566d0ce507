//! Where the controller reads the time. Production uses the system's monotonic clock; the
//! decision tests and the simulation harness use a virtual one they advance themselves, so
//! a decision depends on the modelled costs only, never on how busy the machine is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told: an origin plus an offset in nanoseconds.
#[derive(Debug)]
pub struct VirtualClock {
    origin: Instant,
    offset_ns: AtomicU64,
}

impl Default for VirtualClock {
    fn default() -> Self {
        VirtualClock {
            origin: Instant::now(),
            offset_ns: AtomicU64::new(0),
        }
    }
}

impl VirtualClock {
    pub fn advance(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.offset_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Move to `t` if it lies ahead (the clock never runs backwards).
    pub fn advance_to(&self, t: Instant) {
        let ns =
            u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX);
        self.offset_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Time since the clock was made.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.offset_ns.load(Ordering::Relaxed))
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.origin + self.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_virtual_clock_moves_only_forward_and_only_when_told() {
        let c = VirtualClock::default();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now() - t0, Duration::from_millis(5));
        c.advance_to(t0);
        assert_eq!(c.now() - t0, Duration::from_millis(5));
        c.advance_to(t0 + Duration::from_millis(9));
        assert_eq!(c.elapsed(), Duration::from_millis(9));
    }
}
