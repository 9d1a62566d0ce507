//! The goodput controller: each round it decides how many draft tokens to verify (K), or
//! that the stream should relay — let the upstream decode plainly — because speculation
//! would not pay right now.
//!
//! # The rule
//! Take a proposal d_1..d_K and estimates p_i = P(d_i accepted | d_1..d_{i-1} accepted).
//! A verify round with the first k drafts yields on average
//!
//! ```text
//! E(k) = 1 + Σ_{i=1..k} Π_{j=1..i} p_j   tokens, in   T(k) = T_draft + T_ver(k)   seconds,
//! ```
//!
//! while plain decoding yields one token per T_dec. A verify pass is an extend step, and
//! on a batching server it also slows the steps of every stream decoding beside it; that
//! loss, L(k) = others × (T_ver(k) − T_dec) / (streams verifying at once), is charged to
//! the round in tokens of plain decoding. The controller picks
//!
//! ```text
//! k* = argmax_k  (E(k) − L(k)/T_dec) / T(k),     speedup = (E(k*) − L(k*)/T_dec) · T_dec / T(k*)
//! ```
//!
//! Switching costs a relay (re)start: its first-token latency exceeds T_dec. So in `auto`
//! a speculating stream relays when the speedup is below 1 and the time lost by a few
//! such rounds (4, or as many as the verdict has held in a row, never more than the
//! rounds left in the generation) exceeds that extra cost; a
//! relaying stream comes back when a round at k* saves time (E·T_dec − L − T > 0) and a
//! few such rounds save more than that extra cost. Before T_dec is measured, a stream
//! relays to measure it, unless its round yields more tokens than a verify is believed to
//! cost decode steps (`RATIO_MAX`, in a step small enough to stay memory-bound): then it
//! speculates, and the probe waits a quarter of the probe interval for each time the
//! round's tokens hold that bound, up to the whole interval; once waiting, a later round
//! keeps it waiting while it yields `DEFER_KEEP` of that bound (an estimate's dip). `on`
//! verifies whatever the drafter proposed, up to the request's K. Seeded sampled requests
//! never relay (a relay segment draws many positions from one random stream, so where it
//! starts would change the output); they choose among k = 0..K, k = 0 being one plain
//! token through a verify call.
//!
//! # Guarantees
//! Checked over every scenario of the simulation harness (`sim/`, virtual time; the table
//! with the measured worst cases is in `docs/controller.md`): (a) where speculation loses,
//! `auto` ≥ 0.97× plain, and (b) where it wins, ≥ 0.95× the best static K — targets met in
//! most scenarios, with the worst case measured and enforced as a bound; (c) the switch
//! after a phase change, (d) rounds in a row with nothing accepted while decoding is
//! measured cheaper than a verify (the switch horizon grows with the losing streak, so
//! this is bounded by the relay restart cost over the loss per round), (e) recovery of
//! the estimates after a load spike (stale verify costs are trusted less each probe
//! interval; few-sample ones are re-probed sooner, and estimates that look like a stall,
//! a verify above `RATIO_MAX` decode steps on its level's first steps or a decode cost near
//! a verify's, within a sixteenth of the interval).
//!
//! # The parts
//! - `costs.rs` — the cost model: T_dec, relay restart and T_ver(k) by load level (each
//!   verify cost read at the speed the decode cost was timed at), draft cost per drafter;
//!   `ewma.rs`, the running estimates it keeps (mean, low envelope, quantile);
//!   `rounds.rs`, what a round of K yields and costs over them, and the best K.
//! - `acceptance.rs` — the acceptance model: calibration per drafter, residual per stream.
//! - `load.rs` — the load tracker: streams speculating, relaying, passing through, and
//!   clients that bypass specd.
//! - `watch.rs` — admission: which `auto` requests run the loop at all.
//! - `decide.rs` — the decision rule: `plan_round`, `plan_resume`.
//! - `relay.rs` — the relay tracker: a relaying stream's per-token measurements and checks.
//! - `pacing.rs` — which drafters draft for a proposal: proposals not expected to be
//!   verified (shadow proposals, a costly drafter's beside a cheaper winner) get a small
//!   share of the stream's time, by each drafter's measured cost.
//! - `clock.rs` — the time every estimate is stamped with: the system clock in
//!   production, a virtual one in the tests and the simulation harness.
//!
//! # The estimates (shared by all streams of the upstream)
//! - T_dec and the relay restart latency, by the number of active streams, from relay
//!   segments (gap between tokens; first-token latency). T_dec is a low envelope (quick
//!   to fall, slow to rise) of each segment's mean gap, sampled every 16 tokens (a mean
//!   over the segment, so bursts of buffered tokens barely move it); until a segment was
//!   that long, the mean of 4-token windows. Speculation is compared with plain decoding
//!   at its recent best, so a machine whose speed wanders does not make marginal rounds
//!   look like wins. Gaps that overlapped a verify call of this server are skipped: a
//!   verify step slows the whole batch, and that is charged to the round as L(k). A
//!   sample moves the mean and the envelope at most as far as one stream's samples would
//!   in the time since the previous one: many streams relaying at once must not make
//!   "slow to rise" fast. A decode step does no more work than a verify call at the same
//!   load: a decode cost above 0.8 of the cheapest verify cost of its level (a window
//!   that caught a stall, with nothing yet to clip it against) is capped there, replaced
//!   by the next window, and re-probed within a sixteenth of the probe interval.
//! - T_ver(k), by the number of streams speculating at once, from every verify call (at
//!   the drafts per call of the verify calls that shared its steps: a step costs what all
//!   its drafts cost, whatever the stream's own K): a running quantile near the median
//!   of the calls, unbiased by jitter, that one stalled call moves no more than any
//!   other; the relay restart latency: a low envelope, so one stalled call cannot switch
//!   speculation off; a level's verify costs resting on fewer than 8 steps (the calls of
//!   streams verifying in one step count once) are re-probed proportionally sooner than
//!   the probe interval. On a level's first 3 steps, a call under half an estimate
//!   replaces it, and a level whose cheapest verify costs more than `RATIO_MAX` decode
//!   steps (a stall) borrows the nearest level that does not and is re-probed soon.
//!   Missing k are interpolated from measured ones; a missing level borrows the nearest.
//! - T_draft per drafter (times the share of drafts hidden behind verify calls by overlap).
//! - Acceptance: per drafter, a calibration of its confidences (by position in the
//!   proposal and confidence decile; the prior of the first position is the confidence
//!   itself, that of a later one the position before it), plus a per-stream
//!   residual that tracks how this stream deviates from it right now. Observations come
//!   from verify rounds and, while relaying, from checking shadow proposals against the
//!   tokens the upstream streams back — so acceptance stays fresh in both modes. In a
//!   batch of several streams, a residual counts only as far as it stands out from its
//!   noise and from what all streams' residuals share (a stream's K is weighed against
//!   the whole step there, and chance runs of rejections moved it).
//! - "Others" are, while the batch relays, this server's relaying streams and passthrough
//!   requests, plus the upstream's running requests (from its `/metrics`) beyond what
//!   this server can have had there when they were read — clients that bypass specd.
//!   While the batch speculates (below), only the sequences outside the loop and the
//!   streams of the loop that have posted nothing yet.
//!
//! # The batch verdict (`batch.rs`)
//! A verify pass costs every sequence in its step what it costs the verifying stream, so
//! speculation pays for the batch or for none of it. Each stream in the loop posts, at
//! every decision, what its best round saves against plain decoding with every stream of
//! the loop verifying in the same step (E·T_dec − T at that level; negative when it would
//! lose). The batch speculates while the sum exceeds what one verify step costs the
//! sequences outside the loop (passthrough, other clients: `outside × (T_ver − T_dec)`);
//! it enters speculation only when `SWITCH_HORIZON` rounds (or as many as the sum has
//! been positive in a row) of that net saving outweigh a relay restart per stream, and
//! leaves it as soon as the sum turns negative (each stream then weighs its own switch
//! as before). While the batch speculates, every stream of the loop speculates at its
//! best K (a relaying one resumes at once: beside the batch's verify steps a relayed token
//! costs a verify step, and a round yields at least that token). While a decode-cost probe
//! relays, every stream relays with it: plain decoding cannot be measured beside verify
//! steps.
//!
//! Until T_dec is known at all, streams relay: plain decoding is never a loss.
//!
//! # Which requests run the loop at all
//! Estimates can be wrong, and relaying costs specd work per token. `watch.rs` judges by
//! outcome: while recent `auto` requests barely speculated, or those that did took longer
//! than plain decoding would have, most new `auto` requests pass through untouched (one
//! in `watch_every`, and one per probe interval, is still watched).
//!
//! Levels are powers of two. Estimates go stale: when a level's decode cost is older than
//! the probe interval (a quarter of it where the decision hinges on T_dec: the stream's
//! estimated speedup, averaged over its recent rounds, under 1.2), one speculating stream
//! relays a few tokens to re-measure it; when its verify cost is stale, one relaying
//! stream runs a verify round if an optimistic estimate says it could pay — the older the
//! estimate, the more optimistic (a verify cost measured in a load spike must not keep
//! speculation off for good). A few rounds try another K than the best (`explore`), so
//! neighbouring K stay measured; the batch explores together (`Batch::explore`: beside
//! the batch's steps one stream's other K would measure the batch's K, since a verify's
//! time is recorded at it).

