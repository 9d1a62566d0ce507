// One-token kernels of specd's CUDA draft-model engine, compiled after kernels.cu (whose
// helpers and macros they use) in one NVRTC module.

// A weight load: weights are read once per token, so they skip L1 and leave L2 first,
// keeping the step's activations and cached keys/values there (docs/draft-model.md has
// the measurement). Volatile keeps every load ahead of the griddepcontrol.wait.
__device__ __forceinline__ uint4 ldw(const uint4* p) {
    uint4 v;
    asm volatile("{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0;"
                 " ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], pol; }"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// One-token projection y[o] (+)= sum_k xin[k] * W[o, k] with the input in registers:
// MODE 0 takes x as is, MODE 1 RMSNorm(x) * nw (each warp computes the norm itself). A
// warp owns R output units of the whole row, or with S > 1 one of S slices of the
// row's 16-byte chunks (the S warps of a unit sum in shared memory); 8 warps a block,
// one unit group per warp and no loop, so every weight load of the kernel is issued
// before it waits for its predecessor (weights never depend on it): with programmatic
// dependent launch they stream in while the previous kernel runs. A unit is one row
// (OUT 0: the model dtype, added to y with `accumulate`; OUT 1: f32 logits; OUT 4: f32
// logits and the block's (max, first index, sum of exp) in `aux` for argmax_final_block),
// or a pair of rows: OUT 2 rows o and O + o of a gate/up weight, writing silu(gate)·up;
// OUT 3 rows i and i + HD/2 of a q/k/v head, adding the bias, rotating q and k at
// position pos[0] and writing q to y and k/v to the cache of slot[0] (no qk-norm).
// O counts units. Rounding follows the reference as in the unfused kernels.
template <int K, int MODE, int R, int S, int OUT>
__device__ __forceinline__ void gemv_impl(const u16* __restrict__ W, const u16* __restrict__ x,
                                          const u16* __restrict__ nw, void* __restrict__ y,
                                          int O, int accumulate, const u16* __restrict__ bias,
                                          const float* __restrict__ cos_t,
                                          const float* __restrict__ sin_t, const int* __restrict__ pos,
                                          const int* __restrict__ slot, u16* __restrict__ kc,
                                          u16* __restrict__ vc, float* __restrict__ aux) {
    constexpr int NC = K / 8;                    // 16-byte chunks of a row
    constexpr int CPL = (NC + 32 * S - 1) / (32 * S);  // chunks per lane
    constexpr int RW = (OUT == 2 || OUT == 3) ? 2 : 1;  // rows per unit
    constexpr int NR = R * RW;
    constexpr int RG = 8 / S;                    // unit groups per block
    __shared__ float part[8][NR];
    __shared__ float lg[RG * R];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int s = warp % S, g = warp / S;
    int u0 = (blockIdx.x * RG + g) * R;
    const uint4* rows[NR];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int u = min(u0 + r, O - 1);  // clamped: out-of-range units load a valid row, unused
        size_t r1, r2;
        if (OUT == 3) { r1 = (size_t)(u / (HD / 2)) * HD + u % (HD / 2); r2 = r1 + HD / 2; }
        else { r1 = u; r2 = (size_t)O + u; }
        rows[r * RW] = (const uint4*)(W + r1 * K);
        if (RW == 2) rows[r * RW + RW - 1] = (const uint4*)(W + r2 * K);
    }
    uint4 wv[NR][CPL];
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int c = (j * S + s) * 32 + lane;
#pragma unroll
        for (int r = 0; r < NR; ++r) wv[r][j] = c < NC ? ldw(rows[r] + c) : make_uint4(0, 0, 0, 0);
    }
    // The norm weight and the bias are constant too: loaded before the wait, so that
    // after it only the input (and the residual, position and rotation) are waited for.
    constexpr int CPT = (NC + 255) / 256;
    uint4 nwv[MODE == 1 ? CPT : 1];
    if (MODE == 1) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            int c = threadIdx.x + 256 * i;
            nwv[i] = c < NC ? __ldg((const uint4*)nw + c) : make_uint4(0, 0, 0, 0);
        }
    }
    int wu = min(u0 + lane, O - 1);  // the unit lane r < R writes
    float bias_a = 0.f, bias_b = 0.f;
    if (OUT == 3 && bias && lane < R) {
        int h = wu / (HD / 2), i = wu % (HD / 2);
        bias_a = to_f(__ldg(bias + h * HD + i));
        bias_b = to_f(__ldg(bias + h * HD + i + HD / 2));
    }
    // The q/k/v projection with rotation precedes attention, which reads pos and the
    // cache before it waits: it lets attention start only once it has waited itself.
    if (OUT == 3) {
        pdl_enter();
    } else {
        pdl_trigger();
        pdl_wait();
    }
    // What the epilogue reads that its predecessors wrote, loaded beside the input.
    float resid = 0.f, cs = 0.f, sn = 0.f;
    int p_ = 0;
    size_t crow = 0;
    if (OUT == 0 && accumulate && s == 0 && lane < R) resid = to_f(((const u16*)y)[wu]);
    if (OUT == 3 && lane < R) {
        p_ = pos[0];
        crow = ((size_t)slot[0] * MAX_LEN + p_) * NKV;
        int i = wu % (HD / 2);
        cs = rnd(cos_t[(size_t)p_ * PAIRS + i]);
        sn = rnd(sin_t[(size_t)p_ * PAIRS + i]);
    }
    const uint4* xv = (const uint4*)x;
    // MODE 1: the block normalizes the input once into shared memory (halves of each
    // 8-element chunk in two float4 arrays, conflict-free), instead of every warp
    // keeping the whole normalized row in registers beside its weights.
    constexpr int XS = MODE == 1 ? NC : 1;
    __shared__ float4 xs0[XS], xs1[XS];
    __shared__ float red_s[8];
    if (MODE == 1) {
        uint4 xr[CPT];
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            int c = threadIdx.x + 256 * i;
            xr[i] = c < NC ? xv[c] : make_uint4(0, 0, 0, 0);
            float f[8];
            unpack8(xr[i], f);
#pragma unroll
            for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
        }
        ss = warp_sum(ss);
        if (lane == 0) red_s[warp] = ss;
        __syncthreads();
        ss = 0.f;
