// Decode attention on tensor cores, compiled after mma.cu (mma16816, pack2) in one NVRTC
// module. A block takes one token's whole query group over one key split, as `attn` does,
// with the same splits, partial sums and merge; its ATC_WARPS warps take chunks of 16 keys
// in turn, each with its own running max and sum, merged in shared memory at the end.
//
// Scores: the group's query heads are the rows of A (GROUP <= 8: rows 8..15 stay zero),
// 8 keys the columns of B, head_dim the k of m16n8k16. As in mma.cu a lane's fragments
// are 16 contiguous bytes of a row (one vector load), which only permutes the terms of
// each dot product. Weighted values: the probabilities (rows: heads, k: the chunk's 16
// keys, in the layout the scores leave them) times values whose 8 output columns of
// n-tile nt are dims g * HD/8 + nt for lane group g, so that a lane reads one key's
// values as HD/64 vector loads. The probabilities go in as a bf16/f16 pair (hi + lo, two
// products), so that their rounding costs no more than f32 arithmetic on the values.
// `attn` scores one key per thread and sums the dot products of every head of the group
// one after another. At 32 streams of 128-256 keys: 0.984-0.992 -> 0.940-0.956 ms per
// step on the Qwen2.5-0.5B shape; fewer streams stay on attn / attn_half / attn_few,
// which were faster there (measured on an NVIDIA H200).
#ifndef ATC_WARPS
#define ATC_WARPS 8
#endif
#define ATC_OK (GROUP <= 8 && HD % 64 == 0 && ATC_WARPS * GROUP * (HD + 2) * 4 <= 46 * 1024)

extern "C" __global__ void __launch_bounds__(ATC_WARPS * 32)
attn_tc(const u16* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
        const int* __restrict__ pos, const int* __restrict__ slot, u16* __restrict__ out,
        float* part_o, float* part_ml, unsigned int* counters, float scale, int prefetch,
        int min_split) {
#if ATC_OK
    constexpr int NB = HD / 32;  // a row's 16-byte fragments per lane (dims 32 b + 8 tig ..)
    constexpr int NT = HD / 8;   // n-tiles of the weighted values
    constexpr int VB = HD / 64;  // 16-byte loads of a key's values per lane
    __shared__ float o_s[ATC_WARPS][GROUP][HD];
    __shared__ float ml_s[ATC_WARPS][GROUP][2];
    __shared__ int last_s;
    int t = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z, SG = gridDim.z;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    int L = pos[t] + 1;
    int per = max(min_split, (L + SG - 1) / SG);
    int S = (L + per - 1) / per;
    if (sp >= S) return;
    int j0 = sp * per, j1 = min(L, j0 + per);
    size_t base = (size_t)slot[t] * MAX_LEN * NKV;
    auto krow = [&](int j) { return kc + (base + (size_t)j * NKV + kvh) * HD; };
    auto vrow = [&](int j) { return vc + (base + (size_t)j * NKV + kvh) * HD; };
    // In a decode step every row but the newest is older than the predecessor: the warp's
    // first chunk of keys and values is loaded before the wait, but for the newest row
    // (L - 1), loaded after it. A lane's rows: keys c0 + 8n + g, values vkey(c0, k).
    auto vkey = [&](int c0, int k) { return min(c0 + (k >> 1) * 8 + 2 * tig + (k & 1), j1 - 1); };
    int cf = j0 + 16 * warp;
    uint4 kv0[2][NB], vv0[4][VB];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        int j = min(cf + 8 * n + g, j1 - 1);
#pragma unroll
        for (int b = 0; b < NB; ++b)
            kv0[n][b] = prefetch && cf < j1 && j < L - 1 ? ((const uint4*)krow(j) + tig)[4 * b] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int j = vkey(cf, k);
#pragma unroll
        for (int b = 0; b < VB; ++b)
            vv0[k][b] = prefetch && cf < j1 && j < L - 1 ? ((const uint4*)vrow(j) + g * VB)[b] : make_uint4(0, 0, 0, 0);
    }
    pdl_trigger();
    pdl_wait();
    uint4 qa[NB];
    {
        const uint4* qr = (const uint4*)(q + (size_t)t * NH * HD + (size_t)(kvh * GROUP + min(g, GROUP - 1)) * HD) + tig;
#pragma unroll
        for (int b = 0; b < NB; ++b) qa[b] = g < GROUP ? qr[4 * b] : make_uint4(0, 0, 0, 0);
    }
    float sl = scale * LOG2E;
    float m_r = NEG_INF, l_r = 0.f;
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    for (int c0 = j0 + 16 * warp; c0 < j1; c0 += 16 * ATC_WARPS) {
        // Scores of keys c0 + 8n + (this lane's column g), clamped to a valid row.
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            int j = min(c0 + 8 * n + g, j1 - 1);
            const uint4* kr = (const uint4*)krow(j) + tig;
            bool pre = prefetch && c0 == cf && j < L - 1;
            uint4 kv[NB];
#pragma unroll
            for (int b = 0; b < NB; ++b) kv[b] = pre ? kv0[n][b] : kr[4 * b];
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                mma16816(s[n], qa[b].x, 0u, qa[b].y, 0u, kv[b].x, kv[b].y);
                mma16816(s[n], qa[b].z, 0u, qa[b].w, 0u, kv[b].z, kv[b].w);
            }
        }
        // The values of keys c0 + {2 tig, 2 tig + 1, 8 + 2 tig, 9 + 2 tig}: dims g * NT ..
        uint4 vv[4][VB];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int j = vkey(c0, k);
            const uint4* vr = (const uint4*)vrow(j) + g * VB;
            bool pre = prefetch && c0 == cf && j < L - 1;
