//! The load tracker: how many streams this server has at the upstream and what each is
//! doing (speculating, relaying, passing through), plus clients that bypass specd, seen
//! through the upstream's own count of running requests. Counters of its own, never read
//! back from metrics.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::inflight::InFlight;
use crate::metrics::labels::StreamMode;

/// Requests the upstream reports running, and when that was read (its `/metrics`).
pub type RunningSource = Box<dyn Fn() -> Option<(f64, Instant)> + Send + Sync>;

/// How long a reading of the upstream's running requests is trusted.
const RUNNING_FRESH: Duration = Duration::from_secs(2);
/// How long a finished verify call is remembered (to share steps with later-recorded ones).
const CALLS_KEPT: Duration = Duration::from_secs(1);

/// A verify call of this server: its drafts, and when it started and (once it has) ended.
struct Call {
    id: u64,
    drafts: usize,
    start: Instant,
    end: Option<Instant>,
}

pub(super) struct LoadTracker {
    active: AtomicUsize,
    relaying: AtomicUsize,
    /// Prompts of this server's verify calls in flight, and the recent peak of those plus
    /// relays (previous and current window, and when the current one began): what the
    /// upstream may have counted as ours when it was last read.
    verify_prompts: AtomicUsize,
    /// Relays whose prompt the upstream has not computed yet (no token back): a step that
    /// computes one costs every sequence beside it what a verify step does.
    relay_starts: AtomicUsize,
    /// Verify calls and relays started: changes whenever a prompt is sent.
    prompts_started: AtomicU64,
    peak: Mutex<(usize, usize, Option<Instant>)>,
    /// Verify calls in flight and recently finished (see `batch_drafts`).
    calls: Mutex<VecDeque<Call>>,
    pub(super) running: Option<RunningSource>,
    /// Client requests in flight (passthrough ones load the upstream too).
    pub(super) in_flight: Arc<InFlight>,
}

impl Default for LoadTracker {
    fn default() -> Self {
        LoadTracker {
            active: AtomicUsize::new(0),
            relaying: AtomicUsize::new(0),
            verify_prompts: AtomicUsize::new(0),
            relay_starts: AtomicUsize::new(0),
            prompts_started: AtomicU64::new(0),
            peak: Mutex::new((0, 0, None)),
            calls: Mutex::default(),
            running: None,
            in_flight: Arc::default(),
        }
    }
}

