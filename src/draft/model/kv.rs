//! Per-stream KV cache bookkeeping: which stream owns which cache slot and which tokens
//! the slot holds keys and values for.
//!
//! The engines keep the actual key/value memory, addressed by slot and position; this
//! table decides where a request starts. A request's context is compared with the slot's
//! tokens: the common prefix is kept (so a round that accepted only part of the drafts
//! rolls the cache back to the accepted length, and a speculative request for the next
//! round leaves the longest prefix for the real one), everything after it is recomputed.

use std::collections::HashMap;

use crate::draft::StreamId;

#[derive(Debug, Default)]
struct Slot {
    owner: Option<StreamId>,
    /// Tokens whose keys and values are in the slot, positions 0..len.
    tokens: Vec<u32>,
    last_used: u64,
    busy: bool,
    /// `finish` arrived while a request was running: free the slot when it ends.
    release_when_idle: bool,
}

#[derive(Debug)]
pub struct SlotTable {
    slots: Vec<Slot>,
    by_stream: HashMap<StreamId, usize>,
    clock: u64,
}

/// Where a request starts in its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    /// First position to compute (keys/values before it are reused).
    pub start: usize,
    /// Cached tokens dropped because the context diverged from them.
    pub rolled_back: usize,
}

impl SlotTable {
    pub fn new(n: usize) -> Self {
        Self {
            slots: (0..n).map(|_| Slot::default()).collect(),
            by_stream: HashMap::new(),
            clock: 0,
        }
    }

    /// The slot of `stream`, or a free one, or the least recently used idle one (whose
    /// cache is dropped). Marks it busy. `None` when every slot is busy.
    pub fn acquire(&mut self, stream: StreamId) -> Option<usize> {
        self.clock += 1;
        if let Some(&i) = self.by_stream.get(&stream) {
            if self.slots[i].busy {
                return None;
            }
            self.slots[i].busy = true;
            self.slots[i].release_when_idle = false;
            self.slots[i].last_used = self.clock;
            return Some(i);
        }
        let i = match self.slots.iter().position(|s| s.owner.is_none()) {
            Some(i) => i,
            None => {
                let (i, _) = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !s.busy)
                    .min_by_key(|(_, s)| s.last_used)?;
                if let Some(old) = self.slots[i].owner.take() {
                    self.by_stream.remove(&old);
                }
                i
            }
        };
        let s = &mut self.slots[i];
        s.owner = Some(stream);
        s.tokens.clear();
        s.busy = true;
        s.release_when_idle = false;
        s.last_used = self.clock;
        self.by_stream.insert(stream, i);
        Some(i)
    }

    /// Keep the longest common prefix of the slot's tokens and `context`, but at most
    /// `context.len() - 1` tokens: the last context token is always fed again so that
    /// the step yields the distribution after it.
    pub fn prepare(&mut self, slot: usize, context: &[u32]) -> Prepared {
        let s = &mut self.slots[slot];
        let common = s
            .tokens
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len().saturating_sub(1));
        let rolled_back = s.tokens.len() - common;
        s.tokens.truncate(common);
        Prepared {
            start: common,
            rolled_back,
        }
    }

    /// Number of tokens cached in `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.slots[slot].tokens.len()
    }

    /// Keys and values for `tokens` were written after the slot's cached tokens.
    pub fn commit(&mut self, slot: usize, tokens: &[u32]) {
        self.slots[slot].tokens.extend_from_slice(tokens);
    }

    /// Forget the slot's contents (after a failed step its memory is not trusted).
    pub fn reset(&mut self, slot: usize) {
        self.slots[slot].tokens.clear();
    }

    /// The request using `slot` ended.
    pub fn release(&mut self, slot: usize) {
        self.clock += 1;
        let s = &mut self.slots[slot];
        s.busy = false;
        s.last_used = self.clock;
        if s.release_when_idle {
            self.free(slot);
        }
    }

    /// The stream ended: free its slot now, or when its running request ends.
    pub fn finish(&mut self, stream: StreamId) {
        if let Some(&i) = self.by_stream.get(&stream) {
            if self.slots[i].busy {
                self.slots[i].release_when_idle = true;
            } else {
                self.free(i);
            }
        }
    }

    fn free(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if let Some(owner) = s.owner.take() {
            self.by_stream.remove(&owner);
        }
        s.tokens.clear();
        s.release_when_idle = false;
    }

    pub fn streams(&self) -> usize {
        self.by_stream.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rollback_and_refeed_last() {
        let mut t = SlotTable::new(2);
        let s = t.acquire(7).unwrap();
        assert_eq!(t.prepare(s, &[1, 2, 3]).start, 0);
        t.commit(s, &[1, 2, 3, 9, 9]);
        // Accepted one draft then diverged: keep [1,2,3,9], drop the last 9.
        let p = t.prepare(s, &[1, 2, 3, 9, 4]);
        assert_eq!(
            p,
            Prepared {
                start: 4,
                rolled_back: 1
            }
        );
        // Everything cached: the last token is fed again.
        t.commit(s, &[4]);
        let p = t.prepare(s, &[1, 2, 3, 9, 4]);
        assert_eq!(
            p,
            Prepared {
                start: 4,
                rolled_back: 1
            }
        );
        assert_eq!(t.len(s), 4);
    }

    #[test]
    fn busy_slots_are_not_evicted_and_lru_is() {
        let mut t = SlotTable::new(2);
        let a = t.acquire(1).unwrap();
        let b = t.acquire(2).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.acquire(3), None);
        assert_eq!(t.acquire(1), None, "a stream's slot is busy until released");
        t.commit(a, &[5, 5]);
        t.release(a);
        t.release(b);
        // Stream 1 was released first, so its slot is the least recently used.
        let c = t.acquire(3).unwrap();
        assert_eq!(c, a);
        assert_eq!(t.len(c), 0);
        let again = t.acquire(1).unwrap();
        assert_eq!(again, b, "stream 1 lost its slot and gets the other one");
    }

    #[test]
    fn finish_while_busy_frees_on_release() {
        let mut t = SlotTable::new(1);
        let a = t.acquire(1).unwrap();
        t.commit(a, &[1]);
        t.finish(1);
        assert_eq!(t.streams(), 1);
        t.release(a);
        assert_eq!(t.streams(), 0);
        assert_eq!(t.len(a), 0);
    }
}
