// Kernels of specd's CUDA draft-model engine, compiled at load time with NVRTC.
// The model's dimensions arrive as macros (HIDDEN, NH, NKV, HD, GROUP, INTER, MAX_LEN,
// EPS, QK_NORM, DT_BF16) so loops have constant bounds. No CUDA headers are needed:
// 16-bit values are stored as unsigned short and converted by hand.

typedef unsigned short u16;
typedef unsigned int u32;

#define LOG2E 1.4426950408889634f
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float to_f(u16 x) {
#if DT_BF16
    return __uint_as_float(((u32)x) << 16);
#else
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(x));
    return f;
#endif
}

__device__ __forceinline__ u16 from_f(float f) {
#if DT_BF16 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // One instruction instead of seven: the tensor-core kernels round every input value.
    u16 h;
    asm("{ cvt.rn.bf16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
#elif DT_BF16
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
#else
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
#endif
}

// Round to the model dtype, as the reference computes in it.
__device__ __forceinline__ float rnd(float f) { return to_f(from_f(f)); }

__device__ __forceinline__ void unpack8(uint4 v, float* f) {
#if DT_BF16
    f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
    f[4] = __uint_as_float(v.z << 16); f[5] = __uint_as_float(v.z & 0xffff0000u);
    f[6] = __uint_as_float(v.w << 16); f[7] = __uint_as_float(v.w & 0xffff0000u);
#else
    f[0] = to_f((u16)(v.x & 0xffff)); f[1] = to_f((u16)(v.x >> 16));
    f[2] = to_f((u16)(v.y & 0xffff)); f[3] = to_f((u16)(v.y >> 16));
    f[4] = to_f((u16)(v.z & 0xffff)); f[5] = to_f((u16)(v.z >> 16));
    f[6] = to_f((u16)(v.w & 0xffff)); f[7] = to_f((u16)(v.w >> 16));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x (a multiple of 32, at most 1024) threads.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.f;
    return warp_sum(t);
}

// Programmatic dependent launch (PDL): with it, a kernel's blocks may start while the
// kernel before it is still running, so each kernel first waits for its predecessor's
// writes, then lets the next one be scheduled.
__device__ __forceinline__ void pdl_enter() {
#if PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The two halves of pdl_enter for kernels whose successor reads nothing before its own
// wait except constant weights (GEMVs) or cache rows an earlier kernel wrote: they let
// the next kernel be scheduled before they wait themselves, so its weight loads start one
// kernel earlier. griddepcontrol.wait still waits for the whole predecessor grid (and so,
// transitively, for every kernel before it). A kernel whose successor reads pos/slot or
// the cache before waiting (the q/k/v projection before attention) keeps pdl_enter.
__device__ __forceinline__ void pdl_trigger() {
#if PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Row t of the embedding table into x[t]. With `ss` (the tensor-core decode step) it
// also writes the row's sum of squares there, which the first q/k/v projection's
// RMSNorm reads instead of every block recomputing it, and zeroes ss_next, into which
// the first output projection adds the sums of the next residual stream.
__device__ __forceinline__ void embed_row(const u16* __restrict__ src, u16* __restrict__ dst,
                                          int t, float* __restrict__ ss, float* __restrict__ ss_next) {
    __shared__ float red[32];
    float sq = 0.f;
    for (int i = threadIdx.x; i < HIDDEN / 8; i += blockDim.x) {
        uint4 v = ((const uint4*)src)[i];
        ((uint4*)dst)[i] = v;
        float f[8];
        unpack8(v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) sq += f[e] * f[e];
    }
    if (!ss) return;
    sq = block_sum(sq, red);
    if (threadIdx.x == 0) { ss[t] = sq; ss_next[t] = 0.f; }
}

// x[t] = embedding[ids[t]]
extern "C" __global__ void embed(const int* __restrict__ ids, const u16* __restrict__ table,
                                 u16* __restrict__ x, float* ss, float* ss_next) {
    pdl_enter();
    int t = blockIdx.x;
    embed_row(table + (size_t)ids[t] * HIDDEN, x + (size_t)t * HIDDEN, t, ss, ss_next);
}

// A chained decode step: x[t] = embedding[prev[t]] (the step before's sample) at the
// position after the step before's.
extern "C" __global__ void embed_next(const int* __restrict__ prev, int* __restrict__ pos,
                                      const u16* __restrict__ table, u16* __restrict__ x,
                                      float* ss, float* ss_next) {
    pdl_enter();
    int t = blockIdx.x;
    if (threadIdx.x == 0) pos[t] += 1;
    embed_row(table + (size_t)prev[t] * HIDDEN, x + (size_t)t * HIDDEN, t, ss, ss_next);
}

// out[r] = rmsnorm(x[rows ? rows[r] : r]) * w, rounded like the reference
// (normalize in f32, round, multiply by the weight, round). Blocks of RN_THREADS. Where
// rows are whole 16-byte chunks, a thread holds its chunks of the row in registers from
// the sum of squares to the write, and loads its chunks of the weights before the wait:
// one round trip to memory instead of two passes of 2-byte loads.
#define RN_THREADS 256
extern "C" __global__ void __launch_bounds__(RN_THREADS)
rmsnorm(const u16* __restrict__ x, const u16* __restrict__ w, u16* __restrict__ out,
        const int* __restrict__ rows) {
    __shared__ float red[32];
    int r = blockIdx.x;
#if HIDDEN % 8 == 0
    constexpr int NC = HIDDEN / 8, PER = (NC + RN_THREADS - 1) / RN_THREADS;
    uint4 wv[PER], xv[PER];
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        int c = threadIdx.x + p * RN_THREADS;
        wv[p] = c < NC ? ((const uint4*)w)[c] : make_uint4(0, 0, 0, 0);
    }
    pdl_enter();
    const uint4* xr = (const uint4*)(x + (size_t)(rows ? rows[r] : r) * HIDDEN);
    float ss = 0.f;
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        int c = threadIdx.x + p * RN_THREADS;
        xv[p] = c < NC ? xr[c] : make_uint4(0, 0, 0, 0);
        float f[8];
        unpack8(xv[p], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
    }
    float inv = rsqrtf(block_sum(ss, red) / HIDDEN + EPS);
    uint4* o = (uint4*)(out + (size_t)r * HIDDEN);
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        int c = threadIdx.x + p * RN_THREADS;
        if (c >= NC) break;
        float f[8], g[8];
        u32 h[4];
        unpack8(xv[p], f);
        unpack8(wv[p], g);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            h[e] = (u32)from_f(g[2 * e] * rnd(f[2 * e] * inv)) | ((u32)from_f(g[2 * e + 1] * rnd(f[2 * e + 1] * inv)) << 16);
        o[c] = make_uint4(h[0], h[1], h[2], h[3]);
    }
#else
    pdl_enter();
    const u16* xr = x + (size_t)(rows ? rows[r] : r) * HIDDEN;
    float ss = 0.f;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x) {
        float v = to_f(xr[i]);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss, red) / HIDDEN + EPS);
    u16* o = out + (size_t)r * HIDDEN;
    for (int i = threadIdx.x; i < HIDDEN; i += blockDim.x)
        o[i] = from_f(to_f(w[i]) * rnd(to_f(xr[i]) * inv));
