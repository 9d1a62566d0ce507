//! CUDA engine: the model forward as a fixed sequence of NVRTC-compiled kernels and
//! GEMMs over preallocated buffers, so that a decode step can be captured once per batch
//! size and replayed as a CUDA graph.
//!
//! A one-token step (batch 1, the common drafting case) runs five kernels a layer:
//! GEMVs that compute their own input (RMSNorm) and epilogue (q/k/v bias + rotation +
//! cache write; silu(gate)·up; the residual add), and attention; each issues its weight
//! loads before waiting for its predecessor (programmatic dependent launch), so weights
//! stream in while the previous kernel runs. Larger steps run, per layer: RMSNorm, QKV
//! projection, one kernel for bias + qk-norm + rotation + cache write, attention (split
//! over the keys for small batches, the last block merging the splits), output
//! projection with the residual added in place, RMSNorm, gate/up projection, SiLU·mul,
//! down projection with the residual added in place; projections through cuBLAS.
//! `SPECD_DRAFT_FUSED=0` runs one-token steps that way too. Decode steps of a few streams
//! run on tensor-core kernels instead (`tune::tc_max_streams`), five kernels a layer:
//! each RMSNorm scales by a per-token sum of squares that the kernel writing the
//! residual stream accumulated.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use cudarc::cublas::{sys as cb, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};

use super::config::ModelConfig;
use super::weights::Weights;
use crate::draft::DraftError;

/// Batch sizes with a captured decode graph; a decode step is padded to the next one.
const BUCKETS: [usize; 10] = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64];
/// Decode steps one run may queue (`SPECD_DRAFT_CHAIN` lowers it; 1 turns runs off).
const MAX_CHAIN: usize = 8;
/// Blocks per row of the two-pass greedy sampling.
const ARGMAX_BLOCKS: usize = 64;

/// (hidden size, head_dim, query heads, key/value heads, intermediate size).
fn dims(c: &ModelConfig) -> (usize, usize, usize, usize, usize) {
    (
        c.hidden_size,
        c.head_dim,
        c.num_heads,
        c.num_kv_heads,
        c.intermediate_size,
    )
}

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
    embed_next: CudaFunction,
    rmsnorm: CudaFunction,
    qkv_post: CudaFunction,
    attn: CudaFunction,
    /// Attention over about half a group's query heads a block (`att_half_heads`).
    attn_half: CudaFunction,
    /// Attention over `att_few_heads` query heads of a group a block.
    attn_few: CudaFunction,
    /// Decode attention on tensor cores (attn_tc.cu), whole groups.
    attn_tc: CudaFunction,
    silu_mul: CudaFunction,
    /// The one-token projections, indexed by `Role`.
    gemv: Vec<CudaFunction>,
    argmax_part: CudaFunction,
    argmax_final: CudaFunction,
    argmax_final_block: CudaFunction,
    /// The multi-token projections: tc[`TcRole`][index in `TC_TILES`].
    tc: Vec<Vec<CudaFunction>>,
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

/// Where a step takes its token ids and leaves its samples.
#[derive(Clone, Copy)]
struct StepIo {
    /// The samples of the chained step before (whose positions advance by one) instead
    /// of the uploaded ids.
    prev_tok: Option<u64>,
    tok: u64,
    prob: u64,
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
    /// A step's inputs, uploaded in one copy: ids, positions, slots (max_tokens each),
    /// then the sampled rows; `ids`..`rows` address its parts.
    inp: Buf<i32>,
    ids: u64,
    pos: u64,
    slot: u64,
    rows: u64,
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
    /// Sampled tokens (i32), then their probabilities (f32), max_rows each: one download.
    out: Buf<u32>,
    tok: u64,
    prob: u64,
    /// Samples of a run's decode steps: tokens of step j at j * max_rows, then the
    /// probabilities at (MAX_CHAIN + j) * max_rows.
    chain: Buf<u32>,
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
    /// One-token steps run the `gemv_*` kernels instead of norms + cuBLAS.
    fused: bool,
    tune: GemvTune,
    /// Decode steps of 2..=tc_max tokens run the `tc_*` kernels instead of cuBLAS
    /// (`tune::tc_max_streams`; 0 where widths are not divisible by 32).
    tc_max: usize,
    tc_tune: TcTune,
    /// Decode steps of tc_max+1..=64 tokens run these projections on the `tc_*` kernels.
    mix: Mix,
    /// Per-token sums of squares of the residual stream for the tensor-core step's
    /// RMSNorms: [2][max_tokens], alternately written (embed, o / down projections) and
    /// read (q/k/v and output projections / gate/up).
    ss: Buf<f32>,
    /// Launch with programmatic dependent launch: a kernel's blocks are scheduled while
    /// the one before it finishes, and wait for it on the device (`pdl_enter`).
    pdl: bool,
    /// Threads of an attention block: keys it scores at once (`tune::att_threads`).
    att_threads: u32,
    /// Fewest keys per attention split in decode steps of several streams
    /// (`SPECD_DRAFT_ATT_SPLIT` overrides).
    att_split: i32,
    /// Query heads of a group an `attn_few` block takes (`tune::att_few_heads`; None:
    /// every step takes whole groups).
    att_few_heads: Option<usize>,
    /// Decode steps of at least this many rows take `attn_tc` (None: never).
    att_tc_rows: Option<usize>,
    /// Threads of an `attn_tc` block.
    att_tc_threads: u32,
    /// Multiprocessors of the device, to size grids.
    sms: usize,
    use_graphs: bool,
    graphs: HashMap<usize, CudaGraph>,
    /// Decode steps one `decode_while` call runs (1: one at a time).
    chain: usize,
    run: chain::Runs,
    h_ids: Vec<i32>,
    h_pos: Vec<i32>,
    h_slot: Vec<i32>,
    h_rows: Vec<i32>,
    h_in: Vec<i32>,
    last_rows: usize,
}

