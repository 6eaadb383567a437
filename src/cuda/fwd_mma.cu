/*
 * Tensor-core forward for f16 / bf16 storage (sm_80 and later): FlashAttention-2's schedule in
 * plain CUDA C with inline PTX.
 *
 * A block owns BQ = 16 * WARPS query rows of one (batch, head); warp w owns rows
 * [16 w, 16 w + 16) of them and runs the whole recurrence for them alone, so no block-wide
 * reduction is ever needed. Per key tile of BK keys:
 *
 *   S  = Q K^T           mma.sync m16n8k16, Q fragments in registers (ldmatrix once), K
 *                        fragments by ldmatrix from swizzled shared memory
 *   x  = S * scale * log2(e)      (or the full §1 pipeline, then * log2(e)): base-2 logits
 *   mask, row max m (4-lane quad shuffles), P = exp2(x - m), l += rowsum P
 *   O  = alpha O + P V   P converted to 16-bit in registers *is* the A operand of the second
 *                        MMA (the accumulator layout of m16n8 equals the A layout of m16k16
 *                        two n-tiles at a time), V fragments by ldmatrix.trans
 *
 * K and V tiles are double-buffered with cp.async: tile t + 1 is in flight while tile t is
 * computed. The shared-memory rows are XOR-swizzled in 16-byte chunks so that the 8 row
 * addresses of every ldmatrix phase hit 8 different bank groups.
 *
 * The recurrence is the one of core/recurrence.h in base 2: m2 = max x, l = sum 2^(x - m2), so
 * exp(s - m) = 2^(x - m2) with m = m2 ln 2, and the final LSE = m2 ln 2 + ln l, O = acc / l
 * (times 1/(1-p)); a row whose running max is still -inf skips the tile (never -inf - -inf).
 *
 * Masked terms are dropped by selection (x = -inf, so P = 0) -- but P = 0 times a non-finite V
 * element inside the MMA would still be NaN. In every tile that is not fully allowed for the
 * whole block, or when dropout is on, the block therefore scans the V tile in shared memory,
 * replaces non-finite elements by 0 and flags their keys; the few flagged (row, key) pairs
 * that are allowed (and kept) are then added back exactly, P times the original V from global
 * memory, outside the MMA. Full tiles without dropout need no scan: every term is allowed and
 * multiplies, as in the reference.
 */
#include "common.cuh"

#include <stdint.h>

namespace {

/* ------------------------------------------------------------------ PTX wrappers */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; with pred false the 16 bytes are zero-filled and
 * nothing is read. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool pred)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

