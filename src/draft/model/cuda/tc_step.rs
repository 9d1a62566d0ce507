//! The tensor-core decode step of 2..=64 tokens: queuing its kernels (`mma.cu`).

use super::{dims, tc_tiles, CudaEngine, LmPath, StepIo, TcRole};
use crate::draft::DraftError;

impl CudaEngine {
    /// Tensor-core projection `role` of `nt` tokens (2..=64) over `units` output units.
    /// `ss`: the sums of squares it reads (RMSNorm), adds into (`accumulate`) and
    /// zeroes; `rope`: the bias and the key/value cache of `TcRole::QkvRope`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tc_proj(
        &self,
        role: TcRole,
        w: u64,
        x: u64,
        nw: u64,
        y: u64,
        units: usize,
        accumulate: bool,
        nt: usize,
        ss: (u64, u64, u64),
        rope: (u64, u64, u64),
    ) -> Result<(), DraftError> {
        let tiles = tc_tiles(nt)?;
        let (grid, threads) = self.tc_tune.launch(role, units, tiles);
        let a = &self.a;
        launch!(self, &self.k.tc[role as usize][tiles], (grid, 1, 1), threads;
            w, x, nw, y, units as i32, accumulate as i32, nt as i32, a.am_part.p,
            ss.0, ss.1, ss.2, rope.0, a.cos.p, a.sin.p, a.pos, a.slot, rope.1, rope.2)
    }

    /// A decode step of `nt` tokens (2..=64) on the tensor-core kernels: per layer the
    /// q/k/v projection with its RMSNorm (and, without qk-norm, the bias, rotation and
    /// cache write; else `qkv_post`), attention, the output projection adding into the
    /// residual, gate/up with its RMSNorm writing silu(gate)·up, down. The RMSNorms
    /// scale by per-token sums of squares: `embed` writes those of the input into
    /// `ss_in`, the output projection adds those of its output into `ss_mid` (read by
    /// gate/up) and zeroes `ss_in`, down adds into `ss_in` (read by the next layer and
    /// the output projection) and zeroes `ss_mid`.
    pub(super) fn encode_tc(&self, nt: usize, splits: usize, io: StepIo) -> Result<(), DraftError> {
        let c = &self.cfg;
        let (h, d, nh, nkv, inter) = dims(c);
        let a = &self.a;
        let ntu = nt as u32;
        let decode = 1i32;
        let scale = 1f32 / (d as f32).sqrt();
        let (ss_in, ss_mid) = self.ss_bufs();
        let none = (0, 0, 0);
        // The step's attention kernel and its blocks, the same in every layer.
        let (att, hb, att_threads) = self.att(ntu as usize, true);
        for (i, l) in self.layers.iter().enumerate() {
            let (kc, vc) = (
                self.kc.p + (i * self.layer_kv * 2) as u64,
                self.vc.p + (i * self.layer_kv * 2) as u64,
            );
            let qkv_dim = (nh + 2 * nkv) * d;
            let norm_in = (ss_in, 0, 0);
            if c.qk_norm {
                self.tc_proj(
                    TcRole::Qkv,
                    l.qkv,
                    a.x.p,
                    l.ln1,
                    a.qkv.p,
                    qkv_dim,
                    false,
                    nt,
                    norm_in,
                    none,
                )?;
                let head_blocks = (nh + 2 * nkv).div_ceil(8) as u32;
                launch!(self, &self.k.qkv_post, (ntu, head_blocks, 1), 256;
                    a.qkv.p, l.qkv_bias, l.q_norm, l.k_norm, a.cos.p, a.sin.p, a.pos, a.slot, a.q.p, kc, vc)?;
            } else {
                self.tc_proj(
                    TcRole::QkvRope,
                    l.qkv,
                    a.x.p,
                    l.ln1,
                    a.q.p,
                    qkv_dim / 2,
                    false,
                    nt,
                    norm_in,
                    (l.qkv_bias, kc, vc),
                )?;
            }
            launch!(self, att, (ntu, hb, splits as u32), att_threads;
                a.q.p, kc, vc, a.pos, a.slot, a.attn.p, a.part_o.p, a.part_ml.p, a.counters.p, scale, decode, self.att_split)?;
            self.tc_o(l.o, nt, (0, ss_mid, ss_in))?;
            self.tc_proj(
                TcRole::GateUp,
                l.gate_up,
                a.x.p,
                l.ln2,
                a.act.p,
                inter,
                false,
                nt,
                (ss_mid, 0, 0),
                none,
            )?;
            self.tc_proj(
                TcRole::Down,
                l.down,
                a.act.p,
                0,
                a.x.p,
                h,
                true,
                nt,
                (0, ss_in, ss_mid),
                none,
            )?;
        }
        self.encode_tc_lm(nt, ss_in, io)
    }

    /// The output projection `w` of `nt` tokens on tensor cores, added into the residual
    /// stream; `ss` as `tc_proj`'s.
    pub(super) fn tc_o(&self, w: u64, nt: usize, ss: (u64, u64, u64)) -> Result<(), DraftError> {
        let (a, h) = (&self.a, self.cfg.hidden_size);
        self.tc_proj(TcRole::O, w, a.attn.p, 0, a.x.p, h, true, nt, ss, (0, 0, 0))
    }

    /// The tensor-core step's vocabulary projection and argmax (`LmPath`).
    fn encode_tc_lm(&self, nt: usize, ss_in: u64, io: StepIo) -> Result<(), DraftError> {
        if self.tc_tune.lm == LmPath::Cublas {
            return self.encode_lm_cublas(nt, 0, io);
        }
        let (a, v) = (&self.a, self.cfg.vocab_size);
        let none = (0, 0, 0);
        self.tc_proj(
            TcRole::Lm,
            self.lm_head,
            a.x.p,
            self.norm,
            a.logits.p,
            v,
            false,
            nt,
            (ss_in, 0, 0),
            none,
        )?;
        let nb = self.tc_tune.launch(TcRole::Lm, v, tc_tiles(nt)?).0 as i32;
        launch!(self, &self.k.argmax_final, (nt as u32, 1, 1), 32; a.am_part.p, nb, io.tok, io.prob)
    }
}
