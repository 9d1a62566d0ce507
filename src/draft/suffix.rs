//! `suffix`: SuffixDecoding-style drafting over two corpora — the stream's own
//! prompt+output, and a global store of recent outputs of all streams (bounded, evicted
//! first in, first out).
//!
//! Both are indexed by token bigram. A lookup takes the most recent occurrences of the
//! context's last bigram, extends each match backwards (up to `max_depth` tokens) and
//! keeps the occurrences with the longest match — the deepest node of a suffix tree over
//! the corpus. It then walks forward through what followed those occurrences, taking the
//! most frequent next token at each step. A token's confidence is its empirical frequency
//! among the surviving occurrences, discounted for short matches. The chain stops when
//! the cumulative confidence drops below `min_prob`, when it gets longer than
//! `spec_factor` × match length, or at `max_k`. The better of the two corpora's chains
//! (by expected accepted length) is proposed.
//!
//! Concurrency: each stream's index sits behind its own mutex (only that stream touches
//! it); the global store is a sharded `DashMap`, read by every lookup and written only
//! when a stream finishes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use futures_util::future::{ready, BoxFuture};
use futures_util::FutureExt;

use super::{DraftError, DraftRequest, Drafter, DrafterKind, Proposal, StreamId};

/// Tunables (flags `--suffix-*`).
#[derive(Debug, Clone)]
pub struct SuffixConfig {
    /// Longest suffix matched, in tokens.
    pub max_depth: usize,
    /// Stop the chain when the cumulative confidence falls below this.
    pub min_prob: f32,
    /// Chain length is at most this factor times the match length.
    pub spec_factor: f32,
    /// Occurrences of a bigram examined per lookup (most recent first).
    pub max_occurrences: usize,
    /// Tokens kept in the global store of finished outputs.
    pub global_max_tokens: usize,
}

impl Default for SuffixConfig {
    fn default() -> Self {
        SuffixConfig {
            max_depth: 32,
            min_prob: 0.1,
            spec_factor: 1.0,
            max_occurrences: 256,
            global_max_tokens: 1 << 20,
        }
    }
}

fn bigram(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

/// Occurrences kept per bigram in the global store (the most recent ones).
const GLOBAL_PER_KEY: usize = 64;
/// Outputs shorter than this are not worth storing globally.
const GLOBAL_MIN_LEN: usize = 4;

/// One stream's corpus: its full context and a bigram → start positions index.
#[derive(Default)]
struct Local {
    tokens: Vec<u32>,
    prompt_len: usize,
    index: HashMap<u64, Vec<u32>>,
}

impl Local {
    /// Bring the copy in line with `ctx` (append the new tail, or rebuild on divergence).
    fn sync(&mut self, ctx: &[u32], prompt_len: usize) {
        let n = self.tokens.len();
        let tail = n.saturating_sub(16);
        let extends = ctx.len() >= n && ctx[tail..n] == self.tokens[tail..];
        if !extends {
            self.tokens.clear();
            self.index.clear();
        }
        self.prompt_len = prompt_len;
        for &t in &ctx[self.tokens.len()..] {
            self.push(t);
        }
    }

    fn push(&mut self, t: u32) {
        if let Some(&prev) = self.tokens.last() {
            let pos = (self.tokens.len() - 1) as u32;
            self.index.entry(bigram(prev, t)).or_default().push(pos);
        }
        self.tokens.push(t);
    }

    fn memory_bytes(&self) -> usize {
        let positions: usize = self.index.values().map(|v| v.capacity() * 4).sum();
        self.tokens.capacity() * 4 + positions + self.index.capacity() * (8 + 24 + 8)
    }
}

/// A candidate occurrence: the corpus sequence and where its continuation starts.
struct Cand<'a> {
    seq: &'a [u32],
    next: usize,
}

/// Length of the common suffix of `seq[..end]` and `ctx`, capped at `max`.
fn match_len(seq: &[u32], end: usize, ctx: &[u32], max: usize) -> usize {
    let mut m = 0;
    while m < max && m < end && m < ctx.len() && seq[end - 1 - m] == ctx[ctx.len() - 1 - m] {
        m += 1;
    }
    m
}

