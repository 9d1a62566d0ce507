// Decode steps of several tokens (2..64 streams) on tensor cores, compiled after
// kernels.cu in one NVRTC module: Y[n, o] (+)= in(X)[n, k] · W[o, k] with mma.sync
// m16n8k16, tokens as the 16 rows of A and 8 weight rows as the 8 columns of B. The sum
// over k may take its terms in any order, so a thread's fragments are 16 contiguous
// bytes of a row (its 8 k of a 32-wide k block) for X and W alike: one vector load each.
//
// A warp owns RT tiles of 8 output units for TT tiles of 16 tokens over every S-th k
// block; S warps of a unit sum in shared memory, RG unit groups a block. The first
// k blocks' weights (all of them where they fit, TC_ALLW) are loaded before waiting for
// the predecessor (programmatic dependent launch). MODE 1 computes RMSNorm(X) · nw on the fly from each token's sum
// of squares in ssr, which the kernel that wrote X left there (embed, or a projection
// adding into the residual stream: OUT 0 with accumulate adds its outputs' squares into
// ssw), so no block recomputes the norm of the whole input. ssz, when given, is zeroed:
// the sums read two kernels before, so the next residual write can add into them.
// OUT as the one-token GEMVs: 0 model dtype (+ accumulate), 2 rows o and O + o of
// gate/up to silu(gate)·up, 3 rows i and i + HD/2 of a q/k/v head with the bias, the
// rotation at pos[t] and the cache write of slot[t] (q to y; no qk-norm), 4 f32 logits
// and per-(token, block) argmax partials (max, first index, sum of exp) for argmax_final.

#if DT_BF16
#define MMA_T "bf16"
#else
#define MMA_T "f16"
#endif

