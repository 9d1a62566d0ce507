//! Runs of decode steps (`decode_while`): one captured step at a time, step `j` reading
//! the samples of step `j - 1` on the device (`embed_next`, which also advances the
//! positions), the next step queued while the host takes a step's samples. These are
//! copied to pinned memory on a second stream, so the copy is not in the steps' path
//! either. A single stream runs the same way: one graph for all of its steps measured no
//! faster (docs/draft-model.md, "Single streams in runs"), and a run lets a request that
//! arrives meanwhile join within a step.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc;
use cudarc::driver::{result, sys, CudaEvent, CudaGraph, CudaStream, PinnedHostSlice};

use super::{derr, CudaEngine, StepIo, MAX_CHAIN};
use crate::draft::model::batch::{decode_while_step_by_step, RowStep, Sample};
use crate::draft::DraftError;

/// Runs of decode steps: not yet prepared, ready, or off after their preparation failed
/// (then steps go one at a time, as before runs existed).
#[derive(Default)]
pub(super) enum Runs {
    #[default]
    Unprepared,
    Ready(RunState),
    Off,
}

/// What runs of decode steps need beyond the single-step graphs, made at the first run.
pub(super) struct RunState {
    /// Copies the samples of finished steps to the host beside the next step.
    copy: Arc<CudaStream>,
    /// The chain buffer's layout: tokens of step j at j * max_rows, probabilities at
    /// (MAX_CHAIN + j) * max_rows.
    host: PinnedHostSlice<u32>,
    /// Per step of a run: its kernels finished (main stream), its samples on the host.
    computed: Vec<CudaEvent>,
    copied: Vec<CudaEvent>,
    /// Step j of a run (reading step j - 1's samples) per (batch bucket, j).
    graphs: HashMap<(usize, usize), CudaGraph>,
}

impl CudaEngine {
    /// Step `j` of a run reads the samples of step `j - 1` and writes its own into
    /// slot `j` of the chain buffer.
    fn chain_io(&self, j: usize) -> StepIo {
        let (m, c) = (self.max_rows as u64, self.a.chain.p);
        StepIo {
            prev_tok: j.checked_sub(1).map(|p| c + 4 * p as u64 * m),
            tok: c + 4 * j as u64 * m,
            prob: c + 4 * (MAX_CHAIN + j) as u64 * m,
        }
    }

    /// Step `j` of a run of batch bucket `n`, captured as a graph.
    fn capture_run_step(&self, n: usize, j: usize) -> Result<CudaGraph, DraftError> {
        let splits = self.att_splits(n);
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(derr)?;
        let queued = self.encode(n, n, splits, self.chain_io(j));
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(derr);
        queued?;
        let graph = graph?.ok_or_else(|| DraftError::Model("empty CUDA graph".into()))?;
        graph.upload().map_err(derr)?;
        Ok(graph)
    }