template <typename T> struct mma_t;
template <> struct mma_t<__nv_bfloat16> {
    /* d += a b, m16n8k16, bf16 in, f32 accumulate */
    __device__ static void run(float *d, const uint32_t *a, const uint32_t *b)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    /* non-finite: exponent all ones */
    __device__ static bool nonfinite(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u; }
};
template <> struct mma_t<__half> {
    __device__ static void run(float *d, const uint32_t *a, const uint32_t *b)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static uint32_t pack(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    __device__ static bool nonfinite(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u; }
};

/* ------------------------------------------------------------------ shared-memory layout */

/*
 * A tile row of D 16-bit elements is D/8 chunks of 16 bytes, stored in a row of P chunks
 * (P = D/8 rounded up to a power of two, so D = 96 uses rows of 16 chunks). Chunk c of row r
 * sits at chunk position c ^ swz(r):
 *   P >= 8:  swz(r) = r mod 8. Rows are >= 128 bytes, so the 8 rows r0..r0+7 (r0 = 0 mod 8)
 *            that one ldmatrix phase reads at one logical chunk c land on the 8 distinct
 *            positions c ^ 0..7 of one 128-byte window: 8 different bank groups.
 *   P == 4:  rows are 64 bytes, two rows per 128-byte line; swz(r) = (r / 2) mod 4 gives rows
 *            r0..r0+7 the byte offsets 64 (r mod 2) + 16 (c ^ (r/2 mod 4)) within their line:
 *            8 distinct values, again 8 different bank groups.
 * The XOR stays inside [0, P) since c < P and swz(r) < P.
 */
template <int D> struct layout {
    static constexpr int chunks = D / 8;
    static constexpr int P = chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    static constexpr int pitch = P * 8; /* elements */
    __device__ static int off(int r, int c)
    {
        const int s = P >= 8 ? (r & 7) : ((r >> 1) & 3);
        return r * pitch + ((c ^ s) << 3);
    }
};

/* ------------------------------------------------------------------ the kernel */

template <typename T, int D, int BK, int WARPS> struct fwd_cfg {
    static constexpr int BQ = 16 * WARPS;
    static constexpr int threads = 32 * WARPS;
    static constexpr bool qreg = D <= 128; /* Q fragments held in registers */
    using L = layout<D>;
    /* Q, K x2, V x2, then the fix path's scratch: each warp's 16 x BK probabilities (f32),
     * then BK key flags */
    static constexpr size_t scratch_off = (size_t)(BQ + 4 * BK) * L::pitch * 2;
    static constexpr size_t smem_bytes = scratch_off + (size_t)WARPS * 16 * BK * 4 + BK / 8;
};

/* FAST: scale-only score pipeline and no dropout (the common case, kept lean in registers);
 * otherwise softcap / ALiBi / dropout as needed. */
template <typename T, int D, int BK, int WARPS, bool FAST>
__global__ void __launch_bounds__(32 * WARPS)
    fa_fwd_kernel_mma__sm80(const fai_cuda_args a)
{
    using cfg = fwd_cfg<T, D, BK, WARPS>;
    using L = typename cfg::L;
    using M = mma_t<T>;
    constexpr int BQ = cfg::BQ, NT = BK / 8, DT = D / 8, KQ = D / 16, KP = BK / 16;
    constexpr float kLog2e = 1.4426950408889634f;

    extern __shared__ __align__(128) unsigned char smem[];
    T *qs = (T *)smem;
    T *ks = qs + BQ * L::pitch;           /* [2][BK][pitch] */
    T *vs = ks + 2 * BK * L::pitch;       /* [2][BK][pitch] */
    float *pscr = (float *)(smem + cfg::scratch_off);                 /* [WARPS][16][BK] */
    unsigned char *bad = (unsigned char *)(pscr + WARPS * 16 * BK);    /* BK bits: key flags */
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;
    const fai_drop dr = fai_drop_of(a);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;
    const int64_t nqt = (a.sq + BQ - 1) / BQ;
    /* heavy tiles first: under a causal mask the last query tiles see the most keys */
    const int64_t qt = nqt - 1 - blockIdx.x;
    const int64_t i0 = qt * BQ, i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
    const int64_t wi0 = i0 + 16 * warp, wi1 = wi0 + 16 < i1 ? wi0 + 16 : i1;
    const float scale2 = (float)a.score.scale * kLog2e;

    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
        const float slope = a.slopes ? a.slopes[h] : 0.0f;
        const T *qg = fai_at<T>(a.tq, b, 0, h), *kg = fai_at<T>(a.tk, b, 0, hk),
                *vg = fai_at<T>(a.tv, b, 0, hk);

        int64_t klo, khi; /* keys any row of the block may see */
        fai_mask_key_span(&mask, i0, i1, &klo, &khi);
        const int ntiles = klo < khi ? (int)((khi - klo + BK - 1) / BK) : 0;

        /* the thread's two rows per warp: g and g + 8; their allowed keys [lo, hi) */
        int64_t rlo[2], rhi[2];
        for (int r = 0; r < 2; r++)
            fai_mask_row(&mask, wi0 + g + 8 * r, &rlo[r], &rhi[r]);

        __syncthreads(); /* the previous (b, h)'s readers are done with shared memory */
        /* Q tile, rows past Sq zero-filled */
        for (int c = tid; c < BQ * (D / 8); c += cfg::threads) {
            const int r = c / (D / 8), ch = c % (D / 8);
            const bool ok = i0 + r < a.sq;
            cp_async16(qs + L::off(r, ch), qg + (ok ? (i0 + r) * a.tq.ss + ch * 8 : 0), ok);
        }
        cp_async_commit();
        auto load_kv = [&](int t) {
            const int64_t j0 = klo + (int64_t)t * BK;
            T *kd = ks + (t & 1) * BK * L::pitch, *vd = vs + (t & 1) * BK * L::pitch;
            for (int c = tid; c < BK * (D / 8); c += cfg::threads) {
                const int r = c / (D / 8), ch = c % (D / 8);
                const bool ok = j0 + r < a.sk;
                cp_async16(kd + L::off(r, ch), kg + (ok ? (j0 + r) * a.tk.ss + ch * 8 : 0), ok);
                cp_async16(vd + L::off(r, ch), vg + (ok ? (j0 + r) * a.tv.ss + ch * 8 : 0), ok);
            }
            cp_async_commit();
        };
        if (ntiles > 0)
            load_kv(0);

        uint32_t qf[cfg::qreg ? KQ : 1][4];
        float o[DT][4];
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
        for (int d = 0; d < DT; d++)
            o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0;

        /* the A fragment (16 x 16) of rows 16 warp .. +15, k-columns 16 kk .. +15, of a
         * swizzled tile: lane l addresses row (l mod 16), chunk 2 kk + l / 16 */
        auto ldA = [&](uint32_t *r, const T *base, int kk) {
            ldmatrix_x4(r, base + L::off(16 * warp + (lane & 15), 2 * kk + (lane >> 4)));
        };

        for (int t = 0; t < ntiles; t++) {
            const int64_t j0 = klo + (int64_t)t * BK;
            if (t + 1 < ntiles) {
                load_kv(t + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const T *kt = ks + (t & 1) * BK * L::pitch;
            T *vt = vs + (t & 1) * BK * L::pitch;
            if (cfg::qreg && t == 0)
#pragma unroll
                for (int kk = 0; kk < KQ; kk++)
                    ldA(qf[kk], qs, kk);

            /* scan V for non-finite values where P = 0 may meet them (see the top) */
            const fai_tile_class bcls = fai_mask_classify(&mask, i0, i1, j0, j0 + BK);
            bool fix = false;
            if (bcls != FAI_TILE_FULL || (!FAST && dr.threshold)) {
                if (tid < BK / 8)
                    bad[tid] = 0;
                __syncthreads();
                int any = 0;
                for (int c = tid; c < BK * (D / 8); c += cfg::threads) {
                    const int r = c / (D / 8), ch = c % (D / 8);
                    uint16_t *p = (uint16_t *)(vt + L::off(r, ch));
                    uint4 w = *(uint4 *)p;
                    uint16_t *e = (uint16_t *)&w;
                    int hit = 0;
#pragma unroll
                    for (int x = 0; x < 8; x++)
                        if (M::nonfinite(e[x])) {
                            e[x] = 0;
                            hit = 1;
                        }
                    if (hit) {
                        *(uint4 *)p = w;
                        atomicOr((unsigned int *)(bad + (r >> 3 & ~3)), 1u << ((r & 31)));
                        any = 1;
                    }
                }
                fix = __syncthreads_or(any) != 0;
            }

            const fai_tile_class wcls =
                wi0 < wi1 ? fai_mask_classify(&mask, wi0, wi1, j0, j0 + BK) : FAI_TILE_EMPTY;
            if (wcls != FAI_TILE_EMPTY) {
                /* S = Q K^T */
                float s[NT][4];
#pragma unroll
                for (int n = 0; n < NT; n++)
                    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0;
#pragma unroll
                for (int kk = 0; kk < KQ; kk++) {
                    uint32_t af[4];
                    if (!cfg::qreg)
                        ldA(af, qs, kk);
                    const uint32_t *A = cfg::qreg ? qf[cfg::qreg ? kk : 0] : af;
#pragma unroll
                    for (int n = 0; n < NT; n += 2) {
                        /* B fragments of key n-tiles n, n+1: matrices (keys 8n.., d 16kk..),
                         * (8n.., 16kk+8..), (8n+8.., 16kk..), (8n+8.., 16kk+8..) */
                        uint32_t bf[4];
                        const int mi = lane >> 3;
                        ldmatrix_x4(bf, kt + L::off(8 * n + 8 * (mi >> 1) + (lane & 7),
                                                    2 * kk + (mi & 1)));
                        M::run(s[n], A, bf);
                        M::run(s[n + 1], A, bf + 2);
                    }
                }
                /* scores to base-2 logits, mask, row max. Row r allows the tile's key
                 * columns [lo_c, hi_c): 32-bit, relative to j0 */
                int lo_c[2], hi_c[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int64_t x = rlo[r] - j0, y = rhi[r] - j0;
                    lo_c[r] = x < 0 ? 0 : x > BK ? BK : (int)x;
                    hi_c[r] = y < 0 ? 0 : y > BK ? BK : (int)y;
                }
                float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, c = 8 * n + 2 * tg + (e & 1);
                        float x;
                        if (FAST)
                            x = s[n][e] * scale2;
                        else
                            x = fai_score_f32(&sc, s[n][e], slope, wi0 + g + 8 * r, j0 + c,
                                              nullptr) *
                                kLog2e;
                        if (wcls == FAI_TILE_PARTIAL && !(c >= lo_c[r] && c < hi_c[r]))
                            x = -INFINITY;
                        s[n][e] = x;
                        bmax[r] = fai_nanmax(bmax[r], x);
                    }
                float alpha[2];
                bool live[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    bmax[r] = fai_nanmax(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 1));
                    bmax[r] = fai_nanmax(bmax[r], __shfl_xor_sync(0xffffffffu, bmax[r], 2));
                    /* core/recurrence.h's rescale, base 2: skip while nothing finite is seen */
                    const float mn = fai_nanmax(m[r], bmax[r]);
                    live[r] = mn != -INFINITY;
                    alpha[r] = live[r] ? exp2f(m[r] - mn) : 1.0f;
                    if (live[r])
                        m[r] = mn;
                }
                float rs[2] = {0, 0};
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1;
                        const float p = live[r] ? exp2f(s[n][e] - m[r]) : 0.0f;
                        rs[r] += p;
                        s[n][e] = p;
                    }
#pragma unroll
                for (int r = 0; r < 2; r++)
                    l[r] = alpha[r] * l[r] + rs[r]; /* quad-partial; reduced at the end */
#pragma unroll
                for (int d = 0; d < DT; d++) {
                    o[d][0] *= alpha[0], o[d][1] *= alpha[0];
                    o[d][2] *= alpha[1], o[d][3] *= alpha[1];
                }
                /* dropout by selection: P~ = keep ? P : 0 (the 1/(1-p) comes at the end) */
                if (!FAST && dr.threshold) {
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int64_t i = wi0 + g + 8 * r, j = j0 + 8 * n + 2 * tg;
                            /* keys j, j+1 (j even) share one Philox call (counter j/4) */
                            fai_u32x4 ctr = {{(uint32_t)(j >> 2), (uint32_t)i,
                                              (uint32_t)(b * dr.hq + h), dr.offset}};
                            fai_u32x4 u = fai_philox4x32_10(ctr, dr.k0, dr.k1);
                            const uint32_t w0 = (j & 2) ? u.v[2] : u.v[0];
                            const uint32_t w1 = (j & 2) ? u.v[3] : u.v[1];
                            if (w0 < dr.threshold)
                                s[n][2 * r] = 0;
                            if (w1 < dr.threshold)
                                s[n][2 * r + 1] = 0;
                        }
                }
                /* O += P V: P's accumulator tiles n = 2 kk, 2 kk + 1 are the A fragment of
                 * k-step kk: a0 = (row g, keys 2tg..) of tile 2kk, a1 = (row g+8, ..) of tile
                 * 2kk, a2, a3 = the same of tile 2kk+1 */
#pragma unroll
                for (int kk = 0; kk < KP; kk++) {
                    uint32_t pa[4];
                    pa[0] = M::pack(s[2 * kk][0], s[2 * kk][1]);
                    pa[1] = M::pack(s[2 * kk][2], s[2 * kk][3]);
                    pa[2] = M::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pa[3] = M::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                    for (int d = 0; d < DT; d += 2) {
                        /* B fragments of dim n-tiles d, d+1 from V (keys x dims, row-major):
                         * transposed matrices (keys 16kk.., dims 8d..), (16kk+8.., 8d..),
                         * (16kk.., 8d+8..), (16kk+8.., 8d+8..) */
                        uint32_t bf[4];
                        const int mi = lane >> 3;
                        ldmatrix_x4_trans(bf, vt + L::off(16 * kk + 8 * (mi & 1) + (lane & 7),
                                                          d + (mi >> 1)));
                        M::run(o[d], pa, bf);
                        M::run(o[d + 1], pa, bf + 2);
                    }
                }
                /* the flagged keys' exact terms, P times the original V (rare path): the
                 * warp's P~ goes through its scratch so keys can be walked at run time */
                if (fix) {
                    float *ps = pscr + warp * 16 * BK;
#pragma unroll
                    for (int n = 0; n < NT; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            ps[(g + 8 * (e >> 1)) * BK + 8 * n + 2 * tg + (e & 1)] = s[n][e];
                    __syncwarp();
                    for (int c = 0; c < BK; c++) {
                        if (!(bad[c >> 3] >> (c & 7) & 1))
                            continue;
                        const int64_t j = j0 + c;
                        const T *vr = vg + j * a.tv.ss;
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int64_t i = wi0 + g + 8 * r;
                            if (!live[r] || !(c >= lo_c[r] && c < hi_c[r]))
                                continue;
                            if (!FAST && dr.threshold && !fai_keep(dr, b, h, i, j))
                                continue;
                            const float p = ps[(g + 8 * r) * BK + c];
#pragma unroll
                            for (int d = 0; d < DT; d++) {
                                const float v0 = fai_storage<T>::load(vr[8 * d + 2 * tg]);
                                const float v1 = fai_storage<T>::load(vr[8 * d + 2 * tg + 1]);
                                /* only the elements the scan zeroed */
                                if (!isfinite(v0))
                                    o[d][2 * r] += p * v0;
                                if (!isfinite(v1))
                                    o[d][2 * r + 1] += p * v1;
                            }
                        }
                    }
                    __syncwarp();
                }
            }
            __syncthreads(); /* buffer t & 1 is reloaded by the next iteration */
        }
        cp_async_wait<0>(); /* the Q copy when there was no tile */

        /* finalize (core/recurrence.h's fai_online_finalize in base 2) and store */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
            const int64_t i = wi0 + g + 8 * r;
            double lse;
            float f;
            if (!(l[r] != 0)) { /* nothing absorbed: O = 0, LSE = -inf */
                lse = -INFINITY;
                f = 0;
            } else {
                lse = (double)m[r] * 0.6931471805599453 + log((double)l[r]);
                f = (float)a.keep_scale / l[r];
            }
            if (i >= a.sq)
                continue;
            T *orow = fai_at<T>(a.tout, b, i, h);
