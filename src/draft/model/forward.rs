//! The model forward written with candle tensors and candle-nn layers, over a per-slot KV
//! cache that can be rolled back. It runs on any candle device; specd uses it on the CPU
//! (and as the reference for the CUDA engine).
//!
//! All rows of a step go through the projections and the MLP as one matrix; attention
//! is computed per row against that row's slot.

use candle_core::{DType, Device, IndexOp, Module, Tensor};
use candle_nn::{Embedding, Linear, RmsNorm};

use super::batch::{Engine, RowStep, Sample};
use super::config::ModelConfig;
use super::weights::Weights;
use crate::draft::DraftError;

fn merr(e: candle_core::Error) -> DraftError {
    DraftError::Model(e.to_string())
}

struct Layer {
    ln1: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    ln2: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// Keys and values of one slot, per layer, `[capacity, kv_heads, head_dim]`, grown on
/// demand up to the engine's maximum length.
#[derive(Default)]
struct SlotKv {
    cap: usize,
    layers: Vec<(Tensor, Tensor)>,
}

pub struct CandleEngine {
    cfg: ModelConfig,
    device: Device,
    dtype: DType,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    kv: Vec<SlotKv>,
    max_len: usize,
    max_step_tokens: usize,
    last_logits: Option<Tensor>,
}

pub struct LoadArgs<'a> {
    pub weights: &'a Weights,
    pub cfg: &'a ModelConfig,
    pub device: &'a Device,
    pub dtype: DType,
    pub max_slots: usize,
    pub max_len: usize,
    pub max_step_tokens: usize,
}