impl LoadTracker {
    pub(super) fn enter(&self) {
        self.active.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn leave(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }
    pub(super) fn start_relay(&self, now: Instant) {
        self.relaying.fetch_add(1, Ordering::Relaxed);
        self.relay_starts.fetch_add(1, Ordering::Relaxed);
        self.prompts_started.fetch_add(1, Ordering::Relaxed);
        self.note_peak(now);
    }
    /// The relay's first token arrived (or it ended before one did): its prompt is done.
    pub(super) fn relay_started(&self) {
        self.relay_starts.fetch_sub(1, Ordering::Relaxed);
    }
    pub(super) fn end_relay(&self) {
        self.relaying.fetch_sub(1, Ordering::Relaxed);
    }
    /// A verify call of `prompts` prompts (drafts + 1) starts; returns its id.
    pub(super) fn start_verify(&self, prompts: usize, now: Instant) -> u64 {
        let id = self.prompts_started.fetch_add(1, Ordering::Relaxed);
        self.verify_prompts.fetch_add(prompts, Ordering::Relaxed);
        self.note_peak(now);
        if let Ok(mut g) = self.calls.lock() {
            g.retain(|c| {
                c.end
                    .is_none_or(|e| now.saturating_duration_since(e) < CALLS_KEPT)
            });
            g.push_back(Call {
                id,
                drafts: prompts.saturating_sub(1),
                start: now,
                end: None,
            });
        }
        id
    }
    pub(super) fn end_verify(&self, id: u64, prompts: usize, now: Instant) {
        self.verify_prompts.fetch_sub(prompts, Ordering::Relaxed);
        if let Ok(mut g) = self.calls.lock() {
            if let Some(c) = g.iter_mut().find(|c| c.id == id) {
                c.end = Some(now);
            }
        }
    }

    /// Drafts per call of this server's verify calls that shared the upstream's steps
    /// with one that took from `now - took` to `now` (itself included), each weighted by
    /// how much of that time it overlapped. A step's cost grows with every sequence's
    /// drafts, so this, not the call's own K, is what its time measured.
    pub(super) fn batch_drafts(&self, took: Duration, now: Instant) -> Option<f64> {
        let g = self.calls.lock().ok()?;
        let from = now.checked_sub(took)?;
        let span = took.as_secs_f64();
        let (mut w, mut sum) = (0.0, 0.0);
        for c in g.iter() {
            let end = c.end.unwrap_or(now).min(now);
            let start = c.start.max(from);
            if end <= start {
                continue;
            }
            let share = end.saturating_duration_since(start).as_secs_f64() / span;
            w += share;
            sum += share * c.drafts as f64;
        }
        (span > 0.0 && w > 0.0).then(|| sum / w)
    }

    pub(super) fn prompt_epoch(&self) -> u64 {
        self.prompts_started.load(Ordering::Relaxed)
    }

    pub(super) fn prompt_in_flight(&self) -> bool {
        self.verify_prompts.load(Ordering::Relaxed) > 0
            || self.relay_starts.load(Ordering::Relaxed) > 0
    }

    /// Streams in the session loop (speculating or relaying): those that can speculate.
    pub(super) fn in_loop(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Streams of this server at the upstream: sessions and passthrough requests.
    pub(super) fn streams(&self) -> usize {
        self.active.load(Ordering::Relaxed) + self.passing()
    }

    /// Passthrough requests in flight.
    fn passing(&self) -> usize {
        self.in_flight.count(StreamMode::Passthrough)
    }

    /// Streams in speculation right now (at least 1: the caller).
    pub(super) fn speculating(&self) -> usize {
        self.active
            .load(Ordering::Relaxed)
            .saturating_sub(self.relaying.load(Ordering::Relaxed))
            .max(1)
    }

    /// Streams decoding plainly besides the caller: this server's relaying streams (less
    /// the caller when it relays), and the `outside` sequences (passthrough requests and
    /// other clients, as `outside` counts them).
    pub(super) fn others_decoding(&self, self_relaying: bool, outside: usize) -> usize {
        let relaying = self.relaying.load(Ordering::Relaxed);
        relaying.saturating_sub(usize::from(self_relaying)) + outside
    }

    /// Sequences at the upstream that cannot speculate: this server's passthrough
    /// requests and other clients'.
    pub(super) fn outside(&self, now: Instant) -> usize {
        let pass = self.passing();
        // Clients of the upstream that do not go through this server: what it reports
        // running beyond the most this server can have had there when it was read.
        let external = self
            .running
            .as_ref()
            .and_then(|f| f())
            .filter(|(_, at)| now.saturating_duration_since(*at) < RUNNING_FRESH)
            .map_or(0, |(running, _)| {
                let peak = self.peak.lock().map_or(0, |g| g.0.max(g.1));
                let ours = pass + peak.max(self.own_requests());
                (running - ours as f64).max(0.0) as usize
            });
        pass + external
    }

    /// Requests this server has at the upstream now: verify prompts and relays.
    fn own_requests(&self) -> usize {
        self.verify_prompts.load(Ordering::Relaxed) + self.relaying.load(Ordering::Relaxed)
    }

    /// Remember the recent peak of our own requests (a reading may predate a drop).
    fn note_peak(&self, now: Instant) {
        let own = self.own_requests();
        if let Ok(mut g) = self.peak.lock() {
            let since =
                g.2.map_or(Duration::MAX, |t| now.saturating_duration_since(t));
            if since > RUNNING_FRESH {
                *g = (g.1, 0, Some(now));
            }
            g.1 = g.1.max(own);
        }
    }
}
