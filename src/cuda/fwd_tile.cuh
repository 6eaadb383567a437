/*
 * The per-tile row work of the tensor-core forwards, shared by the mma.sync kernel
 * (fwd_mma.cu) and the wgmma kernel (fwd_wgmma.cu): everything between the two GEMMs of a key
 * tile, and the final store. Both kernels hand over their accumulators in the m16n8 layout,
 * which is also wgmma's per-warp layout:
 *
 *   s[mt][n][e]: score of row 16 mt + 8 (e / 2) + g, column 8 n + 2 tg + (e mod 2) of the
 *                warp's rows, lane = 4 g + tg; o[mt][d][e] the same over the value dims.
 *
 * so the thread's rows are rr = 2 mt + e / 2 = 0 .. 2 MT - 1, row index wi0 + 8 rr + g.
 *
 * The recurrence is the one of core/recurrence.h in base 2: m2 = max x, l = sum 2^(x - m2), so
 * exp(s - m) = 2^(x - m2) with m = m2 ln 2, and the final LSE = m2 ln 2 + ln l, O = acc / l
 * (times 1/(1-p)); a row whose running max is still -inf skips the tile (never -inf - -inf).
 *
 * Masked terms are dropped by selection (x = -inf, so P = 0) -- but P = 0 times a non-finite V
 * element inside the MMA would still be NaN. In every tile that is not fully allowed for the
 * whole block, or when dropout is on, the block therefore scans the V tile in shared memory
 * (fwd_scan_v), replaces non-finite elements by 0 and flags their keys; the few flagged
 * (row, key) pairs that are allowed (and kept) are then added back exactly, P times the
 * original V from global memory, outside the MMA (fwd_add_back). Full tiles without dropout
 * need no scan: every term is allowed and multiplies, as in the reference.
 *
 * Internal to src/cuda/.
 */
#ifndef FAI_CUDA_FWD_TILE_CUH
#define FAI_CUDA_FWD_TILE_CUH

#include "common.cuh"
#include "mma.cuh"

