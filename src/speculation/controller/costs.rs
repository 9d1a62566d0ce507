//! The cost model: decode, relay restart and verify costs by load level, and the
//! drafters' own cost (`rounds.rs` chooses K over them).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ewma::{Ewma, VER_QUANTILE};
use super::relay::{DECODE_WINDOW, SEGMENT_SAMPLE};
use super::K_TRACKED;
use crate::draft::DrafterKind;

/// Load levels (powers of two of the stream count; the last one holds everything above).
pub(super) const LEVELS: usize = 8;
/// Learning rate floor of the cost EWMAs (earlier samples average 1/n).
const COST_ALPHA: f64 = 0.1;

/// Seconds over which an unsampled decode cost loses its weight against a new window.
const DEC_MEMORY: f64 = 3.0;

/// The weight of a cheaper decode window against an estimate last sampled long ago: an
/// estimate from another state of the machine (measured in a load spike, before it
/// ended) says little about now. At the learning-rate floor alone, one probe window
/// every probe interval moved it a tenth of the way, and after a 3× spike `auto`
/// speculated at 0.93 of plain decoding on a decode cost 40 % too high for seconds
/// (docs/controller.md). Only falls learn this way: a dearer window may have caught a
/// stall, and decisions use the lower of the mean and the low envelope anyway.
fn fresh_weight(e: &Ewma, now: Instant) -> f64 {
    let age = e.at.map_or(f64::INFINITY, |t| {
        now.saturating_duration_since(t).as_secs_f64()
    });
    COST_ALPHA.max(1.0 - (-age / DEC_MEMORY).exp())
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
    /// The decode cost (as decisions use it) when the newest verify call here was timed,
    /// if it was fresh then: the machine's speed the verify costs were measured at.
    pub(super) ver_dec: Option<f64>,
    /// Verify steps timed at this level: the calls of streams verifying in one step count
    /// once (they caught the same stall, if any).
    pub(super) ver_steps: u32,
    pub(super) dec_probe: Option<Instant>,
    pub(super) ver_probe: Option<Instant>,
    /// When a stream first speculated at this level without a decode cost, the probe
    /// deferred because speculation won under any plausible one (`Costs::defer_probe`).
    pub(super) dec_deferred: Option<Instant>,
}

impl Level {
    /// T_dec as decisions use it: the low envelope once a relay segment was long enough
    /// to feed it, else the mean of the short windows — never above that mean (a first
    /// segment that caught a stall would otherwise set the envelope alone).
    pub(super) fn dec_cost(&self) -> f64 {
        match self.dec_low.get() {
            Some(low) if self.dec.n > 0 => low.min(self.dec.v),
            Some(low) => low,
            None => self.dec.v,
        }
    }
    /// On the few steps timed so far, the cheapest verify measured here costs more than
    /// `RATIO_MAX` decode steps of `dec` in a step of `streams` small enough to stay
    /// memory-bound, which it cannot: one of them caught a stall.
    pub(super) fn ver_suspect(&self, dec: f64, streams: usize) -> bool {
        self.ver_steps < STALL_STEPS
            && self.cheapest_ver().is_some_and(|(k, v)| {
                v > RATIO_MAX * dec && streams * (k + 1) <= MEMORY_BOUND_TOKENS
            })
    }
    /// A window of relayed tokens; returns T_dec as decisions use it.
    fn add_decode_window(&mut self, per_token: f64, now: Instant) -> f64 {
        // One window that caught a stall must not make plain decoding look as slow as
        // a verify: a sample counts for at most twice the estimate (a real rise in
        // load still doubles it within a few windows).
        let x = match self.dec.get() {
            Some(v) => per_token.min(2.0 * v),
            None => per_token,
        };
        // Nor can a decode step cost what a verify call costs (`SUSPECT`): a first
        // window that caught a stall made plain decoding look 4× slower than it was,
        // and the streams verified hopeless drafts until the probe interval. Such an
        // estimate is replaced, not averaged with, and a sample is capped there.
        let x = match self.ver_min() {
            Some(b) => {
                if self.dec.get().is_some_and(|v| v >= SUSPECT * b * 0.999) {
                    self.dec = Ewma::default();
                }
                x.min(SUSPECT * b)
            }
            None => x,
        };
        // Windows of many streams arrive together: the mean moves at most as fast as
        // one stream's windows would move it.
        let pace = f64::from(DECODE_WINDOW) * self.dec.get().unwrap_or(per_token);
        let floor = match self.dec.get() {
            Some(v) if x < v => fresh_weight(&self.dec, now),
            _ => COST_ALPHA,
        };
        self.dec.add_paced(x, floor, pace, now);
        self.dec_cost()
    }