#pragma unroll
            for (int d = 0; d < DT; d++) {
                const float x0 = f == 0 ? 0.0f : o[d][2 * r] * f;
                const float x1 = f == 0 ? 0.0f : o[d][2 * r + 1] * f;
                *(uint32_t *)(orow + 8 * d + 2 * tg) = M::pack(x0, x1);
            }
            if (a.tlse.data && tg == 0)
                fai_lse_put(a.tlse, a.lse_f64, b, h, i, lse);
        }
    }
}

/* ------------------------------------------------------------------ launch */

template <typename T, int D, int BK, int WARPS>
fai_cuda_result launch(const fai_cuda_args &a, char *err, size_t n)
{
    using cfg = fwd_cfg<T, D, BK, WARPS>;
    const bool fast = a.score.softcap == 0 && a.slopes == nullptr && a.drop_threshold == 0;
    auto k = fast ? fa_fwd_kernel_mma__sm80<T, D, BK, WARPS, true>
                  : fa_fwd_kernel_mma__sm80<T, D, BK, WARPS, false>;
    const size_t sm = cfg::smem_bytes;
    if (sm > 48 * 1024 &&
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
            cudaSuccess)
        return fai_cuda_check_launch("tensor-core forward: shared memory", err, n);
    const int64_t nqt = (a.sq + cfg::BQ - 1) / cfg::BQ, bh = a.b * a.hq;
    dim3 grid((unsigned)nqt, (unsigned)(bh < 65535 ? bh : 65535));
    k<<<grid, cfg::threads, sm, (cudaStream_t)a.stream>>>(a);
    return fai_cuda_check_launch("tensor-core forward", err, n);
}