namespace {

/* What a warp's row code needs besides its accumulators. */
struct fwd_rows {
    fai_mask mask;
    fai_score sc;
    fai_dropout dr; /* the head's stream */
    float slope;  /* ALiBi slope of the head (0 without) */
    float scale2; /* score scale * log2(e) */
    int64_t wi0;  /* the warp's first query row */
    int64_t b, h;
    int g, tg; /* lane = 4 g + tg */
};

/* The allowed key columns [lo, hi) of the thread's row rr within the BK-key tile at j0 --
 * recomputed where needed (partial tiles) rather than held in registers across the loop. */
template <int BK>
__device__ __forceinline__ void fwd_cols(const fwd_rows &c, int rr, int64_t j0, int *lo, int *hi)
{
    int64_t x, y;
    fai_mask_row(&c.mask, c.wi0 + 8 * rr + c.g, &x, &y);
    x -= j0, y -= j0;
    *lo = x < 0 ? 0 : x > BK ? BK : (int)x;
    *hi = y < 0 ? 0 : y > BK ? BK : (int)y;
}

/*
 * Zero the non-finite elements of the V tile (BK keys x D, element (r, chunk ch) at
 * vt + off(r, ch)) and set bit r of `bad` (BK bits, cleared beforehand) for their keys, the
 * THREADS threads tid = 0 .. THREADS-1 sharing the work. Returns whether this thread flagged a
 * key; a thread that did has fenced the async proxy, so tensor-core reads (wgmma) ordered
 * after it by a barrier see the zeros.
 */
template <typename T, int D, int BK, int THREADS, class Off>
__device__ __forceinline__ int fwd_scan_v_part(T *vt, unsigned char *bad, int tid, Off off)
{
    using M = mma_t<T>;
    int any = 0;
    for (int c = tid; c < BK * (D / 8); c += THREADS) {
        const int r = c / (D / 8), ch = c % (D / 8);
        uint16_t *p = (uint16_t *)(vt + off(r, ch));
        uint4 w = *(uint4 *)p;
        uint32_t wd[4] = {w.x, w.y, w.z, w.w};
        int hit = 0;
#pragma unroll
        for (int x = 0; x < 4; x++) {
            if (M::nonfinite((uint16_t)wd[x]))
                wd[x] &= 0xffff0000u, hit = 1;
            if (M::nonfinite((uint16_t)(wd[x] >> 16)))
                wd[x] &= 0x0000ffffu, hit = 1;
        }
        if (hit) {
            *(uint4 *)p = make_uint4(wd[0], wd[1], wd[2], wd[3]);
            atomicOr((unsigned int *)(bad + 4 * (r >> 5)), 1u << (r & 31));
            any = 1;
        }
    }
    if (any)
        fence_proxy_async();
    return any;
}

/* fwd_scan_v_part by the whole block (THREADS threads), flags cleared first; returns whether
 * any key was flagged, the same in every thread. Starts and ends with a barrier. */
template <typename T, int D, int BK, int THREADS, class Off>
__device__ __forceinline__ bool fwd_scan_v(T *vt, unsigned char *bad, int tid, Off off)
{
    if (tid < (BK + 31) / 32)
        ((uint32_t *)bad)[tid] = 0;
    __syncthreads();
    return __syncthreads_or(fwd_scan_v_part<T, D, BK, THREADS>(vt, bad, tid, off)) != 0;
}

/*
 * The online-softmax step of one key tile at j0 for the warp's rows: S (raw scores in s) to
 * P (in place), m and l updated, and alpha[rr] the factor that row rr's O takes before this
 * tile's P V is added (fwd_rescale; returns whether any row of the warp has one other than 1).
 * live[rr] says whether row rr took part, and with `fix` pos[rr] gets bit 2n + (e mod 2) for
 * each column 8n + 2tg + (e mod 2) with P > 0 (for fwd_add_back). wcls is the tile's class
 * for the warp's rows (not EMPTY). FAST: scale-only score pipeline and no dropout.
 */
template <int MT, int NT, int BK, bool FAST>
__device__ __forceinline__ bool fwd_softmax_p(const fwd_rows &c, float (&s)[MT][NT][4],
                                              float (&m)[2 * MT], float (&l)[2 * MT],
                                              bool (&live)[2 * MT], uint32_t (&pos)[2 * MT],
                                              float (&alpha)[2 * MT], int64_t j0,
                                              fai_tile_class wcls, bool fix)
{
    constexpr int R = 2 * MT;
    constexpr float kLog2e = FAI_LOG2E_F; /* base-2 units: core/recurrence.h */
    /* scores to base-2 logits, mask, row max, in separate passes, so that the common full
     * FAST tile runs none of them */
    if (!FAST)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int rr = 2 * mt + (e >> 1), col = 8 * n + 2 * c.tg + (e & 1);
                    s[mt][n][e] = fai_score_f32(&c.sc, s[mt][n][e], c.slope,
                                                c.wi0 + 8 * rr + c.g, j0 + col, nullptr) *
                                  kLog2e;
                }
    if (wcls == FAI_TILE_PARTIAL) {
        int lo_c[R], hi_c[R];
#pragma unroll
        for (int rr = 0; rr < R; rr++)
            fwd_cols<BK>(c, rr, j0, &lo_c[rr], &hi_c[rr]);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int rr = 2 * mt + (e >> 1), col = 8 * n + 2 * c.tg + (e & 1);
                    if (!(col >= lo_c[rr] && col < hi_c[rr]))
                        s[mt][n][e] = -INFINITY; /* masked: by selection */
                }
    }
    /* Row max by FMNMX, which skips NaN; a NaN score still reaches the row through its
     * P = 2^(NaN - m) in l and O, except in a row whose tile holds nothing but NaN and -inf:
     * that rare case is caught below, so NaN always propagates. */
    float bmax[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++)
        bmax[rr] = -INFINITY;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                bmax[2 * mt + (e >> 1)] = fmaxf(bmax[2 * mt + (e >> 1)], s[mt][n][e]);
    /* FAST: the row max of the raw scores times scale2 > 0 is the max of the logits, so
     * x = s scale2 - m is one FMA inside exp2 */
    const float xs = FAST ? c.scale2 : 1.0f;
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        bmax[rr] = fmaxf(bmax[rr], __shfl_xor_sync(0xffffffffu, bmax[rr], 1));
        bmax[rr] = fmaxf(bmax[rr], __shfl_xor_sync(0xffffffffu, bmax[rr], 2));
        /* core/recurrence.h's move in base 2: skip while nothing finite is seen, else
         * alpha = 2^(m_old - m_new). FMNMX dropped NaN from the block max: a block whose
         * row holds only NaN and -inf (rare) gets its NaN back here, so NaN propagates */
        float bm = bmax[rr] * xs, x;
        const bool skip = fai_nanmax(m[rr], bm) == -INFINITY;
        if (__any_sync(0xffffffffu, skip)) {
            int nan = 0;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    nan |= s[rr >> 1][n][2 * (rr & 1) + e] != s[rr >> 1][n][2 * (rr & 1) + e];
            nan |= __shfl_xor_sync(0xffffffffu, nan, 1);
            nan |= __shfl_xor_sync(0xffffffffu, nan, 2);
            if (skip && nan)
                bm = NAN;
        }
        live[rr] = fai_online_move_f32(&m[rr], bm, &x);
        alpha[rr] = live[rr] ? ex2(x) : 1.0f;
    }
    float rs[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++)
        rs[rr] = 0, pos[rr] = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = 2 * mt + (e >> 1);
                const float p = live[rr] ? ex2(fmaf(s[mt][n][e], xs, -m[rr])) : 0.0f;
                rs[rr] += p;
                s[mt][n][e] = p;
            }
    bool rescale = false;