    pub(super) fn has_ver(&self) -> bool {
        self.ver.iter().any(|e| e.n > 0)
    }
    /// The cheapest verify cost measured at this level: a decode step does no more work
    /// than a verify call at the same load, so no more than this.
    pub(super) fn ver_min(&self) -> Option<f64> {
        self.cheapest_ver().map(|(_, v)| v)
    }
    /// The K whose verify cost measured at this level is the cheapest, and that cost.
    fn cheapest_ver(&self) -> Option<(usize, f64)> {
        (0..=K_TRACKED)
            .filter_map(|k| self.ver[k].get().map(|v| (k, v)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }
    /// T_ver(k) from this level's measurements (`streams` verifying together): measured,
    /// interpolated, or extrapolated.
    pub(super) fn ver_at(&self, k: usize, streams: usize) -> Option<f64> {
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
                let line = (at(a) + slope * (k as f64 - a as f64)).max(0.5 * at(a));
                // Past the tokens a step computes bound by memory, the prior's mild slope
                // no longer holds: a step's cost grows with its tokens there. From 64
                // streams' first round at K = 3, the mild slope put K = 12 at 82 ms where
                // it cost 152 (docs/controller.md).
                let tokens = |k: usize| (streams.max(1) * (k + 1)) as f64;
                let knee = tokens(a).max(MEMORY_BOUND_TOKENS as f64);
                let bound = if second.is_none() && k > a {
                    at(a) * tokens(k) / knee
                } else {
                    0.0
                };
                Some(line.max(bound))
            }
            (None, None) => None,
        }
    }
}

/// The level nearest `me` that `has` what is asked.
fn nearest_level(g: &[Level], me: usize, has: impl Fn(&Level) -> bool) -> Option<usize> {
    nearest_level_index(g.len(), me, |i| has(&g[i]))
}

/// The index below `n` nearest `me` that `has` what is asked.
fn nearest_level_index(n: usize, me: usize, has: impl Fn(usize) -> bool) -> Option<usize> {
    (0..n)
        .filter(|&i| has(i))
        .min_by_key(|&i| (i as isize - me as isize).unsigned_abs())
}

/// The level nearest `level` that measured T_dec.
fn decode_level(g: &[Level], level: usize) -> Option<usize> {
    nearest_level(g, level, |l| l.dec.n > 0)
}

/// T_dec from the level nearest `level` that measured it.
fn decode_cost_at(g: &[Level], level: usize) -> Option<f64> {
    decode_level(g, level).map(|i| g[i].dec_cost())
}

/// Verify costs whose speed is unknown (timed before any decode cost was, or while it
/// was stale) were timed at about the speed the next decode sample finds.
fn date_verify_costs(g: &mut [Level]) {
    for i in 0..g.len() {
        if g[i].ver_dec.is_none() && g[i].has_ver() {
            g[i].ver_dec = decode_cost_at(g, i);
        }
    }
}

pub(super) fn level_of(load: usize) -> usize {
    let n = load.max(1);
    ((usize::BITS - (n - 1).leading_zeros()) as usize).min(LEVELS - 1)
}

#[derive(Default)]
pub(super) struct Costs {
    pub(super) dec: Option<f64>,
    pub(super) restart: Option<f64>,
    pub(super) ver: Vec<Option<f64>>,
    /// Seconds since the level's decode cost was last sampled (infinite if never).
    pub(super) dec_age: f64,
    /// The decode cost is near the cheapest verify cost, which it cannot really be: a
    /// window that caught a stall, to re-measure soon.
    pub(super) dec_suspect: bool,
    /// Probe intervals since the verify cost was last measured at this level (0 while
    /// fresh; infinite if never).
    pub(super) ver_staleness: f64,
    /// The verify costs above come from a level where they look like a stall
    /// (`Level::ver_suspect`; no other level measured any): to re-measure now.
    pub(super) ver_suspect: bool,
}

