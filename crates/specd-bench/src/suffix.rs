//! Benchmark of the `suffix` drafter: time per proposal and memory, for several context
//! lengths, with an empty and a full global store, single- and multi-threaded. The text is
//! synthetic: documents stitched from a shared pool of phrases (so outputs repeat both
//! their own prompt and other streams' outputs) with random tokens in between.

use std::sync::Arc;
use std::time::Instant;

use specd::draft::suffix::{SuffixConfig, SuffixDrafter};
use specd::draft::Drafter;

#[derive(Debug, Clone, clap::Args)]
pub struct SuffixBenchArgs {
    /// Context lengths (prompt + output) to measure.
    #[arg(long, value_delimiter = ',', default_value = "1024,8192,32768")]
    pub contexts: Vec<usize>,
    /// Tokens put in the global store before measuring (the default cap is 1 Mi tokens).
    #[arg(long, default_value_t = 1 << 20)]
    pub global_tokens: usize,
    /// Streams measured per configuration.
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Proposals timed per stream.
    #[arg(long, default_value_t = 2000)]
    pub proposals: usize,
    /// Threads proposing at once in the concurrent run.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

struct Text {
    phrases: Vec<Vec<u32>>,
    rng: fastrand::Rng,
}

impl Text {
    fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let phrases = (0..400)
            .map(|_| (0..rng.usize(4..24)).map(|_| rng.u32(4..4096)).collect())
            .collect();
        Text { phrases, rng }
    }
    /// `n` tokens: mostly phrases (low indices more often), sometimes a random token.
    fn doc(&mut self, n: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(n + 32);
        while out.len() < n {
            if self.rng.f64() < 0.2 {
                out.push(self.rng.u32(4..4096));
            } else {
                let i = (self.rng.f64().powi(2) * self.phrases.len() as f64) as usize;
                out.extend(&self.phrases[i.min(self.phrases.len() - 1)]);
            }
        }
        out.truncate(n);
        out
    }
}

fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

struct Row {
    context: usize,
    global: usize,
    threads: usize,
    mean_us: f64,
    p99_us: f64,
    accepted: f64,
    stream_bytes: usize,
}

/// Time proposals at the end of `streams` contexts of length `ctx_len`.
fn measure(
    d: &Arc<SuffixDrafter>,
    ctx_len: usize,
    a: &SuffixBenchArgs,
    threads: usize,
    seed: u64,
) -> (Vec<f64>, f64, usize) {
    let per_thread = a.streams.div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let d = d.clone();
            let proposals = a.proposals;
            std::thread::spawn(move || {
                let mut text = Text::new(seed);
                let mut times = Vec::new();
                let (mut acc, mut n) = (0usize, 0usize);
                let mut bytes = 0;
                for s in 0..per_thread {
                    let id = 1_000_000 + (t * per_thread + s) as u64;
                    let full = text.doc(ctx_len + proposals);
                    let prompt = ctx_len / 2;
                    d.observe(id, &full[..ctx_len], prompt);
                    for i in 0..proposals {
                        let ctx = &full[..ctx_len + i];
                        let t0 = Instant::now();
                        let p = d.lookup(id, ctx, prompt, 8);
                        times.push(t0.elapsed().as_secs_f64() * 1e6);
                        let truth = &full[ctx_len + i..];
                        acc += p
                            .tokens
                            .iter()
                            .zip(truth)
                            .take_while(|(a, b)| a == b)
                            .count();
                        n += 1;
                        d.observe(id, &full[..ctx_len + i + 1], prompt);
                    }
                    bytes = d.memory().stream_bytes;
                    d.finish(id);
                }
                (times, acc, n, bytes)
            })
        })
        .collect();
    let mut times = Vec::new();
    let (mut acc, mut n, mut bytes) = (0, 0, 0);
    for h in handles {
        if let Ok((t, a, k, b)) = h.join() {
            times.extend(t);
            acc += a;
            n += k;
            bytes = bytes.max(b);
        }
    }
    (times, acc as f64 / n.max(1) as f64, bytes)
}

pub fn run(a: SuffixBenchArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut global_mem = (0, 0);
    for &global in &[0usize, a.global_tokens] {
        let d = Arc::new(SuffixDrafter::new(SuffixConfig {
            global_max_tokens: global.max(1),
            ..SuffixConfig::default()
        }));
        if global > 0 {
            let before = rss_bytes();
            let mut text = Text::new(99);
            let mut id = 0u64;
            let mut filled = 0;
            while filled < global {
                let out = text.doc(2048);
                d.observe(id, &out, 0);
                d.finish(id);
                filled += out.len();
                id += 1;
            }
            global_mem = (d.memory().global_bytes, rss_bytes().saturating_sub(before));
        }
        for &ctx in &a.contexts {
            for threads in [1, a.threads] {
                let (mut t, accepted, bytes) = measure(&d, ctx, &a, threads, 7);
                t.sort_by(f64::total_cmp);
                let mean = t.iter().sum::<f64>() / t.len().max(1) as f64;
                let p99 = t.get(t.len() * 99 / 100).copied().unwrap_or(0.0);
                rows.push(Row {
                    context: ctx,
                    global,
                    threads,
                    mean_us: mean,
                    p99_us: p99,
                    accepted,
                    // With several threads, that many streams are alive at once.
                    stream_bytes: bytes / threads,
                });
            }
        }
    }
    println!("\nsuffix drafter: time per proposal (max_k 8) and memory\n");
    println!("| context | global store tokens | threads | mean µs | p99 µs | accepted/proposal | bytes per stream |");
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {} |",
            r.context, r.global, r.threads, r.mean_us, r.p99_us, r.accepted, r.stream_bytes
        );
    }
    println!(
        "\nglobal store with {} tokens: {:.1} MiB by the drafter's own count, {:.1} MiB RSS growth",
        a.global_tokens,
        global_mem.0 as f64 / 1048576.0,
        global_mem.1 as f64 / 1048576.0
    );
    Ok(())
}
