//! The batch verdict: whether this server's streams at the upstream speculate or relay,
//! decided for all of them at once. A verify pass costs every sequence in the batch's step
//! what it costs the verifying one, so speculation pays for the batch or for none of it:
//! streams that split between the two modes make the relaying ones pay for verify steps
//! without gaining from them. Each stream in the loop posts what a round of its latest
//! proposal would save were every stream of the loop verifying in the same step; the
//! batch speculates while those savings outweigh what its verify steps cost the sequences
//! that cannot speculate (passthrough requests, other clients).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::decide::SWITCH_HORIZON;

/// One stream's entry; removed when its controller state is dropped.
pub struct Slot {
    batch: Arc<Batch>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut g) = self.batch.inner.lock() {
            g.gains.retain(|(id, _)| *id != self.id);
        }
    }
}

#[derive(Default)]
struct Inner {
    /// Per stream: seconds a round of its latest proposal saves against plain decoding of
    /// the same tokens, with every stream of the loop verifying in one step (negative when
    /// it would lose); and the same under the acceptance a switch is judged by.
    gains: Vec<(u64, Gain)>,
    next: u64,
    /// The verdict in force, and evaluations in a row that found the other one better.
    speculating: bool,
    streak: u32,
}

#[derive(Default)]
pub(super) struct Batch {
    inner: Mutex<Inner>,
    /// Decode-cost probes relaying now. Plain decoding cannot be measured beside verify
    /// steps (those gaps are skipped), so while one probes, the whole batch relays.
    probing: AtomicUsize,
    /// An exploring round in force: the offset from each stream's best K, and until when
    /// streams starting a round follow it.
    explore: Mutex<Option<(isize, Instant)>>,
}

/// Counts a decode-cost probe while it lives.
pub struct Probe(Arc<Batch>);