/// Walk forward from the deepest-match candidates; see the module comment.
fn walk(mut cands: Vec<Cand<'_>>, depth: usize, max_k: usize, cfg: &SuffixConfig) -> Proposal {
    let limit = max_k.min(((cfg.spec_factor * depth as f32).floor() as usize).max(1));
    let mut out = Proposal::default();
    let mut cum = 1.0f32;
    let mut counts: Vec<(u32, u32)> = Vec::new();
    while out.tokens.len() < limit {
        counts.clear();
        let mut total = 0u32;
        // Candidates are ordered most recent first, so ties go to the most recent.
        for c in &cands {
            if let Some(&t) = c.seq.get(c.next) {
                total += 1;
                match counts.iter_mut().find(|(tok, _)| *tok == t) {
                    Some(e) => e.1 += 1,
                    None => counts.push((t, 1)),
                }
            }
        }
        let Some(cnt) = counts.iter().map(|c| c.1).max() else {
            break;
        };
        // `counts` is in order of first appearance, i.e. most recent first.
        let Some(&(best, _)) = counts.iter().find(|c| c.1 == cnt) else {
            break;
        };
        let ell = (depth + out.tokens.len()) as f32;
        let conf = cnt as f32 / total as f32 * (ell / (ell + 1.0));
        if cum * conf < cfg.min_prob {
            break;
        }
        cum *= conf;
        out.tokens.push(best);
        out.confidence.push(conf);
        cands.retain(|c| c.seq.get(c.next) == Some(&best));
        for c in &mut cands {
            c.next += 1;
        }
    }
    out
}

/// Keep the candidates with the longest match; returns them with that length.
fn deepest<'a>(
    found: impl Iterator<Item = (&'a [u32], usize)>,
    ctx: &[u32],
    cfg: &SuffixConfig,
) -> (Vec<Cand<'a>>, usize) {
    let mut best = 0;
    let mut cands = Vec::new();
    for (seq, end) in found {
        if end >= seq.len() {
            continue; // nothing follows this occurrence
        }
        let m = match_len(seq, end, ctx, cfg.max_depth);
        if m > best {
            best = m;
            cands.clear();
        }
        if m == best && m >= 2 {
            cands.push(Cand { seq, next: end });
        }
    }
    (cands, best)
}

/// Expected accepted length of a chain under its own confidences.
fn score(p: &Proposal) -> f32 {
    let mut cum = 1.0;
    p.confidence
        .iter()
        .map(|c| {
            cum *= c;
            cum
        })
        .sum()
}

/// Recent outputs of all streams, FIFO-evicted beyond `max_tokens`.
#[derive(Default)]
struct Global {
    seqs: DashMap<u64, Arc<[u32]>>,
    index: DashMap<u64, VecDeque<(u64, u32)>>,
    /// (id, length) in insertion order; touched only when a stream finishes.
    fifo: Mutex<(VecDeque<(u64, usize)>, usize)>,
    next_id: AtomicU64,
}

impl Global {
    fn insert(&self, out: &[u32], max_tokens: usize) {
        if out.len() < GLOBAL_MIN_LEN || max_tokens == 0 {
            return;
        }
        let out = if out.len() > max_tokens {
            &out[out.len() - max_tokens..]
        } else {
            out
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.seqs.insert(id, Arc::from(out));
        for (p, w) in out.windows(2).enumerate() {
            let mut e = self.index.entry(bigram(w[0], w[1])).or_default();
            e.push_back((id, p as u32));
            if e.len() > GLOBAL_PER_KEY {
                e.pop_front();
            }
        }
        let evict: Vec<u64> = {
            let Ok(mut g) = self.fifo.lock() else { return };
            let (q, total) = &mut *g;
            q.push_back((id, out.len()));
            *total += out.len();
            let mut ev = Vec::new();
            while *total > max_tokens {
                let Some((old, len)) = q.pop_front() else {
                    break;
                };
                *total -= len;
                ev.push(old);
            }
            ev
        };
        for old in evict {
            let Some((_, seq)) = self.seqs.remove(&old) else {
                continue;
            };
            for w in seq.windows(2) {
                let key = bigram(w[0], w[1]);
                let empty = match self.index.get_mut(&key) {
                    Some(mut e) => {
                        e.retain(|(i, _)| *i != old);
                        e.is_empty()
                    }
                    None => false,
                };
                if empty {
                    self.index.remove_if(&key, |_, e| e.is_empty());
                }
            }
        }
    }

    fn lookup(&self, ctx: &[u32], max_k: usize, cfg: &SuffixConfig) -> Proposal {
        let n = ctx.len();
        if n < 2 {
            return Proposal::default();
        }
        let entries: Vec<(u64, u32)> = match self.index.get(&bigram(ctx[n - 2], ctx[n - 1])) {
            Some(e) => e.iter().rev().copied().collect(),
            None => return Proposal::default(),
        };
        let seqs: Vec<(Arc<[u32]>, usize)> = entries
            .iter()
            .filter_map(|(id, p)| Some((self.seqs.get(id)?.clone(), *p as usize + 2)))
            .collect();
        let (cands, depth) = deepest(seqs.iter().map(|(s, e)| (&s[..], *e)), ctx, cfg);
        walk(cands, depth, max_k, cfg)
    }

    fn memory_bytes(&self) -> usize {
        let tokens: usize = self.seqs.iter().map(|s| s.len() * 4 + 48).sum();
        let entries: usize = self.index.iter().map(|e| e.capacity() * 16 + 48).sum();
        tokens + entries
    }
}

pub struct SuffixDrafter {
    cfg: SuffixConfig,
    streams: DashMap<StreamId, Arc<Mutex<Local>>>,
    global: Global,
}

impl SuffixDrafter {
    pub fn new(cfg: SuffixConfig) -> Self {
        SuffixDrafter {
            cfg,
            streams: DashMap::new(),
            global: Global::default(),
        }
    }

