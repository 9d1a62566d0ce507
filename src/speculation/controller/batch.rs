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
    /// it would lose).
    gains: Vec<(u64, f64)>,
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
    pub(super) fn post(self: &Arc<Self>, slot: &mut Option<Slot>, gain: f64) {
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

    /// A decode-cost probe is relaying: every stream relays with it.
    pub(super) fn probing(&self) -> bool {
        self.probing.load(Ordering::Relaxed) > 0
    }

    /// Does speculation pay for the batch? The streams' savings per verify step (the
    /// caller's as `own`, in place of what its slot holds) against `outside_loss`, what one
    /// verify step costs the sequences that cannot speculate. The verdict changes when a
    /// few rounds of the difference (`SWITCH_HORIZON`, or as many as the other verdict has
    /// been found better in a row) outweigh what the move costs: a relay restart
    /// (`restart`) per stream. When the batch speculates, also how many other streams
    /// would not gain from a round even then (they relay beside its verify steps).
    pub(super) fn speculates(
        &self,
        slot: Option<&Slot>,
        own: Option<f64>,
        outside_loss: f64,
        restart: f64,
    ) -> Option<usize> {
        let mut g = self.inner.lock().ok()?;
        let mine = slot.map(|s| s.id);
        let rest = |g: &Inner| {
            g.gains
                .iter()
                .filter(|(id, _)| Some(*id) != mine)
                .map(|e| e.1)
                .collect::<Vec<_>>()
        };
        let others = rest(&g);
        let n = others.len() + usize::from(own.is_some());
        let net = others.iter().sum::<f64>() + own.unwrap_or(0.0) - outside_loss;
        if n == 0 {
            return None;
        }
        if g.speculating {
            // Leaving needs no margin: each stream then weighs its own switch as before.
            g.speculating = net > 0.0;
            g.streak = 0;
        } else if net > 0.0 {
            g.streak = g.streak.saturating_add(1);
            // Every stream evaluates once per round: the streak in rounds.
            let rounds = f64::from(g.streak) / n as f64;
            g.speculating = net * SWITCH_HORIZON.max(rounds) > n as f64 * restart;
        } else {
            g.streak = 0;
        }
        g.speculating
            .then(|| others.iter().filter(|v| **v <= 0.0).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_speculates_while_its_savings_outweigh_the_outside_loss() {
        let b = Arc::new(Batch::default());
        let verdict =
            |own: Option<f64>, slot: Option<&Slot>, loss: f64| b.speculates(slot, own, loss, 0.0).is_some();
        assert!(!verdict(None, None, 0.0), "nothing posted: relay");
        let (mut s1, mut s2) = (None, None);
        b.post(&mut s1, 0.010);
        b.post(&mut s2, -0.004);
        assert!(verdict(None, None, 0.005));
        assert_eq!(b.speculates(s1.as_ref(), Some(0.01), 0.0, 0.0), Some(1), "one would relay");
        assert!(!verdict(None, None, 0.007));
        assert!(!verdict(Some(-0.012), s2.as_ref(), 0.0), "the caller's fresh value counts");
        b.post(&mut s2, -0.012);
        assert!(!verdict(None, None, 0.0), "a stream's new value replaces its old one");
        drop(s2);
        assert!(verdict(None, None, 0.0), "a dropped stream no longer counts");
    }
}
