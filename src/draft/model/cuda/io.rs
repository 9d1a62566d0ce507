//! A step's inputs and outputs: checking and staging the rows, one upload, one download.

use candle_core::cuda_backend::cudarc;
use cudarc::driver::result;

use super::{derr, CudaEngine, BUCKETS};
use crate::draft::model::batch::{RowStep, Sample};
use crate::draft::DraftError;

impl CudaEngine {
    pub(super) fn upload_inputs(&mut self, n: usize, nr: usize) -> Result<(), DraftError> {
        let t = self.max_tokens;
        let mut inp = std::mem::take(&mut self.h_in);
        inp.clear();
        inp.resize(3 * t + nr, 0);
        inp[..n].copy_from_slice(&self.h_ids[..n]);
        inp[t..t + n].copy_from_slice(&self.h_pos[..n]);
        inp[2 * t..2 * t + n].copy_from_slice(&self.h_slot[..n]);
        inp[3 * t..].copy_from_slice(&self.h_rows[..nr]);
        // SAFETY: the input buffer holds 4 * max_tokens i32 and nr <= max_tokens.
        let r = unsafe { result::memcpy_htod_async(self.a.inp.p, &inp, self.stream.cu_stream()) };
        self.h_in = inp;
        r.map_err(derr)
    }

    pub(super) fn download(&self, nr: usize) -> Result<Vec<Sample>, DraftError> {
        let m = self.max_rows;
        let mut out = vec![0u32; 2 * m];
        // SAFETY: the output buffer holds 2 * max_rows u32 on the device and on the host.
        unsafe { result::memcpy_dtoh_async(&mut out, self.a.out.p, self.stream.cu_stream()) }
            .map_err(derr)?;
        self.stream.synchronize().map_err(derr)?;
        Ok((0..nr)
            .map(|i| Sample {
                token: out[i],
                prob: f32::from_bits(out[m + i]),
            })
            .collect())
    }

    /// Tokens of a step after checking that it fits the engine's buffers and slots.
    pub(super) fn check_rows(&self, rows: &[RowStep<'_>]) -> Result<usize, DraftError> {
        let nt: usize = rows.iter().map(|r| r.tokens.len()).sum();
        if rows.len() > self.max_rows || nt > self.max_tokens {
            return Err(DraftError::Model(format!(
                "step of {} rows / {nt} tokens exceeds the engine's buffers",
                rows.len()
            )));
        }
        for r in rows {
            if r.slot >= self.max_slots
                || r.tokens.is_empty()
                || r.start + r.tokens.len() > self.max_len
            {
                return Err(DraftError::Model(format!(
                    "row (slot {}, {} tokens at {}) out of range",
                    r.slot,
                    r.tokens.len(),
                    r.start
                )));
            }
        }
        Ok(nt)
    }

    /// The captured batch size that a decode step of `rows` rows is padded to.
    pub(super) fn bucket(&self, rows: usize) -> Option<usize> {
        BUCKETS
            .iter()
            .copied()
            .find(|&b| b >= rows && b <= self.max_rows)
    }

    /// The host copies of a step's inputs, padded to `n` tokens.
    pub(super) fn stage(&mut self, rows: &[RowStep<'_>], n: usize) {
        self.h_ids.clear();
        self.h_pos.clear();
        self.h_slot.clear();
        self.h_rows.clear();
        for r in rows {
            for (j, &t) in r.tokens.iter().enumerate() {
                self.h_ids.push(t as i32);
                self.h_pos.push((r.start + j) as i32);
                self.h_slot.push(r.slot as i32);
            }
            self.h_rows.push(self.h_ids.len() as i32 - 1);
        }
        // Padding rows of a graph bucket: token 0 at position 0 of the spare slot.
        while self.h_ids.len() < n {
            self.h_rows.push(self.h_ids.len() as i32);
            self.h_ids.push(0);
            self.h_pos.push(0);
            self.h_slot.push(self.max_slots as i32);
        }
    }
}
