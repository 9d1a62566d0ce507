//! The acceptance model: per drafter, a calibration of its confidences (by position in the
//! proposal and confidence decile), and per stream a residual that tracks how this stream
//! deviates from it right now.

use std::sync::Mutex;

use super::K_TRACKED;
use crate::draft::DrafterKind;

/// Learning rates of the per-stream acceptance residual: a slow one that is used, and a
/// fast one that replaces it when the two disagree by more than the fast one's noise (and
/// at least `RESIDUAL_JUMP`): the stream's acceptance changed, e.g. it left a repetitive
/// region.
const RESIDUAL_SLOW: f64 = 0.05;
const RESIDUAL_FAST: f64 = 0.3;
const RESIDUAL_JUMP: f64 = 0.3;
/// Standard deviations of the fast estimate's noise beyond which it replaces the slow one:
/// more downwards than upwards. A fast estimate can fall far below the slow one (three
/// rejections in a row take it about 0.5 down at p = 0.8) but rise only to 1 − p above
/// it, so at 3 sigmas both ways chance runs of rejections snapped good streams down, and
/// nothing snapped them back (docs/controller.md, "Guarantees": (a) 0.849 -> 0.897).
const SNAP_UP_SIGMAS: f64 = 3.0;
const SNAP_DOWN_SIGMAS: f64 = 4.0;
/// In a batch of several streams the residual counts only as far as it stands out from
/// its own noise and from the streams' common residual (`Residual::quieted`). There each
/// stream's K is weighed against the whole step, whose verify cost every stream's drafts
/// raise (with 8 streams in the harness's model, 1.2 ms a draft against 0.15 ms for one
/// stream), so the slow residual's noise (about 0.05 at acceptance 0.9) moved K from 16
/// to 5–11 on chance runs of rejections, each such round yielding 14–44 % fewer tokens.
/// A stream alone keeps the residual whole: its K hardly depends on it, and a change of
/// acceptance must show at once (docs/controller.md, "The acceptance estimate's
/// precision").
const QUIET_VARIANCES: f64 = 4.0;
/// Weight of one observation in what the streams' residuals have in common.
const COMMON_RATE: f64 = 0.02;

/// Positions calibrated apart: every one K can reach (deeper ones share the last).
const POSITIONS: usize = K_TRACKED;
/// Weight of the confidence itself as the prior of the first position, in observations.
const CONF_WEIGHT: f64 = 2.0;
/// Weight of a later position's prior, in observations: enough that one rejection at a position few
/// proposals reach does not condemn it (K then stays below it, and it is never observed
/// again).
const PRIOR_WEIGHT: f64 = 8.0;

/// One drafter's confidence calibration: per position in the proposal (a drafter's later
/// drafts are usually worse, and how much worse decides how long a round pays) and
/// confidence decile.
#[derive(Clone, Copy)]
struct Calibration {
    rate: [[f64; 10]; POSITIONS],
    n: [[u32; 10]; POSITIONS],
    /// What the streams' residuals have in common (an average over every observation of
    /// the observing stream's residual): the calibration's own lag, e.g. while acceptance
    /// ramps down for all of them, which `Residual::quieted` keeps.
    common: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            rate: [[0.0; 10]; POSITIONS],
            n: [[0; 10]; POSITIONS],
            common: 0.0,
        }
    }
}

fn cell(pos: usize, conf: f32) -> (usize, usize) {
    let g = pos.min(POSITIONS - 1);
    let b = ((conf.clamp(0.0, 1.0) * 10.0) as usize).min(9);
    (g, b)
}

impl Calibration {
    /// The cell's observed rate, shrunk towards a prior: at the first position the
    /// confidence itself, at a later one the calibrated rate of the position before (few
    /// proposals get that deep, and an unobserved position is more like its neighbour
    /// than like the raw confidence).
    fn calibrated(&self, pos: usize, conf: f32) -> f64 {
        let (g, b) = cell(pos, conf);
        let mut v = f64::from(conf.clamp(0.0, 1.0));
        for row in 0..=g {
            let n = f64::from(self.n[row][b]);
            let w = if row == 0 { CONF_WEIGHT } else { PRIOR_WEIGHT };
            v = (n * self.rate[row][b] + w * v) / (n + w);
        }
        v
    }
    fn learn(&mut self, pos: usize, conf: f32, accepted: bool) {
        let (g, b) = cell(pos, conf);
        self.n[g][b] = self.n[g][b].saturating_add(1);
        let a = (1.0 / f64::from(self.n[g][b])).max(0.01);
        self.rate[g][b] += a * (f64::from(u8::from(accepted)) - self.rate[g][b]);
    }
}

/// The stationary variance of an exponential average (weight `rate` per observation) of
/// Bernoulli(`q`) outcomes: the noise of a residual estimate at acceptance `q`.
fn ewma_variance(rate: f64, q: f64) -> f64 {
    rate / (2.0 - rate) * q * (1.0 - q)
}

/// How one stream's acceptance deviates from its drafter's calibration right now.
#[derive(Debug, Clone, Copy, Default)]
pub struct Residual {
    /// Observed minus predicted acceptance, smoothed (the one estimates use).
    slow: f64,
    fast: f64,
}

impl Residual {
    pub fn value(&self) -> f64 {
        self.slow
    }