#endif
}

#define QKV_DIM ((NH + 2 * NKV) * HD)
#define PAIRS (HD / 2)
#define PPL ((PAIRS + 31) / 32)

// Bias, per-head RMSNorm (QK_NORM), rotation of queries and keys, and the key/value
// cache write. Grid (tokens, heads / 8), one warp per head.
extern "C" __global__ void qkv_post(const u16* __restrict__ qkv, const u16* __restrict__ bias,
                                    const u16* __restrict__ qn, const u16* __restrict__ kn,
                                    const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                    const int* __restrict__ pos, const int* __restrict__ slot,
                                    u16* __restrict__ q_out, u16* __restrict__ kc,
                                    u16* __restrict__ vc) {
    pdl_enter();
    int t = blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int p = pos[t];
    size_t cache_row = ((size_t)slot[t] * MAX_LEN + p) * NKV;
    const u16* row = qkv + (size_t)t * QKV_DIM;
    {
        int h = blockIdx.y * (blockDim.x >> 5) + warp;
        if (h >= NH + 2 * NKV) return;
        const u16* src = row + h * HD;
        float x1[PPL], x2[PPL];
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < PPL; ++j) {
            int i = lane + 32 * j;
            x1[j] = 0.f; x2[j] = 0.f;
            if (i < PAIRS) {
                float a = to_f(src[i]), b = to_f(src[i + PAIRS]);
                if (bias) {
                    a = rnd(a + to_f(bias[h * HD + i]));
                    b = rnd(b + to_f(bias[h * HD + i + PAIRS]));
                }
                x1[j] = a; x2[j] = b;
                ss += a * a + b * b;
            }
        }
        if (h >= NH + NKV) {  // value: straight into the cache
            u16* dst = vc + (cache_row + (h - NH - NKV)) * HD;
#pragma unroll
            for (int j = 0; j < PPL; ++j) {
                int i = lane + 32 * j;
                if (i < PAIRS) { dst[i] = from_f(x1[j]); dst[i + PAIRS] = from_f(x2[j]); }
            }
            return;
        }
#if QK_NORM
        {
            float inv = rsqrtf(warp_sum(ss) / HD + EPS);
            const u16* nw_ = h < NH ? qn : kn;
#pragma unroll
            for (int j = 0; j < PPL; ++j) {
                int i = lane + 32 * j;
                if (i < PAIRS) {
                    x1[j] = rnd(to_f(nw_[i]) * rnd(x1[j] * inv));
                    x2[j] = rnd(to_f(nw_[i + PAIRS]) * rnd(x2[j] * inv));
                }
            }
        }
#endif
        u16* dst = h < NH ? q_out + (size_t)t * NH * HD + h * HD : kc + (cache_row + (h - NH)) * HD;
#pragma unroll
        for (int j = 0; j < PPL; ++j) {
            int i = lane + 32 * j;
            if (i < PAIRS) {
                float c = rnd(cos_t[(size_t)p * PAIRS + i]), s = rnd(sin_t[(size_t)p * PAIRS + i]);
                dst[i] = from_f(rnd(x1[j] * c) - rnd(x2[j] * s));
                dst[i + PAIRS] = from_f(rnd(x2[j] * c) + rnd(x1[j] * s));
            }
        }
    }
}

