/*
 * Tensor-core forward for f16 / bf16 storage (sm_80 and later): FlashAttention-2's schedule in
 * plain CUDA C with inline PTX.
 *
 * A block owns BQ = 16 * MT * WARPS query rows of one (batch, head); warp w owns rows
 * [16 MT w, 16 MT (w + 1)) -- MT m-tiles of 16 rows, so every K/V fragment it loads feeds MT
 * MMAs -- and runs the whole recurrence for them alone, so no block-wide reduction is ever
 * needed. Per key tile of BK keys:
 *
 *   S  = Q K^T           mma.sync m16n8k16; Q fragments kept in registers where they fit
 *                        (MT D <= 128), else re-read by ldmatrix per k-step; K fragments by
 *                        ldmatrix from swizzled shared memory
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
#include "mma.cuh"

#include <stdint.h>

namespace {

/* ------------------------------------------------------------------ the kernel */

/* WARPS warps of MT m-tiles (16 rows each): BQ = 16 MT WARPS query rows per block. With MT = 2
 * every K/V fragment a warp loads from shared memory feeds two MMAs instead of one. */
template <typename T, int D, int BK, int WARPS, int MT> struct fwd_cfg {
    static constexpr int BQ = 16 * MT * WARPS;
    static constexpr int threads = 32 * WARPS;
    /* Q fragments held in registers when they fit beside O and S */
    static constexpr bool qreg = MT * D <= 128;
    using L = layout<D>;
    /* Q, K x2, V x2, then BK key flags */
    static constexpr size_t flags_off = (size_t)(BQ + 4 * BK) * L::pitch * 2;
    static constexpr size_t smem_bytes = flags_off + (BK + 31) / 32 * 4;
};

/* FAST: scale-only score pipeline and no dropout (the common case, kept lean in registers);
 * otherwise softcap / ALiBi / dropout as needed. */