    /// The residual as far as it stands out from its own noise at acceptance `q`: its
    /// departure from what all streams' residuals have in common (`common`) shrunk towards
    /// 0 by `QUIET_VARIANCES` times the variance of the slow estimate of Bernoulli(q)
    /// outcomes (James–Stein, positive part). A departure several standard deviations
    /// out is kept nearly whole; one within the noise counts little.
    fn quieted(&self, q: f64, common: f64) -> f64 {
        let q = q.clamp(0.01, 0.99);
        let v = QUIET_VARIANCES * ewma_variance(RESIDUAL_SLOW, q);
        let own = self.slow - common;
        let r2 = own * own;
        if r2 <= v {
            common
        } else {
            common + own * (1.0 - v / r2)
        }
    }
}

#[derive(Default)]
pub(super) struct AcceptanceModel {
    drafters: Mutex<[Calibration; DrafterKind::COUNT]>,
}

impl AcceptanceModel {
    /// A verified (or shadow-checked) proposal: the first `accepted` of `conf.len()` drafts
    /// matched, and (`resolved`) the next one did not — an unresolved check stopped early,
    /// so only its matches are known. Updates the drafter's calibration and the stream's
    /// residual.
    pub(super) fn observe(
        &self,
        r: &mut Residual,
        drafter: DrafterKind,
        conf: &[f32],
        accepted: usize,
        resolved: bool,
    ) {
        let Ok(mut g) = self.drafters.lock() else {
            return;
        };
        let d = &mut g[drafter.index()];
        let (mut slow, mut fast) = (r.slow, r.fast);
        for (i, &c) in conf
            .iter()
            .enumerate()
            .take(accepted + usize::from(resolved))
        {
            let ok = f64::from(u8::from(i < accepted));
            let base = d.calibrated(i, c);
            slow += RESIDUAL_SLOW * (ok - (base + slow).clamp(0.01, 0.99));
            fast += RESIDUAL_FAST * (ok - (base + fast).clamp(0.01, 0.99));
            slow = slow.clamp(-1.0, 1.0);
            fast = fast.clamp(-1.0, 1.0);
            // Snap when the fast estimate is further off than its own noise allows
            // (standard deviations of an EWMA of Bernoulli(p) outcomes).
            let q = (base + slow).clamp(0.01, 0.99);
            let noise = ewma_variance(RESIDUAL_FAST, q).sqrt();
            let sigmas = if fast < slow {
                SNAP_DOWN_SIGMAS
            } else {
                SNAP_UP_SIGMAS
            };
            if (fast - slow).abs() > (sigmas * noise).max(RESIDUAL_JUMP) {
                slow = fast;
            }
            d.learn(i, c, i < accepted);
            d.common += COMMON_RATE * (slow - d.common);
        }
        r.slow = slow;
        r.fast = fast;
    }

    /// p_i for each proposed token: the calibrated confidence plus the stream's residual
    /// (`together`: the streams of the loop, this one included, which verify in the same
    /// steps while the batch speculates).
    pub(super) fn per_position(
        &self,
        r: &Residual,
        drafter: DrafterKind,
        conf: &[f32],
        together: usize,
    ) -> Vec<f64> {
        let Ok(g) = self.drafters.lock() else {
            return Vec::new();
        };
        let d = &g[drafter.index()];
        conf.iter()
            .enumerate()
            .map(|(i, &c)| {
                let q = d.calibrated(i, c);
                let r = if together > 1 {
                    r.quieted(q, d.common)
                } else {
                    r.slow
                };
                (q + r).clamp(0.01, 0.99)
            })
            .collect()
    }

    /// `p` (from `per_position`) lowered by `sigmas` standard deviations of a lone
    /// stream's residual noise at each estimate: the acceptance a switch into speculation
    /// is judged by (`decide::ENTRY_SIGMAS`).
    pub(super) fn lowered(p: &[f64], sigmas: f64) -> Vec<f64> {
        p.iter()
            .map(|&q| (q - sigmas * ewma_variance(RESIDUAL_SLOW, q).sqrt()).clamp(0.01, 0.99))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Confidence 0.9 with nothing learned yet: the calibration says 0.9.
    fn estimate(slow: f64, together: usize) -> f64 {
        let r = Residual { slow, fast: slow };
        AcceptanceModel::default().per_position(&r, DrafterKind::Oracle, &[0.9], together)[0]
    }

    #[test]
    fn in_a_batch_the_residual_counts_as_far_as_it_exceeds_its_noise() {
        // Within the slow estimate's noise (about 0.05 at 0.9): whole for a stream alone,
        // nothing in a batch.
        assert!((estimate(-0.05, 1) - 0.85).abs() < 1e-6);
        assert!((estimate(-0.05, 8) - 0.9).abs() < 1e-6);
        // Far beyond it (acceptance fell): nearly whole in a batch too.
        assert!((estimate(-0.4, 1) - 0.5).abs() < 1e-6);
        let batch = estimate(-0.4, 8);
        assert!(batch > 0.5 && batch < 0.53, "{batch}");
        // Upwards alike.
        assert!((estimate(0.05, 8) - 0.9).abs() < 1e-6);
        assert!(estimate(0.08, 1) > estimate(0.08, 8));
    }
}
