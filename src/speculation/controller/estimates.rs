//! The controller's estimates: smoothed costs by level, acceptance calibration per
//! drafter, and the per-round choice of K over them.

use std::time::{Duration, Instant};

use super::{K_TRACKED, LEVELS};

/// Learning rates of a low envelope (see `Ewma::add_low`).
const LOW_FALL: f64 = 0.3;
const LOW_RISE: f64 = 0.03;

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ewma {
    pub(super) v: f64,
    pub(super) n: u32,
    pub(super) at: Option<Instant>,
}

impl Ewma {
    pub(super) fn add(&mut self, x: f64, floor: f64) {
        self.n = self.n.saturating_add(1);
        let a = (1.0 / f64::from(self.n)).max(floor);
        self.v += a * (x - self.v);
        self.at = Some(Instant::now());
    }
    /// A low envelope instead of a mean: falls fast to lower samples, rises slowly, so it
    /// sits near the low end of what was recently measured.
    pub(super) fn add_low(&mut self, x: f64) {
        self.n = self.n.saturating_add(1);
        let a = if self.n == 1 {
            1.0
        } else if x < self.v {
            LOW_FALL
        } else {
            LOW_RISE
        };
        self.v += a * (x - self.v);
        self.at = Some(Instant::now());
    }
    pub(super) fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.v)
    }
    pub(super) fn stale(&self, max_age: Duration) -> bool {
        self.at.is_none_or(|t| t.elapsed() > max_age)
    }
}

#[derive(Default, Clone, Copy)]
pub(super) struct Level {
    pub(super) dec: Ewma,
    /// The low envelope of decode samples: plain decoding at its recent best. Decisions
    /// compare speculation with this, so noise in the machine's speed does not make a
    /// marginal round look like a win.
    pub(super) dec_low: Ewma,
    pub(super) restart: Ewma,
    pub(super) ver: [Ewma; K_TRACKED + 1],
    pub(super) dec_probe: Option<Instant>,
    pub(super) ver_probe: Option<Instant>,
}

impl Level {
    /// T_dec as decisions use it: the low envelope once a relay segment was long enough
    /// to feed it, else the mean of the short windows.
    pub(super) fn dec_cost(&self) -> f64 {
        self.dec_low.get().unwrap_or(self.dec.v)
    }
    pub(super) fn has_ver(&self) -> bool {
        self.ver.iter().any(|e| e.n > 0)
    }
    /// T_ver(k) from this level's measurements: measured, interpolated, or extrapolated.
    pub(super) fn ver_at(&self, k: usize) -> Option<f64> {
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
pub(super) struct DrafterStats {
    pub(super) rate: [[f64; 10]; 4],
    pub(super) n: [[u32; 10]; 4],
    pub(super) draft: Ewma,
    pub(super) overlap_hit: Ewma,
}

impl Default for DrafterStats {
    fn default() -> Self {
        DrafterStats {
            rate: [[0.0; 10]; 4],
            n: [[0; 10]; 4],
            draft: Ewma::default(),
            overlap_hit: Ewma::default(),
        }
    }
}

pub(super) fn cell(pos: usize, conf: f32) -> (usize, usize) {
    let g = pos.min(3);
    let b = ((conf.clamp(0.0, 1.0) * 10.0) as usize).min(9);
    (g, b)
}

impl DrafterStats {
    pub(super) fn calibrated(&self, pos: usize, conf: f32) -> f64 {
        let (g, b) = cell(pos, conf);
        let n = f64::from(self.n[g][b]);
        (n * self.rate[g][b] + 2.0 * f64::from(conf.clamp(0.0, 1.0))) / (n + 2.0)
    }
    pub(super) fn learn(&mut self, pos: usize, conf: f32, accepted: bool) {
        let (g, b) = cell(pos, conf);
        self.n[g][b] = self.n[g][b].saturating_add(1);
        let a = (1.0 / f64::from(self.n[g][b])).max(0.01);
        self.rate[g][b] += a * (f64::from(u8::from(accepted)) - self.rate[g][b]);
    }
}

pub(super) fn level_of(load: usize) -> usize {
    let n = load.max(1);
    ((usize::BITS - (n - 1).leading_zeros()) as usize).min(LEVELS - 1)
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

/// The best round: its K, expected tokens net of the others' loss (in tokens of plain
/// decoding), and its time.
pub(super) struct Best {
    pub(super) k: usize,
    pub(super) tokens: f64,
    pub(super) time: f64,
}

impl Best {
    /// Rate relative to plain decoding.
    pub(super) fn speedup(&self, dec: f64) -> f64 {
        self.tokens * dec / self.time
    }
}

impl Costs {
    /// k in `lo..=p.len()` maximising net tokens per second. A verify pass slows the steps
    /// of the streams decoding beside it (by T_ver − T_dec each, shared among the streams
    /// verifying at once); that loss, in tokens of plain decoding, is charged to the round.
    pub(super) fn best(
        &self,
        p: &[f64],
        t_draft: f64,
        lo: usize,
        others: usize,
        spec: usize,
    ) -> Option<Best> {
        (lo..=p.len())
            .filter_map(|k| {
                let ver = self.ver.get(k).copied().flatten()?;
                let time = t_draft + ver;
                let tokens = match self.dec {
                    Some(dec) if dec > 0.0 => {
                        let loss = others as f64 * (ver - dec).max(0.0) / spec.max(1) as f64;
                        expected_tokens(p, k) - loss / dec
                    }
                    _ => expected_tokens(p, k),
                };
                (time > 0.0).then_some(Best { k, tokens, time })
            })
            .max_by(|a, b| (a.tokens / a.time).total_cmp(&(b.tokens / b.time)))
    }
}

#[derive(Default)]
pub(super) struct Costs {
    pub(super) dec: Option<f64>,
    pub(super) restart: Option<f64>,
    pub(super) ver: Vec<Option<f64>>,
    pub(super) dec_stale: bool,
    /// Probe intervals since the verify cost was last measured at this level (0 while
    /// fresh; infinite if never).
    pub(super) ver_staleness: f64,
}

/// How far a verify cost one probe interval old is trusted (by a relaying stream deciding
/// whether to re-measure it); each further interval multiplies it again.
pub(super) const STALE_TRUST: f64 = 0.7;

/// Probe intervals since the newest of `ver` was measured: 0 while that is within one
/// interval, infinite if none ever was.
pub(super) fn staleness(ver: &[Ewma], interval: Duration) -> f64 {
    let newest = ver.iter().filter_map(|e| e.at).max();
    match newest {
        None => f64::INFINITY,
        Some(t) if t.elapsed() <= interval => 0.0,
        Some(t) => t.elapsed().as_secs_f64() / interval.as_secs_f64().max(1e-3),
    }
}
