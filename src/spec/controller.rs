//! The goodput controller: each round it decides how many draft tokens to verify (K), or
//! that the stream should relay — let the upstream decode plainly — because speculation
//! would not pay right now.
//!
//! # The rule
//! Take a proposal d_1..d_K and estimates p_i = P(d_i accepted | d_1..d_{i-1} accepted).
//! A verify round with the first k drafts yields on average
//!
//! ```text
//! E(k) = 1 + Σ_{i=1..k} Π_{j=1..i} p_j        tokens, in  T_draft + T_ver(k, load)  seconds,
//! ```
//!
//! while plain decoding yields 1 / T_dec(load) tokens per second. The controller picks
//! k* = argmax_{1≤k≤K} E(k) / (T_draft + T_ver(k)). In `auto` a stream relays when that
//! rate is below 1 / T_dec, and comes back from relay when a round at k* saves more time
//! than it costs to restart a relay afterwards (restart latency − T_dec), spread over the
//! speculation rounds such an excursion typically lasts. `on` verifies whatever the drafter
//! proposed (up to the request's K). Seeded sampled requests never relay (a relay segment
//! uses one random stream for many positions, so where it starts would change the
//! output); they choose among k = 0..K, k = 0 being one plain token through a verify call.
//!
//! # The estimates (shared by all streams of the upstream)
//! - T_dec and the relay restart latency, per load level, from relay segments (gap between
//!   tokens; first-token latency).
//! - T_ver(k), per load level and k, from every verify call. Missing k are interpolated
//!   from measured ones; a missing load level borrows its nearest neighbour's, scaled by
//!   the ratio of their decode costs.
//! - T_draft per drafter (times the share of drafts hidden behind verify calls by overlap).
//! - Acceptance: per drafter, a calibration of its confidences (by position group and
//!   confidence decile, with the confidence itself as the prior), plus a per-stream
//!   residual that tracks how this stream deviates from it right now. Observations come
//!   from verify rounds and, while relaying, from checking shadow proposals against the
//!   tokens the upstream streams back — so acceptance stays fresh in both modes.
//!
//! Load is the number of specd streams speculating or relaying, bucketed by powers of two.
//! Estimates go stale: when a level's decode cost is older than the probe interval, one
//! speculating stream relays a few tokens to re-measure it; when its verify cost is stale,
//! one relaying stream runs a verify round if an optimistic estimate says it could pay.
//! A few rounds try another K than the best (`explore`), so neighbouring K stay measured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::SpecMode;
use crate::draft::Proposal;
use crate::metrics::Metrics;

/// Largest K the estimates track (requests may ask for more; costs beyond are extrapolated).
pub const K_TRACKED: usize = 16;
const LEVELS: usize = 8;
const DRAFTERS: usize = 6;
/// Learning rate floor of the cost EWMAs (earlier samples average 1/n).
const COST_ALPHA: f64 = 0.1;
/// Learning rate of the per-stream acceptance residual.
const RESIDUAL_ALPHA: f64 = 0.15;
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
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            probe_interval: Duration::from_secs(10),
            explore: 0.05,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Ewma {
    v: f64,
    n: u32,
    at: Option<Instant>,
}

impl Ewma {
    fn add(&mut self, x: f64, floor: f64) {
        self.n = self.n.saturating_add(1);
        let a = (1.0 / f64::from(self.n)).max(floor);
        self.v += a * (x - self.v);
        self.at = Some(Instant::now());
    }
    fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.v)
    }
    fn stale(&self, max_age: Duration) -> bool {
        self.at.is_none_or(|t| t.elapsed() > max_age)
    }
}

#[derive(Default, Clone, Copy)]
struct Level {
    dec: Ewma,
    restart: Ewma,
    ver: [Ewma; K_TRACKED + 1],
    dec_probe: Option<Instant>,
    ver_probe: Option<Instant>,
}

impl Level {
    fn has_ver(&self) -> bool {
        self.ver.iter().any(|e| e.n > 0)
    }
    /// T_ver(k) from this level's measurements: measured, interpolated, or extrapolated.
    fn ver_at(&self, k: usize) -> Option<f64> {
        let k = k.min(K_TRACKED);
        if let Some(v) = self.ver[k].get() {
            return Some(v);
        }
        let below = (0..k).rev().find(|&i| self.ver[i].n > 0);
        let above = (k + 1..=K_TRACKED).find(|&i| self.ver[i].n > 0);
        let at = |i: usize| self.ver[i].v;
        match (below, above) {
            (Some(a), Some(b)) => {
                let t = (k - a) as f64 / (b - a) as f64;
                Some(at(a) + t * (at(b) - at(a)))
            }
            (Some(a), None) | (None, Some(a)) => {
                // Slope from a second measured point on the same side, else a mild prior
                // (3 % of the cost per extra draft token); never decreasing with k.
                let second = if a < k {
                    (0..a).rev().find(|&i| self.ver[i].n > 0)
                } else {
                    (a + 1..=K_TRACKED).find(|&i| self.ver[i].n > 0)
                };
                let slope = match second {
                    Some(b) => ((at(a) - at(b)) / (a as f64 - b as f64)).max(0.0),
                    None => 0.03 * at(a),
                };
                Some((at(a) + slope * (k as f64 - a as f64)).max(0.5 * at(a)))
            }
            (None, None) => None,
        }
    }
}

