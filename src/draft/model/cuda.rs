//! CUDA engine: the model forward as a fixed sequence of NVRTC-compiled kernels and
//! GEMMs over preallocated buffers, so that a decode step can be captured once per batch
//! size and replayed as a CUDA graph.
//!
//! Per layer: RMSNorm, QKV projection, one kernel for bias + qk-norm + rotation + cache
//! write, attention (split over the keys for small batches, then merged), output
//! projection with the residual added in place, RMSNorm, gate/up projection, SiLU·mul,
//! down projection with the residual added in place. A step of one token (batch-1
//! decode) runs its projections as GEMV kernels that also compute their input (the
//! RMSNorm, the SiLU·mul) in shared memory, so a layer is six kernels; larger steps use
//! separate norm/activation kernels and cuBLAS.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use cudarc::cublas::{sys as cb, CudaBlas};
use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr,
    DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use super::batch::{Engine, RowStep, Sample};
use super::config::ModelConfig;
use super::weights::Weights;
use crate::draft::DraftError;

const KERNELS: &str = include_str!("kernels.cu");
/// Batch sizes with a captured decode graph; a decode step is padded to the next one.
const BUCKETS: [usize; 10] = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64];
/// Blocks per row of the two-pass greedy sampling.
const ARGMAX_BLOCKS: usize = 64;
/// Largest GEMV input staged in shared memory (floats), within the default 48 KiB.
const GEMV_MAX_K: usize = 11 * 1024;

fn derr(e: impl std::fmt::Debug) -> DraftError {
    DraftError::Model(format!("cuda: {e:?}"))
}

pub struct CudaLoad<'a> {
    pub weights: &'a Weights,
    pub cfg: &'a ModelConfig,
    pub ordinal: usize,
    pub dtype: DType,
    pub max_slots: usize,
    pub max_len: usize,
    pub max_step_tokens: usize,
    pub graphs: bool,
}

/// A device allocation and its raw address (kernels take addresses).
struct Buf<T> {
    _s: CudaSlice<T>,
    p: u64,
}

fn alloc<T: DeviceRepr + ValidAsZeroBits>(
    st: &Arc<CudaStream>,
    n: usize,
) -> Result<Buf<T>, DraftError> {
    let s = st.alloc_zeros::<T>(n.max(1)).map_err(derr)?;
    let p = s.device_ptr(st).0;
    Ok(Buf { _s: s, p })
}

fn upload<T: DeviceRepr + ValidAsZeroBits>(
    st: &Arc<CudaStream>,
    v: &[T],
) -> Result<Buf<T>, DraftError> {
    let mut s = st.alloc_zeros::<T>(v.len().max(1)).map_err(derr)?;
    st.memcpy_htod(v, &mut s).map_err(derr)?;
    let p = s.device_ptr(st).0;
    Ok(Buf { _s: s, p })
}

/// The 16-bit payload of a bf16/f16 CPU tensor.
fn bits16(t: &Tensor) -> Result<Vec<u16>, DraftError> {
    let t = t.flatten_all().and_then(|t| t.contiguous()).map_err(derr)?;
    let (storage, layout) = t.storage_and_layout();
    let (a, b) = (
        layout.start_offset(),
        layout.start_offset() + t.elem_count(),
    );
    match &*storage {
        Storage::Cpu(CpuStorage::BF16(v)) => Ok(v[a..b].iter().map(|x| x.to_bits()).collect()),
        Storage::Cpu(CpuStorage::F16(v)) => Ok(v[a..b].iter().map(|x| x.to_bits()).collect()),
        _ => Err(DraftError::Model("expected a 16-bit CPU tensor".into())),
    }
}

struct Kernels {
    embed: CudaFunction,
    rmsnorm: CudaFunction,
    qkv_post: CudaFunction,
    attn: CudaFunction,
    silu_mul: CudaFunction,
    /// gemv[mode][log2 warps per row][f32 output]
    gemv: Vec<Vec<[CudaFunction; 2]>>,
    argmax_part: CudaFunction,
    argmax_final: CudaFunction,
}