#pragma unroll
        for (int w = 0; w < 8; ++w) ss += red_s[w];
        float inv = rsqrtf(ss / K + EPS);
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            int c = threadIdx.x + 256 * i;
            if (c < NC) {
                float f[8], n[8];
                unpack8(xr[i], f);
                unpack8(nwv[i], n);
#pragma unroll
                for (int e = 0; e < 8; ++e) f[e] = rnd(n[e] * rnd(f[e] * inv));
                xs0[c] = make_float4(f[0], f[1], f[2], f[3]);
                xs1[c] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
        __syncthreads();
    }
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.f;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
        int c = (j * S + s) * 32 + lane;
        if (c < NC) {
            float f[8];
            if (MODE == 1) {
                float4 a0 = xs0[c], a1 = xs1[c];
                f[0] = a0.x; f[1] = a0.y; f[2] = a0.z; f[3] = a0.w;
                f[4] = a1.x; f[5] = a1.y; f[6] = a1.z; f[7] = a1.w;
            } else {
                unpack8(xv[c], f);
            }
#pragma unroll
            for (int r = 0; r < NR; ++r) {
                float w[8];
                unpack8(wv[r][j], w);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[r] += w[e] * f[e];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = warp_sum(acc[r]);
    if (S > 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < NR; ++r) part[warp][r] = acc[r];
        __syncthreads();
        if (s == 0)
#pragma unroll
            for (int k = 1; k < S; ++k)
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] += part[warp + k][r];
    }
    bool writer = s == 0 && lane < R;
    // Lane r writes unit r; a register array indexed by lane would spill, so select.
    float a = acc[0], b = acc[RW - 1];