__device__ __forceinline__ void mma16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_T "." MMA_T ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 r;
#if DT_BF16
    asm("{ cvt.rn.bf16x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("{ cvt.rn.f16x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
#else
    return (u32)from_f(lo) | ((u32)from_f(hi) << 16);
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Two products of model-dtype values rounded once to the model dtype: the same value as
// rounding their exact (f32) product.
__device__ __forceinline__ u32 mul2(u32 a, u32 b) {
    u32 r;
#if DT_BF16
    asm("{ mul.rn.bf16x2 %0, %1, %2; }" : "=r"(r) : "r"(a), "r"(b));
#else
    asm("{ mul.rn.f16x2 %0, %1, %2; }" : "=r"(r) : "r"(a), "r"(b));
#endif
    return r;
}

// RMSNorm of a 16-byte chunk of X: rnd(w · rnd(x · inv)), with w the packed norm weights.
__device__ __forceinline__ uint4 norm8(uint4 v, uint4 w, float inv) {
    float f[8];
    unpack8(v, f);
    return make_uint4(mul2(pack2(f[0] * inv, f[1] * inv), w.x), mul2(pack2(f[2] * inv, f[3] * inv), w.y),
                      mul2(pack2(f[4] * inv, f[5] * inv), w.z), mul2(pack2(f[6] * inv, f[7] * inv), w.w));
}
#else
__device__ __forceinline__ uint4 norm8(uint4 v, uint4 w, float inv) {
    float f[8], n[8];
    unpack8(v, f);
    unpack8(w, n);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = n[e] * rnd(f[e] * inv);  // pack2 rounds the product
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
}
#endif

#ifndef TC_U
#define TC_U 2  // k blocks in flight per warp
#endif
// Up to two token tiles (32 streams; more would spill), a warp loads all its weights
// before the wait where they fit in TC_ALLW_MAX 16-byte fragments a lane (TC_ALLW), and
// issues the epilogue's reads of earlier kernels' outputs right after it (TC_HOIST);
// 0 turns either off. Both together, 16 streams: 0.886 -> 0.809 ms per step on the
// Qwen2.5-0.5B shape, 1.979 -> 1.868 on the 1.5B shape (measured on an NVIDIA H200).
#ifndef TC_ALLW
#define TC_ALLW 1
#endif
#ifndef TC_ALLW_MAX
#define TC_ALLW_MAX 16
#endif
#ifndef TC_HOIST
#define TC_HOIST 1
#endif
// Every warp of a tile leaves its sums in shared memory, and the epilogue's output slots
// (a unit pair of a token row) are spread over the S warps, each summing its own: the
// first warp alone read (S - 1) × NACC partial sums and ran the whole epilogue before
// (TC_SPLIT 0). Not for the vocabulary projection (OUT 4), whose argmax spans the block.
// 16 / 32 streams: 0.79 / 1.10 -> 0.77 / 1.00 ms per step on the Qwen2.5-0.5B shape,
// 1.74 / 2.52 -> 1.70 / 2.37 on the 1.5B shape (measured on an NVIDIA H200).
#ifndef TC_SPLIT
#define TC_SPLIT 1
#endif

template <int K, int MODE, int RT, int S, int RG, int TT, int OUT>
__device__ __forceinline__ void tc_impl(const u16* __restrict__ W, const u16* __restrict__ X,
                                        const u16* __restrict__ nw, void* __restrict__ y, int O,
                                        int accumulate, int nt, float* __restrict__ aux,
                                        const float* __restrict__ ssr, float* __restrict__ ssw,
                                        float* __restrict__ ssz, const u16* __restrict__ bias,
                                        const float* __restrict__ cos_t,
                                        const float* __restrict__ sin_t, const int* __restrict__ pos,
                                        const int* __restrict__ slot, u16* __restrict__ kc,
                                        u16* __restrict__ vc) {
    constexpr int NKB = K / 32;
    constexpr int RW = OUT == 2 || OUT == 3 ? 2 : 1;  // weight tiles per unit tile
    constexpr int NW = RT * RW;
    constexpr int NACC = RT * TT * 4 * RW;
    constexpr int ITER = (NKB + S - 1) / S;
    constexpr bool SPLIT = TC_SPLIT && OUT != 4 && S > 1;
    constexpr int SLOTS = RT * TT * 2;  // output slots (r, t, h) of a lane
    __shared__ float inv_s[TT * 16];
    __shared__ float red[S > 1 ? (SPLIT ? S : S - 1) * RG : 1][NACC][32];
    __shared__ float bm[RG][TT * 16];
    __shared__ int bi_s[RG][TT * 16];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    int s = warp % S, grp = warp / S;
    // Whether this warp runs the epilogue of slot (r, t, h).
    auto owns = [&](int r, int t, int h) { return SPLIT ? ((r * TT + t) * 2 + h) % S == s : s == 0; };
    int u0 = (blockIdx.x * RG + grp) * RT * 8;  // first output unit of the warp
    const uint4* wrow[NW];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int w = 0; w < RW; ++w) {
            int unit = min(u0 + r * 8 + g, O - 1);
            int row = OUT == 3 ? (unit / (HD / 2)) * HD + unit % (HD / 2) + w * (HD / 2) : unit + w * O;
            wrow[r * RW + w] = (const uint4*)(W + (size_t)row * K) + tig;
        }
    // One token tile: weights skip L1 and leave L2 first, as in the one-token GEMVs (0.98
    // -> 0.91 ms per step at 8 streams, Qwen2.5-0.5B shape, on an NVIDIA H200). With more
    // tiles the asm loads' fixed order spills registers, so those keep __ldg.
    auto ldwt = [](const uint4* p) { return TT == 1 ? ldw(p) : __ldg(p); };
    // ALLW: every weight fragment of the warp is loaded before the wait, as the one-token
    // GEMVs do, so that none is waited for after it; else TC_U k blocks in flight.
    constexpr bool ALLW = TC_ALLW && TT <= 2 && ITER * NW <= TC_ALLW_MAX;
    constexpr int WD = ALLW ? ITER : TC_U;
    uint4 wb[WD][NW];
#pragma unroll
    for (int u = 0; u < WD; ++u) {
        int kb = s + S * u;
#pragma unroll
        for (int i = 0; i < NW; ++i) wb[u][i] = kb < NKB ? ldwt(wrow[i] + kb * 4) : make_uint4(0, 0, 0, 0);
    }
    // The q/k/v projection precedes attention, which reads pos and the cache before it
    // waits; the others let their successor (which loads only weights before its wait)
    // be scheduled before they wait themselves.
    if (OUT == 3) {
        pdl_enter();
    } else {
        pdl_trigger();
        pdl_wait();
    }
    if (ssz && blockIdx.x == 0)
        for (int i = threadIdx.x; i < nt; i += blockDim.x) ssz[i] = 0.f;
    const uint4* xrow[TT][2];
    float inv[TT][2];
#pragma unroll
    for (int t = 0; t < TT; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int tok = min(t * 16 + g + 8 * h, nt - 1);
            xrow[t][h] = (const uint4*)(X + (size_t)tok * K) + tig;
            inv[t][h] = MODE == 1 ? rsqrtf(ssr[tok] / K + EPS) : 1.f;
        }
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = 0.f;
    // HOIST: the epilogue's reads of what predecessors wrote (the residual; the position,
    // then its rotation) are issued now, beside the input's, instead of after the sum.
    // (The rotation's 16 floats a lane at two tiles spill on wide shapes: one tile only.)
    constexpr bool HOIST = TC_HOIST && ((OUT == 3 && TT == 1) || (OUT == 0 && TT <= 2));
    u32 res_h[HOIST && OUT == 0 ? RT : 1][TT][2];
    float cs_h[HOIST && OUT == 3 ? RT : 1][TT][2][4];
    int pos_h[TT][2];
    if constexpr (HOIST) {
        if (SPLIT || s == 0) {
#pragma unroll
            for (int t = 0; t < TT; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int tok = min(t * 16 + g + 8 * h, nt - 1);
                    int p = OUT == 3 ? pos[tok] : 0;
                    pos_h[t][h] = p;
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        if (!owns(r, t, h)) continue;
                        int row = min(u0 + r * 8 + tig * 2, O - 2);
                        if constexpr (OUT == 0) {
                            res_h[r][t][h] = accumulate ? *(const u32*)((const u16*)y + (size_t)tok * O + row) : 0u;
                        } else {
                            int i = row % (HD / 2);
                            const float* cp = cos_t + (size_t)p * PAIRS + i;
                            const float* sp = sin_t + (size_t)p * PAIRS + i;
                            cs_h[r][t][h][0] = cp[0]; cs_h[r][t][h][1] = cp[1];
                            cs_h[r][t][h][2] = sp[0]; cs_h[r][t][h][3] = sp[1];
                        }
                    }
                }
        }
    }
    // The X fragments (and norm weights) of a round's TC_U k blocks, loaded together before
    // any is used: clamped to a valid block, so that no load waits behind the branch on
    // the k block (which made each block's loads a round trip of their own).
    uint4 xb[TC_U][TT][2], nwb[TC_U];
    auto load_x = [&](int it0, uint4 (&xd)[TC_U][TT][2], uint4 (&nd)[TC_U]) {
#pragma unroll
        for (int u = 0; u < TC_U; ++u) {
            int kb = min(s + S * (it0 + u), NKB - 1);
            nd[u] = MODE == 1 ? ((const uint4*)nw)[kb * 4 + tig] : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int t = 0; t < TT; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h) xd[u][t][h] = xrow[t][h][kb * 4];
        }
    };
    // The products of a round's k blocks; w: the weight fragments of block u of the round.
    auto round_mma = [&](int it, const uint4 (&w)[TC_U][NW]) {
#pragma unroll
        for (int u = 0; u < TC_U; ++u) {
            int kb = s + S * (it + u);
            if (kb >= NKB) break;
            uint4 xa[TT][2];
#pragma unroll
            for (int t = 0; t < TT; ++t)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    xa[t][h] = MODE == 1 ? norm8(xb[u][t][h], nwb[u], inv[t][h]) : xb[u][t][h];
#pragma unroll
            for (int i = 0; i < NW; ++i)
#pragma unroll
                for (int t = 0; t < TT; ++t) {
                    float* d = acc + (i * TT + t) * 4;
                    uint4 a = xa[t][0], b = xa[t][1], wv = w[u][i];
                    mma16816(d, a.x, b.x, a.y, b.y, wv.x, wv.y);
                    mma16816(d, a.z, b.z, a.w, b.w, wv.z, wv.w);
                }
        }
    };
    if constexpr (ALLW) {
#pragma unroll
        for (int it = 0; it < ITER; it += TC_U) {
            load_x(it, xb, nwb);
            uint4 w[TC_U][NW];
#pragma unroll
            for (int u = 0; u < TC_U; ++u)
#pragma unroll
                for (int i = 0; i < NW; ++i) w[u][i] = it + u < WD ? wb[min(it + u, WD - 1)][i] : make_uint4(0, 0, 0, 0);
            round_mma(it, w);
        }
    } else {
        for (int it = 0; it < ITER; it += TC_U) {
            uint4 wn[TC_U][NW];
#pragma unroll
            for (int u = 0; u < TC_U; ++u) {
                int kb = s + S * (it + TC_U + u);
#pragma unroll
                for (int i = 0; i < NW; ++i) wn[u][i] = kb < NKB ? ldwt(wrow[i] + kb * 4) : make_uint4(0, 0, 0, 0);
            }
            load_x(it, xb, nwb);
            round_mma(it, wb);
#pragma unroll
            for (int u = 0; u < TC_U; ++u)
#pragma unroll
                for (int i = 0; i < NW; ++i) wb[u][i] = wn[u][i];
        }
    }
    if constexpr (SPLIT) {
#pragma unroll
        for (int i = 0; i < NACC; ++i) red[grp * S + s][i][lane] = acc[i];
        __syncthreads();
    } else if (S > 1) {
        if (s > 0)
#pragma unroll
            for (int i = 0; i < NACC; ++i) red[grp * (S - 1) + s - 1][i][lane] = acc[i];
        __syncthreads();
        if (s == 0)
            for (int k = 0; k < S - 1; ++k)
#pragma unroll
                for (int i = 0; i < NACC; ++i) acc[i] += red[grp * (S - 1) + k][i][lane];
    }
    // Accumulator i summed over the tile's warps (SPLIT), or this warp's (summed above).
    auto total = [&](int i) {
        if constexpr (SPLIT) {
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < S; ++k) v += red[grp * S + k][i][lane];
            return v;
        } else {
            return acc[i];
        }
    };
    // acc[(i * TT + t) * 4 + 2h + e]: token t*16 + g + 8h, unit row u0 + (i / RW) * 8 + tig*2 + e.
    if (OUT == 4) {
        float best[TT][2];
        int bix[TT][2];
#pragma unroll
        for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                best[t][h] = NEG_INF; bix[t][h] = 0x7fffffff;
#pragma unroll
                for (int r = 0; r < RT; ++r)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        int row = u0 + r * 8 + tig * 2 + e;
                        float v = rnd(acc[(r * TT + t) * 4 + 2 * h + e]);
                        if (row < O && v > best[t][h]) { best[t][h] = v; bix[t][h] = row; }
                    }
