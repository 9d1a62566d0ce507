//! Running the CUDA engine: queuing a step's kernels, graph capture and replay.

use candle_core::cuda_backend::cudarc;
use cudarc::cublas::sys as cb;
use cudarc::driver::{result, sys, CudaFunction, CudaGraph};

use super::{att_min_split, derr, dims, CudaEngine, Input, MixRoles, Role, StepIo, ARGMAX_BLOCKS};
use crate::draft::model::batch::{Engine, RowStep, Sample};
use crate::draft::DraftError;

impl CudaEngine {
    /// Launch `f` on the engine's stream, as a programmatic dependent launch when the
    /// engine uses them.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a value of that
    /// parameter's type, and every device address among them must be valid for the kernel.
    pub(super) unsafe fn launch_raw(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<(), DraftError> {
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: self.pdl as u32,
        };
        // SAFETY: the caller vouches for the parameters; cfg and attr outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(derr)
    }

    /// One-token projection kernel `role` over `units` output units (rows, or row pairs
    /// for the pairing roles); `x` is the input row, `y` the output.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        role: Role,
        w: u64,
        x: u64,
        nw: u64,
        y: u64,
        units: usize,
        accumulate: bool,
        bias: u64,
        cache: (u64, u64),
    ) -> Result<(), DraftError> {
        let (r, s) = self.tune.of(role);
        let grid = (units.div_ceil(r * (8 / s)) as u32, 1, 1);
        let a = &self.a;
        launch!(self, &self.k.gemv[role as usize], grid, 256;
            w, x, nw, y, units as i32, accumulate as i32, bias, a.cos.p, a.sin.p, a.pos,
            a.slot, cache.0, cache.1, a.am_part.p)
    }

    /// The layers of a one-token step as GEMV kernels that compute their own inputs
    /// (RMSNorm) and epilogues (bias + rotation + cache write, SiLU·mul, residual add).
    fn encode_one(&self, splits: usize, io: StepIo) -> Result<(), DraftError> {
        let c = &self.cfg;
        let (h, d, nh, nkv, inter) = dims(c);
        let a = &self.a;
        let scale = 1f32 / (d as f32).sqrt();
        // The step's attention kernel and its blocks, the same in every layer.
        let (att, hb, att_threads) = self.att(1, true);
        for (i, l) in self.layers.iter().enumerate() {
            let (kc, vc) = (
                self.kc.p + (i * self.layer_kv * 2) as u64,
                self.vc.p + (i * self.layer_kv * 2) as u64,
            );
            let qkv_dim = (nh + 2 * nkv) * d;
            if c.qk_norm {
                // The per-head norm needs whole heads: a separate kernel after the GEMV.
                self.gemv(
                    Role::Qkv,
                    l.qkv,
                    a.x.p,
                    l.ln1,
                    a.qkv.p,
                    qkv_dim,
                    false,
                    0,
                    (0, 0),
                )?;
                let head_blocks = (nh + 2 * nkv).div_ceil(8) as u32;
                launch!(self, &self.k.qkv_post, (1, head_blocks, 1), 256;
                    a.qkv.p, l.qkv_bias, l.q_norm, l.k_norm, a.cos.p, a.sin.p, a.pos, a.slot, a.q.p, kc, vc)?;
            } else {
                self.gemv(
                    Role::QkvRope,
                    l.qkv,
                    a.x.p,
                    l.ln1,
                    a.q.p,
                    qkv_dim / 2,
                    false,
                    l.qkv_bias,
                    (kc, vc),
                )?;
            }
            launch!(self, att, (1, hb, splits as u32), att_threads;
                a.q.p, kc, vc, a.pos, a.slot, a.attn.p, a.part_o.p, a.part_ml.p, a.counters.p, scale, 1i32, att_min_split(self.att_threads))?;
            self.gemv(Role::O, l.o, a.attn.p, 0, a.x.p, h, true, 0, (0, 0))?;
            self.gemv(
                Role::GateUp,
                l.gate_up,
                a.x.p,
                l.ln2,
                a.act.p,
                inter,
                false,
                0,
                (0, 0),
            )?;
            self.gemv(Role::Down, l.down, a.act.p, 0, a.x.p, h, true, 0, (0, 0))?;
        }
        let v = c.vocab_size;
        self.gemv(
            Role::Lm,
            self.lm_head,
            a.x.p,
            self.norm,
            a.logits.p,
            v,
            false,
            0,
            (0, 0),
        )?;
        let nb = self.tune.lm_blocks(v) as i32;
        launch!(self, &self.k.argmax_final_block, (1, 1, 1), 1024; a.am_part.p, nb, io.tok, io.prob)
    }

    /// y[n, o] (+)= in(x)[n, k] · W[o, k]ᵀ, where `in` is `input` applied to x.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn proj(
        &self,
        w: u64,
        x: u64,
        y: u64,
        o: usize,
        k: usize,
        n: usize,
        input: Input,
        accumulate: bool,
        out_f32: bool,
    ) -> Result<(), DraftError> {
        let x = match input {
            Input::Plain => x,
            Input::Norm(nw) => self.norm_rows(x, nw, n)?,
            Input::SiluMul => self.silu_mul(x, n, k)?,
        };
        self.gemm(w, x, y, o, k, n, accumulate, out_f32)
    }

    /// RMSNorm(x) · nw of `n` rows into `a.h`; returns its address.
    pub(super) fn norm_rows(&self, x: u64, nw: u64, n: usize) -> Result<u64, DraftError> {
        launch!(self, &self.k.rmsnorm, (n as u32, 1, 1), 256; x, nw, self.a.h.p, 0u64)?;
        Ok(self.a.h.p)
    }

    /// silu(gate) · up of `n` rows of gate/up pairs `x` (`k` wide) into `a.act`; returns
    /// its address.
    pub(super) fn silu_mul(&self, x: u64, n: usize, k: usize) -> Result<u64, DraftError> {
        let blocks = (n * k).div_ceil(256).min(8 * self.sms) as u32;
        launch!(self, &self.k.silu_mul, (blocks, 1, 1), 256; x, self.a.act.p, n as i32)?;
        Ok(self.a.act.p)
    }

    /// cuBLAS: y[n, o] (+)= x[n, k] · W[o, k]ᵀ
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        w: u64,
        x: u64,
        y: u64,
        o: usize,
        k: usize,
        n: usize,
        accumulate: bool,
        out_f32: bool,
    ) -> Result<(), DraftError> {
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        let out_t = if out_f32 {
            cb::cudaDataType::CUDA_R_32F
        } else {
            self.cu_dtype
        };
        // Column-major view: Yᵀ (o×n) = Wᵀ-as-stored (k×o)ᵀ · Xᵀ (k×n).
        // SAFETY: addresses and sizes describe engine-owned buffers of these shapes.
        let st = unsafe {
            cb::cublasGemmEx(
                *self.blas.handle(),
                cb::cublasOperation_t::CUBLAS_OP_T,
                cb::cublasOperation_t::CUBLAS_OP_N,
                o as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const _,
                w as *const _,
                self.cu_dtype,
                k as i32,
                x as *const _,
                self.cu_dtype,
                k as i32,
                &beta as *const f32 as *const _,
                y as *mut _,
                out_t,
                o as i32,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if st != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(derr(st));
        }
        Ok(())
    }

    /// Queue the whole forward for `nt` tokens already uploaded, sampling `nr` rows.
    pub(super) fn encode(
        &self,
        nt: usize,
        nr: usize,
        splits: usize,
        io: StepIo,
    ) -> Result<(), DraftError> {
        let c = &self.cfg;
        let (_, d, _, _, _) = dims(c);
        let a = &self.a;
        let ntu = nt as u32;
        let one = self.fused && nt == 1;
        // Every row one token: a decode step of several streams (one token alone runs the
        // GEMVs, or cuBLAS with `SPECD_DRAFT_FUSED=0`).
        let tc = nt >= 2 && nt == nr && nt <= self.tc_max;
        // The tensor-core step's first RMSNorm reads the input's sums of squares.
        let (ss, ss_next) = if tc { self.ss_bufs() } else { (0, 0) };
        match io.prev_tok {
            None => {
                launch!(self, &self.k.embed, (ntu, 1, 1), 128; a.ids, self.embed, a.x.p, ss, ss_next)?
            }
            Some(prev) => {
                launch!(self, &self.k.embed_next, (ntu, 1, 1), 128; prev, a.pos, self.embed, a.x.p, ss, ss_next)?
            }
        }
        if one {
            return self.encode_one(splits, io);
        }
        if tc {
            return self.encode_tc(nt, splits, io);
        }
        // Attention may prefetch cache rows only when each slot gets one new token.
        let decode = (nt == nr) as i32;
        let scale = 1f32 / (d as f32).sqrt();
        // The step's attention kernel and its blocks, the same in every layer.
        let (att, hb, att_threads) = self.att(ntu as usize, decode == 1);
        // Decode steps above the tensor-core step's size (up to 64 tokens) run some
        // projections on its kernels (`Mix`).
        let mix = if decode == 1 && nt >= 2 {
            self.mix.roles(nt)
        } else {
            MixRoles::NONE
        };
        for (i, l) in self.layers.iter().enumerate() {
            let (kc, vc) = (
                self.kc.p + (i * self.layer_kv * 2) as u64,
                self.vc.p + (i * self.layer_kv * 2) as u64,
            );
            self.encode_qkv(l, nt, mix.qkv, (kc, vc))?;
            let min_split = if decode == 1 {
                self.att_split
            } else {
                att_min_split(self.att_threads)
            };
            launch!(self, att, (ntu, hb, splits as u32), att_threads;
                a.q.p, kc, vc, a.pos, a.slot, a.attn.p, a.part_o.p, a.part_ml.p, a.counters.p, scale, decode, min_split)?;
            self.encode_o(l, nt, mix.o)?;
            self.encode_mlp(l, nt, mix)?;
        }
        self.encode_lm_cublas(nr, a.rows, io)
    }

    /// The final RMSNorm of `nr` rows (`rows`: the sampled ones, 0: the first `nr`), the
    /// vocabulary projection on cuBLAS and the two-pass argmax.
    pub(super) fn encode_lm_cublas(
        &self,
        nr: usize,
        rows: u64,
        io: StepIo,
    ) -> Result<(), DraftError> {
        let (a, v, h) = (&self.a, self.cfg.vocab_size, self.cfg.hidden_size);
        launch!(self, &self.k.rmsnorm, (nr as u32, 1, 1), 256; a.x.p, self.norm, a.xs.p, rows)?;
        self.gemm(self.lm_head, a.xs.p, a.logits.p, v, h, nr, false, true)?;
        launch!(self, &self.k.argmax_part, (nr as u32, ARGMAX_BLOCKS as u32, 1), 256; a.logits.p, v as i32, a.am_part.p)?;
        launch!(self, &self.k.argmax_final, (nr as u32, 1, 1), 32; a.am_part.p, ARGMAX_BLOCKS as i32, io.tok, io.prob)
    }

    /// The two halves of the sums-of-squares buffer (see `encode_tc`).
    pub(super) fn ss_bufs(&self) -> (u64, u64) {
        (self.ss.p, self.ss.p + 4 * self.max_tokens as u64)
    }

    /// The step's own inputs and outputs (no chaining).
    pub(super) fn plain_io(&self) -> StepIo {
        StepIo {
            prev_tok: None,
            tok: self.a.tok,
            prob: self.a.prob,
        }
    }

    fn capture(&self, bucket: usize, splits: usize) -> Result<CudaGraph, DraftError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(derr)?;
        let queued = self.encode(bucket, bucket, splits, self.plain_io());
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(derr);
        queued?;
        let graph = graph?.ok_or_else(|| DraftError::Model("empty CUDA graph".into()))?;
        graph.upload().map_err(derr)?;
        Ok(graph)
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> &'static str {
        if self.use_graphs {
            "cuda-graph"
        } else {
            "cuda"
        }
    }

    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let nt = self.check_rows(rows)?;
        let decode = rows.iter().all(|r| r.tokens.len() == 1);
        let bucket = self.bucket(rows.len());
        let n = if decode { bucket.unwrap_or(nt) } else { nt };
        self.stage(rows, n);
        let nr = if decode { n } else { rows.len() };
        self.upload_inputs(n, nr)?;
        let splits = if decode { self.att_splits(n) } else { 1 };
        let graphed = decode && self.use_graphs && bucket.is_some();
        let mut samples = if graphed && self.graphs.contains_key(&n) {
            self.graphs[&n].launch().map_err(derr)?;
            self.download(nr)?
        } else {
            self.encode(n, nr, splits, self.plain_io())?;
            let s = self.download(nr)?;
            if graphed {
                // Captured after an eager run of the same shape, so that lazily loaded
                // library kernels are resident before capture.
                let g = self.capture(n, splits)?;
                self.graphs.insert(n, g);
            }
            s
        };
        samples.truncate(rows.len());
        self.last_rows = rows.len();
        Ok(samples)
    }

    fn last_logits(&mut self) -> Result<Vec<Vec<f32>>, DraftError> {
        let v = self.cfg.vocab_size;
        let mut out = vec![0f32; self.last_rows * v];
        // SAFETY: the logits buffer holds max_rows >= last_rows rows of v floats.
        unsafe {
            result::memcpy_dtoh_async(&mut out, self.a.logits.p, self.stream.cu_stream())
                .map_err(derr)?;
        }
        self.stream.synchronize().map_err(derr)?;
        Ok(out.chunks(v).map(|c| c.to_vec()).collect())
    }

    fn max_slots(&self) -> usize {
        self.max_slots
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn max_step_tokens(&self) -> usize {
        self.max_tokens
    }

    fn max_chain(&self) -> usize {
        if self.use_graphs {
            self.chain
        } else {
            1
        }
    }

    fn decode_while(
        &mut self,
        rows: &[RowStep<'_>],
        max_steps: usize,
        more: &mut dyn FnMut(&[Sample]) -> bool,
    ) -> Result<(), DraftError> {
        self.run_decode(rows, max_steps, more)
    }
}