/// The ratio of decode costs (now against when the verify costs were timed) beyond which
/// the machine's speed is taken to have changed (`speed_since_verify`).
const SPEED_MOVED: f64 = 1.25;
/// How recently the decode cost must have been sampled to date a verify call's speed.
const DEC_FRESH: Duration = Duration::from_secs(1);

/// How much slower the machine runs now than when level `i`'s verify costs were timed
/// (1 within `SPEED_MOVED`). A decision compares them with the decode cost, timed now:
/// a batch entered a 3× load spike on a verify cost timed before it against a decode cost
/// timed in it (244 ms a step where 103 ms was expected), and after the spike 32 streams
/// speculated on a decode cost from it (docs/controller.md).
fn speed_since_verify(g: &[Level], i: usize) -> f64 {
    match (decode_cost_at(g, i), g[i].ver_dec) {
        (Some(d), Some(then)) if (d / then).ln().abs() > SPEED_MOVED.ln() => d / then,
        _ => 1.0,
    }
}

/// Verify steps in a row a stall is believed to catch (`Level::ver_suspect`): a stall
/// is a moment of the machine, while a load that really went up (a spike of 3×: 90 ms a
/// verify against a decode cost measured at 12 ms before it) shows in every step after.
const STALL_STEPS: u32 = 3;

/// Verify samples after which a level's verify cost is re-probed at the full interval;
/// with fewer, proportionally sooner (one sample may have caught a stall, and a verify cost
/// that high keeps streams relaying, so nothing else would correct it).
const CONFIRMED: u32 = 8;

/// The re-probe interval of an estimate resting on `n` samples: shorter while they are few
/// (one may have caught a stall, and a cost that looks high keeps streams in the mode that
/// never measures it again).
fn sample_interval(n: u32, interval: Duration) -> Duration {
    interval.mul_f64(f64::from(n.clamp(1, CONFIRMED)) / f64::from(CONFIRMED))
}

/// The re-probe interval of a level's verify costs.
fn verify_interval(l: &Level, interval: Duration) -> Duration {
    sample_interval(l.ver_steps, interval)
}

/// How far a verify cost one probe interval old is trusted (by a relaying stream deciding
/// whether to re-measure it); each further interval multiplies it again.
pub(super) const STALE_TRUST: f64 = 0.7;

/// Probe intervals since the newest of `ver` was measured: 0 while that is within one
/// interval, infinite if none ever was.
pub(super) fn staleness(l: &Level, interval: Duration, now: Instant) -> f64 {
    let interval = verify_interval(l, interval);
    let newest = l.ver.iter().filter_map(|e| e.at).max();
    match newest.map(|t| now.saturating_duration_since(t)) {
        None => f64::INFINITY,
        Some(age) if age <= interval => 0.0,
        Some(age) => age.as_secs_f64() / interval.as_secs_f64().max(1e-3),
    }
}

/// One drafter's cost per proposal and the share of it overlap hides.
#[derive(Clone, Copy, Default)]
struct DraftCost {
    draft: Ewma,
    overlap_hit: Ewma,
}

/// The measured costs, shared by every stream of the upstream.
pub(super) struct CostModel {
    levels: Mutex<[Level; LEVELS]>,
    drafters: Mutex<[DraftCost; DrafterKind::COUNT]>,
    probe_interval: Duration,
}

impl CostModel {
    pub(super) fn new(probe_interval: Duration) -> Self {
        CostModel {
            levels: Mutex::new([Level::default(); LEVELS]),
            drafters: Mutex::new([DraftCost::default(); DrafterKind::COUNT]),
            probe_interval,
        }
    }

    fn with_level<R>(&self, load: usize, f: impl FnOnce(&mut Level) -> R) -> Option<R> {
        let mut g = self.levels.lock().ok()?;
        Some(f(&mut g[level_of(load)]))
    }

    fn with_drafter<R>(
        &self,
        drafter: DrafterKind,
        f: impl FnOnce(&mut DraftCost) -> R,
    ) -> Option<R> {
        let mut g = self.drafters.lock().ok()?;
        Some(f(&mut g[drafter.index()]))
    }