template <typename T, int D, int BK, int WARPS, int MT, bool FAST>
__global__ void __launch_bounds__(32 * WARPS)
    fa_fwd_kernel_mma__sm80(const fai_cuda_args a)
{
    using cfg = fwd_cfg<T, D, BK, WARPS, MT>;
    using L = typename cfg::L;
    using M = mma_t<T>;
    constexpr int BQ = cfg::BQ, NT = BK / 8, DT = D / 8, KQ = D / 16, KP = BK / 16, R = 2 * MT;
    constexpr float kLog2e = 1.4426950408889634f;

    extern __shared__ __align__(128) unsigned char smem[];
    T *qs = (T *)smem;
    T *ks = qs + BQ * L::pitch;     /* [2][BK][pitch] */
    T *vs = ks + 2 * BK * L::pitch; /* [2][BK][pitch] */
    unsigned char *bad = smem + cfg::flags_off; /* BK bits: keys with a non-finite V element */
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;
    const fai_drop dr = fai_drop_of(a);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3, sw = L::lane_swz(lane);
    const int64_t nqt = (a.sq + BQ - 1) / BQ;
    /* heavy tiles first: under a causal mask the last query tiles see the most keys */
    const int64_t qt = nqt - 1 - blockIdx.x;
    const int64_t i0 = qt * BQ, i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
    /* warp rows [wi0, wi1); the thread's row rr = 2 mt + r is wi0 + 16 mt + 8 r + g */
    const int64_t wi0 = i0 + 16 * MT * warp, wi1 = wi0 + 16 * MT < i1 ? wi0 + 16 * MT : i1;
    const float scale2 = (float)a.score.scale * kLog2e;

    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
        const float slope = a.slopes ? a.slopes[h] : 0.0f;
        const T *qg = fai_at<T>(a.tq, b, 0, h), *kg = fai_at<T>(a.tk, b, 0, hk),
                *vg = fai_at<T>(a.tv, b, 0, hk);

        int64_t klo, khi; /* keys any row of the block may see */
        fai_mask_key_span(&mask, i0, i1, &klo, &khi);
        /* tiles start at a multiple of BK: then every thread's key pair (j, j+1) has j even
         * and j / 4 in common, so one Philox call covers both (and extra keys are masked) */
        klo = klo / BK * BK;
        const int ntiles = klo < khi ? (int)((khi - klo + BK - 1) / BK) : 0;

        /* the allowed key columns [lo, hi) of the thread's row rr within the tile at j0,
         * recomputed where needed (partial tiles) rather than held in registers */
        auto cols = [&](int rr, int64_t j0, int *lo, int *hi) {
            int64_t x, y;
            fai_mask_row(&mask, wi0 + 8 * rr + g, &x, &y);
            x -= j0, y -= j0;
            *lo = x < 0 ? 0 : x > BK ? BK : (int)x;
            *hi = y < 0 ? 0 : y > BK ? BK : (int)y;
        };

        __syncthreads(); /* the previous (b, h)'s readers are done with shared memory */
        /* Q tile, rows past Sq zero-filled */
        tile_load<D, BQ, cfg::threads>(qs, qg + i0 * a.tq.ss, a.tq.ss, a.sq - i0, tid);
        cp_async_commit();
        auto load_kv = [&](int t) {
            const int64_t j0 = klo + (int64_t)t * BK;
            T *kd = ks + (t & 1) * BK * L::pitch, *vd = vs + (t & 1) * BK * L::pitch;
            tile_load<D, BK, cfg::threads>(kd, kg + j0 * a.tk.ss, a.tk.ss, a.sk - j0, tid);
            tile_load<D, BK, cfg::threads>(vd, vg + j0 * a.tv.ss, a.tv.ss, a.sk - j0, tid);
            cp_async_commit();
        };
        if (ntiles > 0)
            load_kv(0);

        uint32_t qf[cfg::qreg ? MT : 1][cfg::qreg ? KQ : 1][4];
        float o[MT][DT][4];
        float m[R], l[R];
#pragma unroll
        for (int rr = 0; rr < R; rr++)
            m[rr] = -INFINITY, l[rr] = 0;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int d = 0; d < DT; d++)
                o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0;

        /* the A fragment (16 x 16) of m-tile mt, k-columns 16 kk .. +15, of the swizzled Q
         * tile: lane l addresses row (l mod 16), chunk 2 kk + l / 16 */
        auto ldA = [&](uint32_t *r, int mt, int kk) {
            ldmatrix_x4(r, qs + L::off_sw(16 * (MT * warp + mt) + (lane & 15), 2 * kk + (lane >> 4), sw));
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
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int kk = 0; kk < KQ; kk++)
                        ldA(qf[cfg::qreg ? mt : 0][cfg::qreg ? kk : 0], mt, kk);

            /* scan V for non-finite values where P = 0 may meet them (see the top) */
            const fai_tile_class bcls = fai_mask_classify(&mask, i0, i1, j0, j0 + BK);
            bool fix = false;
            if (bcls != FAI_TILE_FULL || (!FAST && dr.threshold)) {
                if (tid < (BK + 31) / 32)
                    ((uint32_t *)bad)[tid] = 0;
                __syncthreads();
                int any = 0;
                for (int c = tid; c < BK * (D / 8); c += cfg::threads) {
                    const int r = c / (D / 8), ch = c % (D / 8);
                    uint16_t *p = (uint16_t *)(vt + L::off(r, ch));
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
                fix = __syncthreads_or(any) != 0;
            }

            const fai_tile_class wcls =
                wi0 < wi1 ? fai_mask_classify(&mask, wi0, wi1, j0, j0 + BK) : FAI_TILE_EMPTY;
            if (wcls != FAI_TILE_EMPTY) {
                /* S = Q K^T */
                float s[MT][NT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < NT; n++)
                        s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
#pragma unroll
                for (int kk = 0; kk < KQ; kk++) {
                    uint32_t af[cfg::qreg ? 1 : MT][4];
                    if (!cfg::qreg)
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
                            ldA(af[cfg::qreg ? 0 : mt], mt, kk);
#pragma unroll
                    for (int n = 0; n < NT; n += 2) {
                        /* B fragments of key n-tiles n, n+1: matrices (keys 8n.., d 16kk..),
                         * (8n.., 16kk+8..), (8n+8.., 16kk..), (8n+8.., 16kk+8..) */
                        uint32_t bf[4];
                        const int mi = lane >> 3;
                        ldmatrix_x4(bf, kt + L::off_sw(8 * n + 8 * (mi >> 1) + (lane & 7),
                                                       2 * kk + (mi & 1), sw));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            const uint32_t *A = cfg::qreg ? qf[cfg::qreg ? mt : 0][cfg::qreg ? kk : 0]
                                                          : af[cfg::qreg ? 0 : mt];
                            M::run(s[mt][n], A, bf);
                            M::run(s[mt][n + 1], A, bf + 2);
                        }
                    }
                }
                /* scores to base-2 logits, mask, row max, in separate passes, so that the common full FAST tile runs none of them */
                if (!FAST)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int rr = 2 * mt + (e >> 1), c = 8 * n + 2 * tg + (e & 1);
                                s[mt][n][e] = fai_score_f32(&sc, s[mt][n][e], slope,
                                                            wi0 + 8 * rr + g, j0 + c, nullptr) *
                                              kLog2e;
                            }
                if (wcls == FAI_TILE_PARTIAL) {
                    int lo_c[R], hi_c[R];
#pragma unroll
                    for (int rr = 0; rr < R; rr++)
                        cols(rr, j0, &lo_c[rr], &hi_c[rr]);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int rr = 2 * mt + (e >> 1), c = 8 * n + 2 * tg + (e & 1);
                                if (!(c >= lo_c[rr] && c < hi_c[rr]))
                                    s[mt][n][e] = -INFINITY; /* masked: by selection */
                            }
                }
                /* Row max by FMNMX, which skips NaN; a NaN score still reaches the row through
                 * its P = 2^(NaN - m) in l and O, except in a row whose tile holds nothing but
                 * NaN and -inf: that rare case is caught below, so NaN always propagates. */
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
                /* FAST: the row max of the raw scores times scale2 > 0 is the max of the
                 * logits, so x = s scale2 - m is one FMA inside exp2 */
                const float xs = FAST ? scale2 : 1.0f;
                float alpha[R];
                bool live[R];