/// Per-drafter acceptance calibration and costs.
#[derive(Clone, Copy)]
struct DrafterStats {
    rate: [[f64; 10]; 4],
    n: [[u32; 10]; 4],
    draft: Ewma,
    overlap_hit: Ewma,
    /// Rounds per speculation excursion (between relays).
    excursion: Ewma,
}

impl Default for DrafterStats {
    fn default() -> Self {
        DrafterStats {
            rate: [[0.0; 10]; 4],
            n: [[0; 10]; 4],
            draft: Ewma::default(),
            overlap_hit: Ewma::default(),
            excursion: Ewma::default(),
        }
    }
}

fn cell(pos: usize, conf: f32) -> (usize, usize) {
    let g = pos.min(3);
    let b = ((conf.clamp(0.0, 1.0) * 10.0) as usize).min(9);
    (g, b)
}

impl DrafterStats {
    fn calibrated(&self, pos: usize, conf: f32) -> f64 {
        let (g, b) = cell(pos, conf);
        let n = f64::from(self.n[g][b]);
        (n * self.rate[g][b] + 2.0 * f64::from(conf.clamp(0.0, 1.0))) / (n + 2.0)
    }
    fn learn(&mut self, pos: usize, conf: f32, accepted: bool) {
        let (g, b) = cell(pos, conf);
        self.n[g][b] = self.n[g][b].saturating_add(1);
        let a = (1.0 / f64::from(self.n[g][b])).max(0.01);
        self.rate[g][b] += a * (f64::from(u8::from(accepted)) - self.rate[g][b]);
    }
}

fn drafter_index(label: &str) -> usize {
    match label {
        "ngram" => 0,
        "suffix" => 1,
        "model" => 2,
        "oracle" => 3,
        "adversarial" => 4,
        _ => 5,
    }
}

fn level_of(load: usize) -> usize {
    let n = load.max(1);
    ((usize::BITS - (n - 1).leading_zeros()) as usize).min(LEVELS - 1)
}

/// One stream's controller state (owned by its loop).
pub struct StreamCtl {
    /// Observed minus predicted acceptance, smoothed: how this stream deviates now.
    residual: f64,
    /// False for seeded sampled requests (see the module comment).
    pub may_relay: bool,
    rng: fastrand::Rng,
    excursion_rounds: u32,
}