#pragma unroll
                for (int o = 1; o < 4; o <<= 1) {
                    float ov = __shfl_xor_sync(0xffffffffu, best[t][h], o);
                    int oi = __shfl_xor_sync(0xffffffffu, bix[t][h], o);
                    if (ov > best[t][h] || (ov == best[t][h] && oi < bix[t][h])) { best[t][h] = ov; bix[t][h] = oi; }
                }
                if (s == 0 && tig == 0) { bm[grp][t * 16 + g + 8 * h] = best[t][h]; bi_s[grp][t * 16 + g + 8 * h] = bix[t][h]; }
            }
        __syncthreads();
        if (threadIdx.x < TT * 16) {
            int tk = threadIdx.x;
            float b = bm[0][tk];
            int bi = bi_s[0][tk];
            for (int q = 1; q < RG; ++q)
                if (bm[q][tk] > b || (bm[q][tk] == b && bi_s[q][tk] < bi)) { b = bm[q][tk]; bi = bi_s[q][tk]; }
            inv_s[tk] = b;  // reused: the block's max per token
            if (tk < nt) {
                float* p = aux + ((size_t)tk * gridDim.x + blockIdx.x) * 3;
                p[0] = b; p[1] = __int_as_float(bi);
            }
        }
        __syncthreads();