#pragma unroll
                for (int rr = 0; rr < R; rr++) {
                    bmax[rr] = fmaxf(bmax[rr], __shfl_xor_sync(0xffffffffu, bmax[rr], 1));
                    bmax[rr] = fmaxf(bmax[rr], __shfl_xor_sync(0xffffffffu, bmax[rr], 2));
                    /* core/recurrence.h's rescale, base 2: skip while nothing finite is seen */
                    float mn = fai_nanmax(m[rr], bmax[rr] * xs);
                    live[rr] = mn != -INFINITY;
                    if (__any_sync(0xffffffffu, !live[rr])) { /* rare: NaN-only rows? */
                        int nan = 0;
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                nan |= s[rr >> 1][n][2 * (rr & 1) + e] != s[rr >> 1][n][2 * (rr & 1) + e];
                        nan |= __shfl_xor_sync(0xffffffffu, nan, 1);
                        nan |= __shfl_xor_sync(0xffffffffu, nan, 2);
                        if (!live[rr] && nan)
                            mn = NAN, live[rr] = true;
                    }
                    alpha[rr] = live[rr] ? ex2(m[rr] - mn) : 1.0f;
                    if (live[rr])
                        m[rr] = mn;
                }
                float rs[R];
                uint32_t pos[R]; /* bit 2n + (e & 1): P of column 8n + 2tg + (e & 1) is > 0 */
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
                /* O *= alpha, skipped when no row of the warp moved its max (most tiles) */
                if (__any_sync(0xffffffffu, rescale))
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int d = 0; d < DT; d++) {
                            o[mt][d][0] *= alpha[2 * mt], o[mt][d][1] *= alpha[2 * mt];
                            o[mt][d][2] *= alpha[2 * mt + 1], o[mt][d][3] *= alpha[2 * mt + 1];
                        }
                /* dropout by selection: P~ = keep ? P : 0 (the 1/(1-p) comes at the end) */
                if (!FAST && dr.threshold) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NT; n++)