    fn local(&self, stream: StreamId) -> Arc<Mutex<Local>> {
        self.streams.entry(stream).or_default().clone()
    }

    /// The proposal for a stream's context; synchronous, so it is tested directly.
    pub fn lookup(
        &self,
        stream: StreamId,
        ctx: &[u32],
        prompt_len: usize,
        max_k: usize,
    ) -> Proposal {
        let n = ctx.len();
        if max_k == 0 || n < 2 {
            return Proposal::default();
        }
        let local = self.local(stream);
        let own = match local.lock() {
            Ok(mut l) => {
                l.sync(ctx, prompt_len);
                let toks = &l.tokens;
                let found = l
                    .index
                    .get(&bigram(ctx[n - 2], ctx[n - 1]))
                    .into_iter()
                    .flat_map(|v| v.iter().rev())
                    .map(|&p| p as usize + 2)
                    .filter(|&end| end < n)
                    .take(self.cfg.max_occurrences)
                    .map(|end| (&toks[..], end));
                let (cands, depth) = deepest(found, ctx, &self.cfg);
                walk(cands, depth, max_k, &self.cfg)
            }
            Err(_) => Proposal::default(),
        };
        let global = self.global.lookup(ctx, max_k, &self.cfg);
        if score(&global) > score(&own) {
            global
        } else {
            own
        }
    }