// Keys a block scores at once: 256 unless the engine defines 128 (tune.rs att_threads).
#ifndef ATT_THREADS
#define ATT_THREADS 256
#endif
// Query heads of a group an `attn_few` block takes (tune.rs att_few_heads); `attn_half`
// takes ATT_HALF (cuda/tune.rs att_half_heads: about half), `attn` the whole group.
#ifndef ATT_HEADS
#define ATT_HEADS 1
#endif
#ifndef ATT_HALF
#define ATT_HALF ((GROUP + 1) / 2)
#endif
// Value phase: VT threads cover a value row, 8 dims (16 bytes) each; KG key groups.
#define VT (HD / 8)
#define KG (ATT_THREADS / VT)
// Fewest keys per split: a block scores ATT_THREADS keys at once, so a shorter split
// saves nothing and costs a merge.
// Two chunks: below 2 x ATT_THREADS keys a split's second chunk (prefetched into L1
// before the wait) costs less than merging two splits.
#define MIN_SPLIT (2 * ATT_THREADS)

// The last split block of token t's query heads h0 .. h0 + gn - 1 merges the S splits'
// partial sums and (max, sum) into `out` (threads: the block's).
__device__ __forceinline__ void attn_merge(const float* part_o, const float* part_ml, u16* out,
                                           int t, int h0, int gn, int S, int SG, int threads) {
    for (int i = threadIdx.x; i < gn * HD; i += threads) {
        int g = i / HD, d = i % HD;
        size_t pi = ((size_t)t * NH + h0 + g) * SG;
        float M = NEG_INF;
#pragma unroll 4
        for (int s = 0; s < S; ++s) M = fmaxf(M, __ldcg(&part_ml[(pi + s) * 2]));
        float num = 0.f, den = 0.f;
#pragma unroll 4
        for (int s = 0; s < S; ++s) {
            float l = __ldcg(&part_ml[(pi + s) * 2 + 1]);
            if (l == 0.f) continue;
            float w = exp2f(__ldcg(&part_ml[(pi + s) * 2]) - M);
            num += w * __ldcg(&part_o[(pi + s) * HD + d]);
            den += w * l;
        }
        out[(size_t)t * NH * HD + (h0 + g) * HD + d] = from_f(num / den);
    }
}