#pragma unroll
                            for (int r = 0; r < 2; r++) {
                                const int64_t i = wi0 + 16 * mt + 8 * r + g, j = j0 + 8 * n + 2 * tg;
                                /* keys j, j+1 (j even) share one Philox call (counter j/4) */
                                fai_u32x4 ctr = {{(uint32_t)(j >> 2), (uint32_t)i,
                                                  (uint32_t)(b * dr.hq + h), dr.offset}};
                                fai_u32x4 u = fai_philox4x32_10(ctr, dr.k0, dr.k1);
                                const uint32_t w0 = (j & 2) ? u.v[2] : u.v[0];
                                const uint32_t w1 = (j & 2) ? u.v[3] : u.v[1];
                                if (w0 < dr.threshold)
                                    s[mt][n][2 * r] = 0;
                                if (w1 < dr.threshold)
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
                /* O += P V: P's accumulator tiles n = 2 kk, 2 kk + 1 are the A fragment of
                 * k-step kk: a0 = (row g, keys 2tg..) of tile 2kk, a1 = (row g+8, ..) of tile
                 * 2kk, a2, a3 = the same of tile 2kk+1 */
#pragma unroll
                for (int kk = 0; kk < KP; kk++) {
                    uint32_t pa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pa[mt][0] = M::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                        pa[mt][1] = M::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                        pa[mt][2] = M::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                        pa[mt][3] = M::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                    }
#pragma unroll
                    for (int d = 0; d < DT; d += 2) {
                        /* B fragments of dim n-tiles d, d+1 from V (keys x dims, row-major):
                         * transposed matrices (keys 16kk.., dims 8d..), (16kk+8.., 8d..),
                         * (16kk.., 8d+8..), (16kk+8.., 8d+8..) */
                        uint32_t bf[4];
                        const int mi = lane >> 3;
                        ldmatrix_x4_trans(bf, vt + L::off_sw(16 * kk + 8 * (mi & 1) + (lane & 7),
                                                             d + (mi >> 1), sw));
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            M::run(o[mt][d], pa[mt], bf);
                            M::run(o[mt][d + 1], pa[mt], bf + 2);
                        }
                    }
                }
                /* the flagged keys' exact terms (rare path). The scan zeroed V's non-finite
                 * elements; an allowed, kept term P v with v non-finite is inf or NaN whatever
                 * P's size, and NaN exactly when P = 0: so add (P > 0 ? 1 : 0) v for them.
                 * Column c's P > 0 bit lives in lane 4g + (c mod 8)/2, bit 2 (c/8) + (c mod 2) */
                if (fix) {
                    int lo_c[R], hi_c[R];
#pragma unroll
                    for (int rr = 0; rr < R; rr++)
                        cols(rr, j0, &lo_c[rr], &hi_c[rr]);
                    for (int c = 0; c < BK; c++) {
                        if (!(bad[c >> 3] >> (c & 7) & 1))
                            continue;
                        const int64_t j = j0 + c;
                        const T *vr = vg + j * a.tv.ss;
                        const int src = 4 * g + ((c & 7) >> 1);
#pragma unroll
                        for (int rr = 0; rr < R; rr++) {
                            const uint32_t bits = __shfl_sync(0xffffffffu, pos[rr], src);
                            const int64_t i = wi0 + 8 * rr + g;
                            if (!live[rr] || !(c >= lo_c[rr] && c < hi_c[rr]))
                                continue;
                            if (!FAST && dr.threshold && !fai_keep(dr, b, h, i, j))
                                continue;
                            const float p = (bits >> (2 * (c >> 3) + (c & 1)) & 1) ? 1.0f : 0.0f;
                            const int mt = rr >> 1, r = rr & 1;
#pragma unroll
                            for (int d = 0; d < DT; d++) {
                                const float v0 = fai_storage<T>::load(vr[8 * d + 2 * tg]);
                                const float v1 = fai_storage<T>::load(vr[8 * d + 2 * tg + 1]);
                                /* only the elements the scan zeroed */
                                if (!isfinite(v0))
                                    o[mt][d][2 * r] += p * v0;
                                if (!isfinite(v1))
                                    o[mt][d][2 * r + 1] += p * v1;
                            }
                        }
                    }
                }
            }
            __syncthreads(); /* buffer t & 1 is reloaded by the next iteration */
        }
        cp_async_wait<0>(); /* the Q copy when there was no tile */

        /* finalize (core/recurrence.h's fai_online_finalize in base 2) and store */
