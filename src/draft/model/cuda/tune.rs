//! Choices the one-token kernels are compiled with: the GEMV shapes per projection, what
//! attention prefetches, and the kernel source.

use super::ModelConfig;
use crate::draft::DraftError;

/// The kernel sources, compiled as one module when the model loads.
const KERNELS: [(&str, &str); 4] = [
    ("kernels.cu", include_str!("../kernels.cu")),
    ("gemv.cu", include_str!("../gemv.cu")),
    ("mma.cu", include_str!("../mma.cu")),
    ("attn_tc.cu", include_str!("../attn_tc.cu")),
];

/// The one-token projection kernels (`gemv_*` in kernels.cu), in `Kernels::gemv` order.
#[derive(Clone, Copy)]
pub(super) enum Role {
    /// q/k/v with the input RMSNorm (models with qk-norm: `qkv_post` follows).
    Qkv = 0,
    /// q/k/v with the input RMSNorm, bias, rotation and cache write in the epilogue.
    QkvRope = 1,
    O = 2,
    /// gate/up with the RMSNorm, writing silu(gate)·up.
    GateUp = 3,
    Down = 4,
    /// Output projection with the final RMSNorm and per-block argmax partials.
    Lm = 5,
}

pub(super) const ROLE_KERNELS: [&str; 6] = [
    "gemv_qkv",
    "gemv_qkv_rope",
    "gemv_o",
    "gemv_gate_up",
    "gemv_down",
    "gemv_lm",
];

/// Output units per warp (R) and warps per unit (S) of each one-token projection:
/// enough blocks to cover the GPU and bytes in flight per warp, few registers.
#[derive(Clone, Copy, Debug)]
pub(super) struct GemvTune {
    qkv: (usize, usize),
    o: (usize, usize),
    gate_up: (usize, usize),
    down: (usize, usize),
    lm: (usize, usize),
}

impl GemvTune {
    pub(super) fn new(c: &ModelConfig) -> Self {
        let mut t = Self {
            qkv: (1, 1),
            o: (1, 1),
            gate_up: (1, 1),
            down: (1, 4),
            lm: (if c.hidden_size > 1024 { 2 } else { 4 }, 1),
        };
        // Wide shapes (Qwen2.5-1.5B: 1536 / 8960): two rows per warp for gate/up and down
        // (1.222 -> 1.183 ms per token at batch 1, measured on an NVIDIA H200).
        if c.hidden_size > 1024 {
            t.gate_up = (2, 1);
        }
        if c.intermediate_size > 6144 {
            t.down = (2, 8);
        }
        // SPECD_DRAFT_GEMV="down=1x8,lm=2x1" overrides them (tuning on another GPU).
        if let Ok(v) = std::env::var("SPECD_DRAFT_GEMV") {
            for item in v.split(',') {
                if let Some((role, rs)) = parse_tune(item) {
                    match role {
                        "qkv" => t.qkv = rs,
                        "o" => t.o = rs,
                        "gate_up" => t.gate_up = rs,
                        "down" => t.down = rs,
                        "lm" => t.lm = rs,
                        _ => {}
                    }
                }
            }
        }
        t
    }

    pub(super) fn of(&self, role: Role) -> (usize, usize) {
        match role {
            Role::Qkv | Role::QkvRope => self.qkv,
            Role::O => self.o,
            Role::GateUp => self.gate_up,
            Role::Down => self.down,
            Role::Lm => self.lm,
        }
    }

    /// Blocks of the output projection over `vocab` rows (one argmax partial each).
    pub(super) fn lm_blocks(&self, vocab: usize) -> usize {
        vocab.div_ceil(self.lm.0 * (8 / self.lm.1))
    }

    pub(super) fn defines(&self) -> String {
        [
            ("QKV", self.qkv),
            ("O", self.o),
            ("GU", self.gate_up),
            ("DOWN", self.down),
            ("LM", self.lm),
        ]
        .iter()
        .map(|(n, (r, s))| format!("#define GEMV_{n}_R {r}\n#define GEMV_{n}_S {s}\n"))
        .collect()
    }
}