    /// What the drafter holds: streams with state and estimates of the bytes they and the
    /// global store use.
    pub fn memory(&self) -> MemoryUse {
        let stream_bytes = self
            .streams
            .iter()
            .filter_map(|e| e.value().lock().ok().map(|l| l.memory_bytes()))
            .sum();
        MemoryUse {
            streams: self.streams.len(),
            stream_bytes,
            global_bytes: self.global.memory_bytes(),
            global_tokens: self.global.seqs.iter().map(|s| s.len()).sum(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct MemoryUse {
    pub streams: usize,
    pub stream_bytes: usize,
    pub global_bytes: usize,
    pub global_tokens: usize,
}

impl Drafter for SuffixDrafter {
    fn kind(&self) -> DrafterKind {
        DrafterKind::Suffix
    }
    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>> {
        let p = self.lookup(req.stream, &req.context, req.prompt_len, req.max_k);
        ready(Ok(p)).boxed()
    }
    fn observe(&self, stream: StreamId, context: &[u32], prompt_len: usize) {
        if let Ok(mut l) = self.local(stream).lock() {
            l.sync(context, prompt_len);
        }
    }
    fn finish(&self, stream: StreamId) {
        let Some((_, local)) = self.streams.remove(&stream) else {
            return;
        };
        let Ok(l) = local.lock() else { return };
        let out = &l.tokens[l.prompt_len.min(l.tokens.len())..];
        self.global.insert(out, self.cfg.global_max_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> SuffixDrafter {
        SuffixDrafter::new(SuffixConfig::default())
    }

    #[test]
    fn proposes_the_continuation_of_the_longest_match() {
        let s = d();
        // "1 2 3 4 5 6 | 9 9 | 1 2 3" → "4 5 6"; the chain is capped by the match length.
        let ctx = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3];
        let p = s.lookup(1, &ctx, 0, 8);
        assert_eq!(p.tokens, vec![4, 5, 6]);
        assert_eq!(p.confidence.len(), 3);
        assert!(p.confidence.iter().all(|&c| c > 0.0 && c <= 1.0));
        assert_eq!(s.lookup(1, &ctx, 0, 2).tokens, vec![4, 5]);
        assert!(s.lookup(1, &ctx, 0, 0).tokens.is_empty());
        assert!(s.lookup(2, &[1], 0, 4).tokens.is_empty());
    }

    #[test]
    fn deeper_matches_win_and_frequency_sets_confidence() {
        let s = d();
        // "7 1 2" is followed by 8 once; "1 2" is followed by 5 twice elsewhere. The
        // context ends in "7 1 2", so the deeper match (→ 8) wins.
        let ctx = [1, 2, 5, 0, 1, 2, 5, 0, 7, 1, 2, 8, 0, 7, 1, 2];
        assert_eq!(s.lookup(1, &ctx, 0, 1).tokens, vec![8]);
        // Ambiguous continuation: 3 of 4 equally deep occurrences go on with 5.
        let ctx = [1, 2, 5, 1, 2, 5, 1, 2, 5, 1, 2, 6, 9, 1, 2];
        let p = s.lookup(2, &ctx, 0, 1);
        assert_eq!(p.tokens, vec![5]);
        assert!((p.confidence[0] - 0.75 * 2.0 / 3.0).abs() < 1e-6, "{p:?}");
    }

    #[test]
    fn min_probability_cuts_the_chain() {
        let cfg = SuffixConfig {
            min_prob: 0.6,
            ..SuffixConfig::default()
        };
        let s = SuffixDrafter::new(cfg);
        // After "1 2" comes 3 or 4 equally often: no token reaches 0.6.
        let ctx = [5, 1, 2, 3, 6, 1, 2, 4, 7, 1, 2];
        assert!(s.lookup(1, &ctx, 0, 4).tokens.is_empty());
        // Without the cut-off the most recent occurrence wins the tie.
        assert_eq!(d().lookup(1, &ctx, 0, 1).tokens, vec![4]);
    }

    #[test]
    fn global_store_serves_other_streams_and_evicts_fifo() {
        let cfg = SuffixConfig {
            global_max_tokens: 40,
            ..SuffixConfig::default()
        };
        let s = SuffixDrafter::new(cfg);
        let prompt = [100, 101];
        let out: Vec<u32> = (10..30).collect();
        let mut ctx = prompt.to_vec();
        ctx.extend(&out);
        s.observe(1, &ctx, prompt.len());
        s.finish(1);
        // Another stream whose context ends like the middle of that output.
        let p = s.lookup(2, &[200, 14, 15, 16], 1, 3);
        assert_eq!(p.tokens, vec![17, 18, 19]);
        // Two more outputs push the first one out (cap 40 tokens).
        for (id, base) in [(3, 40u32), (4, 70)] {
            let o: Vec<u32> = (base..base + 20).collect();
            s.observe(id, &o, 0);
            s.finish(id);
        }
        assert!(s.lookup(5, &[200, 14, 15, 16], 1, 3).tokens.is_empty());
        assert_eq!(s.lookup(6, &[200, 74, 75], 1, 2).tokens, vec![76, 77]);
        assert!(s.global.index.len() <= 40, "evicted entries are removed");
        assert!(s.global.seqs.len() == 2);
        // Streams 2, 5 and 6 only looked up; the finished ones dropped their state.
        let m = s.memory();
        assert_eq!(m.streams, 3);
        assert_eq!(m.global_tokens, 40);
    }

    #[test]
    fn observe_follows_the_context_and_rebuilds_on_divergence() {
        let s = d();
        let mut ctx = vec![5, 6, 7, 8, 5, 6];
        s.observe(1, &ctx, 2);
        ctx.push(7);
        s.observe(1, &ctx, 2);
        assert_eq!(s.lookup(1, &ctx, 2, 1).tokens, vec![8]);
        let other = vec![1, 2, 3, 1, 2];
        assert_eq!(s.lookup(1, &other, 0, 1).tokens, vec![3]);
    }

    #[test]
    fn concurrent_streams_update_safely() {
        let s = Arc::new(d());
        let handles: Vec<_> = (0..8u64)
            .map(|id| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut ctx: Vec<u32> = vec![1, 2, 3];
                    for i in 0..400u32 {
                        ctx.push(i % 17 + (id as u32 % 3));
                        s.observe(id, &ctx, 3);
                        let _ = s.lookup(id, &ctx, 3, 4);
                    }
                    s.finish(id);
                })
            })
            .collect();
        for h in handles {
            h.join().expect("no panic");
        }
        let p = s.lookup(99, &[0, 1, 2, 3, 4, 5], 0, 4);
        assert!(!p.tokens.is_empty(), "the global store learned the pattern");
    }
}