impl StreamCtl {
    pub fn new(may_relay: bool, seed: u64) -> Self {
        StreamCtl {
            residual: 0.0,
            may_relay,
            rng: fastrand::Rng::with_seed(seed),
            excursion_rounds: 0,
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

pub struct Controller {
    cfg: ControllerConfig,
    levels: Mutex<[Level; LEVELS]>,
    drafters: Mutex<[DrafterStats; DRAFTERS]>,
    active: AtomicUsize,
    metrics: Option<Arc<Metrics>>,
}

impl Default for Controller {
    fn default() -> Self {
        Controller::new(ControllerConfig::default(), None)
    }
}

/// E(k) for acceptance estimates p (k ≤ p.len()).
pub fn expected_tokens(p: &[f64], k: usize) -> f64 {
    let mut cum = 1.0;
    let mut e = 1.0;
    for &x in p.iter().take(k) {
        cum *= x;
        e += cum;
    }
    e
}

impl Controller {
    pub fn new(cfg: ControllerConfig, metrics: Option<Arc<Metrics>>) -> Self {
        Controller {
            cfg,
            levels: Mutex::new([Level::default(); LEVELS]),
            drafters: Mutex::new([DrafterStats::default(); DRAFTERS]),
            active: AtomicUsize::new(0),
            metrics,
        }
    }

    pub fn enter(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::Relaxed);
        Active(self.clone())
    }

    pub fn load(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    fn with_level<R>(&self, load: usize, f: impl FnOnce(&mut Level) -> R) -> Option<R> {
        let mut g = self.levels.lock().ok()?;
        Some(f(&mut g[level_of(load)]))
    }

    fn with_drafter<R>(&self, label: &str, f: impl FnOnce(&mut DrafterStats) -> R) -> Option<R> {
        let mut g = self.drafters.lock().ok()?;
        Some(f(&mut g[drafter_index(label)]))
    }

    pub fn record_verify(&self, k: usize, load: usize, dt: Duration) {
        let v = self.with_level(load, |l| {
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
            l.dec.v
        });
        if let (Some(m), Some(v)) = (&self.metrics, v) {
            m.decode_cost.set(v);
        }
    }

    pub fn record_draft(&self, drafter: &str, dt: Duration) {
        self.with_drafter(drafter, |d| d.draft.add(dt.as_secs_f64(), COST_ALPHA));
    }

    pub fn record_overlap(&self, drafter: &str, hit: bool) {
        self.with_drafter(drafter, |d| {
            d.overlap_hit.add(f64::from(u8::from(hit)), COST_ALPHA)
        });
    }

    /// A verified (or shadow-checked) proposal: the first `accepted` of `conf.len()` drafts
    /// matched. Updates the drafter's calibration and the stream's residual.
    pub fn observe_acceptance(
        &self,
        s: &mut StreamCtl,
        drafter: &str,
        conf: &[f32],
        accepted: usize,
    ) {
        let mut residual = s.residual;
        self.with_drafter(drafter, |d| {
            for (i, &c) in conf.iter().enumerate().take(accepted + 1) {
                let ok = i < accepted;
                let pred = (d.calibrated(i, c) + residual).clamp(0.01, 0.99);
                residual += RESIDUAL_ALPHA * (f64::from(u8::from(ok)) - pred);
                residual = residual.clamp(-1.0, 1.0);
                d.learn(i, c, ok);
            }
        });
        s.residual = residual;
    }

    /// p_i for each proposed token.
    fn acceptance(&self, s: &StreamCtl, drafter: &str, conf: &[f32]) -> Vec<f64> {
        self.with_drafter(drafter, |d| {
            conf.iter()
                .enumerate()
                .map(|(i, &c)| (d.calibrated(i, c) + s.residual).clamp(0.01, 0.99))
                .collect()
        })
        .unwrap_or_default()
    }

    /// Costs at the current load: (T_dec, relay restart, T_ver for k = 0..=kmax, stale flags).
    fn costs(&self, load: usize, kmax: usize) -> Costs {
        let Ok(g) = self.levels.lock() else {
            return Costs::default();
        };
        let me = level_of(load);
        let nearest = |has: &dyn Fn(&Level) -> bool| {
            (0..LEVELS)
                .filter(|&i| has(&g[i]))
                .min_by_key(|&i| (i as isize - me as isize).unsigned_abs())
        };
        let dec_at = nearest(&|l: &Level| l.dec.n > 0);
        let dec = dec_at.map(|i| g[i].dec.v);
        let restart = nearest(&|l: &Level| l.restart.n > 0).map(|i| g[i].restart.v);
        let ver_at = nearest(&|l: &Level| l.has_ver());
        let scale = match (ver_at, dec) {
            (Some(i), Some(d)) if i != me => g[i].dec.get().map_or(1.0, |di| d / di),
            _ => 1.0,
        };
        let ver = (0..=kmax)
            .map(|k| ver_at.and_then(|i| g[i].ver_at(k)).map(|v| v * scale))
            .collect();
        let age = self.cfg.probe_interval;
        Costs {
            dec,
            restart,
            ver,
            dec_stale: g[me].dec.stale(age),
            ver_stale: g[me].ver.iter().all(|e| e.stale(age)),
        }
    }

    /// Claim the decode (or verify) probe of a load level: true for one caller per interval.
    fn claim_probe(&self, load: usize, verify: bool) -> bool {
        let Ok(mut g) = self.levels.lock() else {
            return false;
        };
        let l = &mut g[level_of(load)];
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
    fn draft_cost(&self, drafter: &str) -> f64 {
        self.with_drafter(drafter, |d| {
            d.draft.get().unwrap_or(0.0) * (1.0 - d.overlap_hit.get().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
    }

    /// Best k in `lo..=p.len()` by expected rate; (k, tokens/s).
    fn best_k(p: &[f64], c: &Costs, t_draft: f64, lo: usize) -> Option<(usize, f64)> {
        (lo..=p.len())
            .filter_map(|k| {
                let t = t_draft + c.ver.get(k).copied().flatten()?;
                (t > 0.0).then(|| (k, expected_tokens(p, k) / t))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    fn publish(&self, drafter: &'static str, speedup: f64) {
        if let Some(m) = &self.metrics {
            m.estimated_speedup
                .with_label_values(&[drafter])
                .set(speedup);
        }
    }

    /// Speculating: what this round does with `proposal` (already cut to the round's cap).
    pub fn plan_round(
        &self,
        s: &mut StreamCtl,
        mode: SpecMode,
        drafter: &'static str,
        proposal: &Proposal,
    ) -> Decision {
        let kp = proposal.tokens.len();
        if mode != SpecMode::Auto {
            return Decision::Speculate(kp);
        }
        let load = self.load();
        let p = self.acceptance(s, drafter, &proposal.confidence);
        let c = self.costs(load, kp);
        let t_draft = self.draft_cost(drafter);
        let lo = usize::from(s.may_relay);
        let best = Self::best_k(&p, &c, t_draft, lo);
        let decision = match (c.dec, best) {
            // Never measured a verify round: measure one if there is anything to verify.
            (_, None) if kp > 0 => Decision::Speculate(kp),
            (_, None) if !s.may_relay => Decision::Speculate(0),
            (_, None) => Decision::Relay { probe: false },
            (None, Some((k, _))) => {
                if s.may_relay && self.claim_probe(load, false) {
                    Decision::Relay { probe: true }
                } else {
                    Decision::Speculate(k)
                }
            }
            (Some(dec), Some((k, rate))) => {
                self.publish(drafter, rate * dec);
                if !s.may_relay {
                    Decision::Speculate(k)
                } else if rate * dec < 1.0 {
                    Decision::Relay { probe: false }
                } else if c.dec_stale && self.claim_probe(load, false) {
                    Decision::Relay { probe: true }
                } else if kp >= 2 && s.rng.f64() < self.cfg.explore {
                    let other = s.rng.usize(1..kp);
                    Decision::Speculate(if other >= k { other + 1 } else { other })
                } else {
                    Decision::Speculate(k)
                }
            }
        };
        match decision {
            Decision::Speculate(_) => s.excursion_rounds += 1,
            Decision::Relay { .. } => self.end_excursion(s, drafter),
        }
        decision
    }

    fn end_excursion(&self, s: &mut StreamCtl, drafter: &str) {
        let n = std::mem::take(&mut s.excursion_rounds);
        if n > 0 {
            self.with_drafter(drafter, |d| d.excursion.add(f64::from(n), COST_ALPHA));
        }
    }

    /// Relaying: leave relay for a verify round of the returned K with this proposal?
    pub fn plan_resume(
        &self,
        s: &mut StreamCtl,
        drafter: &'static str,
        proposal: &Proposal,
    ) -> Option<usize> {
        let kp = proposal.tokens.len();
        if kp == 0 {
            return None;
        }
        let load = self.load();
        let p = self.acceptance(s, drafter, &proposal.confidence);
        let c = self.costs(load, kp);
        let t_draft = self.draft_cost(drafter);
        let Some((k, rate)) = Self::best_k(&p, &c, t_draft, 1) else {
            // Verify cost never measured: measure it (one stream per interval).
            return self.claim_probe(load, true).then_some(kp);
        };
        let dec = c.dec?;
        self.publish(drafter, rate * dec);
        let t_round = t_draft + c.ver.get(k).copied().flatten().unwrap_or(f64::MAX);
        let gain = expected_tokens(&p, k) * dec - t_round;
        let switch_cost = c.restart.map_or(0.0, |r| (r - dec).max(0.0));
        let rounds = self
            .with_drafter(drafter, |d| d.excursion.get())
            .flatten()
            .unwrap_or(2.0)
            .max(1.0);
        if gain > 0.0 && gain * rounds > switch_cost {
            return Some(k);
        }
        // A stale verify cost may hide a chance: re-measure when an optimistic guess pays.
        let optimistic = expected_tokens(&p, k) / (t_draft + 0.7 * (t_round - t_draft));
        (c.ver_stale && optimistic * dec > 1.0 && self.claim_probe(load, true)).then_some(k)
    }

    /// Relaying: draft for shadow checks every this many tokens (slow drafters less often).
    pub fn shadow_stride(&self, drafter: &str) -> u32 {
        let t_draft = self
            .with_drafter(drafter, |d| d.draft.get())
            .flatten()
            .unwrap_or(0.0);
        let dec = self.costs(self.load(), 0).dec.unwrap_or(0.0);
        if t_draft <= 0.0 || dec <= 0.0 {
            return 1;
        }
        ((t_draft / (0.25 * dec)).ceil() as u32).clamp(1, 16)
    }
}

#[derive(Default)]
struct Costs {
    dec: Option<f64>,
    restart: Option<f64>,
    ver: Vec<Option<f64>>,
    dec_stale: bool,
    ver_stale: bool,
}

const K_LABELS: [&str; K_TRACKED + 1] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
];