// Attention of token t's query heads g0 .. g0 + GH - 1 of the GROUP sharing key/value head
// blockIdx.y / HSPLIT (a group's heads spread over HSPLIT blocks, each reading the same keys
// and values; the last block's missing heads are scored with zero queries and not written)
// over split blockIdx.z of its keys 0..pos[t], writing [T, NH*HD] to `out`. The grid has the
// most splits a step may use (fixed when it is captured); a token uses as many as its
// keys fill, at least min_split keys each (MIN_SPLIT unless SPECD_DRAFT_ATT_SPLIT sets it
// for steps of several streams; shorter splits measured slower), and the blocks beyond
// them leave at once.
// With several splits each block leaves its unnormalized sums and (max, sum) in part_o
// ([T, NH, S, HD]) and part_ml ([T, NH, S, 2]); the last block of a (token, head block) to
// finish merges them (counters, one per (token, blockIdx.y), must start at zero; the merging
// block resets its own).
template <int GH>
__device__ __forceinline__ void attn_impl(const u16* __restrict__ q, const u16* __restrict__ kc,
                                          const u16* __restrict__ vc, const int* __restrict__ pos,
                                          const int* __restrict__ slot, u16* __restrict__ out,
                                          float* part_o, float* part_ml, unsigned int* counters,
                                          float scale, int prefetch, int min_split) {
    constexpr int HSPLIT = (GROUP + GH - 1) / GH;
    __shared__ float qs[GH][HD];
    __shared__ float ps[GH][ATT_THREADS];
    __shared__ float alpha_s[GH], m_s[GH], l_s[GH];
    __shared__ float red[ATT_THREADS / 32][GH][HD];
    __shared__ int last_s;
    int t = blockIdx.x, kvh = blockIdx.y / HSPLIT, sp = blockIdx.z, SG = gridDim.z;
    // This block's heads: g0 .. g0 + gn - 1 of the group.
    int g0 = (blockIdx.y % HSPLIT) * GH, gn = min(GH, GROUP - g0);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int L = pos[t] + 1;
    int per = max(min_split, (L + SG - 1) / SG);
    // Splits this token uses; part_o / part_ml keep the grid's stride SG.
    int S = (L + per - 1) / per;
    if (sp >= S) return;
    int j0 = sp * per, j1 = min(L, j0 + per);
    size_t base = (size_t)slot[t] * MAX_LEN * NKV;
    int vd = (tid % VT) * 8, kg = tid / VT;
    // In a decode step the rows after the first chunk (up to MIN_SPLIT keys) and the
    // first chunk's values where they are not loaded into registers are prefetched into
    // L1 before the wait: every row but the newest is older than the predecessor.
    if (prefetch) {
#pragma unroll
        for (int i = 0; i < MIN_SPLIT / ATT_THREADS; ++i) {
            int j = j0 + i * ATT_THREADS + tid;
            if (j < j1 && j < L - 1) {
                size_t row = (base + (size_t)j * NKV + kvh) * HD;
#pragma unroll
                for (int b = 0; b < HD * 2; b += 128) {
                    if (i > 0) asm volatile("prefetch.global.L1 [%0];" :: "l"((const char*)(kc + row) + b));
                    if (i > 0 || ATT_PREFETCH < 2)
                        asm volatile("prefetch.global.L1 [%0];" :: "l"((const char*)(vc + row) + b));
                }
            }
        }
    }
#if ATT_PREFETCH
    // In a decode step (`prefetch`: one token per slot) the first chunk's keys (and with
    // ATT_PREFETCH 2 its values) are loaded before waiting for the predecessor, except the
    // newest, which the predecessor writes: pos and slot come from the host, older cache
    // rows from earlier steps.
    uint4 kp[HD / 8];
#if ATT_PREFETCH > 1
    uint4 vp[ATT_THREADS / KG];
#endif
    {
        int n0 = min(ATT_THREADS, j1 - j0);
        if (prefetch && tid < n0 && j0 + tid < L - 1) {
            const uint4* kr = (const uint4*)(kc + (base + (size_t)(j0 + tid) * NKV + kvh) * HD);
#pragma unroll
            for (int v8 = 0; v8 < HD / 8; ++v8) kp[v8] = kr[v8];
        }
#if ATT_PREFETCH > 1
#pragma unroll
        for (int i = 0; i < ATT_THREADS / KG; ++i) {
            int j = kg + i * KG;
            if (prefetch && j < n0 && j0 + j < L - 1)
                vp[i] = *(const uint4*)(vc + (base + (size_t)(j0 + j) * NKV + kvh) * HD + vd);
        }
#endif
    }
#endif
    pdl_trigger();
    pdl_wait();
    const u16* qrow = q + (size_t)t * NH * HD + (size_t)(kvh * GROUP + g0) * HD;
    for (int i = tid; i < GH * HD; i += ATT_THREADS)
        qs[i / HD][i % HD] = i / HD < gn ? to_f(qrow[i]) * scale * LOG2E : 0.f;
    if (tid < GH) { m_s[tid] = NEG_INF; l_s[tid] = 0.f; }
    float acc[GH][8];
#pragma unroll
    for (int g = 0; g < GH; ++g)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
    __syncthreads();
    for (int c = j0; c < j1; c += ATT_THREADS) {
        int n = min(ATT_THREADS, j1 - c);
        // Scores: one key per thread.
        if (tid < n) {
            const uint4* kr = (const uint4*)(kc + (base + (size_t)(c + tid) * NKV + kvh) * HD);
            float dot[GH];
#pragma unroll
            for (int g = 0; g < GH; ++g) dot[g] = 0.f;
#if ATT_PREFETCH
            bool pre = prefetch && c == j0 && c + tid < L - 1;
#pragma unroll
#else
#pragma unroll 4
#endif
            for (int v8 = 0; v8 < HD / 8; ++v8) {
                float kf[8];
#if ATT_PREFETCH
                unpack8(pre ? kp[v8] : kr[v8], kf);
#else
                unpack8(kr[v8], kf);
#endif
#pragma unroll
                for (int g = 0; g < GH; ++g)
#pragma unroll
                    for (int e = 0; e < 8; ++e) dot[g] += qs[g][v8 * 8 + e] * kf[e];
            }
#pragma unroll
            for (int g = 0; g < GH; ++g) ps[g][tid] = dot[g];
        }
        __syncthreads();
        // Online softmax update, one warp per head of the group.
        for (int g = warp; g < GH; g += ATT_THREADS / 32) {
            float mx = NEG_INF;
            for (int j = lane; j < n; j += 32) mx = fmaxf(mx, ps[g][j]);
            mx = warp_max(mx);
            float m_old = m_s[g], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int j = lane; j < n; j += 32) {
                float e = exp2f(ps[g][j] - m_new);
                ps[g][j] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                float a = exp2f(m_old - m_new);
                alpha_s[g] = a;
                l_s[g] = l_s[g] * a + sum;
                m_s[g] = m_new;
            }
        }
        __syncthreads();
        // Weighted values: a thread owns 8 dims of the keys kg, kg+KG, ...
#pragma unroll
        for (int g = 0; g < GH; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] *= alpha_s[g];
#if ATT_PREFETCH > 1
#pragma unroll
        for (int i = 0; i < ATT_THREADS / KG; ++i) {
            int j = kg + i * KG;
            if (j >= n) break;
            float vf[8];
            bool pre = prefetch && c == j0 && c + j < L - 1;
            unpack8(pre ? vp[i] : *(const uint4*)(vc + (base + (size_t)(c + j) * NKV + kvh) * HD + vd), vf);
#else
#pragma unroll 2
        for (int j = kg; j < n; j += KG) {
            float vf[8];
            unpack8(*(const uint4*)(vc + (base + (size_t)(c + j) * NKV + kvh) * HD + vd), vf);
#endif
#pragma unroll
            for (int g = 0; g < GH; ++g) {
                float p = ps[g][j];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
            }
        }
        __syncthreads();
    }
    // Sum the key groups: lanes VT apart by shuffles, then the warps in shared memory.
#pragma unroll
    for (int off = VT; off < 32; off <<= 1)
#pragma unroll
        for (int g = 0; g < GH; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], off);
    if (lane < VT)