use std::sync::Arc;
use std::time::{Duration, Instant};

mod acceptance;
mod batch;
pub mod clock;
mod costs;
mod decide;
mod ewma;
mod load;
mod pacing;
#[cfg(test)]
mod probe_tests;
pub mod relay;
mod rounds;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod speed_tests;
#[cfg(test)]
mod stall_tests;
#[cfg(test)]
mod tests;
mod watch;

pub use acceptance::Residual;
pub use clock::{Clock, SystemClock, VirtualClock};
pub use load::RunningSource;
pub use pacing::Rival;
pub use relay::RelayTracker;
pub use rounds::expected_tokens;
pub use watch::Watched;

use acceptance::AcceptanceModel;
use costs::CostModel;
use load::LoadTracker;

use crate::draft::DrafterKind;
use crate::inflight::InFlight;
use crate::metrics::Metrics;

/// Largest K the estimates track (requests may ask for more; costs beyond are extrapolated).
pub const K_TRACKED: usize = 16;
/// Tokens a decode-cost probe relays before the stream may leave relay again.
pub const PROBE_TOKENS: u32 = 5;

/// What a stream does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Verify the first K proposed tokens (K may be 0: one plain token by verify call).
    Speculate(usize),
    /// Continue with a streamed plain continuation; `probe` when it re-measures T_dec.
    Relay { probe: bool },
}

