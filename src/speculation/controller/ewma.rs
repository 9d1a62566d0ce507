//! Running estimates of a cost from its samples: a mean with a learning-rate floor, a low
//! envelope, and a running quantile, each with a variant paced for many streams sampling
//! at once.

use std::time::Instant;

/// Learning rates of a low envelope (see `Ewma::add_low`).
const LOW_FALL: f64 = 0.3;
const LOW_RISE: f64 = 0.03;

/// The share of verify samples the verify estimate sits above (`Ewma::add_quantile`): near
/// the median, so jitter in single calls does not bias it as it biases a low
/// envelope (under ±30 % jitter a low envelope sat near 0.8 of the mean, and speculation
/// looked a quarter better than it was), and a stall moves it no more than any sample.
pub(super) const VER_QUANTILE: f64 = 0.45;
/// How far the verify estimate moves per sample, as a share of itself.
const QUANTILE_STEP: f64 = 0.02;

/// One running estimate: a mean, a low envelope or a quantile, as its user feeds it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ewma {
    pub(super) v: f64,
    pub(super) n: u32,
    pub(super) at: Option<Instant>,
}

impl Ewma {
    pub(super) fn add(&mut self, x: f64, floor: f64, now: Instant) {
        self.n = self.n.saturating_add(1);
        let a = (1.0 / f64::from(self.n)).max(floor);
        self.v += a * (x - self.v);
        self.at = Some(now);
    }
    /// `add` for a quantity many streams sample at once: a sample moves it at most as far
    /// as one stream's, `pace` seconds apart, would.
    pub(super) fn add_paced(&mut self, x: f64, floor: f64, pace: f64, now: Instant) {
        let (v, at) = (self.v, self.at);
        self.add(x, floor, now);
        if let (Some(at), true) = (at, pace > 0.0) {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            self.v = v + (self.v - v) * (dt / pace).min(1.0);
        }
    }
    /// A low envelope instead of a mean: falls fast to lower samples, rises slowly, so it
    /// sits near the low end of what was recently measured.
    pub(super) fn add_low(&mut self, x: f64, now: Instant) {
        self.n = self.n.saturating_add(1);
        let a = if self.n == 1 {
            1.0
        } else if x < self.v {
            LOW_FALL
        } else {
            LOW_RISE
        };
        self.v += a * (x - self.v);
        self.at = Some(now);
    }
    /// `add_low` for a quantity many streams sample at once: it rises at most as fast as
    /// one stream's samples, `pace` seconds apart, would raise it (64 streams relaying
    /// through a load spike must not lift the envelope 64 times faster than one).
    pub(super) fn add_low_paced(&mut self, x: f64, pace: f64, now: Instant) {
        let (v, at) = (self.v, self.at);
        self.add_low(x, now);
        if let (Some(at), true) = (at, x > v && pace > 0.0) {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            self.v = v + LOW_RISE * (dt / pace).min(1.0) * (x - v);
        }
    }
    /// A running quantile: each sample moves the estimate `QUANTILE_STEP` of itself, up
    /// with weight `q`, down with `1 - q`, so it settles where a share `q` of the samples
    /// lie below it; how far a sample lies does not matter. Not paced: the streams of a
    /// step sample it together, and their votes up and down cancel as one step's would
    /// (pacing its rises, as `add_low_paced` does, left the estimate behind the cost of
    /// 64 streams verifying, and `auto` at 0.75 of plain decoding in the harness).
    pub(super) fn add_quantile(&mut self, x: f64, q: f64, now: Instant) {
        self.n = self.n.saturating_add(1);
        self.at = Some(now);
        if self.n == 1 {
            self.v = x;
        } else {
            let step = QUANTILE_STEP.max(0.2 / f64::from(self.n));
            if x > self.v {
                self.v *= 1.0 + step * q;
            } else if x < self.v {
                self.v *= 1.0 - step * (1.0 - q);
            }
        }
    }
    pub(super) fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A K first timed by one fast call (a request's last round, cut short, that caught
    /// the machine at its quickest) comes up to the cost of its calls within a dozen of
    /// them; at the settled step alone it took over twenty.
    #[test]
    fn a_verify_estimate_moves_fast_while_its_samples_are_few() {
        let now = Instant::now();
        let mut e = Ewma::default();
        e.add_quantile(0.023, VER_QUANTILE, now);
        let calls = (0..13).take_while(|_| {
            e.add_quantile(0.031, VER_QUANTILE, now);
            e.v < 0.9 * 0.031
        });
        assert!(calls.count() < 13, "{}", e.v);
    }
}