#pragma unroll
        for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float m = inv_s[t * 16 + g + 8 * h], sum = 0.f;
#pragma unroll
                for (int r = 0; r < RT; ++r)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        int row = u0 + r * 8 + tig * 2 + e;
                        if (row < O && m != NEG_INF) sum += __expf(rnd(acc[(r * TT + t) * 4 + 2 * h + e]) - m);
                    }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                if (s == 0 && tig == 0) bm[grp][t * 16 + g + 8 * h] = sum;
            }
        __syncthreads();
        if (threadIdx.x < TT * 16 && (int)threadIdx.x < nt) {
            float sum = 0.f;
            for (int q = 0; q < RG; ++q) sum += bm[q][threadIdx.x];
            aux[((size_t)threadIdx.x * gridDim.x + blockIdx.x) * 3 + 2] = sum;
        }
    }
    if (SPLIT ? s >= SLOTS : s != 0) return;
    float sq[TT][2];  // OUT 0 with accumulate: squares of the written values per token
#pragma unroll
    for (int t = 0; t < TT; ++t) sq[t][0] = sq[t][1] = 0.f;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int tok = t * 16 + g + 8 * h, row = u0 + r * 8 + tig * 2;
                if (!owns(r, t, h) || tok >= nt || row >= O) continue;
                int di = ((r * RW) * TT + t) * 4 + 2 * h, ui = ((r * RW + RW - 1) * TT + t) * 4 + 2 * h;
                const float d[2] = {total(di), total(di + 1)};
                const float up[2] = {RW == 2 ? total(ui) : 0.f, RW == 2 ? total(ui + 1) : 0.f};
                size_t at = (size_t)tok * O + row;
                if (OUT == 4) {
                    ((float*)y)[at] = rnd(d[0]);
                    if (row + 1 < O) ((float*)y)[at + 1] = rnd(d[1]);
                } else if (OUT == 2) {
                    *(u32*)((u16*)y + at) = (u32)from_f(silu_mul1(rnd(d[0]), rnd(up[0]))) |
                                            ((u32)from_f(silu_mul1(rnd(d[1]), rnd(up[1]))) << 16);
                } else if (OUT == 3) {
                    // Units row, row + 1 of head hd: rows i, i + HD/2 (d) and their partners (up).
                    int hd = row / (HD / 2), i = row % (HD / 2), p = HOIST ? pos_h[t][h] : pos[tok];
                    float a0 = rnd(d[0]), a1 = rnd(d[1]), b0 = rnd(up[0]), b1 = rnd(up[1]);
                    if (bias) {
                        const u16* bh = bias + hd * HD + i;
                        a0 = rnd(a0 + to_f(bh[0])); a1 = rnd(a1 + to_f(bh[1]));
                        b0 = rnd(b0 + to_f(bh[HD / 2])); b1 = rnd(b1 + to_f(bh[HD / 2 + 1]));
                    }
                    size_t crow = ((size_t)slot[tok] * MAX_LEN + p) * NKV;
                    u16* dst;
                    if (hd >= NH + NKV) {
                        dst = vc + (crow + (hd - NH - NKV)) * HD + i;
                    } else {
                        dst = hd < NH ? (u16*)y + (size_t)tok * NH * HD + hd * HD + i
                                      : kc + (crow + (hd - NH)) * HD + i;
                        float c0, c1, s0, s1;
                        if constexpr (HOIST) {
                            const float* q = cs_h[HOIST && OUT == 3 ? r : 0][t][h];
                            c0 = rnd(q[0]); c1 = rnd(q[1]); s0 = rnd(q[2]); s1 = rnd(q[3]);
                        } else {
                            const float* cp = cos_t + (size_t)p * PAIRS + i;
                            const float* sp = sin_t + (size_t)p * PAIRS + i;
                            c0 = rnd(cp[0]); c1 = rnd(cp[1]); s0 = rnd(sp[0]); s1 = rnd(sp[1]);
                        }
                        float ra0 = rnd(a0 * c0) - rnd(b0 * s0), ra1 = rnd(a1 * c1) - rnd(b1 * s1);
                        b0 = rnd(b0 * c0) + rnd(a0 * s0); b1 = rnd(b1 * c1) + rnd(a1 * s1);
                        a0 = ra0; a1 = ra1;
                    }
                    *(u32*)dst = pack2(a0, a1);
                    *(u32*)(dst + HD / 2) = pack2(b0, b1);
                } else {
                    u32* yy = (u32*)((u16*)y + at);
                    float a = d[0], b = d[1];
                    if (accumulate) {
                        u32 old = HOIST ? res_h[HOIST && OUT == 0 ? r : 0][t][h] : *yy;
                        a += to_f((u16)(old & 0xffff));
                        b += to_f((u16)(old >> 16));
                    }
                    u32 v = pack2(a, b);
                    *yy = v;
                    if (ssw && accumulate) {
                        float ra = to_f((u16)(v & 0xffff)), rb = to_f((u16)(v >> 16));
                        sq[t][h] += ra * ra + rb * rb;
                    }
                }
            }
    if (OUT == 0 && ssw && accumulate) {
        // Sum over the four lanes of a token row, then one atomic per (warp, token).
#pragma unroll
        for (int t = 0; t < TT; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v = sq[t][h];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                int tok = t * 16 + g + 8 * h;
                bool mine = false;
#pragma unroll
                for (int r = 0; r < RT; ++r) mine |= owns(r, t, h);
                if (mine && tig == 0 && tok < nt) atomicAdd(ssw + tok, v);
            }
    }
}