#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub probe_interval: Duration,
    pub explore: f64,
    /// While recent `auto` requests barely speculated, watch one in this many (the rest
    /// pass through untouched); 1 watches every request.
    pub watch_every: usize,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            probe_interval: Duration::from_secs(10),
            explore: 0.05,
            watch_every: 8,
        }
    }
}

/// One stream's controller state (owned by its loop).
pub struct StreamCtl {
    /// Per drafter: a request drafting with several (`auto`) scores each of them.
    residual: [Residual; DrafterKind::COUNT],
    /// Decisions in a row that found the current mode worse than the other one, without
    /// enough gain yet to pay for switching (see `horizon`).
    streak: u32,
    /// The estimated speedup of this stream's speculating rounds, smoothed.
    speedup_trend: Trend,
    /// False for seeded sampled requests (see the module comment).
    pub may_relay: bool,
    rng: fastrand::Rng,
    /// This stream's entry in the batch verdict (see `batch.rs`).
    batch: Option<batch::Slot>,
    /// Per drafter, when it last drafted (see `pacing.rs`).
    pace: [pacing::Pace; DrafterKind::COUNT],
    /// Seconds this request's verify calls took, and what the estimates said they would
    /// take (over the calls that had an estimate).
    verify_took: f64,
    verify_expected: f64,
}