#pragma unroll
    for (int rr = 0; rr < R; rr++) {
        l[rr] = alpha[rr] * l[rr] + rs[rr]; /* quad-partial; reduced at the end */
        rescale |= alpha[rr] != 1.0f;
    }
    /* dropout by selection: P~ = keep ? P : 0 (the 1/(1-p) comes at the end) */
    if (!FAST && c.dr.threshold) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int64_t i = c.wi0 + 16 * mt + 8 * r + c.g, j = j0 + 8 * n + 2 * c.tg;
                    /* keys j, j+1 (j even) share one Philox call (counter j/4) */
                    const fai_u32x4 u = fai_dropout_block(&c.dr, i, j);
                    const uint32_t w0 = fai_dropout_word(u, j), w1 = fai_dropout_word(u, j + 1);
                    if (!fai_dropout_kept(&c.dr, w0))
                        s[mt][n][2 * r] = 0;
                    if (!fai_dropout_kept(&c.dr, w1))
                        s[mt][n][2 * r + 1] = 0;
                }
    }
    if (fix)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (s[mt][n][e] > 0)
                        pos[2 * mt + (e >> 1)] |= 1u << (2 * n + (e & 1));
    return __any_sync(0xffffffffu, rescale);
}

/* O *= alpha (fwd_softmax_p's factors), row by row. */
template <int MT, int DT>
__device__ __forceinline__ void fwd_rescale(float (&o)[MT][DT][4], const float (&alpha)[2 * MT])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int d = 0; d < DT; d++) {
            o[mt][d][0] *= alpha[2 * mt], o[mt][d][1] *= alpha[2 * mt];
            o[mt][d][2] *= alpha[2 * mt + 1], o[mt][d][3] *= alpha[2 * mt + 1];
        }
}

/* fwd_softmax_p, then O rescaled at once (skipped when no row of the warp moved its max: most
 * tiles), for a kernel whose O is not in flight in an MMA. */
template <int MT, int NT, int DT, int BK, bool FAST>
__device__ __forceinline__ void fwd_softmax(const fwd_rows &c, float (&s)[MT][NT][4],
                                            float (&o)[MT][DT][4], float (&m)[2 * MT],
                                            float (&l)[2 * MT], bool (&live)[2 * MT],
                                            uint32_t (&pos)[2 * MT], int64_t j0,
                                            fai_tile_class wcls, bool fix)
{
    float alpha[2 * MT];
    if (fwd_softmax_p<MT, NT, BK, FAST>(c, s, m, l, live, pos, alpha, j0, wcls, fix))
        fwd_rescale<MT, DT>(o, alpha);
}