#pragma unroll
            for (int b = 0; b < VB; ++b) vv[k][b] = pre ? vv0[k][b] : vr[b];
        }
        // Online softmax of row g over the chunk: its 16 keys are spread over the 4 lanes
        // of the row (d[0], d[1] of both n-tiles: keys 8n + 2 tig + e).
        float mx = NEG_INF;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                int j = c0 + 8 * n + 2 * tig + e;
                s[n][e] = j < j1 ? s[n][e] * sl : NEG_INF;
                mx = fmaxf(mx, s[n][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float m_new = fmaxf(m_r, mx), alpha = exp2f(m_r - m_new);
        m_r = m_new;
        u32 ph[2], pl[2];
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            float p0 = exp2f(s[n][0] - m_new), p1 = exp2f(s[n][1] - m_new);
            sum += p0 + p1;
            ph[n] = pack2(p0, p1);
            float h0 = to_f((u16)(ph[n] & 0xffff)), h1 = to_f((u16)(ph[n] >> 16));
            pl[n] = pack2(p0 - h0, p1 - h1);
        }
        l_r = l_r * alpha + sum;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= alpha;
            o[n][1] *= alpha;
            // B: keys (2 tig, 2 tig + 1) and (8 + 2 tig, 9 + 2 tig) at dim g * NT + n.
            int b = n / 8, w = (n % 8) / 2;
            u32 sel = n % 2 ? 0x7632u : 0x5410u;
            const u32* v0 = (const u32*)&vv[0][b];
            const u32* v1 = (const u32*)&vv[1][b];
            const u32* v2 = (const u32*)&vv[2][b];
            const u32* v3 = (const u32*)&vv[3][b];
            u32 b0 = __byte_perm(v0[w], v1[w], sel), b1 = __byte_perm(v2[w], v3[w], sel);
            mma16816(o[n], ph[0], 0u, ph[1], 0u, b0, b1);
            mma16816(o[n], pl[0], 0u, pl[1], 0u, b0, b1);
        }
    }
    // The row's sum over its 4 lanes, then the warps' partials merged in shared memory.
    l_r += __shfl_xor_sync(0xffffffffu, l_r, 1);
    l_r += __shfl_xor_sync(0xffffffffu, l_r, 2);
    if (g < GROUP) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) o_s[warp][g][(2 * tig + e) * NT + n] = o[n][e];
        if (tig == 0) { ml_s[warp][g][0] = m_r; ml_s[warp][g][1] = l_r; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GROUP * HD; i += ATC_WARPS * 32) {
        int gh = i / HD, d = i % HD;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < ATC_WARPS; ++w) M = fmaxf(M, ml_s[w][gh][0]);
        float num = 0.f, den = 0.f;
#pragma unroll
        for (int w = 0; w < ATC_WARPS; ++w) {
            float m = ml_s[w][gh][0];
            if (m == NEG_INF) continue;  // a warp without keys
            float a = exp2f(m - M);
            num += a * o_s[w][gh][d];
            den += a * ml_s[w][gh][1];
        }
        int h = kvh * GROUP + gh;
        if (S == 1) {
            out[(size_t)t * NH * HD + h * HD + d] = from_f(num / den);
        } else {
            size_t pi = ((size_t)t * NH + h) * SG + sp;
            part_o[pi * HD + d] = num;
            if (d == 0) { part_ml[pi * 2] = M; part_ml[pi * 2 + 1] = den; }
        }
    }
    if (S == 1) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int prev = atomicAdd(&counters[t * gridDim.y + blockIdx.y], 1u);
        last_s = prev == (unsigned int)(S - 1);
    }
    __syncthreads();
    if (!last_s) return;
    __threadfence();
    attn_merge(part_o, part_ml, out, t, kvh * GROUP, GROUP, S, SG, ATC_WARPS * 32);
    if (threadIdx.x == 0) counters[t * gridDim.y + blockIdx.y] = 0u;
#endif
}