#pragma unroll
    for (int r = 1; r < R; ++r)
        if (lane == r) { a = acc[r * RW]; b = acc[r * RW + RW - 1]; }
    int u = u0 + lane;
    if (OUT == 4) {
        if (s == 0 && lane < R) lg[g * R + lane] = u < O ? rnd(a) : NEG_INF;
        __syncthreads();
        if (warp == 0) {
            float best = NEG_INF;
            int bi = 0x7fffffff;
            for (int i = lane; i < RG * R; i += 32)
                if (lg[i] > best) { best = lg[i]; bi = blockIdx.x * RG * R + i; }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, best, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
            }
            float sum = 0.f;
            for (int i = lane; i < RG * R; i += 32)
                if (lg[i] != NEG_INF) sum += __expf(lg[i] - best);
            sum = warp_sum(sum);
            if (lane == 0) {
                float* p = aux + (size_t)blockIdx.x * 3;
                p[0] = best; p[1] = __int_as_float(bi); p[2] = sum;
            }
        }
    }
    if (!writer || u >= O) return;
    if (OUT == 1 || OUT == 4) {
        ((float*)y)[u] = rnd(a);
    } else if (OUT == 2) {
        ((u16*)y)[u] = from_f(silu_mul1(rnd(a), rnd(b)));
    } else if (OUT == 3) {
        int h = u / (HD / 2), i = u % (HD / 2);
        a = rnd(a); b = rnd(b);
        if (bias) {
            a = rnd(a + bias_a);
            b = rnd(b + bias_b);
        }
        size_t cache_row = crow;
        if (h >= NH + NKV) {
            u16* dst = vc + (cache_row + (h - NH - NKV)) * HD;
            dst[i] = from_f(a); dst[i + HD / 2] = from_f(b);
            return;
        }
        u16* dst = h < NH ? (u16*)y + h * HD : kc + (cache_row + (h - NH)) * HD;
        float c = cs;
        dst[i] = from_f(rnd(a * c) - rnd(b * sn));
        dst[i + HD / 2] = from_f(rnd(b * c) + rnd(a * sn));
    } else {
        u16* yy = (u16*)y + u;
        *yy = from_f(accumulate ? resid + a : a);
    }
}

// The projections of a one-token step; R (units per warp) and S (warps per unit) of each
// come from the engine (GEMV_<ROLE>_R / _S), tuned per model width.
#define GEMV_KERNEL(NAME, K, MODE, R, S, OUT)                                                  \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                   \
        const u16* W, const u16* x, const u16* nw, void* y, int O, int acc, const u16* bias,  \
        const float* cos_t, const float* sin_t, const int* pos, const int* slot, u16* kc,     \
        u16* vc, float* aux) {                                                                \
        gemv_impl<K, MODE, R, S, OUT>(W, x, nw, y, O, acc, bias, cos_t, sin_t, pos, slot, kc, \
                                      vc, aux);                                               \
    }
GEMV_KERNEL(gemv_qkv, HIDDEN, 1, GEMV_QKV_R, GEMV_QKV_S, 0)
GEMV_KERNEL(gemv_qkv_rope, HIDDEN, 1, GEMV_QKV_R, GEMV_QKV_S, 3)
GEMV_KERNEL(gemv_o, NH * HD, 0, GEMV_O_R, GEMV_O_S, 0)
GEMV_KERNEL(gemv_gate_up, HIDDEN, 1, GEMV_GU_R, GEMV_GU_S, 2)
GEMV_KERNEL(gemv_down, INTER, 0, GEMV_DOWN_R, GEMV_DOWN_S, 0)
GEMV_KERNEL(gemv_lm, HIDDEN, 1, GEMV_LM_R, GEMV_LM_S, 4)

// Greedy token and probability of one row from per-block partials (max, first index of
// the max, sum of exp(l - max)), one block of up to 1024 threads.
extern "C" __global__ void argmax_final_block(const float* __restrict__ part, int nb,
                                              int* __restrict__ tok, float* __restrict__ prob) {
    pdl_enter();
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float red[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float best = NEG_INF;
    int bi = 0x7fffffff;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        float v = part[b * 3];
        int i = __float_as_int(part[b * 3 + 1]);
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) { sv[warp] = best; si[warp] = bi; }
    __syncthreads();
    best = sv[0]; bi = si[0];
    for (int w = 1; w < nw; ++w)
        if (sv[w] > best || (sv[w] == best && si[w] < bi)) { best = sv[w]; bi = si[w]; }
    float s = 0.f;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        float v = part[b * 3];
        if (v != NEG_INF) s += part[b * 3 + 2] * __expf(v - best);
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) { tok[0] = bi; prob[0] = 1.f / s; }
}