#define TC_KERNEL(NAME, K, MODE, ROLE, OUT, TT)                                                   \
    extern "C" __global__ void __launch_bounds__(512) NAME##_t##TT(                             \
        const u16* W, const u16* X, const u16* nw, void* y, int O, int acc, int nt, float* aux,  \
        const float* ssr, float* ssw, float* ssz, const u16* bias, const float* cos_t,           \
        const float* sin_t, const int* pos, const int* slot, u16* kc, u16* vc) {                 \
        tc_impl<K, MODE, TC_##ROLE##_RT##TT, TC_##ROLE##_S##TT, TC_##ROLE##_RG##TT, TT, OUT>(    \
            W, X, nw, y, O, acc, nt, aux, ssr, ssw, ssz, bias, cos_t, sin_t, pos, slot, kc, vc); \
    }
#define TC_ALL(NAME, K, MODE, ROLE, OUT) \
    TC_KERNEL(NAME, K, MODE, ROLE, OUT, 1) TC_KERNEL(NAME, K, MODE, ROLE, OUT, 2) TC_KERNEL(NAME, K, MODE, ROLE, OUT, 4)
TC_ALL(tc_qkv, HIDDEN, 1, QKV, 0)
TC_ALL(tc_qkv_rope, HIDDEN, 1, QKV, 3)
TC_ALL(tc_o, NH * HD, 0, O, 0)
TC_ALL(tc_gate_up, HIDDEN, 1, GU, 2)
TC_ALL(tc_down, INTER, 0, DOWN, 0)
TC_ALL(tc_lm, HIDDEN, 1, LM, 4)
// Plain-input q/k/v and gate/up (an `rmsnorm` wrote the normalized rows) for the steps
// that run the other projections on cuBLAS (`MixRoles`).
TC_ALL(tc_qkv_n, HIDDEN, 0, QKV, 0)
TC_ALL(tc_qkv_rope_n, HIDDEN, 0, QKV, 3)
TC_ALL(tc_gate_up_n, HIDDEN, 0, GU, 2)