#pragma unroll
        for (int g = 0; g < GH; ++g)
#pragma unroll
            for (int e = 0; e < 8; ++e) red[warp][g][vd + e] = acc[g][e];
    __syncthreads();
    for (int i = tid; i < GH * HD; i += ATT_THREADS) {
        int g = i / HD, d = i % HD;
        if (g >= gn) break;
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_THREADS / 32; ++k) v += red[k][g][d];
        int h = kvh * GROUP + g0 + g;
        if (S == 1) {
            out[(size_t)t * NH * HD + h * HD + d] = from_f(v / l_s[g]);
        } else {
            size_t pi = ((size_t)t * NH + h) * SG + sp;
            part_o[pi * HD + d] = v;
            if (d == 0) { part_ml[pi * 2] = m_s[g]; part_ml[pi * 2 + 1] = l_s[g]; }
        }
    }
    if (S == 1) return;
    // Publish the partials; the last split block of this (token, head block) merges.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        unsigned int prev = atomicAdd(&counters[t * gridDim.y + blockIdx.y], 1u);
        last_s = prev == (unsigned int)(S - 1);
    }
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    attn_merge(part_o, part_ml, out, t, kvh * GROUP + g0, gn, S, SG, ATT_THREADS);
    if (tid == 0) counters[t * gridDim.y + blockIdx.y] = 0u;
}