/// What a projection computes its input from.
#[derive(Clone, Copy)]
enum Input {
    Plain,
    /// RMSNorm with these weights.
    Norm(u64),
    /// SiLU(gate)·up of a gate/up output.
    SiluMul,
}

struct LayerW {
    ln1: u64,
    qkv: u64,
    qkv_bias: u64,
    q_norm: u64,
    k_norm: u64,
    o: u64,
    ln2: u64,
    gate_up: u64,
    down: u64,
}

struct Acts {
    ids: Buf<i32>,
    pos: Buf<i32>,
    slot: Buf<i32>,
    rows: Buf<i32>,
    x: Buf<u16>,
    h: Buf<u16>,
    qkv: Buf<u16>,
    q: Buf<u16>,
    attn: Buf<u16>,
    gu: Buf<u16>,
    act: Buf<u16>,
    xs: Buf<u16>,
    part_o: Buf<f32>,
    part_ml: Buf<f32>,
    counters: Buf<u32>,
    logits: Buf<f32>,
    am_part: Buf<f32>,
    tok: Buf<i32>,
    prob: Buf<f32>,
    cos: Buf<f32>,
    sin: Buf<f32>,
}

pub struct CudaEngine {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    cfg: ModelConfig,
    cu_dtype: cb::cudaDataType,
    _weights: Vec<Buf<u16>>,
    layers: Vec<LayerW>,
    embed: u64,
    lm_head: u64,
    norm: u64,
    kc: Buf<u16>,
    vc: Buf<u16>,
    layer_kv: usize,
    a: Acts,
    _workspace: Buf<u8>,
    max_slots: usize,
    max_len: usize,
    max_tokens: usize,
    max_rows: usize,
    fused: bool,
    use_graphs: bool,
    graphs: HashMap<usize, CudaGraph>,
    h_ids: Vec<i32>,
    h_pos: Vec<i32>,
    h_slot: Vec<i32>,
    h_rows: Vec<i32>,
    last_rows: usize,
}

/// Key splits of attention for a pure decode step of `rows` rows: enough blocks to
/// cover the GPU when there are few rows.
fn splits_for(rows: usize, kv_heads: usize) -> usize {
    264usize.div_ceil(rows * kv_heads).clamp(1, 16)
}

macro_rules! launch {
    ($st:expr, $f:expr, $grid:expr, $block:expr; $($arg:expr),* $(,)?) => {
        launch!($st, $f, $grid, $block, 0; $($arg),*)
    };
    ($st:expr, $f:expr, $grid:expr, $block:expr, $smem:expr; $($arg:expr),* $(,)?) => {{
        let __cfg = LaunchConfig { grid_dim: $grid, block_dim: ($block, 1, 1), shared_mem_bytes: $smem };
        let mut __b = $st.launch_builder($f);
        $( let __arg = $arg; __b.arg(&__arg); )*
        // SAFETY: the kernels' signatures match these arguments, and every address points
        // into an allocation owned by the engine, sized for the largest step.
        unsafe { __b.launch(__cfg) }.map(|_| ()).map_err(derr)
    }};
}

