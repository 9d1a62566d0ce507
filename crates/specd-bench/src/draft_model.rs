//! Draft-model checks and speed measurements, shared by the tests and the `draft-bench`
//! command: comparison of the forward with reference logits and greedy continuations
//! (written by `scripts/draft_model_reference.py`), and per-token latency at several
//! batch sizes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device};
use futures_util::future::join_all;

use specd::draft::model::{DraftDevice, DraftDtype, DrafterOptions, ModelDrafter};
use specd::draft::{DraftRequest, Drafter};

/// One reference context: logits after its last token and the greedy continuation.
#[derive(Debug, Clone)]
pub struct RefCase {
    pub context: Vec<u32>,
    pub logits: Vec<f32>,
    pub greedy: Vec<u32>,
    /// Top-1 minus top-2 logit at each greedy step: a tiny gap is a near tie.
    pub gaps: Vec<f32>,
}

pub fn load_reference(path: &Path) -> Result<Vec<RefCase>, String> {
    let t = candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let ints = |name: &str| -> Result<Vec<u32>, String> {
        let x = t
            .get(name)
            .ok_or_else(|| format!("reference lacks {name}"))?;
        let v: Vec<i64> = x
            .to_dtype(DType::I64)
            .and_then(|x| x.flatten_all())
            .and_then(|x| x.to_vec1())
            .map_err(|e| e.to_string())?;
        Ok(v.into_iter().map(|i| i as u32).collect())
    };
    let floats = |name: &str| -> Result<Vec<f32>, String> {
        let x = t
            .get(name)
            .ok_or_else(|| format!("reference lacks {name}"))?;
        x.to_dtype(DType::F32)
            .and_then(|x| x.flatten_all())
            .and_then(|x| x.to_vec1())
            .map_err(|e| e.to_string())
    };
    let mut cases = Vec::new();
    for i in 0.. {
        if !t.contains_key(&format!("case{i}.context")) {
            break;
        }
        cases.push(RefCase {
            context: ints(&format!("case{i}.context"))?,
            logits: floats(&format!("case{i}.logits"))?,
            greedy: ints(&format!("case{i}.greedy"))?,
            gaps: floats(&format!("case{i}.gaps"))?,
        });
    }
    if cases.is_empty() {
        return Err(format!("{}: no cases", path.display()));
    }
    Ok(cases)
}

#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    /// Largest allowed ‖logits − ref‖ / ‖ref‖.
    pub rel_logits: f32,
    /// Greedy steps whose reference top-2 gap is below this may differ (near ties); the
    /// comparison of that continuation stops there.
    pub tie_gap: f32,
}

impl Tolerance {
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F32 => Self {
                rel_logits: 1e-4,
                tie_gap: 1e-3,
            },
            _ => Self {
                rel_logits: 5e-2,
                tie_gap: 0.5,
            },
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct CheckReport {
    pub logit_checks: usize,
    pub max_rel_logits: f32,
    pub greedy_tokens_compared: usize,
    pub greedy_tokens_matched: usize,
    pub near_ties: usize,
    pub failures: Vec<String>,
}

impl CheckReport {
    fn logits(&mut self, what: &str, got: &[f32], want: &[f32], tol: Tolerance) {
        self.logit_checks += 1;
        if got.len() != want.len() {
            self.failures.push(format!(
                "{what}: {} logits, reference has {}",
                got.len(),
                want.len()
            ));
            return;
        }
        let (mut num, mut den) = (0f64, 0f64);
        for (a, b) in got.iter().zip(want) {
            num += ((a - b) as f64).powi(2);
            den += (*b as f64).powi(2);
        }
        let rel = (num / den.max(1e-30)).sqrt() as f32;
        if rel.is_nan() || rel > self.max_rel_logits {
            self.max_rel_logits = if rel.is_nan() { f32::INFINITY } else { rel };
        }
        if rel.is_nan() || rel > tol.rel_logits {
            self.failures.push(format!(
                "{what}: relative logit error {rel:e} > {:e}",
                tol.rel_logits
            ));
        }
    }