#define ATT_KERNEL(NAME, HEADS)                                                                \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                   \
    NAME(const u16* q, const u16* kc, const u16* vc, const int* pos, const int* slot, u16* out, \
         float* part_o, float* part_ml, unsigned int* counters, float scale, int prefetch,      \
         int min_split) {                                                                       \
        attn_impl<HEADS>(q, kc, vc, pos, slot, out, part_o, part_ml, counters, scale, prefetch, \
                         min_split);                                                            \
    }
ATT_KERNEL(attn, GROUP)
ATT_KERNEL(attn_half, ATT_HALF)
ATT_KERNEL(attn_few, ATT_HEADS)

// act[t, i] = silu(gu[t, i]) * gu[t, INTER + i], rounded like the reference.
__device__ __forceinline__ float silu_mul1(float g, float u) { return rnd(rnd(g / (1.f + __expf(-g))) * u); }

extern "C" __global__ void silu_mul(const u16* __restrict__ gu, u16* __restrict__ act, int n) {
    pdl_enter();
    size_t total = (size_t)n * INTER;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t t = k / INTER, i = k % INTER;
        act[k] = from_f(silu_mul1(to_f(gu[t * 2 * INTER + i]), to_f(gu[t * 2 * INTER + INTER + i])));
    }
}

// Greedy token and softmax probability: each of gridDim.y blocks of a row reduces a
// slice to (max, first index of the max, sum of exp(l - max)) in one pass, the sum
// rescaled whenever the max rises (as online softmax does); argmax_final merges the
// slices. Slices start at multiples of 4, so rows of a vocabulary divisible by 4 are read
// as 16-byte loads. Logits are rounded to the model dtype first, as the reference
// computes them in it.
#define AM_THREADS 256
struct AmAcc {
    float m, s;
    int i;
};
__device__ __forceinline__ void am_add(AmAcc& a, float v, int i) {
    if (v > a.m) {
        a.s = (a.m == NEG_INF ? 0.f : a.s * __expf(a.m - v)) + 1.f;
        a.m = v;
        a.i = i;
    } else if (v != NEG_INF) {
        a.s += __expf(v - a.m);
    }
}
__device__ __forceinline__ AmAcc am_merge(AmAcc a, AmAcc b) {
    AmAcc r;
    r.m = fmaxf(a.m, b.m);
    r.i = a.m > b.m || (a.m == b.m && a.i < b.i) ? a.i : b.i;
    r.s = r.m == NEG_INF ? 0.f : (a.m == NEG_INF ? 0.f : a.s * __expf(a.m - r.m)) + (b.m == NEG_INF ? 0.f : b.s * __expf(b.m - r.m));
    return r;
}
extern "C" __global__ void __launch_bounds__(AM_THREADS)
argmax_part(const float* __restrict__ logits, int V, float* __restrict__ part) {
    pdl_enter();
    __shared__ AmAcc sa[AM_THREADS / 32];
    int r = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
    int chunk = ((V + nb - 1) / nb + 3) & ~3;
    int i0 = min(V, b * chunk), i1 = min(V, i0 + chunk);
    const float* l = logits + (size_t)r * V;
    AmAcc acc = {NEG_INF, 0.f, 0x7fffffff};
    int i = i0;
    if ((V & 3) == 0) {
        // Each thread takes every AM_THREADS-th quad in order, so its first maximum is
        // its first index of it.
        for (int q = i0 + 4 * threadIdx.x; q + 4 <= i1; q += 4 * AM_THREADS) {
            float4 v = *(const float4*)(l + q);
            am_add(acc, rnd(v.x), q);
            am_add(acc, rnd(v.y), q + 1);
            am_add(acc, rnd(v.z), q + 2);
            am_add(acc, rnd(v.w), q + 3);
        }
        i = i0 + ((i1 - i0) & ~3);
    }
    for (int k = i + threadIdx.x; k < i1; k += AM_THREADS) am_add(acc, rnd(l[k]), k);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        AmAcc other = {__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o),
                       __shfl_xor_sync(0xffffffffu, acc.i, o)};
        acc = am_merge(acc, other);
    }
    if (lane == 0) sa[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < AM_THREADS / 32; ++w) acc = am_merge(acc, sa[w]);
        float* p = part + ((size_t)r * nb + b) * 3;
        p[0] = acc.m; p[1] = __int_as_float(acc.i); p[2] = acc.s;
    }
}

extern "C" __global__ void argmax_final(const float* __restrict__ part, int nb,
                                        int* __restrict__ tok, float* __restrict__ prob) {
    pdl_enter();
    int r = blockIdx.x, lane = threadIdx.x;
    const float* p = part + (size_t)r * nb * 3;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int b = lane; b < nb; b += 32) {
        float v = p[b * 3];
        int i = __float_as_int(p[b * 3 + 1]);
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    float s = 0.f;
    for (int b = lane; b < nb; b += 32) {
        float v = p[b * 3];
        if (v != NEG_INF) s += p[b * 3 + 2] * __expf(v - best);
    }
    s = warp_sum(s);
    if (lane == 0) { tok[r] = bi; prob[r] = 1.f / s; }
}