impl Drop for Probe {
    fn drop(&mut self) {
        self.0.probing.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Batch {
    /// Record `gain` as the stream's current saving per round (its slot made on first use).
    pub(super) fn post(self: &Arc<Self>, slot: &mut Option<Slot>, gain: Gain) {
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        let id = match slot {
            Some(s) => s.id,
            None => {
                g.next += 1;
                let id = g.next;
                *slot = Some(Slot {
                    batch: self.clone(),
                    id,
                });
                id
            }
        };
        match g.gains.iter_mut().find(|(i, _)| *i == id) {
            Some(e) => e.1 = gain,
            None => g.gains.push((id, gain)),
        }
    }

    pub(super) fn probe(self: &Arc<Self>) -> Probe {
        self.probing.fetch_add(1, Ordering::Relaxed);
        Probe(self.clone())
    }

    /// The batch explores together: a step costs what all its drafts cost, so one stream
    /// verifying another K beside the batch measures the batch's K, not its own. While an
    /// exploration is in force, the offset from the best K it explores; otherwise `start`
    /// (the caller's own draw) may begin one, for streams starting rounds within `window`.
    pub(super) fn explore(
        &self,
        now: Instant,
        window: Duration,
        start: impl FnOnce() -> Option<isize>,
    ) -> Option<isize> {
        let mut g = self.explore.lock().ok()?;
        if let Some((d, until)) = *g {
            if now < until {
                return Some(d);
            }
        }
        let d = start()?;
        *g = Some((d, now + window));
        Some(d)
    }

    /// A decode-cost probe is relaying: every stream relays with it.
    pub(super) fn probing(&self) -> bool {
        self.probing.load(Ordering::Relaxed) > 0
    }

    /// Does speculation pay for the batch? The streams' savings per verify step (the
    /// caller's own from `w`, in place of what its slot holds) against what one verify
    /// step (the mean of the streams' posted step losses) costs the sequences that cannot
    /// speculate: those outside the loop, and streams of the loop that have posted
    /// nothing yet. The verdict enters speculation
    /// when a few rounds of the net saving (`SWITCH_HORIZON`, or as many as it has been
    /// positive in a row) outweigh a relay restart per stream, and leaves it as soon as
    /// the saving turns negative (each stream then weighs its own switch). When the batch
    /// speculates, also how many other streams relay beside its verify steps: those that
    /// posted nothing (every other one joins them).
    pub(super) fn speculates(&self, slot: Option<&Slot>, w: &Weigh) -> Option<usize> {
        let mut g = self.inner.lock().ok()?;
        let mine = slot.map(|s| s.id);
        let (mut posted, mut others, mut others_entry) = (0usize, 0.0f64, 0.0f64);
        let mut step_losses = w.own.map_or(0.0, |o| o.step_loss);
        for (_, gain) in g.gains.iter().filter(|(id, _)| Some(*id) != mine) {
            posted += 1;
            others += gain.saving;
            others_entry += gain.entry;
            step_losses += gain.step_loss;
        }
        let n = posted + usize::from(w.own.is_some());
        if n == 0 {
            return None;
        }
        let unposted = w.in_loop.saturating_sub(n);
        // The step the batch runs holds each stream's round at its own K, so what it
        // costs a sequence beside it is the mean of the streams' step losses (exact where
        // a step's cost grows linearly with its tokens). The caller's own alone undercounted
        // it: 3 streams verifying K = 1 among 52 passed through, on the savings of others
        // whose K = 16 would cost those 52 ten times as much (docs/controller.md).
        let loss = (w.outside + unposted) as f64 * step_losses / n as f64;
        let net = others + w.own.map_or(0.0, |o| o.saving) - loss;
        let net_entry = others_entry + w.own.map_or(0.0, |o| o.entry) - loss;
        if g.speculating {
            // Leaving needs no margin: each stream then weighs its own switch as before.
            g.speculating = net > 0.0;
            g.streak = 0;
        } else if net_entry > 0.0 {
            g.streak = g.streak.saturating_add(1);
            // Every stream weighs the batch `checks_per_round` times a round: the streak
            // in rounds.
            let rounds = f64::from(g.streak) / n as f64 / w.checks_per_round;
            g.speculating = net_entry * SWITCH_HORIZON.max(rounds) > n as f64 * w.restart;
        } else {
            g.streak = 0;
        }
        g.speculating.then_some(unposted)
    }
}

/// Seconds a round saves against plain decoding with every stream of the loop verifying
/// at its K: as estimated (`saving`, what staying in speculation is judged by) and under
/// the acceptance a switch into it is judged by (`entry`: lower for a stream alone,
/// `decide::ENTRY_SIGMAS`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Gain {
    pub(super) saving: f64,
    pub(super) entry: f64,
    /// What that step costs a sequence decoding beside it (T_ver − T_dec).
    pub(super) step_loss: f64,
    /// Tokens the round is expected to yield.
    pub(super) tokens: f64,
}

impl Gain {
    #[cfg(test)]
    fn same(saving: f64, step_loss: f64) -> Gain {
        Gain {
            saving,
            entry: saving,
            step_loss,
            tokens: 1.0,
        }
    }
}

/// What a stream weighs the batch verdict with.
pub(super) struct Weigh {
    /// Its own saving per round with the batch verifying (None until costs are known).
    pub(super) own: Option<Gain>,
    /// Sequences at the upstream outside the loop, and streams in the loop.
    pub(super) outside: usize,
    pub(super) in_loop: usize,
    /// What a relay restart costs beyond a decode step.
    pub(super) restart: f64,
    /// How often the caller weighs the batch per round: once when it speculates, at
    /// every shadow-drafted token when it relays (a round's worth of tokens).
    pub(super) checks_per_round: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weigh(own: Option<Gain>) -> Weigh {
        Weigh {
            own,
            outside: 1,
            in_loop: 2,
            restart: 0.0,
            checks_per_round: 1.0,
        }
    }

    #[test]
    fn the_batch_speculates_while_its_savings_outweigh_the_outside_loss() {
        let b = Arc::new(Batch::default());
        let verdict = |own: Option<(f64, f64)>, slot: Option<&Slot>| {
            b.speculates(slot, &weigh(own.map(|(g, l)| Gain::same(g, l))))
        };
        assert_eq!(verdict(None, None), None, "nothing posted: relay");
        let (mut s1, mut s2) = (None, None);
        b.post(&mut s1, Gain::same(0.010, 0.005));
        b.post(&mut s2, Gain::same(-0.004, 0.005));
        assert!(verdict(None, None).is_some());
        assert_eq!(
            verdict(Some((0.01, 0.005)), s1.as_ref()),
            Some(0),
            "every stream that posted joins"
        );
        b.post(&mut s1, Gain::same(0.010, 0.009));
        assert!(verdict(None, None).is_none(), "the mean step loss counts");
        b.post(&mut s1, Gain::same(0.010, 0.005));
        assert!(
            verdict(Some((-0.012, 0.005)), s2.as_ref()).is_none(),
            "the caller's fresh value counts"
        );
        b.post(&mut s2, Gain::same(-0.012, 0.0));
        assert!(
            verdict(None, None).is_none(),
            "a stream's new value replaces its old one"
        );
        drop(s2);
        assert!(
            verdict(None, None).is_none(),
            "a stream that posted nothing counts as outside"
        );
        b.post(&mut s1, Gain::same(0.010, 0.0));
        assert!(
            verdict(None, None).is_some(),
            "a dropped stream no longer counts"
        );
    }

