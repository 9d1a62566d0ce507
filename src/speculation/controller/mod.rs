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
//! such rounds (4, or the rounds left in the generation) exceeds that extra cost; a
//! relaying stream comes back when a round at k* saves time (E·T_dec − L − T > 0) and a
//! few such rounds save more than that extra cost. `on`
//! verifies whatever the drafter proposed, up to the request's K. Seeded sampled requests
//! never relay (a relay segment draws many positions from one random stream, so where it
//! starts would change the output); they choose among k = 0..K, k = 0 being one plain
//! token through a verify call.
//!
//! # The estimates (shared by all streams of the upstream)
//! - T_dec and the relay restart latency, by the number of active streams, from relay
//!   segments (gap between tokens; first-token latency). T_dec is a low envelope (quick
//!   to fall, slow to rise) of each segment's mean gap, sampled every 16 tokens (a mean
//!   over the segment, so bursts of buffered tokens barely move it); until a segment was
//!   that long, the mean of 4-token windows. Speculation is compared with plain decoding
//!   at its recent best, so a machine whose speed wanders does not make marginal rounds
//!   look like wins.
//! - T_ver(k), by the number of streams speculating at once, from every verify call.
//!   Missing k are interpolated from measured ones; a missing level borrows the nearest.
//! - T_draft per drafter (times the share of drafts hidden behind verify calls by overlap).
//! - Acceptance: per drafter, a calibration of its confidences (by position group and
//!   confidence decile, with the confidence itself as the prior), plus a per-stream
//!   residual that tracks how this stream deviates from it right now. Observations come
//!   from verify rounds and, while relaying, from checking shadow proposals against the
//!   tokens the upstream streams back — so acceptance stays fresh in both modes.
//! - "Others" are this server's relaying streams and passthrough requests, plus the
//!   upstream's running requests (from its `/metrics`) beyond what this server can have
//!   had there when they were read — clients that bypass specd.
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
//! the probe interval, one speculating stream relays a few tokens to re-measure it; when
//! its verify cost is stale, one relaying stream runs a verify round if an optimistic
//! estimate says it could pay — the older the estimate, the more optimistic (a verify
//! cost measured in a load spike must not keep speculation off for good). A few rounds
//! try another K than the best (`explore`), so neighbouring K stay measured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod estimates;
#[cfg(test)]
mod tests;
mod watch;

pub use watch::Watched;

pub use estimates::expected_tokens;
use estimates::{level_of, staleness, Costs, DrafterStats, Level, STALE_TRUST};

use crate::config::SpecMode;
use crate::draft::{DrafterKind, Proposal};
use crate::inflight::InFlight;
use crate::metrics::labels::StreamMode;
use crate::metrics::Metrics;

/// Largest K the estimates track (requests may ask for more; costs beyond are extrapolated).
pub const K_TRACKED: usize = 16;
const LEVELS: usize = 8;
/// Learning rate floor of the cost EWMAs (earlier samples average 1/n).
const COST_ALPHA: f64 = 0.1;
/// Learning rates of the per-stream acceptance residual: a slow one that is used, and a
/// fast one that replaces it when the two disagree by more than the fast one's noise (and
/// at least `RESIDUAL_JUMP`): the stream's acceptance changed, e.g. it left a repetitive
/// region.
const RESIDUAL_SLOW: f64 = 0.05;
const RESIDUAL_FAST: f64 = 0.3;
const RESIDUAL_JUMP: f64 = 0.3;
/// Rounds a state (speculation paying or not) is expected to last, when weighing a switch
/// against the cost of restarting a relay; fewer when the generation ends sooner.
const SWITCH_HORIZON: f64 = 4.0;

fn horizon(remaining: usize, tokens_per_round: f64) -> f64 {
    (remaining as f64 / tokens_per_round.max(1.0)).clamp(1.0, SWITCH_HORIZON)
}
/// Tokens a decode-cost probe relays before the stream may leave relay again.
pub const PROBE_TOKENS: u32 = 8;

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
    /// Observed minus predicted acceptance, smoothed: how this stream deviates now.
    residual: f64,
    residual_fast: f64,
    /// False for seeded sampled requests (see the module comment).
    pub may_relay: bool,
    rng: fastrand::Rng,
}

impl StreamCtl {
    pub fn new(may_relay: bool, seed: u64) -> Self {
        StreamCtl {
            residual: 0.0,
            residual_fast: 0.0,
            may_relay,
            rng: fastrand::Rng::with_seed(seed),
        }
    }
}