/// How much slower than expected a request's verify calls may run, all together, for its
/// time to say whether speculating paid (see `Controller::plain_seconds`).
const DISTURBED: f64 = 1.5;
/// Up to this many times their estimates, a request's verify calls, all together, ran as
/// expected (jitter); only the time beyond it counts as a slowdown plain decoding would
/// have shared. Counting all of it credited plain decoding with jitter's upward half.
const SLOWED: f64 = 1.1;

/// An exponential moving average over a stream's rounds (`TREND_ALPHA` a round), starting
/// at its first value.
#[derive(Debug, Default, Clone, Copy)]
struct Trend(Option<f64>);

/// Weight of a round in a [`Trend`]: about 30 rounds' memory.
const TREND_ALPHA: f64 = 0.03;

impl Trend {
    /// Add a round's value; returns the average.
    fn update(&mut self, x: f64) -> f64 {
        let v = self.0.map_or(x, |v| v + TREND_ALPHA * (x - v));
        self.0 = Some(v);
        v
    }
}

impl StreamCtl {
    pub fn new(may_relay: bool, seed: u64) -> Self {
        StreamCtl {
            residual: [Residual::default(); DrafterKind::COUNT],
            streak: 0,
            speedup_trend: Trend::default(),
            may_relay,
            rng: fastrand::Rng::with_seed(seed),
            batch: None,
            pace: Default::default(),
            verify_took: 0.0,
            verify_expected: 0.0,
        }
    }

    /// A verify call of this request took `took`; the estimate before it was `expected`.
    pub fn note_verify(&mut self, took: Duration, expected: Option<f64>) {
        if let Some(e) = expected {
            self.verify_took += took.as_secs_f64();
            self.verify_expected += e;
        }
    }

    /// Seconds this request's verify calls ran over `SLOWED` times what they were expected
    /// to take, all together (at least 0); None when they took `DISTURBED` times that or
    /// more (a load spike, stalls): the request ran under load its cost estimates never saw.
    fn delayed(&self) -> Option<f64> {
        let over =
            self.verify_took > DISTURBED * self.verify_expected && self.verify_expected > 0.0;
        (!over).then(|| (self.verify_took - SLOWED * self.verify_expected).max(0.0))
    }

    fn residual(&self, drafter: DrafterKind) -> &Residual {
        &self.residual[drafter.index()]
    }
}

pub struct Controller {
    cfg: ControllerConfig,
    clock: Arc<dyn Clock>,
    costs: CostModel,
    acceptance: AcceptanceModel,
    load: LoadTracker,
    batch: Arc<batch::Batch>,
    watch: watch::Watch,
    metrics: Option<Arc<Metrics>>,
}

impl Default for Controller {
    fn default() -> Self {
        Controller::new(ControllerConfig::default(), None)
    }
}

impl Controller {
    pub fn new(cfg: ControllerConfig, metrics: Option<Arc<Metrics>>) -> Self {
        Controller {
            watch: watch::Watch::new(cfg.watch_every, cfg.probe_interval),
            costs: CostModel::new(cfg.probe_interval),
            cfg,
            clock: Arc::new(SystemClock),
            acceptance: AcceptanceModel::default(),
            load: LoadTracker::default(),
            batch: Arc::default(),
            metrics,
        }
    }

    /// Read the time from `clock` (a virtual one in tests and the simulation harness).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Count the server's passthrough requests in flight as load on the upstream.
    pub fn with_in_flight(mut self, t: Arc<InFlight>) -> Self {
        self.load.in_flight = t;
        self
    }

    /// Use the upstream's own count of running requests to see load from other clients.
    pub fn with_upstream_running(mut self, f: RunningSource) -> Self {
        self.load.running = Some(f);
        self
    }