macro_rules! launch {
    ($e:expr, $f:expr, $grid:expr, $block:expr; $($arg:expr),* $(,)?) => {
        launch!($e, $f, $grid, $block, 0; $($arg),*)
    };
    ($e:expr, $f:expr, $grid:expr, $block:expr, $smem:expr; $($arg:expr),* $(,)?) => {{
        let mut __params: Vec<*mut std::ffi::c_void> = Vec::new();
        $( let __arg = $arg; __params.push(&__arg as *const _ as *mut std::ffi::c_void); )*
        // SAFETY: the kernels' signatures match these arguments (each pointer addresses
        // one of them, alive until the launch returns), and every address passed points
        // into an allocation owned by the engine, sized for the largest step.
        unsafe { $e.launch_raw($f, $grid, $block, $smem, &mut __params) }
    }};
}
mod chain;
mod exec;
mod io;
mod mixed;
mod tc_step;
mod tune;
use tune::{
    att_few_heads, att_half_heads, att_heads_for, att_min_split, att_prefetch, att_shared_bytes,
    att_tc_min_rows, att_tc_warps, att_threads, kernel_source, splits_for, tc_max_streams,
    tc_tiles, GemvTune, LmPath, Mix, MixRoles, Role, TcRole, TcTune, ATT_SHARED_MAX, ROLE_KERNELS,
    TC_KERNELS, TC_TILES,
};

