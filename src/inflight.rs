//! Client requests being answered right now, by how they are served. The drain on
//! SIGTERM waits for them, and the controller counts the passthrough ones as load on the
//! upstream. State of its own: the `specd_active_streams` gauge only reports it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metrics::labels::StreamMode;

#[derive(Debug, Default)]
pub struct InFlight {
    counts: [AtomicUsize; StreamMode::ALL.len()],
}

/// Held while one request is answered; counted out on drop.
#[derive(Debug)]
pub struct InFlightGuard {
    tracker: Arc<InFlight>,
    mode: StreamMode,
}

impl InFlight {
    pub fn enter(self: &Arc<Self>, mode: StreamMode) -> InFlightGuard {
        self.counts[mode as usize].fetch_add(1, Ordering::Relaxed);
        InFlightGuard {
            tracker: self.clone(),
            mode,
        }
    }

    pub fn count(&self, mode: StreamMode) -> usize {
        self.counts[mode as usize].load(Ordering::Relaxed)
    }

    pub fn total(&self) -> usize {
        StreamMode::ALL.iter().map(|&m| self.count(m)).sum()
    }
}

impl InFlightGuard {
    pub fn mode(&self) -> StreamMode {
        self.mode
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.tracker.counts[self.mode as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_in_and_out() {
        let t = Arc::new(InFlight::default());
        let a = t.enter(StreamMode::Passthrough);
        let b = t.enter(StreamMode::Speculate);
        assert_eq!(t.count(StreamMode::Passthrough), 1);
        assert_eq!(t.total(), 2);
        drop(a);
        assert_eq!(t.count(StreamMode::Passthrough), 0);
        assert_eq!(b.mode(), StreamMode::Speculate);
        drop(b);
        assert_eq!(t.total(), 0);
    }
}