fn linear(
    w: &Weights,
    name: &str,
    out_dim: usize,
    in_dim: usize,
    dtype: DType,
    dev: &Device,
) -> Result<Linear, DraftError> {
    let weight = w.get(
        &w.name(&format!("{name}.weight")),
        &[out_dim, in_dim],
        dtype,
        dev,
    )?;
    let bias_name = w.name(&format!("{name}.bias"));
    let bias = if w.has(&bias_name) {
        Some(w.get(&bias_name, &[out_dim], dtype, dev)?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

fn norm(
    w: &Weights,
    name: &str,
    dim: usize,
    eps: f64,
    dtype: DType,
    dev: &Device,
) -> Result<RmsNorm, DraftError> {
    let weight = w.get(&w.name(&format!("{name}.weight")), &[dim], dtype, dev)?;
    Ok(RmsNorm::new(weight, eps))
}

impl CandleEngine {
    pub fn load(a: LoadArgs<'_>) -> Result<Self, DraftError> {
        let (w, c, dev, dt) = (a.weights, a.cfg, a.device, a.dtype);
        let (h, d) = (c.hidden_size, c.head_dim);
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("layers.{i}");
            let qk_norm = |n: &str| -> Result<Option<RmsNorm>, DraftError> {
                if c.qk_norm {
                    Ok(Some(norm(
                        w,
                        &format!("{p}.self_attn.{n}"),
                        d,
                        c.rms_norm_eps,
                        dt,
                        dev,
                    )?))
                } else {
                    Ok(None)
                }
            };
            layers.push(Layer {
                ln1: norm(
                    w,
                    &format!("{p}.input_layernorm"),
                    h,
                    c.rms_norm_eps,
                    dt,
                    dev,
                )?,
                q: linear(
                    w,
                    &format!("{p}.self_attn.q_proj"),
                    c.num_heads * d,
                    h,
                    dt,
                    dev,
                )?,
                k: linear(
                    w,
                    &format!("{p}.self_attn.k_proj"),
                    c.num_kv_heads * d,
                    h,
                    dt,
                    dev,
                )?,
                v: linear(
                    w,
                    &format!("{p}.self_attn.v_proj"),
                    c.num_kv_heads * d,
                    h,
                    dt,
                    dev,
                )?,
                o: linear(
                    w,
                    &format!("{p}.self_attn.o_proj"),
                    h,
                    c.num_heads * d,
                    dt,
                    dev,
                )?,
                q_norm: qk_norm("q_norm")?,
                k_norm: qk_norm("k_norm")?,
                ln2: norm(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    h,
                    c.rms_norm_eps,
                    dt,
                    dev,
                )?,
                gate: linear(
                    w,
                    &format!("{p}.mlp.gate_proj"),
                    c.intermediate_size,
                    h,
                    dt,
                    dev,
                )?,
                up: linear(
                    w,
                    &format!("{p}.mlp.up_proj"),
                    c.intermediate_size,
                    h,
                    dt,
                    dev,
                )?,
                down: linear(
                    w,
                    &format!("{p}.mlp.down_proj"),
                    h,
                    c.intermediate_size,
                    dt,
                    dev,
                )?,
            });
        }
        let embed_w = w.get(&w.name("embed_tokens.weight"), &[c.vocab_size, h], dt, dev)?;
        let lm_w = w.get(&w.lm_head_name(), &[c.vocab_size, h], dt, dev)?;
        let (cos, sin) = c.rope_tables(a.max_len);
        let half = d / 2;
        let table = |v: Vec<f32>| {
            Tensor::from_vec(v, (a.max_len, half), dev)
                .and_then(|t| t.to_dtype(dt))
                .map_err(merr)
        };
        Ok(Self {
            cfg: c.clone(),
            device: dev.clone(),
            dtype: dt,
            embed: Embedding::new(embed_w, h),
            layers,
            norm: norm(w, "norm", h, c.rms_norm_eps, dt, dev)?,
            lm_head: Linear::new(lm_w, None),
            cos: table(cos)?,
            sin: table(sin)?,
            kv: (0..a.max_slots).map(|_| SlotKv::default()).collect(),
            max_len: a.max_len,
            max_step_tokens: a.max_step_tokens,
            last_logits: None,
        })
    }

    fn ensure_capacity(&mut self, slot: usize, need: usize) -> candle_core::Result<()> {
        let kv = &mut self.kv[slot];
        if kv.cap >= need {
            return Ok(());
        }
        let cap = need.next_power_of_two().max(64).min(self.max_len).max(need);
        let shape = (cap, self.cfg.num_kv_heads, self.cfg.head_dim);
        let mut layers = Vec::with_capacity(self.cfg.num_layers);
        for i in 0..self.cfg.num_layers {
            let k = Tensor::zeros(shape, self.dtype, &self.device)?;
            let v = Tensor::zeros(shape, self.dtype, &self.device)?;
            if let Some((ok, ov)) = kv.layers.get(i) {
                k.slice_set(ok, 0, 0)?;
                v.slice_set(ov, 0, 0)?;
            }
            layers.push((k, v));
        }
        kv.layers = layers;
        kv.cap = cap;
        Ok(())
    }

    /// Causal attention of `q` `[m, heads, d]` (positions `start..start+m`) over the
    /// slot's first `start + m` keys and values, grouped by key/value head.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        start: usize,
    ) -> candle_core::Result<Tensor> {
        let c = &self.cfg;
        let (m, d) = (q.dim(0)?, c.head_dim);
        let groups = c.num_heads / c.num_kv_heads;
        let total = k.dim(0)?;
        // Heads g*groups..(g+1)*groups share key/value head g.
        let q = q
            .transpose(0, 1)?
            .contiguous()?
            .reshape((c.num_kv_heads, groups * m, d))?;
        let k = k.transpose(0, 1)?.contiguous()?;
        let v = v.transpose(0, 1)?.contiguous()?;
        let scale = 1.0 / (d as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
        if m > 1 {
            let mask: Vec<f32> = (0..groups * m)
                .flat_map(|r| {
                    let pos = start + r % m;
                    (0..total).map(move |j| if j <= pos { 0.0 } else { f32::NEG_INFINITY })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (groups * m, total), &self.device)?;
            scores = scores.broadcast_add(&mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(self.dtype)?;
        probs
            .matmul(&v)?
            .reshape((c.num_heads, m, d))?
            .transpose(0, 1)?
            .reshape((m, c.num_heads * d))
    }

    fn forward(&mut self, rows: &[RowStep<'_>]) -> candle_core::Result<Tensor> {
        let c = self.cfg.clone();
        let (nh, nkv, d) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        for r in rows {
            ids.extend_from_slice(r.tokens);
            pos.extend((r.start..r.start + r.tokens.len()).map(|p| p as u32));
            self.ensure_capacity(r.slot, r.start + r.tokens.len())?;
        }
        let n = ids.len();
        let ids = Tensor::from_vec(ids, n, &self.device)?;
        let pos = Tensor::from_vec(pos, n, &self.device)?;
        let cos = self.cos.index_select(&pos, 0)?;
        let sin = self.sin.index_select(&pos, 0)?;
        let mut x = self.embed.forward(&ids)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = layer.ln1.forward(&x)?;
            let mut q = layer.q.forward(&h)?.reshape((1, n, nh, d))?;
            let mut k = layer.k.forward(&h)?.reshape((1, n, nkv, d))?;
            let v = layer.v.forward(&h)?.reshape((n, nkv, d))?;
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                q = qn.forward(&q)?;
                k = kn.forward(&k)?;
            }
            let q = candle_nn::rotary_emb::rope_thd(&q, &cos, &sin)?.squeeze(0)?;
            let k = candle_nn::rotary_emb::rope_thd(&k, &cos, &sin)?.squeeze(0)?;
            let mut outs = Vec::with_capacity(rows.len());
            let mut off = 0;
            for r in rows {
                let m = r.tokens.len();
                let (kc, vc) = &self.kv[r.slot].layers[li];
                kc.slice_set(&k.narrow(0, off, m)?.contiguous()?, 0, r.start)?;
                vc.slice_set(&v.narrow(0, off, m)?.contiguous()?, 0, r.start)?;
                let total = r.start + m;
                let qr = q.narrow(0, off, m)?;
                outs.push(self.attend(&qr, &kc.i(..total)?, &vc.i(..total)?, r.start)?);
                off += m;
            }
            let attn = Tensor::cat(&outs, 0)?;
            x = (x + layer.o.forward(&attn)?)?;
            let h = layer.ln2.forward(&x)?;
            let act = (candle_nn::ops::silu(&layer.gate.forward(&h)?)? * layer.up.forward(&h)?)?;
            x = (x + layer.down.forward(&act)?)?;
        }
        let mut last = Vec::with_capacity(rows.len());
        let mut off = 0u32;
        for r in rows {
            off += r.tokens.len() as u32;
            last.push(off - 1);
        }
        let last = Tensor::from_vec(last, rows.len(), &self.device)?;
        let x = self.norm.forward(&x.index_select(&last, 0)?)?;
        self.lm_head.forward(&x)?.to_dtype(DType::F32)
    }
}

/// Greedy token and its softmax probability.
pub fn greedy(logits: &[f32]) -> Sample {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    let max = logits.get(best).copied().unwrap_or(0.0) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    Sample {
        token: best as u32,
        prob: if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 },
    }
}

impl Engine for CandleEngine {
    fn name(&self) -> &'static str {
        match self.device {
            Device::Cpu => "candle-cpu",
            _ => "candle",
        }
    }

    fn step(&mut self, rows: &[RowStep<'_>]) -> Result<Vec<Sample>, DraftError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        for r in rows {
            if r.tokens.is_empty() || r.start + r.tokens.len() > self.max_len {
                return Err(DraftError::Model(format!(
                    "row of {} tokens at {} does not fit {} positions",
                    r.tokens.len(),
                    r.start,
                    self.max_len
                )));
            }
        }
        let logits = self.forward(rows).map_err(merr)?;
        let rows_l: Vec<Vec<f32>> = logits.to_vec2().map_err(merr)?;
        self.last_logits = Some(logits);
        Ok(rows_l.iter().map(|l| greedy(l)).collect())
    }

    fn last_logits(&mut self) -> Result<Vec<Vec<f32>>, DraftError> {
        match &self.last_logits {
            Some(l) => l.to_vec2().map_err(merr),
            None => Ok(Vec::new()),
        }
    }

    fn max_slots(&self) -> usize {
        self.kv.len()
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn max_step_tokens(&self) -> usize {
        self.max_step_tokens
    }
}
