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
    /// verify step costs the sequences that cannot speculate.
    /// When it does, also how many other streams would not gain from a round even then
    /// (they relay beside the batch's verify steps, and pay for them).
    pub(super) fn speculates(
        &self,
        slot: Option<&Slot>,
        own: Option<f64>,
        outside_loss: f64,
    ) -> Option<usize> {
        let g = self.inner.lock().ok()?;
        let mine = slot.map(|s| s.id);
        let rest = || g.gains.iter().filter(|(id, _)| Some(*id) != mine).map(|e| e.1);
        let n = rest().count() + usize::from(own.is_some());
        let sum = rest().sum::<f64>() + own.unwrap_or(0.0);
        (n > 0 && sum > outside_loss).then(|| rest().filter(|v| *v <= 0.0).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_speculates_while_its_savings_outweigh_the_outside_loss() {
        let b = Arc::new(Batch::default());
        let verdict =
            |own: Option<f64>, slot: Option<&Slot>, loss: f64| b.speculates(slot, own, loss).is_some();
        assert!(!verdict(None, None, 0.0), "nothing posted: relay");
        let (mut s1, mut s2) = (None, None);
        b.post(&mut s1, 0.010);
        b.post(&mut s2, -0.004);
        assert!(verdict(None, None, 0.005));
        assert_eq!(b.speculates(s1.as_ref(), Some(0.01), 0.0), Some(1), "one would relay");
        assert!(!verdict(None, None, 0.007));
        assert!(!verdict(Some(-0.012), s2.as_ref(), 0.0), "the caller's fresh value counts");
        b.post(&mut s2, -0.012);
        assert!(!verdict(None, None, 0.0), "a stream's new value replaces its old one");
        drop(s2);
        assert!(verdict(None, None, 0.0), "a dropped stream no longer counts");
    }
}