    #[test]
    fn the_outside_pays_for_the_step_the_batch_runs() {
        // Nine streams whose rounds at K = 16 would save 222 ms each, in a step that costs
        // each of 52 sequences outside 172 ms; the caller's K = 1 saves 2 ms in a step
        // that costs them 18. The batch's step holds both: relay.
        let b = Arc::new(Batch::default());
        let mut slots: Vec<Option<Slot>> = (0..9).map(|_| None).collect();
        for s in &mut slots {
            b.post(s, Gain::same(0.222, 0.172));
        }
        let w = Weigh {
            own: Some(Gain::same(0.002, 0.018)),
            outside: 52,
            in_loop: 10,
            restart: 0.0,
            checks_per_round: 1.0,
        };
        assert!(b.speculates(None, &w).is_none());
        // The same savings with steps that cost the outside little: speculate.
        for s in &mut slots {
            b.post(s, Gain::same(0.222, 0.002));
        }
        assert!(b.speculates(None, &w).is_some());
    }

    #[test]
    fn the_batch_enters_on_the_entry_gain_and_stays_on_the_saving() {
        let b = Arc::new(Batch::default());
        let mut s = None;
        let gain = Gain {
            saving: 0.010,
            entry: -0.001,
            step_loss: 0.0,
            tokens: 1.0,
        };
        b.post(&mut s, gain);
        let w = |own: Gain| Weigh {
            own: Some(own),
            outside: 0,
            in_loop: 1,
            restart: 0.001,
            checks_per_round: 1.0,
        };
        for _ in 0..10 {
            assert!(b.speculates(s.as_ref(), &w(gain)).is_none(), "not entered");
        }
        let sure = Gain {
            saving: 0.010,
            entry: 0.002,
            step_loss: 0.0,
            tokens: 1.0,
        };
        assert!(b.speculates(s.as_ref(), &w(sure)).is_some(), "entered");
        assert!(
            b.speculates(s.as_ref(), &w(gain)).is_some(),
            "stays while the saving is positive"
        );
        let losing = Gain {
            saving: -0.001,
            entry: -0.003,
            step_loss: 0.0,
            tokens: 1.0,
        };
        assert!(b.speculates(s.as_ref(), &w(losing)).is_none(), "left");
    }

    /// A relaying stream weighs the batch at every token it shadow-drafts, a round's
    /// worth of tokens per round: its streak of gains counts in rounds, not checks (as
    /// checks, 64 streams entered an estimated gain of 5 % about 19 tokens into a phase
    /// of 64 and paid a relay restart each when it ended; docs/controller.md).
    #[test]
    fn a_relaying_batch_counts_its_entry_streak_in_rounds() {
        let checks_until_entry = |checks_per_round: f64| {
            let b = Arc::new(Batch::default());
            let mut s = None;
            let gain = Gain {
                saving: 0.002,
                entry: 0.002,
                step_loss: 0.0,
                tokens: checks_per_round,
            };
            b.post(&mut s, gain);
            let w = Weigh {
                own: Some(gain),
                outside: 0,
                in_loop: 1,
                restart: 0.012,
                checks_per_round,
            };
            (1..=100).find(|_| b.speculates(s.as_ref(), &w).is_some())
        };
        assert_eq!(
            checks_until_entry(1.0),
            Some(7),
            "six rounds do not pay a restart"
        );
        assert_eq!(
            checks_until_entry(4.0),
            Some(25),
            "nor do 24 checks of 4 a round"
        );
    }
}
