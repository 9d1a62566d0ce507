//! The sim's engine: one thread running continuous-batching steps on the cost model's
//! clock. Requests join at step boundaries; a sequence first computes its uncached prompt
//! tokens (an extend), then decodes one token per step. Streamed sequences whose client
//! went away are dropped from the batch, as vLLM aborts them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::tokens::mix;
use super::{SimConfig, Tokens};

/// Where a job's tokens go.
pub enum Sink {
    /// All sequences' tokens at once, when every sequence is done.
    Batch(oneshot::Sender<Vec<Vec<u32>>>),
    /// One sequence's tokens as they are produced.
    Stream(mpsc::UnboundedSender<u32>),
}

pub struct Job {
    pub prompts: Vec<Vec<u32>>,
    pub max_tokens: u32,
    pub sink: Sink,
}

struct Seq {
    job: usize,
    index: usize,
    /// Prompt and tokens produced so far (the rule reads the whole context).
    ctx: Vec<u32>,
    /// Prompt tokens still to compute (0 once decoding).
    prefill: usize,
    produced: Vec<u32>,
    hash: u64,
}

struct Running {
    max_tokens: u32,
    sink: Option<Sink>,
    out: Vec<Vec<u32>>,
    left: usize,
}

/// Handle to the engine thread.
#[derive(Clone)]
pub struct Engine {
    tx: std_mpsc::Sender<(Instant, Job)>,
    running: Arc<AtomicUsize>,
    api: Duration,
}

impl Engine {
    pub fn start(cfg: SimConfig, tokens: Tokens) -> Engine {
        let (tx, rx) = std_mpsc::channel();
        let running = Arc::new(AtomicUsize::new(0));
        let api = Duration::from_secs_f64(cfg.api_ms.max(0.0) / 1000.0);
        let r = running.clone();
        std::thread::Builder::new()
            .name("specd-sim-engine".into())
            .spawn(move || run(cfg, tokens, rx, r))
            .ok();
        Engine { tx, running, api }
    }

    /// Queue a job; it joins the batch after the API delay.
    pub fn submit(&self, job: Job) -> bool {
        self.tx.send((Instant::now() + self.api, job)).is_ok()
    }

    /// Sequences in the batch (vLLM's `num_requests_running`, counted per sequence).
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
}