impl CudaEngine {
    pub fn load(l: CudaLoad<'_>) -> Result<Self, DraftError> {
        let c = l.cfg;
        let (h, d, nh, nkv, inter) = dims(c);
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
        // Programmatic dependent launch needs sm_90 (Hopper) or newer.
        let pdl = maj >= 9 && std::env::var("SPECD_DRAFT_PDL").map_or(true, |v| v != "0");
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(derr)?
            .max(1) as usize;
        let group = nh / nkv;
        if att_shared_bytes(group, d, 128) > ATT_SHARED_MAX {
            return Err(DraftError::Model(format!(
                "the CUDA engine does not support {group} query heads per key/value head of \
                 dimension {d}; use f32 for the candle forward"
            )));
        }
        let tune = GemvTune::new(c);
        let tc_tune = TcTune::from_env(h);
        let att_few_heads = att_few_heads(group);
        let att_threads = att_threads(group, d);
        let att_tc_warps = att_tc_warps();
        // mma.sync on bf16/f16 needs sm_80.
        let att_tc_rows = att_tc_min_rows(group, d, att_tc_warps).filter(|_| maj >= 8);
        let defs = format!(
            "#define HIDDEN {h}\n#define NH {nh}\n#define NKV {nkv}\n#define HD {d}\n#define GROUP {}\n\
             #define INTER {inter}\n#define MAX_LEN {}\n#define EPS {:e}f\n#define QK_NORM {}\n#define DT_BF16 {}\n\
             #define PDL {}\n#define ATT_PREFETCH {}\n#define ATT_THREADS {att_threads}\n\
             #define ATT_HEADS {}\n#define ATT_HALF {}\n#define ATC_WARPS {att_tc_warps}\n{}",
            nh / nkv,
            l.max_len,
            c.rms_norm_eps,
            c.qk_norm as i32,
            (l.dtype == DType::BF16) as i32,
            pdl as i32,
            att_prefetch(d),
            att_few_heads.unwrap_or(1),
            att_half_heads(group),
            tune.defines() + &tc_tune.defines(),
        );
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec![
                format!("--gpu-architecture=sm_{maj}{min}"),
                "-std=c++17".into(),
            ],
            ..Default::default()
        };
        let src = kernel_source()?;
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(format!("{defs}{src}"), opts)
            .map_err(|e| DraftError::Model(format!("compiling the draft kernels: {e}")))?;
        let module = ctx.load_module(ptx).map_err(derr)?;
        let f = |n: &str| module.load_function(n).map_err(derr);
        let k = Kernels {
            embed: f("embed")?,
            embed_next: f("embed_next")?,
            rmsnorm: f("rmsnorm")?,
            qkv_post: f("qkv_post")?,
            attn: f("attn")?,
            attn_half: f("attn_half")?,
            attn_few: f("attn_few")?,
            attn_tc: f("attn_tc")?,
            silu_mul: f("silu_mul")?,
            gemv: ROLE_KERNELS
                .iter()
                .map(|n| f(n))
                .collect::<Result<_, _>>()?,
            argmax_part: f("argmax_part")?,
            argmax_final: f("argmax_final")?,
            argmax_final_block: f("argmax_final_block")?,
            tc: TC_KERNELS
                .iter()
                .map(|n| {
                    TC_TILES
                        .iter()
                        .map(|t| f(&format!("{n}_t{t}")))
                        .collect::<Result<Vec<_>, _>>()
                })
                .collect::<Result<_, _>>()?,
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
            .map(|b| b * splits_for(b, nkv, sms))
            .max()
            .unwrap_or(1);
        let (cos, sin) = c.rope_tables(l.max_len);
        let t = max_tokens;
        let inp = alloc::<i32>(&stream, 4 * t)?;
        let out = alloc::<u32>(&stream, 2 * max_rows_padded)?;
        let a = Acts {
            ids: inp.p,
            pos: inp.p + 4 * t as u64,
            slot: inp.p + 8 * t as u64,
            rows: inp.p + 12 * t as u64,
            inp,
            tok: out.p,
            prob: out.p + 4 * max_rows_padded as u64,
            out,
            chain: alloc(&stream, 2 * MAX_CHAIN * max_rows_padded)?,
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
            // Up to one counter per query head (attn_few with one head a block).
            counters: alloc(&stream, t * nh)?,
            logits: alloc(&stream, max_rows_padded * c.vocab_size)?,
            am_part: alloc(
                &stream,
                (max_rows_padded * ARGMAX_BLOCKS)
                    .max(tune.lm_blocks(c.vocab_size))
                    .max(
                        max_rows_padded
                            * (0..TC_TILES.len())
                                .map(|t| tc_tune.launch(TcRole::Lm, c.vocab_size, t).0 as usize)
                                .max()
                                .unwrap_or(0),
                    )
                    * 3,
            )?,
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
        let fused = std::env::var("SPECD_DRAFT_FUSED").map_or(true, |v| v != "0");
        let tc_max = if [h, nh * d, inter].iter().all(|k| k % 32 == 0) {
            tc_max_streams(h)
        } else {
            0
        };
        // SPECD_DRAFT_TC=0 turns the tensor-core kernels off in every step.
        let mix = if tc_max > 0 {
            Mix::from_env()
        } else {
            Mix::NONE
        };
        let ss = alloc::<f32>(&stream, 2 * max_tokens)?;
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
            tune,
            tc_max,
            tc_tune,
            mix,
            ss,
            att_threads,
            att_few_heads,
            att_tc_rows,
            att_tc_threads: 32 * att_tc_warps as u32,
            att_split: std::env::var("SPECD_DRAFT_ATT_SPLIT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(att_min_split(att_threads))
                .max(1),
            pdl,
            sms,
            use_graphs: l.graphs,
            graphs: HashMap::new(),
            chain: std::env::var("SPECD_DRAFT_CHAIN")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(MAX_CHAIN)
                .min(MAX_CHAIN)
                .min(l.max_len)
                .max(1),
            run: chain::Runs::default(),
            h_ids: Vec::new(),
            h_pos: Vec::new(),
            h_slot: Vec::new(),
            h_rows: Vec::new(),
            h_in: Vec::new(),
            last_rows: 0,
        })
    }

    /// The attention kernel of a step of `rows` rows (tokens; `decode`: one a slot), its
    /// blocks a row and split (`att_heads_for`) and its threads.
    fn att(&self, rows: usize, decode: bool) -> (&CudaFunction, u32, u32) {
        let (nkv, group) = (
            self.cfg.num_kv_heads,
            self.cfg.num_heads / self.cfg.num_kv_heads,
        );
        if decode && self.att_tc_rows.is_some_and(|r| rows >= r) {
            return (&self.k.attn_tc, nkv as u32, self.att_tc_threads);
        }
        let heads = att_heads_for(rows, nkv, group, self.att_few_heads, self.sms);
        let f = if heads == group {
            &self.k.attn
        } else if Some(heads) == self.att_few_heads {
            &self.k.attn_few
        } else {
            &self.k.attn_half
        };
        (f, (nkv * group.div_ceil(heads)) as u32, self.att_threads)
    }

    /// Key splits of attention for a pure decode step of `rows` rows.
    fn att_splits(&self, rows: usize) -> usize {
        splits_for(rows, self.att(rows, true).1 as usize, self.sms)
    }
}
