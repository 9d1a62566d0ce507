//! The `model` drafter: a small causal LM (Llama, Qwen2, Qwen3 families) proposing
//! tokens greedily, with a rollback-capable KV cache per stream and one batched forward
//! step for all streams in flight.
//!
//! On the CPU (and for f32 anywhere) the forward is written with candle; with the `cuda`
//! feature and a bf16/f16 dtype, a CUDA engine with fused kernels and CUDA-graph replay
//! of decode steps runs instead.

pub mod batch;
pub mod config;
#[cfg(feature = "cuda")]
mod cuda;
pub mod forward;
pub mod kv;
pub mod translate;
pub mod vocab;
pub mod weights;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;

use candle_core::{DType, Device};
use futures_util::future::BoxFuture;
use tokio::sync::oneshot;

use self::batch::{Engine, Msg, Stats, WorkerOptions};
pub use self::config::{Family, ModelConfig};
use self::translate::Translator;
pub use self::vocab::{check_tokenizer_compat, compare_vocab, VocabMode};
use crate::draft::{DraftError, DraftRequest, Drafter, DrafterKind, Proposal, StreamId};
use crate::metrics::Metrics;
use crate::tokens::ModelTokenizer;

/// Tuning knobs; `Default` suits the device the model is loaded on.
#[derive(Debug, Clone)]
pub struct DrafterOptions {
    /// Streams with a cache slot (more streams evict the least recently used cache).
    pub max_streams: Option<usize>,
    /// Positions per stream (prompt + output + drafts); longer contexts get no proposal.
    pub max_len: Option<usize>,
    /// Tokens per forward step; longer prefills are split over several steps.
    pub max_step_tokens: Option<usize>,
    /// Stop a proposal once the product of its confidences falls below this (0: never).
    pub stop_below: f32,
    /// Replay decode steps as CUDA graphs (CUDA engine only).
    pub cuda_graphs: bool,
    /// Use the candle forward even where the CUDA engine could run.
    pub force_candle: bool,
    /// Draft through text even with the target's own vocabulary (measures what the
    /// translation costs in acceptance).
    pub force_translation: bool,
}

impl Default for DrafterOptions {
    fn default() -> Self {
        Self {
            max_streams: None,
            max_len: None,
            max_step_tokens: None,
            stop_below: 0.0,
            cuda_graphs: true,
            force_candle: false,
            force_translation: false,
        }
    }
}

/// A snapshot of the drafter's counters.
#[derive(Debug, Clone, Default)]
pub struct DrafterStats {
    /// Forward steps run and the rows (streams) they carried.
    pub steps: u64,
    pub step_rows: u64,
    pub step_seconds: f64,
    pub requests: u64,
    pub draft_tokens: u64,
    /// Context tokens computed, and context tokens whose cache was reused.
    pub prefill_tokens: u64,
    pub reused_tokens: u64,
    /// Cached tokens dropped because a context diverged (rejected drafts).
    pub rolled_back_tokens: u64,
    /// Requests whose caller stopped waiting before the proposal was complete.
    pub cancelled: u64,
    /// Requests that got no proposal because the context filled the cache slot.
    pub too_long: u64,
}

pub struct ModelDrafter {
    tx: Option<mpsc::Sender<Msg>>,
    worker: Option<JoinHandle<()>>,
    stats: Arc<Stats>,
    config: ModelConfig,
    engine: &'static str,
    dir: std::path::PathBuf,
    /// Set once the target's tokenizer is known and differs from the draft's.
    translator: OnceLock<Translator>,
    mode: OnceLock<VocabMode>,
    force_translation: bool,
}

/// Where the draft model runs (`--draft-device`: `cpu`, `cuda`, `cuda:N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftDevice {
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for DraftDevice {
    type Err = DraftError;
    fn from_str(s: &str) -> Result<Self, DraftError> {
        let s = s.trim();
        match s {
            "cpu" => Ok(DraftDevice::Cpu),
            "cuda" | "gpu" => Ok(DraftDevice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DraftDevice::Cuda)
                .ok_or_else(|| {
                    DraftError::Model(format!("invalid draft device `{s}` (cpu, cuda, cuda:N)"))
                }),
        }
    }
}

/// The draft model's weights dtype (`--draft-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftDtype {
    F32,
    Bf16,
    F16,
}

impl std::str::FromStr for DraftDtype {
    type Err = DraftError;
    fn from_str(s: &str) -> Result<Self, DraftError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Ok(DraftDtype::F32),
            "bf16" | "bfloat16" => Ok(DraftDtype::Bf16),
            "f16" | "float16" | "half" => Ok(DraftDtype::F16),
            other => Err(DraftError::Model(format!(
                "invalid draft dtype `{other}` (f32, bf16, f16)"
            ))),
        }
    }
}