    /// `Engine::decode_while` for one-token rows, once the single-step graph of the batch
    /// size exists; otherwise step by step.
    pub(super) fn run_decode(
        &mut self,
        rows: &[RowStep<'_>],
        max_steps: usize,
        more: &mut dyn FnMut(&[Sample]) -> bool,
    ) -> Result<(), DraftError> {
        let k = max_steps.min(self.chain);
        let fits = k >= 2
            && self.use_graphs
            && rows
                .iter()
                .all(|r| r.tokens.len() == 1 && r.start + k <= self.max_len);
        let bucket = self
            .bucket(rows.len())
            .filter(|b| fits && self.graphs.contains_key(b));
        let Some(n) = bucket else {
            return decode_while_step_by_step(self, rows, max_steps, more);
        };
        self.check_rows(rows)?;
        if let Err(e) = self.prepare_run(n, k) {
            tracing::warn!(error = %e, "decode runs unavailable; stepping one token at a time");
            self.run = Runs::Off;
        }
        if !matches!(self.run, Runs::Ready(_)) {
            return decode_while_step_by_step(self, rows, max_steps, more);
        }
        self.stage(rows, n);
        self.upload_inputs(n, n)?;
        self.last_rows = rows.len();
        self.launch_run_step(n, 0)?;
        let mut launched = 1;
        let mut go = true;
        let mut samples = Vec::with_capacity(rows.len());
        for j in 0..k {
            if go && launched < k {
                self.launch_run_step(n, launched)?;
                launched += 1;
            }
            self.run_samples(j, rows.len(), &mut samples)?;
            // A step queued before `more` said stop is passed on, then nothing more.
            go = more(&samples) && go;
            if j + 1 == launched {
                break;
            }
        }
        Ok(())
    }

    fn prepare_run(&mut self, n: usize, k: usize) -> Result<(), DraftError> {
        if matches!(self.run, Runs::Off) {
            return Ok(());
        }
        if matches!(self.run, Runs::Unprepared) {
            let ctx = self.stream.context();
            let events = || {
                (0..MAX_CHAIN)
                    .map(|_| ctx.new_event(None))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(derr)
            };
            self.run = Runs::Ready(RunState {
                copy: ctx.new_stream().map_err(derr)?,
                // SAFETY: only read after a copy into it has completed.
                host: unsafe { ctx.alloc_pinned::<u32>(2 * MAX_CHAIN * self.max_rows) }
                    .map_err(derr)?,
                computed: events()?,
                copied: events()?,
                graphs: HashMap::new(),
            });
        }
        // Captured before any step of the run is queued.
        for j in 0..k {
            let have = matches!(&self.run, Runs::Ready(r) if r.graphs.contains_key(&(n, j)));
            if !have {
                let g = self.capture_run_step(n, j)?;
                if let Runs::Ready(r) = &mut self.run {
                    r.graphs.insert((n, j), g);
                }
            }
        }
        Ok(())
    }

    /// Queue step `j` of a run, then the copy of its samples on the copy stream.
    fn launch_run_step(&self, n: usize, j: usize) -> Result<(), DraftError> {
        let (Runs::Ready(r), m) = (&self.run, self.max_rows) else {
            return Err(DraftError::Model("decode run not prepared".into()));
        };
        let g = r
            .graphs
            .get(&(n, j))
            .ok_or_else(|| DraftError::Model("decode run step not captured".into()))?;
        g.launch().map_err(derr)?;
        r.computed[j].record(&self.stream).map_err(derr)?;
        r.copy.wait(&r.computed[j]).map_err(derr)?;
        let host = r.host.as_ptr().map_err(derr)? as *mut u32;
        let io = self.chain_io(j);
        for (dst, src) in [(j * m, io.tok), ((MAX_CHAIN + j) * m, io.prob)] {
            // SAFETY: the pinned buffer holds 2 * MAX_CHAIN * max_rows u32 and the chain
            // buffer as many on the device; nothing reads these n until `copied[j]`.
            unsafe {
                let dst = std::slice::from_raw_parts_mut(host.add(dst), n);
                result::memcpy_dtoh_async(dst, src, r.copy.cu_stream()).map_err(derr)?;
            }
        }
        r.copied[j].record(&r.copy).map_err(derr)
    }

    /// Wait for step `j`'s samples and read the first `rows` of them.
    fn run_samples(&self, j: usize, rows: usize, out: &mut Vec<Sample>) -> Result<(), DraftError> {
        let Runs::Ready(r) = &self.run else {
            return Err(DraftError::Model("decode run not prepared".into()));
        };
        r.copied[j].synchronize().map_err(derr)?;
        let host = r.host.as_ptr().map_err(derr)?;
        let m = self.max_rows;
        out.clear();
        // SAFETY: the copies of step j into these ranges completed (`copied[j]`).
        let read = |x: usize| unsafe { host.add(x).read_volatile() };
        out.extend((0..rows).map(|i| sample_at(read, m, j, i)));
        Ok(())
    }
}

/// Sample `i` of step `j` from a copy of the chain buffer (`RunState::host`'s layout, rows
/// `m` apart), read through `read`.
fn sample_at(read: impl Fn(usize) -> u32, m: usize, j: usize, i: usize) -> Sample {
    Sample {
        token: read(j * m + i),
        prob: f32::from_bits(read((MAX_CHAIN + j) * m + i)),
    }
}