    /// A verify call of k drafts while `spec` streams speculated; returns the new T_ver(k).
    /// Add a verify call's time; the estimate before it and after.
    pub(super) fn add_verify(
        &self,
        k: usize,
        spec: usize,
        secs: f64,
        now: Instant,
    ) -> Option<(Option<f64>, f64)> {
        let mut g = self.levels.lock().ok()?;
        let at = level_of(spec);
        // The decode cost dates a verify's speed only if it is fresh (streams that
        // speculate do not sample it); else the speed is set by the next decode sample
        // (`date_verify_costs`).
        let fresh = |l: &Level| {
            l.dec
                .at
                .is_some_and(|t| now.saturating_duration_since(t) < DEC_FRESH)
        };
        let dec = decode_level(&g[..], at)
            .filter(|&i| fresh(&g[i]))
            .map(|i| g[i].dec_cost());
        let l = &mut g[at];
        l.ver_dec = dec;
        if l.ver_steps < STALL_STEPS {
            // While steps are few, a call under half an estimate says that estimate
            // rests on a step that caught a stall (a step cannot take half its usual
            // time): it starts again from this call. A quantile would come down 5 %
            // per call, and a verify cost that high keeps every stream relaying, so
            // only probes would sample it (a first step caught in a 322 ms stall kept
            // `auto` at 0.32 of static K = 16 in the harness).
            for e in l.ver.iter_mut().filter(|e| e.n > 0 && secs < 0.5 * e.v) {
                *e = Ewma::default();
            }
        }
        let last = l.ver.iter().filter_map(|e| e.at).max();
        if last.is_none_or(|t| now.saturating_duration_since(t).as_secs_f64() > secs / 2.0) {
            l.ver_steps = l.ver_steps.saturating_add(1);
        }
        let e = &mut l.ver[k.min(K_TRACKED)];
        let before = e.get();
        e.add_quantile(secs, VER_QUANTILE, now);
        Some((before, e.v))
    }

    pub(super) fn add_relay_start(&self, load: usize, secs: f64, now: Instant) {
        self.with_level(load, |l| l.restart.add_low(secs, now));
    }

    /// A window of relayed tokens; returns the level's T_dec as decisions use it.
    pub(super) fn add_decode_window(
        &self,
        load: usize,
        per_token: f64,
        now: Instant,
    ) -> Option<f64> {
        let mut g = self.levels.lock().ok()?;
        let cost = g[level_of(load)].add_decode_window(per_token, now);
        date_verify_costs(&mut g[..]);
        Some(cost)
    }

    /// A relay segment's mean gap so far; returns the level's T_dec as decisions use it.
    pub(super) fn add_decode_mean(&self, load: usize, per_token: f64, now: Instant) -> Option<f64> {
        self.with_level(load, |l| {
            // One stream samples the segment mean every `SEGMENT_SAMPLE` tokens.
            let pace = f64::from(SEGMENT_SAMPLE) * l.dec_low.get().unwrap_or(per_token);
            l.dec_low.add_low_paced(per_token, pace, now);
            l.dec_cost()
        })
    }

    pub(super) fn add_draft(&self, drafter: DrafterKind, secs: f64, now: Instant) {
        self.with_drafter(drafter, |d| d.draft.add(secs, COST_ALPHA, now));
    }

    pub(super) fn add_overlap(&self, drafter: DrafterKind, hit: bool, now: Instant) {
        self.with_drafter(drafter, |d| {
            d.overlap_hit.add(f64::from(u8::from(hit)), COST_ALPHA, now)
        });
    }

    /// Seconds one proposal of `drafter` costs (None until measured).
    pub(super) fn draft_seconds(&self, drafter: DrafterKind) -> Option<f64> {
        self.with_drafter(drafter, |d| d.draft.get()).flatten()
    }