/*
 * The flagged keys' exact terms (rare path, after O += P V). fwd_scan_v zeroed V's non-finite
 * elements; an allowed, kept term P v with v non-finite is inf or NaN whatever P's size, and
 * NaN exactly when P = 0: so add (P > 0 ? 1 : 0) v for them. Column col's P > 0 bit lives in
 * lane 4g + (col mod 8)/2, bit 2 (col/8) + (col mod 2). vg: the head's V rows (row stride ss).
 * The row's first DS of the accumulator's DT column groups are V's (the rest pad the wgmma
 * kernel's O to whole 64-column slabs: fwd_wgmma.cu).
 */
template <typename T, int MT, int DT, int BK, bool FAST, int DS = DT>
__device__ __forceinline__ void fwd_add_back(const fwd_rows &c, float (&o)[MT][DT][4],
                                             const bool (&live)[2 * MT],
                                             const uint32_t (&pos)[2 * MT],
                                             const unsigned char *bad, int64_t j0, const T *vg,
                                             int64_t ss)
{
    constexpr int R = 2 * MT;
    int lo_c[R], hi_c[R];
#pragma unroll
    for (int rr = 0; rr < R; rr++)
        fwd_cols<BK>(c, rr, j0, &lo_c[rr], &hi_c[rr]);
    for (int col = 0; col < BK; col++) {
        if (!(bad[col >> 3] >> (col & 7) & 1))
            continue;
        const int64_t j = j0 + col;
        const T *vr = vg + j * ss;
        const int src = 4 * c.g + ((col & 7) >> 1);
#pragma unroll
        for (int rr = 0; rr < R; rr++) {
            const uint32_t bits = __shfl_sync(0xffffffffu, pos[rr], src);
            const int64_t i = c.wi0 + 8 * rr + c.g;
            if (!live[rr] || !(col >= lo_c[rr] && col < hi_c[rr]))
                continue;
            if (!FAST && c.dr.threshold && !fai_dropout_keep(&c.dr, i, j))
                continue;
            const float p = (bits >> (2 * (col >> 3) + (col & 1)) & 1) ? 1.0f : 0.0f;
            const int mt = rr >> 1, r = rr & 1;
#pragma unroll
            for (int d = 0; d < DS; d++) {
                const float v0 = fai_storage<T>::load(vr[8 * d + 2 * c.tg]);
                const float v1 = fai_storage<T>::load(vr[8 * d + 2 * c.tg + 1]);
                /* only the elements the scan zeroed */
                if (!isfinite(v0))
                    o[mt][d][2 * r] += p * v0;
                if (!isfinite(v1))
                    o[mt][d][2 * r + 1] += p * v1;
            }
        }
    }
}

/* End the rows (core/recurrence.h's fai_online_end_base2_f32: the head's sink, in base-2 units,
 * then the finalization) and store the warp's rows of O (the first DS column groups) and LSE;
 * rows at or past Sq are skipped. */
template <typename T, int MT, int DT, int DS = DT>
__device__ __forceinline__ void fwd_store(const fai_cuda_args &a, const fwd_rows &c,
                                          const float (&o)[MT][DT][4], const float (&m)[2 * MT],
                                          float (&l)[2 * MT])
{
    using M = mma_t<T>;
#pragma unroll
    for (int rr = 0; rr < 2 * MT; rr++) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        const int64_t i = c.wi0 + 8 * rr + c.g;
        const int mt = rr >> 1, r = rr & 1;
        double lse;
        float f;
        const float s2 = a.sinks ? a.sinks[c.h] * FAI_LOG2E_F : -INFINITY;
        const int live = fai_online_end_base2_f32(m[rr], l[rr], s2, (float)a.keep_scale, &lse, &f);
        if (i >= a.sq)
            continue;
        T *orow = fai_at<T>(a.tout, c.b, i, c.h);
#pragma unroll
        for (int d = 0; d < DS; d++) {
            const float x0 = live ? o[mt][d][2 * r] * f : 0.0f;
            const float x1 = live ? o[mt][d][2 * r + 1] * f : 0.0f;
            *(uint32_t *)(orow + 8 * d + 2 * c.tg) = M::pack(x0, x1);
        }
        if (a.tlse.data && c.tg == 0)
            fai_lse_put(a.tlse, a.lse_f64, c.b, c.h, i, lse);
    }
}

} // namespace

#endif