/*
 * Tile sizes, one place (see docs/notes/cuda.md for the measurements behind them):
 *   D <= 128: 4 warps x 16 rows = 64 query rows, 64-key tiles, Q in registers.
 *   D = 256:  64 query rows, 32-key tiles (the O accumulator alone is 128 registers), Q read
 *             from shared memory at every k-step.
 */
template <typename T>
fai_cuda_result by_dim(const fai_cuda_args &a, char *err, size_t n)
{
    switch (a.dqk) {
    case 32: return launch<T, 32, 64, 4>(a, err, n);
    case 64: return launch<T, 64, 64, 4>(a, err, n);
    case 96: return launch<T, 96, 64, 4>(a, err, n);
    case 128: return launch<T, 128, 64, 4>(a, err, n);
    default: return launch<T, 256, 32, 4>(a, err, n);
    }
}

/* Whether the tensor-core kernel applies: 16-bit storage, Dqk = Dv in {32, 64, 96, 128, 256},
 * every row 16-byte aligned (base and strides), so cp.async can move whole chunks. */
bool applies(const fai_cuda_args &a)
{
    if (a.dtype != FA_BF16 && a.dtype != FA_F16)
        return false;
    if (a.dqk != a.dv)
        return false;
    if (a.dqk != 32 && a.dqk != 64 && a.dqk != 96 && a.dqk != 128 && a.dqk != 256)
        return false;
    const fai_cuda_view *vs[4] = {&a.tq, &a.tk, &a.tv, &a.tout};
    for (int t = 0; t < 4; t++) {
        if ((uintptr_t)vs[t]->data % 16 != 0)
            return false;
        if (vs[t]->sb % 8 || vs[t]->ss % 8 || vs[t]->sh % 8)
            return false;
    }
    return true;
}

} // namespace

fai_cuda_result fai_cuda_forward_mma(const fai_cuda_args *a, char *err, size_t n)
{
    if (!applies(*a))
        return FAI_CUDA_UNSUPPORTED;
    if (a->sq == 0 || a->b * a->hq == 0)
        return FAI_CUDA_OK;
    return a->dtype == FA_BF16 ? by_dim<__nv_bfloat16>(*a, err, n) : by_dim<__half>(*a, err, n);
}

const char *fai_cuda_forward_mma_name(const fai_cuda_args *a)
{
    if (!applies(*a))
        return nullptr;
    switch (a->dqk) {
    case 32: return "fa_fwd_kernel_mma__sm80 64x64 D32";
    case 64: return "fa_fwd_kernel_mma__sm80 64x64 D64";
    case 96: return "fa_fwd_kernel_mma__sm80 64x64 D96";
    case 128: return "fa_fwd_kernel_mma__sm80 64x64 D128";
    default: return "fa_fwd_kernel_mma__sm80 64x32 D256";
    }
}