    /// Draft cost per round, less what overlap hides.
    pub(super) fn draft_cost_per_round(&self, drafter: DrafterKind) -> f64 {
        self.with_drafter(drafter, |d| {
            d.draft.get().unwrap_or(0.0) * (1.0 - d.overlap_hit.get().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
    }

    /// T_dec at `load` streams alone, as [`Self::costs`] finds it: the question a relayed
    /// token asks (the full table, with its verify costs and staleness, was a tenth of a
    /// relayed token's CPU).
    pub(super) fn decode_cost(&self, load: usize) -> Option<f64> {
        let g = self.levels.lock().ok()?;
        decode_cost_at(&g[..], level_of(load))
    }

    /// Costs: T_dec and relay restart at `load` streams, T_ver(k) with `spec` streams
    /// speculating at once (k = 0..=kmax), and whether they are stale.
    pub(super) fn costs(&self, load: usize, spec: usize, kmax: usize, now: Instant) -> Costs {
        let Ok(g) = self.levels.lock() else {
            return Costs::default();
        };
        let (dl, vl) = (level_of(load), level_of(spec));
        let dec = decode_cost_at(&g[..], dl);
        let restart = nearest_level(&g[..], dl, |l| l.restart.n > 0).map(|i| g[i].restart.v);
        // A level whose verify cost looks like a stall is used only where no other level
        // measured one: 8 streams whose one step together caught a stall otherwise never
        // verified together again (the batch's verdict rests on that level).
        let suspect = |i: usize| dec.is_some_and(|d| g[i].ver_suspect(d, 1 << i));
        let ver_at = nearest_level_index(LEVELS, vl, |i| g[i].has_ver() && !suspect(i))
            .or_else(|| nearest_level(&g[..], vl, Level::has_ver));
        // Verify costs timed at another speed of the machine are read at this one.
        let speed = ver_at.map_or(1.0, |i| speed_since_verify(&g[..], i));
        let ver = (0..=kmax)
            .map(|k| ver_at.and_then(|i| g[i].ver_at(k, spec)).map(|v| v * speed))
            .collect();
        let age = self.probe_interval;
        Costs {
            dec,
            restart,
            ver,
            dec_age: g[dl].dec.at.map_or(f64::INFINITY, |t| {
                now.saturating_duration_since(t).as_secs_f64()
            }),
            dec_suspect: match (dec, g[dl].ver_min()) {
                (Some(d), Some(b)) => d >= SUSPECT * b * 0.999,
                _ => false,
            },
            ver_staleness: staleness(&g[vl], age, now),
            ver_suspect: ver_at.is_some_and(suspect),
        }
    }

    /// How old T_dec may get before a speculating stream re-measures it: the probe
    /// interval, or a quarter of it where the decision `hinges` on T_dec (a speedup
    /// estimated under `DEC_HINGES`). A decode cost measured in a load spike otherwise kept
    /// a batch verifying hopeless drafts (plain decoding looked as slow as a verify) until
    /// the full interval; and where speculation wins by far, the estimate's precision does
    /// not matter, so a few samples are enough and no probe relays sooner. A decode cost
    /// near a verify's (`Costs::dec_suspect`), which a decode step cannot cost, caught a
    /// stall: a sixteenth of the interval (16 streams whose first relay window caught one
    /// verified hopeless drafts for 2.4 s at a quarter).
    pub(super) fn decode_probe_every(&self, hinges: bool, suspect: bool) -> Duration {
        if suspect {
            self.probe_interval / 16
        } else if hinges {
            self.probe_interval / 4
        } else {
            self.probe_interval
        }
    }

    /// With no decode cost measured yet but a round that wins under any plausible one:
    /// whether the first decode probe may still wait. It waits a quarter of the probe
    /// interval from the first such round at the level, times `margin` (how many times
    /// over the round wins at the cheapest plausible decode cost; 1 to 4), so a short
    /// generation with drafts that win by far never pays a probe's relay restart and
    /// decode steps (about 5 % of a perfect-draft run in the harness, three times that
    /// in a load spike), while a wrong guess costs at most that wait before the probe
    /// corrects it; the further the round wins, the less plausible a wrong guess.
    pub(super) fn defer_probe(&self, level_load: usize, margin: f64, now: Instant) -> bool {
        let Ok(mut g) = self.levels.lock() else {
            return false;
        };
        let since = *g[level_of(level_load)].dec_deferred.get_or_insert(now);
        let wait = (self.probe_interval / 4).mul_f64(margin.clamp(1.0, 4.0));
        now.saturating_duration_since(since) < wait
    }

    /// Whether the level at `level_load` has deferred its first decode probe (its first
    /// round that won by far: `defer_probe`).
    pub(super) fn probe_deferred(&self, level_load: usize) -> bool {
        self.levels
            .lock()
            .is_ok_and(|g| g[level_of(level_load)].dec_deferred.is_some())
    }

    /// Claim a probe of a level: true for one caller per interval.
    pub(super) fn claim_probe(&self, level_load: usize, probe: Probe, now: Instant) -> bool {
        let Ok(mut g) = self.levels.lock() else {
            return false;
        };
        let l = &mut g[level_of(level_load)];
        let ver_every = verify_interval(l, self.probe_interval);
        let (slot, every) = match probe {
            Probe::Verify => (&mut l.ver_probe, ver_every),
            Probe::SuspectVerify => (&mut l.ver_probe, ver_every.min(self.probe_interval / 16)),
            Probe::Decode(every) => (&mut l.dec_probe, every),
        };
        if slot.is_some_and(|t| now.saturating_duration_since(t) < every) {
            return false;
        }
        *slot = Some(now);
        true
    }
}

/// What a probe re-measures: the verify cost, or the decode cost (at most once per the
/// given interval).
#[derive(Debug, Clone, Copy)]
pub(super) enum Probe {
    Verify,
    /// A verify cost that looks like a stall (`Level::ver_suspect`): sooner.
    SuspectVerify,
    Decode(Duration),
}

/// A decode cost above this share of the cheapest verify cost at its level is not
/// believed (a verify ≈ 2.5 decode steps in the field, 2.4 in the harness's model).
const SUSPECT: f64 = 0.8;

/// Under this estimated speedup, a decision hinges on T_dec: a decode cost a sixth lower
/// would make relaying win.
pub(super) const DEC_HINGES: f64 = 1.2;

/// The most decode steps a round is believed to cost before the decode cost is measured,
/// in a step small enough to stay bound by memory (`MEMORY_BOUND_TOKENS`): a verify ≈ 2.5
/// decode steps in the field, 2.4 to 3.5 in the harness's model up to 16 streams. A
/// round expected to yield more tokens than that wins whatever T_dec turns out; where a
/// verify costs more, the deferred probe (`CostModel::defer_probe`) corrects the guess,
/// and a round yielding nearly its K + 1 tokens loses little even then.
pub(super) const RATIO_MAX: f64 = 6.0;

/// Once a level has deferred its first decode probe, the share of `RATIO_MAX` a round must
/// still be expected to yield to keep deferring it (within `CostModel::defer_probe`'s
/// wait). Deep positions' acceptance is estimated from few rounds, and a dip under
/// `RATIO_MAX` otherwise set 8 streams at acceptance 0.9 relaying for 120 ms of a 2 s run
/// to time a decode cost that could not have changed the verdict (docs/controller.md,
/// "The first decode probe").
pub(super) const DEFER_KEEP: f64 = 0.65;

/// The K of a level's first verify round, before any verify cost is known: at most the
/// longest that keeps a step of `load` streams bound by memory (`MEMORY_BOUND_TOKENS`), so
/// its cost stays within a few decode steps whatever the drafts are worth. Uncapped, 64
/// streams' first step of K = 16 (1088 tokens) took ten decode steps in the harness's
/// model: 190 ms, 3.7 % of a run where drafts are never right (docs/controller.md).
pub(super) fn first_round_k(load: usize, kp: usize) -> usize {
    (MEMORY_BOUND_TOKENS / load.max(1))
        .saturating_sub(1)
        .clamp(1, kp.max(1))
}

/// Tokens a verify step may compute (streams × (K + 1)) for `RATIO_MAX` to be believed:
/// beyond it a step grows compute-bound and a verify's cost in decode steps has no bound
/// known before measuring (in the harness's model it doubles from 1 to 64 streams).
pub(super) const MEMORY_BOUND_TOKENS: usize = 256;

impl Costs {
    /// The generation's last token costs less drawn by a verify call without drafts than
    /// by a relay started for it: a relay's start is all it would relay.
    pub(super) fn verify_ends_sooner(&self) -> bool {
        matches!((self.ver.first().copied().flatten(), self.restart), (Some(v), Some(r)) if v <= r)
    }

    /// How much more than a decode step (re)starting a relay costs.
    pub(super) fn restart_extra(&self, dec: f64) -> f64 {
        self.restart.map_or(0.0, |r| (r - dec).max(0.0))
    }
}