impl DraftDtype {
    /// The dtype given, else f32 on the CPU and bf16 on CUDA.
    pub fn resolve(dtype: Option<DraftDtype>, device: DraftDevice) -> DType {
        match (dtype, device) {
            (Some(DraftDtype::F32), _) | (None, DraftDevice::Cpu) => DType::F32,
            (Some(DraftDtype::Bf16), _) | (None, DraftDevice::Cuda(_)) => DType::BF16,
            (Some(DraftDtype::F16), _) => DType::F16,
        }
    }
}

impl ModelDrafter {
    /// Load a Hugging Face model directory on `device` (`cpu`, `cuda`, `cuda:N`).
    /// `dtype` defaults to f32 on the CPU and bf16 on CUDA.
    pub fn load(dir: &Path, device: &str, dtype: Option<&str>) -> Result<Self, DraftError> {
        let dtype = dtype.map(str::parse).transpose()?;
        Self::load_with(dir, device.parse()?, dtype, DrafterOptions::default())
    }

    pub fn load_with(
        dir: &Path,
        spec: DraftDevice,
        dtype: Option<DraftDtype>,
        opts: DrafterOptions,
    ) -> Result<Self, DraftError> {
        let dtype = DraftDtype::resolve(dtype, spec);
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let gpu = spec != DraftDevice::Cpu;
        let max_len = opts
            .max_len
            .unwrap_or(4096)
            .min(config.max_position_embeddings)
            .max(2);
        let max_slots = opts.max_streams.unwrap_or(if gpu { 32 } else { 16 }).max(1);
        let max_step_tokens = opts
            .max_step_tokens
            .unwrap_or(if gpu { 2048 } else { 512 })
            .max(max_slots + 1);
        let vocab_limit = crate::tokens::ModelTokenizer::load(dir)
            .map(|t| t.vocab_size.min(config.vocab_size))
            .unwrap_or(config.vocab_size) as u32;
        let worker_opts = WorkerOptions {
            stop_below: opts.stop_below,
            vocab_limit,
        };

        let model_dir = dir.to_path_buf();
        let force_translation = opts.force_translation;
        let dir = dir.to_path_buf();
        let cfg = config.clone();
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let worker_stats = stats.clone();
        let worker = std::thread::Builder::new()
            .name("specd-draft".into())
            .spawn(move || {
                // The engine is built on the worker thread: CUDA state stays on it.
                let engine = build_engine(
                    &dir,
                    &cfg,
                    spec,
                    dtype,
                    &opts,
                    max_slots,
                    max_len,
                    max_step_tokens,
                );
                match engine {
                    Ok(engine) => {
                        let _ = ready_tx.send(Ok(engine.name()));
                        batch::run_worker(engine, rx, worker_stats, worker_opts);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| DraftError::Model(format!("cannot start the draft worker: {e}")))?;
        let engine = match ready_rx.recv() {
            Ok(Ok(name)) => name,
            Ok(Err(e)) => {
                let _ = worker.join();
                return Err(e);
            }
            Err(_) => {
                let _ = worker.join();
                return Err(DraftError::Model("draft worker died while loading".into()));
            }
        };
        tracing::info!(
            engine,
            family = ?config.family,
            layers = config.num_layers,
            hidden = config.hidden_size,
            ?dtype,
            max_slots,
            max_len,
            "draft model loaded"
        );
        Ok(Self {
            tx: Some(tx),
            worker: Some(worker),
            stats,
            config,
            engine,
            dir: model_dir,
            translator: OnceLock::new(),
            mode: OnceLock::new(),
            force_translation,
        })
    }

    /// Compare the draft's vocabulary with the target's: the same one drafts ids
    /// directly, another one through text (see `translate`). Decided once; later calls
    /// return the first decision.
    pub fn bind_target(
        &self,
        target: &Arc<ModelTokenizer>,
        metrics: Option<&Metrics>,
    ) -> Result<VocabMode, DraftError> {
        if let Some(m) = self.mode.get() {
            return Ok(*m);
        }
        let draft = ModelTokenizer::load(&self.dir).map_err(|e| {
            DraftError::Model(format!(
                "cannot read the draft model's tokenizer in {}: {e}",
                self.dir.display()
            ))
        })?;
        let same = compare_vocab(
            &draft.tokenizer.get_vocab(true),
            &target.tokenizer.get_vocab(true),
        );
        let same = match same {
            Ok(()) if self.force_translation => Err("translation forced".to_string()),
            other => other,
        };
        let mode = match same {
            Ok(()) => {
                tracing::info!(
                    "draft model shares the target's vocabulary: drafting token ids directly"
                );
                VocabMode::Same
            }
            Err(diff) => {
                tracing::info!(
                    draft_vocab = draft.vocab_size,
                    target_vocab = target.vocab_size,
                    %diff,
                    "draft model has another vocabulary: drafting through text, translated per round"
                );
                let timing = metrics.map(|m| m.draft_translation.clone());
                let _ = self
                    .translator
                    .set(Translator::new(target.clone(), draft, timing));
                VocabMode::Translated
            }
        };
        Ok(*self.mode.get_or_init(|| mode))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Which forward implementation runs (`candle-cpu`, `candle`, `cuda`).
    pub fn engine(&self) -> &'static str {
        self.engine
    }

    pub fn stats(&self) -> DrafterStats {
        let s = &self.stats;
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        DrafterStats {
            steps: g(&s.steps),
            step_rows: g(&s.step_rows),
            step_seconds: g(&s.step_nanos) as f64 * 1e-9,
            requests: g(&s.requests),
            draft_tokens: g(&s.draft_tokens),
            prefill_tokens: g(&s.prefill_tokens),
            reused_tokens: g(&s.reused_tokens),
            rolled_back_tokens: g(&s.rolled_back_tokens),
            cancelled: g(&s.cancelled),
            too_long: g(&s.too_long),
        }
    }

    /// The model's logits after the last token of `context`, computed through the
    /// stream's cache like a proposal (used to check the forward against a reference).
    pub async fn logits(
        &self,
        stream: StreamId,
        context: Vec<u32>,
    ) -> Result<Vec<f32>, DraftError> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Logits(stream, context, tx))?;
        rx.await.unwrap_or(Err(DraftError::Closed))
    }

    fn send(&self, m: Msg) -> Result<(), DraftError> {
        match &self.tx {
            Some(tx) => tx.send(m).map_err(|_| DraftError::Closed),
            None => Err(DraftError::Closed),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn build_engine(
    dir: &Path,
    cfg: &ModelConfig,
    spec: DraftDevice,
    dtype: DType,
    opts: &DrafterOptions,
    max_slots: usize,
    max_len: usize,
    max_step_tokens: usize,
) -> Result<Box<dyn Engine>, DraftError> {
    let weights = weights::Weights::open(dir)?;
    let device = match spec {
        DraftDevice::Cpu => Device::Cpu,
        DraftDevice::Cuda(n) => {
            #[cfg(feature = "cuda")]
            if dtype != DType::F32 && !opts.force_candle {
                let engine = cuda::CudaEngine::load(cuda::CudaLoad {
                    weights: &weights,
                    cfg,
                    ordinal: n,
                    dtype,
                    max_slots,
                    max_len,
                    max_step_tokens,
                    graphs: opts.cuda_graphs,
                })?;
                return Ok(Box::new(engine));
            }
            Device::new_cuda(n).map_err(|e| {
                DraftError::Model(format!(
                    "cannot open CUDA device {n}: {e} (specd must be built with the `cuda` feature)"
                ))
            })?
        }
    };
    let _ = opts;
    let engine = forward::CandleEngine::load(forward::LoadArgs {
        weights: &weights,
        cfg,
        device: &device,
        dtype,
        max_slots,
        max_len,
        max_step_tokens,
    })?;
    Ok(Box::new(engine))
}

impl Drop for ModelDrafter {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drafter for ModelDrafter {
    fn kind(&self) -> DrafterKind {
        DrafterKind::Model
    }

    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>> {
        let (tx, rx) = oneshot::channel();
        let Some(tr) = self.translator.get() else {
            let sent = self.send(Msg::Propose(req, tx));
            return Box::pin(async move {
                sent?;
                rx.await.unwrap_or(Err(DraftError::Closed))
            });
        };
        let (dreq, plan) = tr.to_draft(&req);
        let sent = self.send(Msg::Propose(dreq, tx));
        Box::pin(async move {
            sent?;
            let p = rx.await.unwrap_or(Err(DraftError::Closed))?;
            Ok(tr.to_target(plan, p))
        })
    }

    fn finish(&self, stream: StreamId) {
        if let Some(tr) = self.translator.get() {
            tr.finish(stream);
        }
        let _ = self.send(Msg::Finish(stream));
    }

    fn bind_target(
        &self,
        target: &Arc<ModelTokenizer>,
        metrics: Option<&Metrics>,
    ) -> Result<(), DraftError> {
        ModelDrafter::bind_target(self, target, metrics).map(drop)
    }

    /// A model forward takes long enough to hide behind the verify call; a wrong guess
    /// costs little, as the cache keeps the longest common prefix.
    fn wants_overlap(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