    /// The time on the controller's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    pub fn enter(self: &Arc<Self>) -> Active {
        self.load.enter();
        Active(self.clone())
    }

    /// Streams of this server at the upstream: sessions and passthrough requests.
    pub fn load(&self) -> usize {
        self.load.streams()
    }

    /// Streams in speculation right now (at least 1: the caller).
    pub fn speculating(&self) -> usize {
        self.load.speculating()
    }

    /// Marks `prompts` verify prompts as in flight at the upstream while the guard lives.
    pub fn verifying(self: &Arc<Self>, prompts: usize) -> Verifying {
        let id = self.load.start_verify(prompts, self.now());
        Verifying(self.clone(), prompts, id)
    }

    /// Marks the caller as relaying while the guard lives, its prompt in flight until
    /// `Relaying::started`.
    pub fn relaying(self: &Arc<Self>) -> Relaying {
        self.load.start_relay(self.now());
        Relaying {
            ctl: self.clone(),
            starting: true,
        }
    }

    /// Marks a decode-cost probe as relaying while the guard lives (the batch relays with it).
    fn probing(&self) -> batch::Probe {
        self.batch.probe()
    }

    /// Changes whenever a verify call or a relay starts; with `prompt_in_flight`, tells a
    /// relay whether its tokens' gaps were those of plain decoding alone.
    pub fn prompt_epoch(&self) -> u64 {
        self.load.prompt_epoch()
    }

    /// Whether a prompt of this server is at the upstream now: a verify call, or a relay
    /// that has no token back yet. Either makes the upstream's steps cost what a verify
    /// step does.
    pub fn prompt_in_flight(&self) -> bool {
        self.load.prompt_in_flight()
    }

    /// Should this `auto` request run the session loop (see `watch.rs`)? False when recent
    /// ones barely speculated; it is then passed through untouched.
    pub fn watch_auto(&self) -> bool {
        self.watch.admit(self.now())
    }

    /// Seconds plain decoding of `tokens` tokens would have taken in this request's
    /// place, by the measurements from relays: first-token latency, then a decode step per
    /// token, plus the time the request's verify calls ran over `SLOWED` times their
    /// estimates (a load spike or a stall that slowed them would have slowed plain
    /// decoding as much, and the estimates, measured outside it, do not know it). None
    /// for a request whose verify calls ran far slower than expected (`DISTURBED`).
    /// Without the overrun, requests that spanned part of a load spike (verify calls
    /// 1.3-1.4x their estimates in all) were judged slower than plain decoding, and
    /// `auto` passed the next ones through while speculation paid.
    pub fn plain_seconds(&self, s: &StreamCtl, tokens: u32) -> Option<f64> {
        let delayed = s.delayed()?;
        let c = self.costs.costs(self.load(), 1, 0, self.now());
        let dec = c.dec?;
        Some(delayed + c.restart.unwrap_or(dec) + f64::from(tokens.saturating_sub(1)) * dec)
    }

    /// T_dec as decisions use it at `load` streams (None until measured).
    pub fn decode_cost_estimate(&self, load: usize) -> Option<f64> {
        self.costs.decode_cost(load)
    }

    /// T_ver(k) as decisions use it with `spec` streams speculating (None until measured).
    pub fn verify_cost_estimate(&self, k: usize, spec: usize) -> Option<f64> {
        self.costs
            .costs(1, spec, k, self.now())
            .ver
            .get(k)
            .copied()
            .flatten()
    }

    /// p_i for each confidence of a proposal, as this stream's decisions see them.
    pub fn acceptance_estimate(
        &self,
        s: &StreamCtl,
        drafter: DrafterKind,
        conf: &[f32],
    ) -> Vec<f64> {
        self.acceptance
            .per_position(s.residual(drafter), drafter, conf, self.load.in_loop())
    }

    /// A watched `auto` request ended.
    pub fn record_auto(&self, w: Watched) {
        self.watch.record(w);
        if let Some(m) = &self.metrics {
            let (share, realized) = self.watch.summary();
            if let Some(s) = share {
                m.auto_speculated_share.set(s);
            }
            if let Some(r) = realized {
                m.realized_speedup.set(r);
            }
        }
    }

    /// A verify call of k drafts while `spec` streams (this one included) speculated,
    /// ended now (its `Verifying` guard dropped). Recorded as the cost of the drafts per
    /// call of the verify calls beside it: their steps cost what all their drafts cost, so
    /// a stream that verifies fewer drafts than the batch beside it pays the batch's step.
    /// Returns the estimate the call was expected to take (None if there was none).
    pub fn record_verify(&self, k: usize, spec: usize, dt: Duration) -> Option<f64> {
        let now = self.now();
        let k = self
            .load
            .batch_drafts(dt, now)
            .map_or(k, |m| m.round() as usize);
        let (before, v) = self.costs.add_verify(k, spec, dt.as_secs_f64(), now)?;
        if let Some(m) = &self.metrics {
            m.verify_cost
                .with_label_values(&[K_LABELS[k.min(K_TRACKED)]])
                .set(v);
        }
        before
    }

    /// First token of a relay segment: the cost of (re)starting one.
    pub fn record_relay_start(&self, load: usize, dt: Duration) {
        self.costs
            .add_relay_start(load, dt.as_secs_f64(), self.now());
    }

    /// Plain decoding: `per_token` seconds per token over a window of relayed tokens.
    pub fn record_decode(&self, load: usize, per_token: f64) {
        let v = self.costs.add_decode_window(load, per_token, self.now());
        self.publish_decode_cost(v);
    }

    /// Plain decoding: the mean gap over a relay segment so far (feeds the low envelope).
    pub fn record_decode_mean(&self, load: usize, per_token: f64) {
        let v = self.costs.add_decode_mean(load, per_token, self.now());
        self.publish_decode_cost(v);
    }

    fn publish_decode_cost(&self, v: Option<f64>) {
        if let (Some(m), Some(v)) = (&self.metrics, v) {
            m.decode_cost.set(v);
        }
    }

    pub fn record_draft(&self, drafter: DrafterKind, dt: Duration) {
        self.costs.add_draft(drafter, dt.as_secs_f64(), self.now());
    }

    pub fn record_overlap(&self, drafter: DrafterKind, hit: bool) {
        self.costs.add_overlap(drafter, hit, self.now());
    }

    /// A verified (or shadow-checked) proposal: the first `accepted` of `conf.len()` drafts
    /// matched. Updates the drafter's calibration and the stream's residual.
    pub fn observe_acceptance(
        &self,
        s: &mut StreamCtl,
        drafter: DrafterKind,
        conf: &[f32],
        accepted: usize,
    ) {
        self.acceptance.observe(
            &mut s.residual[drafter.index()],
            drafter,
            conf,
            accepted,
            true,
        );
    }

    /// A shadow check stopped before it resolved: its first `matched` drafts matched.
    pub fn observe_matches(
        &self,
        s: &mut StreamCtl,
        drafter: DrafterKind,
        conf: &[f32],
        matched: usize,
    ) {
        self.acceptance.observe(
            &mut s.residual[drafter.index()],
            drafter,
            conf,
            matched,
            false,
        );
    }

    fn publish_speedup(&self, drafter: DrafterKind, speedup: f64) {
        if let Some(m) = &self.metrics {
            // A round whose cost to the other streams exceeds its gain nets fewer than zero
            // tokens; to a reader that is simply no speedup.
            m.estimated_speedup
                .with_label_values(&[drafter.as_str()])
                .set(speedup.max(0.0));
        }
    }
}

/// Counts a stream as load while it lives.
pub struct Active(Arc<Controller>);
impl Drop for Active {
    fn drop(&mut self) {
        self.0.load.leave();
    }
}

pub struct Verifying(Arc<Controller>, usize, u64);
impl Drop for Verifying {
    fn drop(&mut self) {
        self.0.load.end_verify(self.2, self.1, self.0.now());
    }
}

/// Marks a stream as relaying while it lives.
pub struct Relaying {
    ctl: Arc<Controller>,
    starting: bool,
}

impl Relaying {
    /// The relay's first token arrived: the upstream has computed its prompt.
    pub fn started(&mut self) {
        if std::mem::take(&mut self.starting) {
            self.ctl.load.relay_started();
        }
    }
}

impl Drop for Relaying {
    fn drop(&mut self) {
        self.started();
        self.ctl.load.end_relay();
    }
}

const K_LABELS: [&str; K_TRACKED + 1] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
];