#pragma unroll
        for (int rr = 0; rr < R; rr++) {
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
            const int64_t i = wi0 + 8 * rr + g;
            const int mt = rr >> 1, r = rr & 1;
            double lse;
            float f;
            if (!(l[rr] != 0)) { /* nothing absorbed: O = 0, LSE = -inf */
                lse = -INFINITY;
                f = 0;
            } else {
                lse = (double)m[rr] * 0.6931471805599453 + log((double)l[rr]);
                f = (float)a.keep_scale / l[rr];
            }
            if (i >= a.sq)
                continue;
            T *orow = fai_at<T>(a.tout, b, i, h);
#pragma unroll
            for (int d = 0; d < DT; d++) {
                const float x0 = f == 0 ? 0.0f : o[mt][d][2 * r] * f;
                const float x1 = f == 0 ? 0.0f : o[mt][d][2 * r + 1] * f;
                *(uint32_t *)(orow + 8 * d + 2 * tg) = M::pack(x0, x1);
            }
            if (a.tlse.data && tg == 0)
                fai_lse_put(a.tlse, a.lse_f64, b, h, i, lse);
        }
    }
}

/* ------------------------------------------------------------------ launch */

template <typename T, int D, int BK, int WARPS, int MT>
fai_cuda_result launch(const fai_cuda_args &a, char *err, size_t n)
{
    using cfg = fwd_cfg<T, D, BK, WARPS, MT>;
    const bool fast = a.score.softcap == 0 && a.slopes == nullptr && a.drop_threshold == 0;
    auto k = fast ? fa_fwd_kernel_mma__sm80<T, D, BK, WARPS, MT, true>
                  : fa_fwd_kernel_mma__sm80<T, D, BK, WARPS, MT, false>;
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
 * Tile sizes, one place (docs/notes/cuda.md has the measurements behind them):
 *   D <= 128: 4 warps x 2 m-tiles = 128 query rows, 64-key tiles (v1, 4 x 1 = 64 rows, ran at
 *             0.4x FA2: one ldmatrix.x4 per two MMAs saturated shared memory).
 *   D = 256:  4 warps x 1 m-tile = 64 query rows, 32-key tiles (the O accumulator alone is
 *             128 registers), Q read from shared memory at every k-step.
 */
template <typename T>
fai_cuda_result by_dim(const fai_cuda_args &a, char *err, size_t n)
{
    switch (a.dqk) {
    case 32: return launch<T, 32, 64, 4, 2>(a, err, n);
    case 64: return launch<T, 64, 64, 4, 2>(a, err, n);
    case 96: return launch<T, 96, 64, 4, 2>(a, err, n);
    case 128: return launch<T, 128, 64, 4, 2>(a, err, n);
    default: return launch<T, 256, 32, 4, 1>(a, err, n);
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