/// The kernels' source; `SPECD_DRAFT_KERNELS=DIR` reads the files from DIR instead
/// (kernel development without a rebuild).
pub(super) fn kernel_source() -> Result<String, DraftError> {
    let dir = std::env::var("SPECD_DRAFT_KERNELS").ok();
    let mut src = String::new();
    for (name, text) in KERNELS {
        match &dir {
            Some(d) => {
                let path = std::path::Path::new(d).join(name);
                src += &std::fs::read_to_string(&path)
                    .map_err(|e| DraftError::Model(format!("reading {}: {e}", path.display())))?;
            }
            None => src += text,
        }
        src.push('\n');
    }
    Ok(src)
}

/// What attention loads before waiting for its predecessor: 0 nothing, 1 the first
/// chunk's keys, 2 its values too (registers: values only up to head_dim 64).
/// `SPECD_DRAFT_ATT_PREFETCH` overrides.
pub(super) fn att_prefetch(head_dim: usize) -> u32 {
    let default = if head_dim <= 64 {
        2
    } else if head_dim <= 128 {
        1
    } else {
        0
    };
    std::env::var("SPECD_DRAFT_ATT_PREFETCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, |v: u32| if head_dim > 128 { 0 } else { v.min(2) })
}

/// Fewest keys per attention split: two chunks of `threads` keys (`MIN_SPLIT` in
/// kernels.cu); a shorter split saves nothing and costs a merge.
pub(super) fn att_min_split(threads: u32) -> i32 {
    2 * threads as i32
}

/// Static shared memory the attention kernel may declare (48 KB, less its small scalars).
pub(super) const ATT_SHARED_MAX: usize = 46 * 1024;

/// Static shared memory of the attention kernel for a query group of `group` heads of
/// `head_dim` and `threads` threads: the queries, the scores and the per-warp sums (f32).
pub(super) fn att_shared_bytes(group: usize, head_dim: usize, threads: usize) -> usize {
    4 * group * (head_dim * (threads / 32 + 1) + threads)
}

/// Threads of an attention block, the keys it scores at once (`SPECD_DRAFT_ATT_THREADS`:
/// 128 or 256). With 256 a context of up to 256 keys takes one chunk instead of two, and
/// one of up to 512 needs no split merge: 0.567 -> 0.526 ms per token at batch 1 and
/// 1.166 -> 1.092 ms per step at 32 streams on the Qwen2.5-0.5B shape, 1.213 -> 1.108 ms
/// at batch 1 on the 1.5B shape (measured on an NVIDIA H200). 128 where the block's shared
/// memory for 256 would pass the 48 KB a kernel may declare (8 warps' partial sums of the
/// whole query group: head_dim 256 with 8 query heads per key/value head).
pub(super) fn att_threads(group: usize, head_dim: usize) -> u32 {
    let default = if att_shared_bytes(group, head_dim, 256) <= ATT_SHARED_MAX {
        256
    } else {
        128
    };
    std::env::var("SPECD_DRAFT_ATT_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n == 128 || (*n == 256 && default == 256))
        .unwrap_or(default)
}

/// Key splits of attention for a pure decode step of `rows` rows, each taking
/// `head_blocks` blocks a split: enough blocks to cover the GPU when there are few rows.
pub(super) fn splits_for(rows: usize, head_blocks: usize, sms: usize) -> usize {
    (2 * sms).div_ceil(rows * head_blocks).clamp(1, 16)
}

/// Query heads an `attn_half` block takes: half the group, rounded up to a power of two
/// (4 + 3 heads for a group of 7, 4 + 2 for 6). On the Qwen2.5-1.5B shape (6 heads of
/// dimension 128) blocks of 3 + 3 heads measured slower than 4 + 2: 1.730 against 1.610 ms
/// per step at 16 streams, 1.570 against 1.482 at 8 (NVIDIA H200).
pub(super) fn att_half_heads(group: usize) -> usize {
    group.div_ceil(2).next_power_of_two().min(group)
}

/// Query heads a block of a step of `rows` rows takes attention over: the fewest of
/// `few`, `att_half_heads` and the group for which the step's blocks (rows ×
/// key/value heads × blocks a group) fill at most half the `sms` multiprocessors. A block
/// of a whole group leaves most of the GPU idle at a few streams (two blocks a token for
/// Qwen2.5's two key/value heads); at many its blocks already fill it, and splitting the
/// group only reads the keys and values again. Measured on an NVIDIA H200 (132
/// multiprocessors; docs/draft-model.md, "Attention of a few streams over more blocks"):
/// one head a block up to 4 streams, half a group at 8 and 16, whole groups at 32.
pub(super) fn att_heads_for(
    rows: usize,
    kv_heads: usize,
    group: usize,
    few: Option<usize>,
    sms: usize,
) -> usize {
    let Some(few) = few else { return group };
    [few, att_half_heads(group)]
        .into_iter()
        .filter(|&h| h < group && rows * kv_heads * group.div_ceil(h) <= sms / 2)
        .min()
        .unwrap_or(group)
}

/// Warps of a tensor-core attention block (`attn_tc`; `SPECD_DRAFT_ATT_TC_WARPS`: 2, 4 or
/// 8). Eight: 0.940 ms per step against 0.998 with four at 32 streams on the Qwen2.5-0.5B
/// shape (NVIDIA H200).
pub(super) fn att_tc_warps() -> usize {
    std::env::var("SPECD_DRAFT_ATT_TC_WARPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| [2, 4, 8].contains(n))
        .unwrap_or(8)
}

/// Decode steps of at least this many rows take attention on tensor cores (`attn_tc`),
/// where the shape allows it: at most 8 query heads a key/value head, head_dim a multiple
/// of 64, and its shared memory within the static limit (`SPECD_DRAFT_ATT_TC`: 0 off,
/// N from N rows).
pub(super) fn att_tc_min_rows(group: usize, head_dim: usize, warps: usize) -> Option<usize> {
    let fits =
        group <= 8 && head_dim % 64 == 0 && 4 * warps * group * (head_dim + 2) <= ATT_SHARED_MAX;
    let rows = std::env::var("SPECD_DRAFT_ATT_TC")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(ATT_TC_MIN_ROWS);
    (fits && rows > 0).then_some(rows)
}

/// Default of `att_tc_min_rows`: steps of two token tiles (17 to 32 streams). At 32 streams
/// of 128-256 keys, 0.984-0.992 -> 0.940-0.956 ms per step on the Qwen2.5-0.5B shape; at
/// 1 / 8 / 16 streams `attn_tc` everywhere measured 0.470 / 0.664 / 0.716 against 0.442 /
/// 0.633 / 0.704 (NVIDIA H200, docs/draft-model.md "Decode attention on tensor cores").
const ATT_TC_MIN_ROWS: usize = 17;

/// Query heads of a group (of `group` sharing a key/value head) an `attn_few` block takes
/// (`SPECD_DRAFT_ATT_HEADS`: 1 to `group`, default 1; 0 turns the split groups off, half
/// groups too, so that every step takes whole groups as before).
pub(super) fn att_few_heads(group: usize) -> Option<usize> {
    match std::env::var("SPECD_DRAFT_ATT_HEADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(0) => None,
        Some(n) => Some(n.min(group)),
        None => Some(1),
    }
}

/// `role=RxS` with 1 <= R <= 8 and S one of 1, 2, 4, 8.
fn parse_tune(item: &str) -> Option<(&str, (usize, usize))> {
    let (role, rs) = item.split_once('=')?;
    let (r, s) = rs.split_once('x')?;
    let (r, s): (usize, usize) = (r.trim().parse().ok()?, s.trim().parse().ok()?);
    ((1..=8).contains(&r) && [1, 2, 4, 8].contains(&s)).then_some((role.trim(), (r, s)))
}

/// The multi-token tensor-core projections (`tc_*` in mma.cu), in `Kernels::tc` order.
#[derive(Clone, Copy)]
pub(super) enum TcRole {
    Qkv = 0,
    O = 1,
    GateUp = 2,
    Down = 3,
    Lm = 4,
    /// q/k/v with the bias, rotation and cache write in the epilogue (no qk-norm); tuned
    /// as `Qkv`.
    QkvRope = 5,
    /// `Qkv`, `QkvRope` and `GateUp` of rows an `rmsnorm` already normalized (`MixRoles`).
    QkvPlain = 6,
    QkvRopePlain = 7,
    GateUpPlain = 8,
}

pub(super) const TC_KERNELS: [&str; 9] = [
    "tc_qkv",
    "tc_o",
    "tc_gate_up",
    "tc_down",
    "tc_lm",
    "tc_qkv_rope",
    "tc_qkv_n",
    "tc_qkv_rope_n",
    "tc_gate_up_n",
];

/// The projections a decode step of more streams than the tensor-core step takes
/// (`tc_max_streams`, up to 64) runs on the tensor-core kernels, the others staying on
/// cuBLAS: `SPECD_DRAFT_MIX=qkv,o,gate_up,down` (any of them, for every step size;
/// `none`).
///
/// At 32 streams on the 1.5B shape cuBLAS's gate/up and down are faster than the
/// tensor-core kernels, its q/k/v slower, and a q/k/v kernel that adds the bias, rotates
/// and writes the cache saves `qkv_post`: 1.774-1.880 ms per step on cuBLAS alone,
/// 1.699-1.705 with q/k/v on tensor cores, 1.667-1.683 with the output projection too.
/// At 33 to 64 streams (four token tiles) no mix won in every machine start: q/k/v alone
/// measured 1.926-2.044 ms on the 1.5B shape against 1.919-2.024 on cuBLAS alone, and
/// 1.049-1.094 on the 0.5B shape against 1.056-1.148; so those steps stay on cuBLAS.
/// Measured on an NVIDIA H200, docs/draft-model.md, "A mixed step: q/k/v on tensor cores,
/// the MLP on cuBLAS".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MixRoles {
    pub(super) qkv: bool,
    pub(super) o: bool,
    pub(super) gate_up: bool,
    pub(super) down: bool,
}

/// `MixRoles` per token tile count (`TC_TILES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mix([MixRoles; TC_TILES.len()]);

impl Mix {
    pub(super) const NONE: Mix = Mix([MixRoles::NONE; TC_TILES.len()]);

    pub(super) fn from_env() -> Self {
        match std::env::var("SPECD_DRAFT_MIX") {
            Ok(v) => Mix([MixRoles::parse(&v); TC_TILES.len()]),
            Err(_) => {
                let qkv_o = MixRoles {
                    qkv: true,
                    o: true,
                    ..MixRoles::NONE
                };
                Mix([qkv_o, qkv_o, MixRoles::NONE])
            }
        }
    }

    /// The roles of a decode step of `nt` tokens (none beyond 64).
    pub(super) fn roles(&self, nt: usize) -> MixRoles {
        tc_tiles(nt).map_or(MixRoles::NONE, |i| self.0[i])
    }
}

impl MixRoles {
    pub(super) const NONE: MixRoles = MixRoles {
        qkv: false,
        o: false,
        gate_up: false,
        down: false,
    };

    fn parse(v: &str) -> Self {
        let mut m = Self::NONE;
        for r in v.split(',').map(str::trim) {
            match r {
                "qkv" => m.qkv = true,
                "o" => m.o = true,
                "gate_up" => m.gate_up = true,
                "down" => m.down = true,
                "none" | "" => {}
                other => tracing::warn!(role = other, "SPECD_DRAFT_MIX: unknown projection"),
            }
        }
        m
    }
}
/// Token tiles (of 16) the `tc_*` kernels are compiled for: steps of up to 64 tokens.
pub(super) const TC_TILES: [usize; 3] = [1, 2, 4];

/// The index in `TC_TILES` of the fewest token tiles that hold `nt` tokens.
pub(super) fn tc_tiles(nt: usize) -> Result<usize, DraftError> {
    TC_TILES
        .iter()
        .position(|&t| t * 16 >= nt)
        .ok_or_else(|| DraftError::Model(format!("{nt} tokens for the tensor-core path")))
}

/// Per tensor-core projection and token tile count (`TC_TILES`): tiles of 8 output units per
/// warp (RT), warps summing one tile's k blocks (S), tile groups per block (RG); a block has
/// RG × S warps (<= 16).
#[derive(Clone, Copy, Debug)]
pub(super) struct TcTune {
    shapes: [[TcShape; TC_TILES.len()]; 5],
    /// How the tensor-core step computes the vocabulary projection.
    pub(super) lm: LmPath,
}

/// The vocabulary projection of a tensor-core step (`SPECD_DRAFT_LM=fused|cublas`).
///
/// `tc_lm` normalizes its input on the fly: every warp applies the RMSNorm to each input
/// fragment it loads, so at two token tiles it issues more instructions per weight byte
/// than it can hide and streams the 272 MB of the Qwen2.5-0.5B shape's vocabulary
/// projection at half the DRAM bandwidth (127 µs; Nsight Compute). cuBLAS after one
/// `rmsnorm` streams it at about 80 %: 32 streams 0.958 / 0.962 -> 0.911 / 0.916 ms per
/// step on that shape, 2 to 16 streams the same within 1-2 % on both shapes (measured on
/// an NVIDIA H200; docs/draft-model.md, "The vocabulary projection on cuBLAS").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LmPath {
    /// `tc_lm`, with the RMSNorm fused and the argmax partials in its epilogue.
    Fused,
    /// `rmsnorm`, cuBLAS and `argmax_part`, as steps on cuBLAS do.
    Cublas,
}

/// (RT, S, RG) of one tensor-core kernel.
type TcShape = (usize, usize, usize);

impl TcTune {
    /// The tuning for a model of width `hidden`, then `SPECD_DRAFT_TC_TUNE`'s overrides.
    pub(super) fn from_env(hidden: usize) -> Self {
        // The output projection with four tiles a warp: ms per step at 8 / 32 streams
        // 0.950 / 1.487 -> 0.934 / 1.437 on the Qwen2.5-0.5B shape, 2.004 / 3.466 ->
        // 1.995 / 3.320 on the 1.5B shape. gate/up with one tile over eight warps, so that
        // a warp's weights fit in registers before its wait (mma.cu's TC_ALLW; two tiles
        // over four warps before): 0.809 -> 0.765 ms per step at 16 streams on the 0.5B
        // shape, 1.868 -> 1.717 on the 1.5B shape (measured on an NVIDIA H200).
        let mut shapes = [(1, 8, 1), (1, 8, 1), (1, 8, 1), (1, 16, 1), (4, 2, 2)].map(|v| [v; 3]);
        // q/k/v of two token tiles over sixteen warps where the tensor-core step takes 32
        // streams: its 72 blocks (0.5B shape) fill 72 of the H200's 132 multiprocessors, so
        // shorter chains of loads a warp count. 32 streams on the 0.5B shape: faster in 9 of
        // 10 alternated pairs over two machine starts, by about 1 %; the 1.5B shape's mixed
        // step about 0.6 % slower (measured on an NVIDIA H200; docs/draft-model.md).
        if hidden <= TC_TWO_TILES_MAX_HIDDEN {
            shapes[TcRole::Qkv as usize][1] = (1, 16, 1);
        }
        // SPECD_DRAFT_TC_TUNE="down=1x8x2,lm@2=2x1x8" overrides them, for every tile count
        // or for steps of that many token tiles (`@2`: 17 to 32 streams).
        if let Ok(v) = std::env::var("SPECD_DRAFT_TC_TUNE") {
            for item in v.split(',') {
                if let Some((i, tiles, tune)) = parse_tc_tune(item) {
                    for (j, tt) in TC_TILES.iter().enumerate() {
                        if tiles.is_none_or(|n| n == *tt) {
                            shapes[i][j] = tune;
                        }
                    }
                }
            }
        }
        let lm = match std::env::var("SPECD_DRAFT_LM").as_deref() {
            Ok("fused") => LmPath::Fused,
            _ => LmPath::Cublas,
        };
        Self { shapes, lm }
    }

    /// (grid, threads) of `role` over `units` output units in a step of `tiles` token
    /// tiles (an index into `TC_TILES`).
    pub(super) fn launch(&self, role: TcRole, units: usize, tiles: usize) -> (u32, u32) {
        let (rt, s, rg) = self.shapes[match role {
            TcRole::QkvRope | TcRole::QkvPlain | TcRole::QkvRopePlain => TcRole::Qkv as usize,
            TcRole::GateUpPlain => TcRole::GateUp as usize,
            r => r as usize,
        }][tiles];
        (units.div_ceil(rt * 8 * rg) as u32, (32 * s * rg) as u32)
    }

    pub(super) fn defines(&self) -> String {
        let mut out = String::new();
        for (n, per_tiles) in ["QKV", "O", "GU", "DOWN", "LM"].iter().zip(self.shapes) {
            for (tt, (rt, s, rg)) in TC_TILES.iter().zip(per_tiles) {
                out += &format!(
                    "#define TC_{n}_RT{tt} {rt}\n#define TC_{n}_S{tt} {s}\n#define TC_{n}_RG{tt} {rg}\n"
                );
            }
        }
        out
    }
}

/// `role=RTxSxRG` or `role@TILES=RTxSxRG` of `SPECD_DRAFT_TC_TUNE`: the role's index, the
/// tile count it is for (None: all) and the tuning.
fn parse_tc_tune(item: &str) -> Option<(usize, Option<usize>, TcShape)> {
    let (role, rest) = item.split_once('=')?;
    let (role, tiles) = match role.trim().split_once('@') {
        Some((r, t)) => (r, Some(t.parse().ok().filter(|t| TC_TILES.contains(t))?)),
        None => (role.trim(), None),
    };
    let i = TC_KERNELS[..5].iter().position(|k| k[3..] == *role)?;
    let n: Vec<usize> = rest
        .split('x')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    let [rt, s, rg] = n[..] else { return None };
    ((1..=4).contains(&rt) && s.is_power_of_two() && rg >= 1 && rg * s <= 16).then_some((
        i,
        tiles,
        (rt, s, rg),
    ))
}

/// Decode steps of 2 to this many streams run on the tensor-core kernels (`mma.cu`), larger
/// ones on cuBLAS. `SPECD_DRAFT_TC=0` turns them off, `1` on up to 64 streams, `N` up to N.
pub(super) fn tc_max_streams(hidden: usize) -> usize {
    match std::env::var("SPECD_DRAFT_TC")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(1) => 64,
        Some(n) => n.min(64),
        None if hidden <= TC_TWO_TILES_MAX_HIDDEN => 32,
        None => 16,
    }
}

/// Up to 16 streams the tensor-core step is faster than cuBLAS's on both Qwen2.5 shapes; at
/// 32 (two token tiles) on the 0.5B shape (hidden 896: 1.000 against 1.08-1.19 ms), not on
/// the 1.5B shape (hidden 1536: 2.370 against 1.98-2.07): measured on an NVIDIA H200,
/// docs/draft-model.md "The sums across warps and the epilogue on every warp". Widths in
/// between are not measured; the limit is the power of two between.
const TC_TWO_TILES_MAX_HIDDEN: usize = 1024;