    fn greedy(&mut self, what: &str, got: &[u32], case: &RefCase, tol: Tolerance) {
        for (p, &want) in case.greedy.iter().enumerate() {
            let Some(&g) = got.get(p) else {
                self.failures
                    .push(format!("{what}: proposal stopped after {p} tokens"));
                return;
            };
            self.greedy_tokens_compared += 1;
            if g == want {
                self.greedy_tokens_matched += 1;
                continue;
            }
            if case.gaps.get(p).is_some_and(|&gap| gap < tol.tie_gap) {
                self.near_ties += 1;
            } else {
                self.failures
                    .push(format!("{what}: token {p} is {g}, reference {want}"));
            }
            return;
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Compare the drafter with the reference: all cases at once on separate streams (one
/// mixed batch; each case on `copies` streams, so that a batch as large as the timed ones
/// takes the same kernels), then one after another on a single stream, so each case
/// starts from a cache holding a different context (rollback), then the first case again.
pub async fn check_reference(
    d: &ModelDrafter,
    cases: &[RefCase],
    tol: Tolerance,
    copies: usize,
) -> CheckReport {
    let mut r = CheckReport::default();
    let batch: Vec<(u64, &RefCase)> = (0..copies.max(1) * cases.len())
        .map(|n| (1000 + n as u64, &cases[n % cases.len()]))
        .collect();
    let props = join_all(batch.iter().map(|&(stream, c)| {
        d.propose(DraftRequest {
            stream,
            context: c.context.clone().into(),
            prompt_len: c.context.len(),
            max_k: c.greedy.len(),
        })
    }))
    .await;
    for (n, (p, (_, c))) in props.into_iter().zip(&batch).enumerate() {
        let what = format!("batched case {} (stream {n})", n % cases.len());
        match p {
            Ok(p) => r.greedy(&what, &p.tokens, c, tol),
            Err(e) => r.failures.push(format!("{what}: {e}")),
        }
    }
    let logits = join_all(
        batch
            .iter()
            .map(|&(stream, c)| d.logits(stream, c.context.clone())),
    )
    .await;
    for (n, (l, (_, c))) in logits.into_iter().zip(&batch).enumerate() {
        let what = format!("batched case {} (stream {n})", n % cases.len());
        match l {
            Ok(l) => r.logits(&what, &l, &c.logits, tol),
            Err(e) => r.failures.push(format!("{what}: {e}")),
        }
    }
    for &(stream, _) in &batch {
        d.finish(stream);
    }
    let order: Vec<usize> = (0..cases.len()).chain(std::iter::once(0)).collect();
    for (n, &i) in order.iter().enumerate() {
        let c = &cases[i];
        let what = format!("sequential step {n} (case {i})");
        let req = DraftRequest {
            stream: 1,
            context: c.context.clone().into(),
            prompt_len: c.context.len(),
            max_k: c.greedy.len(),
        };
        match d.propose(req).await {
            Ok(p) => r.greedy(&what, &p.tokens, c, tol),
            Err(e) => r.failures.push(format!("{what}: {e}")),
        }
        match d.logits(1, c.context.clone()).await {
            Ok(l) => r.logits(&what, &l, &c.logits, tol),
            Err(e) => r.failures.push(format!("{what}: {e}")),
        }
    }
    r
}

/// Arguments of the draft-model benchmark command.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Draft model directory (config.json + safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32, bf16 or f16 (default: f32 on the CPU, bf16 on CUDA).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Reference file to check the forward against before timing.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Concurrent streams to time, comma separated.
    #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
    pub batch: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    /// Tokens drafted per stream in the timed run.
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Timed repetitions per batch size (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Draft length of the speculation-round measurement.
    #[arg(long, default_value_t = 5)]
    pub round_k: usize,
    #[arg(long)]
    pub no_graphs: bool,
    /// Use the candle forward even on CUDA.
    #[arg(long)]
    pub candle: bool,
    /// Print one JSON object per measurement too.
    #[arg(long)]
    pub json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let opts = DrafterOptions {
        max_streams: Some(max_batch.max(8)),
        max_len: Some(args.prompt_len + args.new_tokens + 64),
        cuda_graphs: !args.no_graphs,
        force_candle: args.candle,
        ..DrafterOptions::default()
    };
    let t0 = Instant::now();
    let device: DraftDevice = args.device.parse()?;
    let dtype: Option<DraftDtype> = args.dtype.as_deref().map(str::parse).transpose()?;
    let d = ModelDrafter::load_with(&args.model, device, dtype, opts)?;
    let cfg = d.config().clone();
    println!(
        "loaded {} ({:?}, {} layers, hidden {}) with engine {} in {:.1}s",
        args.model.display(),
        cfg.family,
        cfg.num_layers,
        cfg.hidden_size,
        d.engine(),
        t0.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.reference {
        let cases = load_reference(path).map_err(anyhow::Error::msg)?;
        let dtype = DraftDtype::resolve(dtype, device);
        // As many streams as the largest timed batch: the check covers its kernels.
        let copies = (max_batch / cases.len().max(1)).max(1);
        let r = check_reference(&d, &cases, Tolerance::for_dtype(dtype), copies).await;
        println!(
            "check: {} logit comparisons, max relative error {:.2e}; greedy {}/{} tokens \
             matched, {} near ties; {}",
            r.logit_checks,
            r.max_rel_logits,
            r.greedy_tokens_matched,
            r.greedy_tokens_compared,
            r.near_ties,
            if r.passed() { "PASS" } else { "FAIL" }
        );
        for f in r.failures.iter().take(10) {
            println!("  {f}");
        }
    }

    let vocab = cfg.vocab_size.min(32000) as u32;
    let mut rng = fastrand::Rng::with_seed(7);
    println!(
        "| streams | ms per step (per token of each stream) | tokens/s | ms per round of {} |",
        args.round_k
    );
    println!("| --- | --- | --- | --- |");
    for (bi, &b) in args.batch.iter().enumerate() {
        let base = 10_000 * (bi as u64 + 1);
        let prompts: Vec<Vec<u32>> = (0..b)
            .map(|_| (0..args.prompt_len).map(|_| rng.u32(..vocab)).collect())
            .collect();
        let req = |s: usize, ctx: Vec<u32>, k: usize| DraftRequest {
            stream: base + s as u64,
            prompt_len: ctx.len(),
            context: ctx.into(),
            max_k: k,
        };
        // Warm up: prefill every prompt and capture whatever the engine captures.
        for p in join_all((0..b).map(|s| d.propose(req(s, prompts[s].clone(), 4)))).await {
            p?;
        }
        let mut per_step = Vec::new();
        for _ in 0..args.repeat {
            let t = Instant::now();
            let out =
                join_all((0..b).map(|s| d.propose(req(s, prompts[s].clone(), args.new_tokens))))
                    .await;
            let el = t.elapsed().as_secs_f64();
            let mut min_len = usize::MAX;
            for p in out {
                min_len = min_len.min(p?.tokens.len());
            }
            per_step.push(el * 1e3 / min_len.max(1) as f64);
        }
        // Speculation rounds: draft k, accept about half, append a different token.
        let mut ctxs = prompts.clone();
        let mut round_ms = Vec::new();
        for _ in 0..(args.repeat * 4) {
            let t = Instant::now();
            let out =
                join_all((0..b).map(|s| d.propose(req(s, ctxs[s].clone(), args.round_k)))).await;
            round_ms.push(t.elapsed().as_secs_f64() * 1e3);
            for (s, p) in out.into_iter().enumerate() {
                let p = p?;
                let keep = p.tokens.len() / 2;
                ctxs[s].extend_from_slice(&p.tokens[..keep]);
                ctxs[s].push(rng.u32(..vocab));
            }
        }
        let ms = median(per_step);
        let rms = median(round_ms);
        println!("| {b} | {ms:.3} | {:.0} | {rms:.3} |", b as f64 * 1e3 / ms);
        if args.json {
            println!(
                "{{\"model\":\"{}\",\"engine\":\"{}\",\"streams\":{b},\"ms_per_step\":{ms:.4},\"ms_per_round\":{rms:.4},\"round_k\":{}}}",
                args.model.display(),
                d.engine(),
                args.round_k
            );
        }
        for s in 0..b {
            d.finish(base + s as u64);
        }
    }
    let st = d.stats();
    println!(
        "steps {} (mean {:.2} rows, {:.3} ms each), drafted {}, prefilled {}, reused {}, rolled back {}",
        st.steps,
        st.step_rows as f64 / st.steps.max(1) as f64,
        st.step_seconds * 1e3 / st.steps.max(1) as f64,
        st.draft_tokens,
        st.prefill_tokens,
        st.reused_tokens,
        st.rolled_back_tokens
    );
    Ok(())
}
