//! A layer of a cuBLAS step, projection by projection. Decode steps of more streams than
//! the tensor-core step takes (up to 64) may run some projections on the `tc_*` kernels
//! instead (`MixRoles`): those read rows an `rmsnorm` normalized, as cuBLAS does, so no
//! sums of squares need to be kept across the cuBLAS projections.

use super::{dims, CudaEngine, Input, LayerW, MixRoles, TcRole};
use crate::draft::DraftError;

/// No sums of squares read, added into or zeroed (the plain-input kernels).
const NO_SS: (u64, u64, u64) = (0, 0, 0);

impl CudaEngine {
    /// Layer `l`'s RMSNorm and q/k/v projection of `nt` tokens, with the bias, qk-norm,
    /// rotation and the cache write into `cache` (keys, values); `tc`: on tensor cores.
    pub(super) fn encode_qkv(
        &self,
        l: &LayerW,
        nt: usize,
        tc: bool,
        cache: (u64, u64),
    ) -> Result<(), DraftError> {
        let (h, d, nh, nkv, _) = dims(&self.cfg);
        let a = &self.a;
        let qkv_dim = (nh + 2 * nkv) * d;
        if tc {
            let xs = self.norm_rows(a.x.p, l.ln1, nt)?;
            if !self.cfg.qk_norm {
                // Bias, rotation and cache write in the kernel's epilogue; q to `a.q`.
                let rope = (l.qkv_bias, cache.0, cache.1);
                let (role, units) = (TcRole::QkvRopePlain, qkv_dim / 2);
                return self.tc_proj(role, l.qkv, xs, 0, a.q.p, units, false, nt, NO_SS, rope);
            }
            let role = TcRole::QkvPlain;
            self.tc_proj(
                role, l.qkv, xs, 0, a.qkv.p, qkv_dim, false, nt, NO_SS, NO_SS,
            )?;
        } else {
            let norm = Input::Norm(l.ln1);
            self.proj(l.qkv, a.x.p, a.qkv.p, qkv_dim, h, nt, norm, false, false)?;
        }
        let head_blocks = (nh + 2 * nkv).div_ceil(8) as u32;
        launch!(self, &self.k.qkv_post, (nt as u32, head_blocks, 1), 256;
            a.qkv.p, l.qkv_bias, l.q_norm, l.k_norm, a.cos.p, a.sin.p, a.pos, a.slot, a.q.p, cache.0, cache.1)
    }

    /// Layer `l`'s output projection of `nt` tokens, added into the residual stream.
    pub(super) fn encode_o(&self, l: &LayerW, nt: usize, tc: bool) -> Result<(), DraftError> {
        let (h, d, nh, _, _) = dims(&self.cfg);
        let a = &self.a;
        if tc {
            return self.tc_o(l.o, nt, NO_SS);
        }
        self.proj(
            l.o,
            a.attn.p,
            a.x.p,
            h,
            nh * d,
            nt,
            Input::Plain,
            true,
            false,
        )
    }

    /// Layer `l`'s MLP of `nt` tokens, added into the residual stream.
    pub(super) fn encode_mlp(
        &self,
        l: &LayerW,
        nt: usize,
        mix: MixRoles,
    ) -> Result<(), DraftError> {
        let (h, _, _, _, inter) = dims(&self.cfg);
        let a = &self.a;
        // silu(gate)·up into `a.act` (tensor cores), or gate/up pairs into `a.gu` (cuBLAS).
        let act = if mix.gate_up {
            let xs = self.norm_rows(a.x.p, l.ln2, nt)?;
            let role = TcRole::GateUpPlain;
            self.tc_proj(
                role, l.gate_up, xs, 0, a.act.p, inter, false, nt, NO_SS, NO_SS,
            )?;
            Some(a.act.p)
        } else {
            let norm = Input::Norm(l.ln2);
            self.proj(
                l.gate_up,
                a.x.p,
                a.gu.p,
                2 * inter,
                h,
                nt,
                norm,
                false,
                false,
            )?;
            None
        };
        if mix.down {
            let act = match act {
                Some(p) => p,
                None => self.silu_mul(a.gu.p, nt, inter)?,
            };
            let (role, y) = (TcRole::Down, a.x.p);
            return self.tc_proj(role, l.down, act, 0, y, h, true, nt, NO_SS, NO_SS);
        }
        let (x, input) = match act {
            Some(p) => (p, Input::Plain),
            None => (a.gu.p, Input::SiluMul),
        };
        self.proj(l.down, x, a.x.p, h, inter, nt, input, true, false)
    }
}