impl CudaEngine {
    pub fn load(l: CudaLoad<'_>) -> Result<Self, DraftError> {
        let c = l.cfg;
        let (h, d, nh, nkv, inter) = (
            c.hidden_size,
            c.head_dim,
            c.num_heads,
            c.num_kv_heads,
            c.intermediate_size,
        );
        if h % 8 != 0
            || d % 8 != 0
            || inter % 8 != 0
            || (nh * d) % 8 != 0
            || ![16, 32, 64, 128, 256].contains(&d)
        {
            return Err(DraftError::Model(format!(
                "the CUDA engine needs hidden/intermediate sizes divisible by 8 and head_dim in 16..256 (got {h}, {inter}, {d}); use f32 for the candle forward"
            )));
        }
        let ctx = CudaContext::new(l.ordinal).map_err(derr)?;
        // SAFETY: the engine uses a single stream, so cross-stream event tracking is moot.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(derr)?;
        let (maj, min) = ctx.compute_capability().map_err(derr)?;
        let defs = format!(
            "#define HIDDEN {h}\n#define NH {nh}\n#define NKV {nkv}\n#define HD {d}\n#define GROUP {}\n\
             #define INTER {inter}\n#define MAX_LEN {}\n#define EPS {:e}f\n#define QK_NORM {}\n#define DT_BF16 {}\n",
            nh / nkv,
            l.max_len,
            c.rms_norm_eps,
            c.qk_norm as i32,
            (l.dtype == DType::BF16) as i32,
        );
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec![
                format!("--gpu-architecture=sm_{maj}{min}"),
                "-std=c++17".into(),
            ],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(format!("{defs}{KERNELS}"), opts)
            .map_err(|e| DraftError::Model(format!("compiling the draft kernels: {e}")))?;
        let module = ctx.load_module(ptx).map_err(derr)?;
        let f = |n: &str| module.load_function(n).map_err(derr);
        let k = Kernels {
            embed: f("embed")?,
            rmsnorm: f("rmsnorm")?,
            qkv_post: f("qkv_post")?,
            attn: f("attn")?,
            silu_mul: f("silu_mul")?,
            gemv: (0..3)
                .map(|m| {
                    [1, 2, 4, 8]
                        .iter()
                        .map(|w| {
                            Ok([
                                f(&format!("gemv_m{m}_w{w}"))?,
                                f(&format!("gemv_m{m}_w{w}_f32"))?,
                            ])
                        })
                        .collect::<Result<Vec<_>, DraftError>>()
                })
                .collect::<Result<_, _>>()?,
            argmax_part: f("argmax_part")?,
            argmax_final: f("argmax_final")?,
        };

        // Weights, with q/k/v and gate/up concatenated into one projection each.
        let w = l.weights;
        let mut owned = Vec::new();
        let mut put = |t: Tensor| -> Result<u64, DraftError> {
            let b = upload(&stream, &bits16(&t)?)?;
            let p = b.p;
            owned.push(b);
            Ok(p)
        };
        let get = |name: &str, shape: &[usize]| w.get(&w.name(name), shape, l.dtype, &Device::Cpu);
        let cat = |ts: &[Tensor]| Tensor::cat(ts, 0).map_err(derr);
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("layers.{i}");
            let proj = |n: &str, o: usize| get(&format!("{p}.self_attn.{n}_proj.weight"), &[o, h]);
            let qkv = cat(&[proj("q", nh * d)?, proj("k", nkv * d)?, proj("v", nkv * d)?])?;
            let bias = |n: &str, o: usize| get(&format!("{p}.self_attn.{n}_proj.bias"), &[o]);
            let qkv_bias = if w.has(&w.name(&format!("{p}.self_attn.q_proj.bias"))) {
                put(cat(&[
                    bias("q", nh * d)?,
                    bias("k", nkv * d)?,
                    bias("v", nkv * d)?,
                ])?)?
            } else {
                0
            };
            let mlp = |n: &str| get(&format!("{p}.mlp.{n}_proj.weight"), &[inter, h]);
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    put(get(&format!("{p}.self_attn.q_norm.weight"), &[d])?)?,
                    put(get(&format!("{p}.self_attn.k_norm.weight"), &[d])?)?,
                )
            } else {
                (0, 0)
            };
            layers.push(LayerW {
                ln1: put(get(&format!("{p}.input_layernorm.weight"), &[h])?)?,
                qkv: put(qkv)?,
                qkv_bias,
                q_norm,
                k_norm,
                o: put(get(&format!("{p}.self_attn.o_proj.weight"), &[h, nh * d])?)?,
                ln2: put(get(&format!("{p}.post_attention_layernorm.weight"), &[h])?)?,
                gate_up: put(cat(&[mlp("gate")?, mlp("up")?])?)?,
                down: put(get(&format!("{p}.mlp.down_proj.weight"), &[h, inter])?)?,
            });
        }
        let embed = put(get("embed_tokens.weight", &[c.vocab_size, h])?)?;
        let lm_name = w.lm_head_name();
        let lm_head = if lm_name == w.name("embed_tokens.weight") {
            embed
        } else {
            put(w.get(&lm_name, &[c.vocab_size, h], l.dtype, &Device::Cpu)?)?
        };
        let norm = put(get("norm.weight", &[h])?)?;

        let slots = l.max_slots + 1; // the last one takes the padding rows of a graph step
        let layer_kv = slots * l.max_len * nkv * d;
        let kc = alloc::<u16>(&stream, c.num_layers * layer_kv)?;
        let vc = alloc::<u16>(&stream, c.num_layers * layer_kv)?;
        let max_rows = l.max_slots.max(1);
        let max_tokens = l.max_step_tokens.max(
            *BUCKETS
                .iter()
                .find(|&&b| b >= max_rows)
                .unwrap_or(&max_rows),
        );
        let max_rows_padded = max_tokens.min(
            BUCKETS
                .iter()
                .copied()
                .find(|&b| b >= max_rows)
                .unwrap_or(max_rows),
        );
        let part_rows = (1..=max_rows_padded)
            .map(|b| b * splits_for(b, nkv))
            .max()
            .unwrap_or(1);
        let (cos, sin) = c.rope_tables(l.max_len);
        let t = max_tokens;
        let a = Acts {
            ids: alloc(&stream, t)?,
            pos: alloc(&stream, t)?,
            slot: alloc(&stream, t)?,
            rows: alloc(&stream, t)?,
            x: alloc(&stream, t * h)?,
            h: alloc(&stream, t * h)?,
            qkv: alloc(&stream, t * (nh + 2 * nkv) * d)?,
            q: alloc(&stream, t * nh * d)?,
            attn: alloc(&stream, t * nh * d)?,
            gu: alloc(&stream, t * 2 * inter)?,
            act: alloc(&stream, t * inter)?,
            xs: alloc(&stream, max_rows_padded * h)?,
            part_o: alloc(&stream, part_rows * nh * d)?,
            part_ml: alloc(&stream, part_rows * nh * 2)?,
            counters: alloc(&stream, t * nkv)?,
            logits: alloc(&stream, max_rows_padded * c.vocab_size)?,
            am_part: alloc(&stream, max_rows_padded * ARGMAX_BLOCKS * 3)?,
            tok: alloc(&stream, max_rows_padded)?,
            prob: alloc(&stream, max_rows_padded)?,
            cos: upload(&stream, &cos)?,
            sin: upload(&stream, &sin)?,
        };
        let blas = CudaBlas::new(stream.clone()).map_err(derr)?;
        let workspace = alloc::<u8>(&stream, 32 << 20)?;
        // SAFETY: the workspace outlives the handle's use (both belong to the engine); a
        // fixed workspace keeps cuBLAS from allocating while a graph is captured.
        let st =
            unsafe { cb::cublasSetWorkspace_v2(*blas.handle(), workspace.p as *mut _, 32 << 20) };
        if st != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(derr(st));
        }
        let fused = std::env::var("SPECD_DRAFT_FUSED")
            .map(|v| v != "0")
            .unwrap_or(true);
        stream.synchronize().map_err(derr)?;
        Ok(Self {
            stream,
            blas,
            k,
            cfg: c.clone(),
            cu_dtype: if l.dtype == DType::BF16 {
                cb::cudaDataType::CUDA_R_16BF
            } else {
                cb::cudaDataType::CUDA_R_16F
            },
            _weights: owned,
            layers,
            embed,
            lm_head,
            norm,
            kc,
            vc,
            layer_kv,
            a,
            _workspace: workspace,
            max_slots: l.max_slots,
            max_len: l.max_len,
            max_tokens,
            max_rows: max_rows_padded,
            fused,
            use_graphs: l.graphs,
            graphs: HashMap::new(),
            h_ids: Vec::new(),
            h_pos: Vec::new(),
            h_slot: Vec::new(),
            h_rows: Vec::new(),
            last_rows: 0,
        })
    }

    fn fused_gemv(&self, n: usize, k: usize) -> bool {
        self.fused && n == 1 && k <= GEMV_MAX_K
    }

    /// y[n, o] (+)= in(x)[n, k] · W[o, k]ᵀ, where `in` is `input` applied to x.
    #[allow(clippy::too_many_arguments)]
    fn proj(
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
        let st = &self.stream;
        if self.fused_gemv(n, k) {
            // Enough blocks to cover the GPU: small outputs split each row over warps.
            let wpr = [1usize, 2, 4, 8]
                .into_iter()
                .find(|w| o * w / 8 >= 264)
                .unwrap_or(8);
            let (mode, nw) = match input {
                Input::Plain => (0, 0u64),
                Input::Norm(nw) => (1, nw),
                Input::SiluMul => (2, 0),
            };
            let f = &self.k.gemv[mode][wpr.trailing_zeros() as usize][out_f32 as usize];
            let grid = (o.div_ceil(8 / wpr) as u32, 1, 1);
            return launch!(st, f, grid, 256, (k * 4) as u32; w, x, nw, y, o as i32, k as i32, accumulate as i32);
        }
        let x = match input {
            Input::Plain => x,
            Input::Norm(nw) => {
                launch!(st, &self.k.rmsnorm, (n as u32, 1, 1), 256; x, nw, self.a.h.p, 0u64)?;
                self.a.h.p
            }
            Input::SiluMul => {
                let blocks = (n * k).div_ceil(256).min(132 * 8) as u32;
                launch!(st, &self.k.silu_mul, (blocks, 1, 1), 256; x, self.a.act.p, n as i32)?;
                self.a.act.p
            }
        };
        self.gemm(w, x, y, o, k, n, accumulate, out_f32)
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
    fn encode(&self, nt: usize, nr: usize, splits: usize) -> Result<(), DraftError> {
        let c = &self.cfg;
        let (h, d, nh, nkv, inter) = (
            c.hidden_size,
            c.head_dim,
            c.num_heads,
            c.num_kv_heads,
            c.intermediate_size,
        );
        let a = &self.a;
        let st = &self.stream;
        let ntu = nt as u32;
        launch!(st, &self.k.embed, (ntu, 1, 1), 128; a.ids.p, self.embed, a.x.p)?;
        let scale = 1f32 / (d as f32).sqrt();
        for (i, l) in self.layers.iter().enumerate() {
            let (kc, vc) = (
                self.kc.p + (i * self.layer_kv * 2) as u64,
                self.vc.p + (i * self.layer_kv * 2) as u64,
            );
            self.proj(
                l.qkv,
                a.x.p,
                a.qkv.p,
                (nh + 2 * nkv) * d,
                h,
                nt,
                Input::Norm(l.ln1),
                false,
                false,
            )?;
            launch!(st, &self.k.qkv_post, (ntu, 1, 1), 256;
                a.qkv.p, l.qkv_bias, l.q_norm, l.k_norm, a.cos.p, a.sin.p, a.pos.p, a.slot.p, a.q.p, kc, vc)?;
            launch!(st, &self.k.attn, (ntu, nkv as u32, splits as u32), 128;
                a.q.p, kc, vc, a.pos.p, a.slot.p, a.attn.p, a.part_o.p, a.part_ml.p, a.counters.p, scale)?;
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
            )?;
            self.proj(
                l.gate_up,
                a.x.p,
                a.gu.p,
                2 * inter,
                h,
                nt,
                Input::Norm(l.ln2),
                false,
                false,
            )?;
            self.proj(
                l.down,
                a.gu.p,
                a.x.p,
                h,
                inter,
                nt,
                Input::SiluMul,
                true,
                false,
            )?;
        }
        // Final norm of the sampled rows, then the output projection.
        if self.fused_gemv(nr, h) {
            let row = self.h_rows.first().copied().unwrap_or(0) as u64;
            let x = a.x.p + row * (h as u64) * 2;
            self.proj(
                self.lm_head,
                x,
                a.logits.p,
                c.vocab_size,
                h,
                1,
                Input::Norm(self.norm),
                false,
                true,
            )?;
        } else {
            launch!(st, &self.k.rmsnorm, (nr as u32, 1, 1), 256; a.x.p, self.norm, a.xs.p, a.rows.p)?;
            self.gemm(
                self.lm_head,
                a.xs.p,
                a.logits.p,
                c.vocab_size,
                h,
                nr,
                false,
                true,
            )?;
        }
        launch!(st, &self.k.argmax_part, (nr as u32, ARGMAX_BLOCKS as u32, 1), 256; a.logits.p, c.vocab_size as i32, a.am_part.p)?;
        launch!(st, &self.k.argmax_final, (nr as u32, 1, 1), 32; a.am_part.p, ARGMAX_BLOCKS as i32, a.tok.p, a.prob.p)
    }

    fn upload_inputs(&mut self, n: usize, nr: usize) -> Result<(), DraftError> {
        let st = &self.stream;
        let copy = |src: &[i32], dst: u64| -> Result<(), DraftError> {
            // SAFETY: dst is an engine-owned buffer of at least max_tokens i32 and
            // src.len() <= max_tokens (checked by the caller).
            unsafe { result::memcpy_htod_async(dst, src, st.cu_stream()) }.map_err(derr)
        };
        copy(&self.h_ids[..n], self.a.ids.p)?;
        copy(&self.h_pos[..n], self.a.pos.p)?;
        copy(&self.h_slot[..n], self.a.slot.p)?;
        copy(&self.h_rows[..nr], self.a.rows.p)
    }

    fn download(&self, nr: usize) -> Result<Vec<Sample>, DraftError> {
        let mut tok = vec![0i32; nr];
        let mut prob = vec![0f32; nr];
        // SAFETY: tok/prob hold at least nr entries on the device and on the host.
        unsafe {
            result::memcpy_dtoh_async(&mut tok, self.a.tok.p, self.stream.cu_stream())
                .map_err(derr)?;
            result::memcpy_dtoh_async(&mut prob, self.a.prob.p, self.stream.cu_stream())
                .map_err(derr)?;
        }
        self.stream.synchronize().map_err(derr)?;
        Ok(tok
            .into_iter()
            .zip(prob)
            .map(|(t, p)| Sample {
                token: t as u32,
                prob: p,
            })
            .collect())
    }

    fn capture(&self, bucket: usize, splits: usize) -> Result<CudaGraph, DraftError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(derr)?;
        let queued = self.encode(bucket, bucket, splits);
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
        let decode = rows.iter().all(|r| r.tokens.len() == 1);
        let bucket = BUCKETS
            .iter()
            .copied()
            .find(|&b| b >= rows.len() && b <= self.max_rows);
        let n = if decode { bucket.unwrap_or(nt) } else { nt };
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
        let nr = if decode { n } else { rows.len() };
        self.upload_inputs(n, nr)?;
        let splits = if decode {
            splits_for(n, self.cfg.num_kv_heads)
        } else {
            1
        };
        let graphed = decode && self.use_graphs && bucket.is_some();
        let mut samples = if graphed && self.graphs.contains_key(&n) {
            self.graphs[&n].launch().map_err(derr)?;
            self.download(nr)?
        } else {
            self.encode(n, nr, splits)?;
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
}