/// Counts a stream as load while it lives.
pub struct Active(Arc<Controller>);
impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Requests the upstream reports running, and when that was read (its `/metrics`).
pub type RunningSource = Box<dyn Fn() -> Option<(f64, Instant)> + Send + Sync>;

/// How long a reading of the upstream's running requests is trusted.
const RUNNING_FRESH: Duration = Duration::from_secs(2);

pub struct Controller {
    cfg: ControllerConfig,
    levels: Mutex<[Level; LEVELS]>,
    drafters: Mutex<[DrafterStats; DrafterKind::COUNT]>,
    active: AtomicUsize,
    relaying: AtomicUsize,
    /// Prompts of this server's verify calls in flight, and the recent peak of those plus
    /// relays (previous and current window): what the upstream may have counted as ours
    /// when it was last read.
    verify_prompts: AtomicUsize,
    peak: Mutex<(usize, usize, Instant)>,
    running: Option<RunningSource>,
    metrics: Option<Arc<Metrics>>,
    /// Client requests in flight (passthrough ones load the upstream too).
    in_flight: Arc<InFlight>,
    watch: watch::Watch,
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
            cfg,
            levels: Mutex::new([Level::default(); LEVELS]),
            drafters: Mutex::new([DrafterStats::default(); DrafterKind::COUNT]),
            active: AtomicUsize::new(0),
            relaying: AtomicUsize::new(0),
            verify_prompts: AtomicUsize::new(0),
            peak: Mutex::new((0, 0, Instant::now())),
            running: None,
            metrics,
            in_flight: Arc::default(),
        }
    }

    pub fn enter(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::Relaxed);
        Active(self.clone())
    }

    /// Streams of this server at the upstream: sessions and passthrough requests.
    pub fn load(&self) -> usize {
        self.active.load(Ordering::Relaxed) + self.passing()
    }

    /// Passthrough requests in flight.
    fn passing(&self) -> usize {
        self.in_flight.count(StreamMode::Passthrough)
    }

    /// Streams in speculation right now (at least 1: the caller).
    pub fn speculating(&self) -> usize {
        self.active
            .load(Ordering::Relaxed)
            .saturating_sub(self.relaying.load(Ordering::Relaxed))
            .max(1)
    }

    /// Should this `auto` request run the session loop (see `watch.rs`)? False when recent
    /// ones barely speculated; it is then passed through untouched.
    pub fn watch_auto(&self) -> bool {
        self.watch.admit()
    }

    /// Seconds plain decoding of `tokens` tokens takes at the current load, by the
    /// measurements from relays: first-token latency, then a decode step per token.
    pub fn plain_seconds(&self, tokens: u32) -> Option<f64> {
        let c = self.costs(self.load(), 1, 0);
        let dec = c.dec?;
        Some(c.restart.unwrap_or(dec) + f64::from(tokens.saturating_sub(1)) * dec)
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

    fn with_level<R>(&self, load: usize, f: impl FnOnce(&mut Level) -> R) -> Option<R> {
        let mut g = self.levels.lock().ok()?;
        Some(f(&mut g[level_of(load)]))
    }

    fn with_drafter<R>(
        &self,
        drafter: DrafterKind,
        f: impl FnOnce(&mut DrafterStats) -> R,
    ) -> Option<R> {
        let mut g = self.drafters.lock().ok()?;
        Some(f(&mut g[drafter.index()]))
    }

    /// A verify call of k drafts while `spec` streams (this one included) speculated.
    pub fn record_verify(&self, k: usize, spec: usize, dt: Duration) {
        let v = self.with_level(spec, |l| {
            let e = &mut l.ver[k.min(K_TRACKED)];
            e.add(dt.as_secs_f64(), COST_ALPHA);
            e.v
        });
        if let (Some(m), Some(v)) = (&self.metrics, v) {
            m.verify_cost
                .with_label_values(&[K_LABELS[k.min(K_TRACKED)]])
                .set(v);
        }
    }

    /// First token of a relay segment: the cost of (re)starting one.
    pub fn record_relay_start(&self, load: usize, dt: Duration) {
        self.with_level(load, |l| l.restart.add(dt.as_secs_f64(), COST_ALPHA));
    }

    /// Plain decoding: `per_token` seconds per token over a window of relayed tokens.
    pub fn record_decode(&self, load: usize, per_token: f64) {
        let v = self.with_level(load, |l| {
            l.dec.add(per_token, COST_ALPHA);
            l.dec_cost()
        });
        if let (Some(m), Some(v)) = (&self.metrics, v) {
            m.decode_cost.set(v);
        }
    }

    /// Plain decoding: the mean gap over a relay segment so far (feeds the low envelope).
    pub fn record_decode_mean(&self, load: usize, per_token: f64) {
        let v = self.with_level(load, |l| {
            l.dec_low.add_low(per_token);
            l.dec_cost()
        });
        if let (Some(m), Some(v)) = (&self.metrics, v) {
            m.decode_cost.set(v);
        }
    }

    pub fn record_draft(&self, drafter: DrafterKind, dt: Duration) {
        self.with_drafter(drafter, |d| d.draft.add(dt.as_secs_f64(), COST_ALPHA));
    }

    pub fn record_overlap(&self, drafter: DrafterKind, hit: bool) {
        self.with_drafter(drafter, |d| {
            d.overlap_hit.add(f64::from(u8::from(hit)), COST_ALPHA)
        });
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
        let (mut slow, mut fast) = (s.residual, s.residual_fast);
        self.with_drafter(drafter, |d| {
            for (i, &c) in conf.iter().enumerate().take(accepted + 1) {
                let ok = f64::from(u8::from(i < accepted));
                let base = d.calibrated(i, c);
                slow += RESIDUAL_SLOW * (ok - (base + slow).clamp(0.01, 0.99));
                fast += RESIDUAL_FAST * (ok - (base + fast).clamp(0.01, 0.99));
                slow = slow.clamp(-1.0, 1.0);
                fast = fast.clamp(-1.0, 1.0);
                // Snap when the fast estimate is further off than its own noise allows
                // (3 standard deviations of an EWMA of Bernoulli(p) outcomes).
                let q = (base + slow).clamp(0.01, 0.99);
                let noise = (RESIDUAL_FAST / (2.0 - RESIDUAL_FAST) * q * (1.0 - q)).sqrt();
                if (fast - slow).abs() > (3.0 * noise).max(RESIDUAL_JUMP) {
                    slow = fast;
                }
                d.learn(i, c, i < accepted);
            }
        });
        s.residual = slow;
        s.residual_fast = fast;
    }

    /// p_i for each proposed token.
    fn acceptance(&self, s: &StreamCtl, drafter: DrafterKind, conf: &[f32]) -> Vec<f64> {
        self.with_drafter(drafter, |d| {
            conf.iter()
                .enumerate()
                .map(|(i, &c)| (d.calibrated(i, c) + s.residual).clamp(0.01, 0.99))
                .collect()
        })
        .unwrap_or_default()
    }

    /// Streams of this server decoding plainly besides the caller: relaying streams (less
    /// the caller when it relays) and passthrough requests.
    fn others_decoding(&self, self_relaying: bool) -> usize {
        let relaying = self.relaying.load(Ordering::Relaxed);
        let pass = self.passing();
        // Clients of the upstream that do not go through this server: what it reports
        // running beyond the most this server can have had there when it was read.
        let external = self
            .running
            .as_ref()
            .and_then(|f| f())
            .filter(|(_, at)| at.elapsed() < RUNNING_FRESH)
            .map_or(0, |(running, _)| {
                let peak = self.peak.lock().map_or(0, |g| g.0.max(g.1));
                let ours = pass + peak.max(self.own_requests());
                (running - ours as f64).max(0.0) as usize
            });
        relaying.saturating_sub(usize::from(self_relaying)) + pass + external
    }

    /// Count the server's passthrough requests in flight as load on the upstream.
    pub fn with_in_flight(mut self, t: Arc<InFlight>) -> Self {
        self.in_flight = t;
        self
    }

    /// Use the upstream's own count of running requests to see load from other clients.
    pub fn with_upstream_running(mut self, f: RunningSource) -> Self {
        self.running = Some(f);
        self
    }

    /// Requests this server has at the upstream now: verify prompts and relays.
    fn own_requests(&self) -> usize {
        self.verify_prompts.load(Ordering::Relaxed) + self.relaying.load(Ordering::Relaxed)
    }

    /// Remember the recent peak of our own requests (a reading may predate a drop).
    fn note_peak(&self) {
        let now = self.own_requests();
        if let Ok(mut g) = self.peak.lock() {
            if g.2.elapsed() > RUNNING_FRESH {
                *g = (g.1, 0, Instant::now());
            }
            g.1 = g.1.max(now);
        }
    }

    /// Marks `prompts` verify prompts as in flight at the upstream while the guard lives.
    pub fn verifying(self: &Arc<Self>, prompts: usize) -> Verifying {
        self.verify_prompts.fetch_add(prompts, Ordering::Relaxed);
        self.note_peak();
        Verifying(self.clone(), prompts)
    }

    /// Costs: T_dec and relay restart at `load` streams, T_ver(k) with `spec` streams
    /// speculating at once (k = 0..=kmax), and whether they are stale.
    fn costs(&self, load: usize, spec: usize, kmax: usize) -> Costs {
        let Ok(g) = self.levels.lock() else {
            return Costs::default();
        };
        let nearest = |me: usize, has: &dyn Fn(&Level) -> bool| {
            (0..LEVELS)
                .filter(|&i| has(&g[i]))
                .min_by_key(|&i| (i as isize - me as isize).unsigned_abs())
        };
        let (dl, vl) = (level_of(load), level_of(spec));
        let dec = nearest(dl, &|l: &Level| l.dec.n > 0).map(|i| g[i].dec_cost());
        let restart = nearest(dl, &|l: &Level| l.restart.n > 0).map(|i| g[i].restart.v);
        let ver_at = nearest(vl, &|l: &Level| l.has_ver());
        let ver = (0..=kmax)
            .map(|k| ver_at.and_then(|i| g[i].ver_at(k)))
            .collect();
        let age = self.cfg.probe_interval;
        Costs {
            dec,
            restart,
            ver,
            dec_stale: g[dl].dec.stale(age),
            ver_staleness: staleness(&g[vl].ver, age),
        }
    }

    /// Claim the decode (or verify) probe of a level: true for one caller per interval.
    fn claim_probe(&self, level_load: usize, verify: bool) -> bool {
        let Ok(mut g) = self.levels.lock() else {
            return false;
        };
        let l = &mut g[level_of(level_load)];
        let slot = if verify {
            &mut l.ver_probe
        } else {
            &mut l.dec_probe
        };
        if slot.is_some_and(|t| t.elapsed() < self.cfg.probe_interval) {
            return false;
        }
        *slot = Some(Instant::now());
        true
    }

    /// Draft cost per round, less what overlap hides.
    fn draft_cost(&self, drafter: DrafterKind) -> f64 {
        self.with_drafter(drafter, |d| {
            d.draft.get().unwrap_or(0.0) * (1.0 - d.overlap_hit.get().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
    }

    fn publish(&self, drafter: DrafterKind, speedup: f64) {
        if let Some(m) = &self.metrics {
            // A round whose cost to the other streams exceeds its gain nets fewer than zero
            // tokens; to a reader that is simply no speedup.
            m.estimated_speedup
                .with_label_values(&[drafter.as_str()])
                .set(speedup.max(0.0));
        }
    }

    /// Speculating: what this round does with `proposal` (already cut to the round's cap).
    pub fn plan_round(
        &self,
        s: &mut StreamCtl,
        mode: SpecMode,
        drafter: DrafterKind,
        proposal: &Proposal,
        remaining: usize,
    ) -> Decision {
        let kp = proposal.tokens.len();
        if mode != SpecMode::Auto {
            return Decision::Speculate(kp);
        }
        let load = self.load();
        let others = self.others_decoding(false);
        let spec = load.saturating_sub(others).max(1);
        let p = self.acceptance(s, drafter, &proposal.confidence);
        let c = self.costs(load, spec, kp);
        let t_draft = self.draft_cost(drafter);
        let lo = usize::from(s.may_relay);
        match (c.dec, c.best(&p, t_draft, lo, others, spec)) {
            // Never measured a verify round: measure one if there is anything to verify.
            (_, None) if kp > 0 => Decision::Speculate(kp),
            (_, None) if !s.may_relay => Decision::Speculate(0),
            (_, None) => Decision::Relay { probe: false },
            // Decode cost unknown: relay (plain decoding is never a loss) and measure it;
            // one stream per interval holds the probe, which keeps it relaying a while.
            (None, Some(b)) => {
                if s.may_relay {
                    Decision::Relay {
                        probe: self.claim_probe(load, false),
                    }
                } else {
                    Decision::Speculate(b.k)
                }
            }
            (Some(dec), Some(b)) => {
                self.publish(drafter, b.speedup(dec));
                let d = if !s.may_relay {
                    Decision::Speculate(b.k)
                } else if b.speedup(dec) < 1.0 {
                    // Leaving costs a relay restart; stay when a few such rounds lose less
                    // than that (a small dip in the estimates must not cause flapping).
                    let loss = b.time - b.tokens * dec;
                    let restart = c.restart.map_or(0.0, |r| (r - dec).max(0.0));
                    if horizon(remaining, b.tokens) * loss > restart {
                        Decision::Relay { probe: false }
                    } else {
                        Decision::Speculate(b.k)
                    }
                } else if c.dec_stale && self.claim_probe(load, false) {
                    Decision::Relay { probe: true }
                } else if kp >= 2 && s.rng.f64() < self.cfg.explore {
                    let other = s.rng.usize(1..kp);
                    Decision::Speculate(if other >= b.k { other + 1 } else { other })
                } else {
                    Decision::Speculate(b.k)
                };
                tracing::debug!(
                    ?d,
                    k = b.k,
                    tokens = b.tokens,
                    round_ms = b.time * 1e3,
                    dec_ms = dec * 1e3,
                    restart_ms = c.restart.map(|r| r * 1e3),
                    residual = s.residual,
                    ?p,
                    load,
                    others,
                    "plan round"
                );
                d
            }
        }
    }

    /// Relaying: leave relay for a verify round of the returned K with this proposal?
    pub fn plan_resume(
        &self,
        s: &mut StreamCtl,
        drafter: DrafterKind,
        proposal: &Proposal,
        remaining: usize,
    ) -> Option<usize> {
        let kp = proposal.tokens.len();
        if kp == 0 {
            return None;
        }
        let load = self.load();
        let others = self.others_decoding(true);
        let spec = load.saturating_sub(others).max(1);
        let p = self.acceptance(s, drafter, &proposal.confidence);
        let c = self.costs(load, spec, kp);
        let t_draft = self.draft_cost(drafter);
        let Some(b) = c.best(&p, t_draft, 1, others, spec) else {
            // Verify cost never measured: measure it (one stream per interval).
            return self.claim_probe(spec, true).then_some(kp);
        };
        let dec = c.dec?;
        self.publish(drafter, b.speedup(dec));
        // Time the round saves, net of what it costs the others, against the extra cost
        // of restarting a relay when speculation stops paying again.
        let gain = b.tokens * dec - b.time;
        let switch_cost = c.restart.map_or(0.0, |r| (r - dec).max(0.0));
        let rounds = horizon(remaining, b.tokens);
        tracing::debug!(
            k = b.k,
            tokens = b.tokens,
            round_ms = b.time * 1e3,
            dec_ms = dec * 1e3,
            switch_ms = switch_cost * 1e3,
            residual = s.residual,
            ?p,
            load,
            others,
            "plan resume"
        );
        if gain > 0.0 && gain * rounds > switch_cost {
            return Some(b.k);
        }
        // A stale verify cost may hide a chance (it may have been measured in a load
        // spike): re-measure when an optimistic guess pays. The older the estimate, the
        // less it is trusted, so a high one cannot keep speculation off for good.
        let trust = STALE_TRUST.powf(c.ver_staleness);
        let optimistic = b.tokens * dec > t_draft + trust * (b.time - t_draft);
        (c.ver_staleness > 0.0 && optimistic && self.claim_probe(spec, true)).then_some(b.k)
    }

    /// Relaying: draft for shadow checks every this many tokens (slow drafters less often).
    pub fn shadow_stride(&self, drafter: DrafterKind) -> u32 {
        let t_draft = self
            .with_drafter(drafter, |d| d.draft.get())
            .flatten()
            .unwrap_or(0.0);
        let dec = self.costs(self.load(), 1, 0).dec.unwrap_or(0.0);
        if t_draft <= 0.0 || dec <= 0.0 {
            return 1;
        }
        ((t_draft / (0.25 * dec)).ceil() as u32).clamp(1, 16)
    }

    /// Marks the caller as relaying while the guard lives.
    pub fn relaying(self: &Arc<Self>) -> Relaying {
        self.relaying.fetch_add(1, Ordering::Relaxed);
        self.note_peak();
        Relaying(self.clone())
    }
}

pub struct Verifying(Arc<Controller>, usize);
impl Drop for Verifying {
    fn drop(&mut self) {
        self.0.verify_prompts.fetch_sub(self.1, Ordering::Relaxed);
    }
}

pub struct Relaying(Arc<Controller>);
impl Drop for Relaying {
    fn drop(&mut self) {
        self.0.relaying.fetch_sub(1, Ordering::Relaxed);
    }
}

const K_LABELS: [&str; K_TRACKED + 1] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
];