fn block_hash(h: u64, t: u32) -> u64 {
    mix(h ^ u64::from(t).wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// Prompt tokens past the cached full blocks; caches the prompt's full blocks.
fn uncached(prompt: &[u32], block: usize, cache: &mut HashSet<u64>) -> (usize, u64) {
    let mut h = 0u64;
    let mut cached = 0;
    let mut hit = true;
    for (i, &t) in prompt.iter().enumerate() {
        h = block_hash(h, t);
        if (i + 1) % block == 0 {
            if hit && cache.contains(&h) {
                cached = i + 1;
            } else {
                hit = false;
                cache.insert(h);
            }
        }
    }
    (prompt.len() - cached, h)
}

fn run(
    cfg: SimConfig,
    tokens: Tokens,
    rx: std_mpsc::Receiver<(Instant, Job)>,
    running: Arc<AtomicUsize>,
) {
    let block = cfg.block.max(1);
    let mut cache: HashSet<u64> = HashSet::new();
    let mut waiting: Vec<(Instant, Job)> = Vec::new();
    let mut jobs: HashMap<usize, Running> = HashMap::new();
    let mut next_job = 0usize;
    let mut seqs: Vec<Seq> = Vec::new();
    loop {
        // Collect arrivals; block while there is nothing to do.
        if seqs.is_empty() && waiting.is_empty() {
            match rx.recv() {
                Ok(j) => waiting.push(j),
                Err(_) => return,
            }
        }
        while let Ok(j) = rx.try_recv() {
            waiting.push(j);
        }
        if seqs.is_empty() {
            if let Some(first) = waiting.iter().map(|(t, _)| *t).min() {
                let now = Instant::now();
                if first > now {
                    std::thread::sleep(first - now);
                }
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < waiting.len() {
            if waiting[i].0 > now {
                i += 1;
                continue;
            }
            let (_, job) = waiting.swap_remove(i);
            let id = next_job;
            next_job += 1;
            let count = job.prompts.len();
            for (index, p) in job.prompts.into_iter().enumerate() {
                let (new, hash) = uncached(&p, block, &mut cache);
                seqs.push(Seq {
                    job: id,
                    index,
                    ctx: p,
                    prefill: new.max(1),
                    produced: Vec::new(),
                    hash,
                });
            }
            jobs.insert(
                id,
                Running {
                    max_tokens: job.max_tokens.max(1),
                    out: vec![Vec::new(); count],
                    left: count,
                    sink: Some(job.sink),
                },
            );
        }
        if cache.len() > 4_000_000 {
            cache.clear();
        }
        running.store(seqs.len(), Ordering::Relaxed);
        if seqs.is_empty() {
            continue;
        }
        // One step on the model's clock.
        let decoding = seqs.iter().filter(|s| s.prefill == 0).count();
        let prefill: usize = seqs.iter().map(|s| s.prefill).sum();
        let mut ms = cfg.base_ms
            + cfg.per_seq_ms * decoding as f64
            + cfg.per_prefill_token_ms * prefill as f64;
        if prefill > 0 {
            ms += cfg.extend_ms;
        }
        std::thread::sleep(Duration::from_secs_f64(ms.max(0.0) / 1000.0));
        let mut finished = Vec::new();
        for (si, s) in seqs.iter_mut().enumerate() {
            let t = tokens.next(&s.ctx);
            s.ctx.push(t);
            s.prefill = 0;
            s.hash = block_hash(s.hash, t);
            if s.ctx.len() % block == 0 {
                cache.insert(s.hash);
            }
            s.produced.push(t);
            let Some(job) = jobs.get_mut(&s.job) else {
                finished.push(si);
                continue;
            };
            let mut gone = false;
            if let Some(Sink::Stream(tx)) = &job.sink {
                gone = tx.send(t).is_err();
            }
            if gone || s.produced.len() >= job.max_tokens as usize {
                finished.push(si);
            }
        }
        for si in finished.into_iter().rev() {
            let s = seqs.swap_remove(si);
            let Some(job) = jobs.get_mut(&s.job) else {
                continue;
            };
            job.out[s.index] = s.produced;
            job.left -= 1;
            if job.left == 0 {
                if let Some(Sink::Batch(tx)) = job.sink.take() {
                    let _ = tx.send(std::mem::take(&mut job.out));
                }
                jobs.remove(&s.job);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_cache_counts_full_blocks_only() {
        let mut c = HashSet::new();
        let p: Vec<u32> = (0..40).collect();
        assert_eq!(uncached(&p, 16, &mut c).0, 40);
        assert_eq!(uncached(&p, 16, &mut c).0, 8);
        let mut q = p.clone();
        q.extend([7, 7, 7]);
        assert_eq!(uncached(&q, 16, &mut c).0, 11);
        q[3] = 99;
        assert_eq!(uncached(&q, 16, &mut c).0, 43);
    }

    #[tokio::test]
    async fn batch_and_stream_jobs_produce_the_continuation() {
        let cfg = SimConfig {
            base_ms: 1.0,
            extend_ms: 1.0,
            api_ms: 0.0,
            ..SimConfig::default()
        };
        let e = Engine::start(cfg, Tokens::Hashed { vocab: 4096 });
        let p: Vec<u32> = vec![9, 8, 7, 6];
        let (tx, rx) = oneshot::channel();
        assert!(e.submit(Job {
            prompts: vec![p.clone(), vec![1, 2]],
            max_tokens: 5,
            sink: Sink::Batch(tx),
        }));
        let out = rx.await.expect("batch answer");
        assert_eq!(out[0], crate::continuation(&p, 5, 4096));
        assert_eq!(out[1], crate::continuation(&[1, 2], 5, 4096));
        let (tx, mut rx) = mpsc::unbounded_channel();
        assert!(e.submit(Job {
            prompts: vec![p.clone()],
            max_tokens: 3,
            sink: Sink::Stream(tx),
        }));
        let mut got = Vec::new();
        while let Some(t) = rx.recv().await {
            got.push(t);
        }
        assert_eq!(got, crate::continuation(&p, 3, 4096));
    }
}
