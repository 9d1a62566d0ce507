//! Chained decode steps: `k` greedy steps captured as one CUDA graph, each step embedding
//! the samples of the step before on the device (`embed_next`, which also advances the
//! positions), so that the host uploads inputs and synchronizes once per chain instead
//! of once per token.

use candle_core::cuda_backend::cudarc;
use cudarc::driver::{result, sys, CudaGraph};

use super::{derr, CudaEngine, StepIo, MAX_CHAIN};
use crate::draft::model::batch::{decode_step_by_step, RowStep, Sample};
use crate::draft::DraftError;

impl CudaEngine {
    /// Step `j` of a chain reads the samples of step `j - 1` and writes its own into
    /// slot `j` of the chain buffer.
    fn chain_io(&self, j: usize) -> StepIo {
        let (m, c) = (self.max_rows as u64, self.a.chain.p);
        StepIo {
            prev_tok: j.checked_sub(1).map(|p| c + 4 * p as u64 * m),
            tok: c + 4 * j as u64 * m,
            prob: c + 4 * (MAX_CHAIN + j) as u64 * m,
        }
    }

    fn capture_chain(&self, n: usize, k: usize) -> Result<CudaGraph, DraftError> {
        let splits = self.att_splits(n);
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(derr)?;
        let queued = (0..k).try_for_each(|j| self.encode(n, n, splits, self.chain_io(j)));
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(derr);
        queued?;
        let graph = graph?.ok_or_else(|| DraftError::Model("empty CUDA graph".into()))?;
        graph.upload().map_err(derr)?;
        Ok(graph)
    }

    /// `k` decode steps of one-token rows as one graph launch, once the single-step graph
    /// of the batch size exists (its eager run loaded whatever loads lazily); otherwise
    /// step by step.
    pub(super) fn chain_decode(
        &mut self,
        rows: &[RowStep<'_>],
        k: usize,
    ) -> Result<Vec<Vec<Sample>>, DraftError> {
        let fits = k >= 2
            && k <= self.chain
            && self.use_graphs
            && rows
                .iter()
                .all(|r| r.tokens.len() == 1 && r.start + k <= self.max_len);
        let bucket = self
            .bucket(rows.len())
            .filter(|b| fits && self.graphs.contains_key(b));
        let Some(n) = bucket else {
            return decode_step_by_step(self, rows, k);
        };
        self.check_rows(rows)?;
        self.stage(rows, n);
        self.upload_inputs(n, n)?;
        if !self.chain_graphs.contains_key(&(n, k)) {
            let g = self.capture_chain(n, k)?;
            self.chain_graphs.insert((n, k), g);
        }
        if let Some(g) = self.chain_graphs.get(&(n, k)) {
            g.launch().map_err(derr)?;
        }
        let m = self.max_rows;
        let mut out = vec![0u32; 2 * MAX_CHAIN * m];
        // SAFETY: the chain buffer holds 2 * MAX_CHAIN * max_rows u32, as does `out`.
        unsafe { result::memcpy_dtoh_async(&mut out, self.a.chain.p, self.stream.cu_stream()) }
            .map_err(derr)?;
        self.stream.synchronize().map_err(derr)?;
        self.last_rows = rows.len();
        Ok((0..rows.len())
            .map(|i| {
                (0..k)
                    .map(|j| Sample {
                        token: out[j * m + i],
                        prob: f32::from_bits(out[(MAX_CHAIN + j) * m + i]),
                    })
                    .collect()
            })
            .collect())
    }
}
