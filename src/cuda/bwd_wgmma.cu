/*
 * Tensor-core backward on Hopper (sm_90a): wgmma, TMA and warp specialization, for f16 / bf16
 * storage, Dqk = Dv = 64, 96 (padded to 128 in shared memory, as in fwd_wgmma.cu), 128 or 256,
 * the scale-only score pipeline without dropout (the FAST case of bwd_mma.cu, whose kernels
 * handle everything else). The same schedule as bwd_mma.cu: parallel over key blocks, P
 * recomputed from the forward's LSE, dK and dV held in registers across every query tile of
 * the GQA group and written once.
 *
 * A block owns BK keys of one (batch, KV head) and has three warpgroups:
 *
 *   producer   (warpgroup 0, its registers given to the others): one thread loads K and V by
 *              TMA once, then Q and dO tile by tile (BQ = 64 rows) into STAGES stages; the
 *              group's 128 threads copy the tile's LSE_i log2(e) and D_i beside them. A stage
 *              completes on its `full` mbarrier (128 arrivals and the TMA bytes) and is
 *              reloaded when the consumers have released it on `empty`.
 *   consumers  (warpgroups 1 and 2), per query tile, in one of two arrangements:
 *
 * Split keys (D <= 128, BK = 128): group c owns keys [64 c, 64 c + 64) of the block, all dims.
 *   S^T  = K Q^T     wgmma m64n64k16, K rows and Q rows both K-major
 *   dP^T = V dO^T    the same with V and dO, in a group of its own: P^T is computed while
 *                    its MMAs run
 *   P^T  = 2^(S^T scale log2(e) - LSE_i log2(e)),  dS^T = P^T (dP^T - D_i) scale
 *   dV  += P^T dO    wgmma m64n(DP)k16, A = P^T from registers, dO MN-major
 *   dK  += dS^T Q    the same with dS^T and Q
 *   dQ  += dS K      dS^T through shared memory: at D 96 and 128 both groups' (one named
 *                    barrier), group c taking dims [64 c, 64 c + 64) over the block's 128
 *                    keys; at D 64 each group its own (a barrier of its own), all dims over its
 *                    own 64 keys. wgmma m64n64k16 with A = dS^T read MN-major (transposed) and
 *                    B = K read MN-major.
 *
 * Split dims (D = 256, BK = 64): dK and dV of 64 keys x 256 dims are 256 registers a consumer
 * thread, so group c owns dims [128 c, 128 c + 128) of them (128 registers) and queries
 * [32 c, 32 c + 32) of the tile's S^T:
 *   S^T, dP^T        wgmma m64n32k16: the block's 64 keys x the group's 32 queries (as
 *                    above, P^T computed while dP^T's MMAs run)
 *   P^T, dS^T        as above, both into shared memory (one named barrier: each group needs
 *                    the other's queries)
 *   dV  += P^T dO    wgmma m64n128k16 over the group's dims, A = P^T and B = dO (MN-major)
 *                    from shared memory
 *   dK  += dS^T Q    the same with dS^T and Q
 *   dQ   = dS K      over the group's dims, A = dS^T read MN-major, B = K MN-major; issued
 *                    first, so its sums go out while dV's and dK's MMAs run.
 *
 * dQ's f32 sums go to the workspace's accumulator: split keys, each group's 64 x 64 part is
 * staged in shared memory (TMA's swizzled f32 boxes) and added by one thread's TMA reduce-adds;
 * split dims, by atomics (no shared memory is left for a stage). In deterministic mode dQ is
 * left to bwd_mma.cu's ordered kernel (D <= 128: the plan takes D 256 here only without it).
 * As in bwd_mma.cu, masked pairs are dropped by selection and the kernel runs only when q, k,
 * v and dout are finite (the pre-pass's flag), so a selected 0 times any operand is 0.
 * Consumers meet only at the barrier after the exchange; the exchanged tiles alternate between
 * two copies, so a group writing tile u + 2 cannot overwrite what the other still reads for
 * tile u (it has passed the barrier of tile u + 1, which the reader reaches only after its
 * MMAs of tile u have completed).
 */
#include "common.cuh"
#include "wgmma.cuh"

#include "config.h"

#include <stdint.h>

namespace {

/* The TMA descriptors of Q and dO (boxes of 64 dims x BQ rows), of K and V (x BK rows), and of
 * the f32 dQ accumulator (boxes of 32 dims x BQ rows; split keys, dQ not deterministic). */
struct bwd_maps {
    CUtensorMap q, dout, k, v, dq;
};

/* D: the head dim; DP: D padded to whole 64-column slabs (96 -> 128), the width of the tiles in
 * shared memory and of dK, dV. TMA fills the padding with zeros (past the tensor map's D):
 * S^T and dP^T run D / 16 k-steps, and the padding columns of dK, dV and dQ are never stored. */
template <int D, bool DQ = true> struct bwg_cfg {
    static constexpr bool SPLIT_DIMS = D == 256; /* the arrangement (above) */
    static constexpr int BK = SPLIT_DIMS ? 64 : 128, BQ = 64, STAGES = 2, threads = 384;
    static constexpr int DP = (D + 63) / 64 * 64;
    using LK = slab_layout<DP, BK>; /* K, V */
    using LQ = slab_layout<DP, BQ>; /* Q, dO tiles */
    using LS = slab_layout<64, BK>; /* dS^T, P^T: the block's keys x the tile's 64 queries */
    static constexpr uint32_t kv_bytes = BK * DP * 2, q_bytes = BQ * DP * 2,
                              ds_bytes = BK * BQ * 2;
    /* the exchanged tiles: dS^T x 2 for dQ, and P^T x 2 where the groups split the dims */
    static constexpr int NX = SPLIT_DIMS ? 4 : DQ ? 2 : 0;
    /* dQ's stage, split keys, dQ not deterministic: each group's BQ x 64 f32, two boxes of
     * 32 dims */
    static constexpr bool STAGE_DQ = DQ && !SPLIT_DIMS;
    static constexpr uint32_t dq_box = BQ * 32 * 4;
    /* K, V, Q x STAGES, dO x STAGES, the exchanged tiles, dQ's stages (multiples of 8 KiB:
     * 1024-byte aligned), the per-stage row values (LSE_i log2(e), D_i: 2 BQ floats), the
     * mbarriers; 1 KiB of slack to align the start */
    static constexpr size_t q_off = 2 * (size_t)kv_bytes;
    static constexpr size_t g_off = q_off + STAGES * (size_t)q_bytes;
    static constexpr size_t ds_off = g_off + STAGES * (size_t)q_bytes;
    static constexpr size_t dq_off = ds_off + NX * (size_t)ds_bytes;
    static constexpr size_t rows_off = dq_off + (STAGE_DQ ? 4 : 0) * (size_t)dq_box;
    static constexpr size_t bars_off = rows_off + STAGES * 2 * BQ * sizeof(float);
    static constexpr int nbars = 1 + 2 * STAGES; /* K and V, then per stage full, empty */
    static constexpr size_t smem_bytes = bars_off + 8 * nbars + 1024;
    static_assert(smem_bytes <= 227 * 1024, "shared memory past the H100's 227 KiB a block");
};

/* What both consumer arrangements share: the block's shared memory, its (batch, KV head) and
 * keys, and its sweep over the GQA group's query tiles. */
template <typename T, int D, bool DQ> struct bwg_block {
    using cfg = bwg_cfg<D, DQ>;
    T *ks, *vs, *qs, *gs, *xs; /* K, V, Q [STAGES], dO [STAGES], the exchanged tiles */
    float *dqs;                /* dQ's stages [2 groups][2 boxes][BQ x 32] */
    float *rowv;               /* [STAGES][LSE_i log2(e) x BQ, D_i x BQ] */
    uint64_t *full_kv, *full, *empty;
    int64_t b, hk, j0, qlo;
    int ntiles, total;

    /* query tile u of the sweep: head hk group + u / ntiles, its rows from qlo + (u mod
     * ntiles) BQ */
    __device__ int64_t head(const fai_cuda_args &a, int u) const
    {
        return hk * a.group + u / ntiles;
    }
    __device__ int64_t row(int u) const { return qlo + (int64_t)(u % ntiles) * cfg::BQ; }
};

#ifdef FAI_WGMMA

/* A consumer warp's 16 keys [wj0, wj1) (rows 16 wl .. 16 wl + 15 of its group's accumulators)
 * and, for the thread's keys g and g + 8, the query rows [rlo, rhi) that may see them (none for
 * a key past Sk). */
struct bwg_keys {
    int64_t wj0, wj1;
    int rlo[2], rhi[2]; /* (Sq < 2^31) */
};

__device__ __forceinline__ bwg_keys bwg_keys_of(const fai_cuda_args &a, int64_t wj0, int g)
{
    bwg_keys k;
    k.wj0 = wj0;
    k.wj1 = wj0 + 16 < a.sk ? wj0 + 16 : a.sk;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int64_t x, y;
        fai_mask_query_span(&a.mask, a.sq, wj0 + 8 * r + g, wj0 + 8 * r + g + 1, &x, &y);
        k.rlo[r] = (int)x;
        k.rhi[r] = (int)y;
    }
    return k;
}

/* Accumulator tiles set to 0. */
template <int NT> __device__ __forceinline__ void bwg_zero(float (&x)[NT][4])
{
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            x[n][e] = 0;
}

/* P^T over st (the scores S^T) for the warp's keys k and the query tile [i0, i1) (64 rows; rv
 * its LSE_i log2(e), then its D_i): element (n, e) is key row 8 (e / 2) + g of the warp, query
 * column c0 + 8 n + 2 tg + (e mod 2) of the tile. Returns the allowed pairs, bit 4 n + e.
 * FULL over the warp's keys clipped to Sk and the tile's rows clipped to Sq says nothing of
 * the padding, which the c < qn (i < Sq) and 8 r + g < kn (j < Sk) tests drop. */
template <int NQ>
__device__ __forceinline__ uint32_t bwg_p(float (&st)[NQ][4], const fai_cuda_args &a,
                                          const bwg_keys &k, int64_t i0, int64_t i1, int c0,
                                          const float *rv, int g, int tg)
{
    static_assert(NQ * 4 <= 32, "a bit a pair");
    constexpr int BQ = 64;
    const float scale2 = (float)a.score.scale * FAI_LOG2E_F;
    const fai_tile_class wcls =
        k.wj0 < k.wj1 ? fai_mask_classify(&a.mask, i0, i1, k.wj0, k.wj1) : FAI_TILE_EMPTY;
    const int qn = (int)(i1 - i0), kn = (int)(k.wj1 - k.wj0); /* rows, keys inside Sq, Sk */
    int lo_c[2], hi_c[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int x = k.rlo[r] - (int)i0, y = k.rhi[r] - (int)i0;
        lo_c[r] = x < 0 ? 0 : x > BQ ? BQ : x;
        hi_c[r] = y < 0 ? 0 : y > BQ ? BQ : y;
    }
    uint32_t allow = 0;
#pragma unroll
    for (int n = 0; n < NQ; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, c = c0 + 8 * n + 2 * tg + (e & 1);
            const bool ok = c < qn && 8 * r + g < kn &&
                            (wcls == FAI_TILE_FULL || (c >= lo_c[r] && c < hi_c[r]));
            st[n][e] = ok ? ex2(st[n][e] * scale2 - rv[c]) : 0.0f;
            allow |= (uint32_t)ok << (4 * n + e);
        }
    return allow;
}

/* dS^T over dp (dP^T), from P^T (p) and the allowed pairs of bwg_p; the same elements. */
template <int NQ>
__device__ __forceinline__ void bwg_ds(const float (&p)[NQ][4], float (&dp)[NQ][4],
                                       uint32_t allow, const fai_cuda_args &a, int c0,
                                       const float *rv, int tg)
{
    constexpr int BQ = 64;
    const float scale = (float)a.score.scale;
#pragma unroll
    for (int n = 0; n < NQ; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int c = c0 + 8 * n + 2 * tg + (e & 1);
            dp[n][e] = allow >> (4 * n + e) & 1
                           ? scale * fai_dscore_f32(p[n][e], dp[n][e], 1.0f, rv[BQ + c], 0.0f, 0)
                           : 0.0f;
        }
}

/* dQ's f32 sums of the warp's 16 query rows i0 + 16 wl .. of head h (dq: NT tiles of 8 dims
 * from d0, all the head's) added to the accumulator (rows of D) by atomics. */
template <int D, int NT>
__device__ __forceinline__ void bwg_dq_add(const fai_cuda_args &a, float *dqacc,
                                           const float (&dq)[NT][4], int64_t b, int64_t h,
                                           int64_t i0, int d0, int wl, int g, int tg)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t i = i0 + 16 * wl + 8 * r + g;
        if (i >= a.sq)
            continue;
        float *dst = dqacc + ((b * a.hq + h) * a.sq + i) * D + d0 + 2 * tg;
#pragma unroll
        for (int n = 0; n < NT; n++)
            atomicAdd((float2 *)(dst + 8 * n), make_float2(dq[n][2 * r], dq[n][2 * r + 1]));
    }
}

/* The warp's part of a group's 64 x 64 dQ (dq[n][e]: row 16 wl + 8 (e / 2) + g, dim 8 n + 2 tg
 * + (e mod 2); tiles n < nd) into its stage: boxes of 32 dims, row r's 16-byte chunk c at
 * c ^ (r mod 8) (TMA's 128-byte swizzle; a warp's float2 stores meet no bank twice per
 * wavefront). */
__device__ __forceinline__ void bwg_dq_stage(float *stage, const float (&dq)[8][4], int nd,
                                             int wl, int g, int tg)
{
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = 16 * wl + 8 * r + g, ch = 2 * (n & 3) + (tg >> 1);
            if (n < nd)
                *(float2 *)(stage + (n >> 2) * 64 * 32 + row * 32 + ((ch ^ (row & 7)) << 2) +
                            2 * (tg & 1)) = make_float2(dq[n][2 * r], dq[n][2 * r + 1]);
        }
}

/* The split-keys consumer (D <= 128; the file's comment): group cw. */
template <typename T, int D, bool DQ>
__device__ __forceinline__ void consume_split_keys(const fai_cuda_args &a,
                                                   const bwg_block<T, D, DQ> &blk,
                                                   const CUtensorMap *dqmap, int cw, int warp,
                                                   int lane)
{
    using cfg = bwg_cfg<D, DQ>;
    using LK = typename cfg::LK;
    using LQ = typename cfg::LQ;
    using LS = typename cfg::LS;
    using M = mma_t<T>;
    constexpr int BK = cfg::BK, BQ = cfg::BQ, STAGES = cfg::STAGES, DP = cfg::DP;
    using W64 = wgmma_op<T, 64>; /* S^T, dP^T (64 keys x 64 queries); dQ (64 queries x 64 dims) */
    using WD = wgmma_op<T, DP>;  /* dV, dK (64 keys x DP) */
    /* accumulator tiles over queries and dims (DS of them the head's); k-steps over dims,
     * queries, the block's keys */
    constexpr int NQ = BQ / 8, DT = DP / 8, DS = D / 8, KD = D / 16, KQ = BQ / 16, KB = BK / 16;
    static_assert(BK == 128 && BQ == 64, "two consumer groups of 64 keys, 64-query tiles");

    const int wl = warp & 3, g = lane >> 2, tg = lane & 3;
    const bool issuer = warp % 4 == 0 && lane == 0; /* issues the group's dQ reduce-adds */
    const bwg_keys keys = bwg_keys_of(a, blk.j0 + 64 * cw + 16 * wl, g);
    const T *kw = blk.ks + 64 * 64 * cw, *vw = blk.vs + 64 * 64 * cw; /* the group's rows */

    float dk[DT][4], dv[DT][4];
    bwg_zero(dk);
    bwg_zero(dv);

    if (blk.total > 0)
        mbar_wait(blk.full_kv, 0);
    for (int u = 0; u < blk.total; u++) {
        const int s = u % STAGES;
        const int64_t h = blk.head(a, u), i0 = blk.row(u), i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
        const T *qt = blk.qs + s * BQ * DP, *gt = blk.gs + s * BQ * DP;
        const float *rv = blk.rowv + s * 2 * BQ;
        mbar_wait(blk.full + s, (u / STAGES) & 1);

        /* S^T = K Q^T and dP^T = V dO^T, each its own group: P^T is computed while dP^T's
         * MMAs run */
        /* zeroed, though the first k-step does not read them: left undefined, the compiler
         * moved the last k-step's accumulators to new registers inside the group, and ptxas
         * serialised the MMAs around the moves (C7517/C7519) */
        float st[NQ][4] = {}, dp[NQ][4] = {};
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W64::ss(st, wg_desc(kw + sl * LK::slab + k16, 16, 1024),
                    wg_desc(qt + sl * LQ::slab + k16, 16, 1024), kk > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W64::ss(dp, wg_desc(vw + sl * LK::slab + k16, 16, 1024),
                    wg_desc(gt + sl * LQ::slab + k16, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>(); /* S^T */
        wgmma_pin(st);
        const uint32_t allow = bwg_p(st, a, keys, i0, i1, 0, rv, g, tg);

        wgmma_wait<0>(); /* dP^T */
        wgmma_pin(dp);
        bwg_ds(st, dp, allow, a, 0, rv, tg);

        /* dV += P^T dO, dK += dS^T Q: accumulator tiles n = 2 kk, 2 kk + 1 are the A fragment
         * of k-step kk (queries 16 kk ..) */
        uint32_t pa[KQ][4], da[KQ][4];
#pragma unroll
        for (int kk = 0; kk < KQ; kk++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int n = 2 * kk + (x >> 1), e = 2 * (x & 1);
                pa[kk][x] = M::pack(st[n][e], st[n][e + 1]);
                da[kk][x] = M::pack(dp[n][e], dp[n][e + 1]);
            }
        T *dsb = blk.xs + (u & 1) * BK * BQ;
        wgmma_pin(dv);
        wgmma_pin(dk);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KQ; kk++)
            WD::rs(dv, pa[kk], wg_desc(gt + 16 * kk * 64, BQ * 128, 1024));
        if (DQ) {
            /* dS^T into shared memory while dV's MMAs run, and before dK's take da (an
             * in-flight wgmma's A registers may not be accessed until its wait): fragment word
             * x of k-step kk is key row 16 wl + 8 (x mod 2) + g of the group, queries
             * 8 (2 kk + x / 2) + 2 tg, + 1 */
#pragma unroll
            for (int kk = 0; kk < KQ; kk++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int row = 64 * cw + 16 * wl + 8 * (x & 1) + g;
                    *(uint32_t *)(dsb + LS::off(row, 2 * kk + (x >> 1)) + 2 * tg) = da[kk][x];
                }
            fence_proxy_async();
        }
#pragma unroll
        for (int kk = 0; kk < KQ; kk++)
            WD::rs(dk, da[kk], wg_desc(qt + 16 * kk * 64, BQ * 128, 1024));
        wgmma_commit();

        if (DQ) {
            /*
             * DP = 128: dQ[:, 64 cw ..] (64 queries x 64 dims) = dS (64 x 128 keys) K[:, 64 cw
             *   ..], once both groups' dS^T are in.
             * DP = 64: each group its own keys' part, dQ (64 queries x 64 dims) += dS[:, keys
             *   64 cw ..] K[64 cw .., :], once its own dS^T is in; both parts go to the sums.
             */
            constexpr int SPLIT_DQ_DIMS = DP == 128;
            static_assert(DP == 64 || DP == 128, "dQ: one slab, or the groups' halves of two");
            /* the stage is free once the last tile's reduce-adds have read it: the issuer's
             * wait before the barrier below lets its group write it after */
            if (issuer)
                bulk_wait_read<0>();
            if (SPLIT_DQ_DIMS)
                named_barrier(1, 256);
            else
                named_barrier(2 + cw, 128);
            constexpr int KS = SPLIT_DQ_DIMS ? KB : KB / 2; /* k-steps over keys */
            const int k0 = SPLIT_DQ_DIMS ? 0 : KS * cw;   /* the first */
            const T *kd = blk.ks + (SPLIT_DQ_DIMS ? cw * LK::slab : 0);
            float dq[8][4];
            wgmma_fence();
#pragma unroll
            for (int x = 0; x < KS; x++)
                W64::template ss<1, 1>(dq, wg_desc(dsb + 16 * (k0 + x) * 64, BK * 128, 1024),
                                       wg_desc(kd + 16 * (k0 + x) * 64, BK * 128, 1024), x > 0);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(dq);
            wgmma_pin(dv);
            wgmma_pin(dk);
            mbar_arrive(blk.empty + s); /* this thread is done with stage s */

            /* the group's dims [d0, d0 + 8 nd) (the rest: D's padding) through its stage, then
             * its reduce-adds (rows past Sq dropped by the map) */
            const int d0 = SPLIT_DQ_DIMS ? 64 * cw : 0;
            const int nd = D % 64 == 0 || d0 + 64 <= D ? 8 : (D - d0) / 8;
            float *stage = blk.dqs + cw * 2 * 64 * 32;
            bwg_dq_stage(stage, dq, nd, wl, g, tg);
            fence_proxy_async();
            named_barrier(4 + cw, 128);
            if (issuer) {
                for (int x = 0; x < (nd + 3) / 4; x++)
                    tma_reduce_add_3d(dqmap, stage + x * 64 * 32, d0 + 32 * x, (int)i0,
                                      (int)(blk.b * a.hq + h));
                bulk_commit();
            }
        } else {
            wgmma_wait<0>();
            wgmma_pin(dv);
            wgmma_pin(dk);
            mbar_arrive(blk.empty + s);
        }
    }

    store_dk_dv<T, DT, DS>(a, blk.b, blk.hk, keys.wj0, g, tg, dk, dv); /* the warp's keys */
    if (DQ && issuer)
        bulk_wait<0>(); /* the stage stays until its last reduce-adds are done */
}

/* The split-dims consumer (D = 256; the file's comment): group cw. */
template <typename T, int D>
__device__ __forceinline__ void consume_split_dims(const fai_cuda_args &a,
                                                   const bwg_block<T, D, true> &blk,
                                                   float *dqacc, int cw, int warp, int lane)
{
    using cfg = bwg_cfg<D, true>;
    using LK = typename cfg::LK;
    using LQ = typename cfg::LQ;
    using LS = typename cfg::LS;
    using M = mma_t<T>;
    constexpr int BK = cfg::BK, BQ = cfg::BQ, STAGES = cfg::STAGES, DP = cfg::DP;
    using W32 = wgmma_op<T, 32>;   /* S^T, dP^T: 64 keys x the group's 32 queries */
    using W128 = wgmma_op<T, 128>; /* dV, dK (64 keys x 128 dims); dQ (64 queries x 128 dims) */
    /* k-steps over dims (S^T, dP^T), queries (dV, dK) and keys (dQ) */
    constexpr int KD = D / 16, KQ = BQ / 16, KB = BK / 16;
    static_assert(BK == 64 && BQ == 64 && D == 256 && DP == 256,
                  "64 keys x 64 queries, each group half the queries of S^T and half the dims");

    const int wl = warp & 3, g = lane >> 2, tg = lane & 3;
    const bwg_keys keys = bwg_keys_of(a, blk.j0 + 16 * wl, g);
    const int c0 = 32 * cw; /* the group's queries in S^T */
    const int d0 = 128 * cw; /* its dims: 2 slabs from slab 2 cw */

    float dk[16][4], dv[16][4];
    bwg_zero(dk);
    bwg_zero(dv);

    if (blk.total > 0)
        mbar_wait(blk.full_kv, 0);
    for (int u = 0; u < blk.total; u++) {
        const int s = u % STAGES;
        const int64_t h = blk.head(a, u), i0 = blk.row(u), i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
        const T *qt = blk.qs + s * BQ * DP, *gt = blk.gs + s * BQ * DP;
        const float *rv = blk.rowv + s * 2 * BQ;
        mbar_wait(blk.full + s, (u / STAGES) & 1);

        /* S^T[:, c0 ..] = K Q[c0 .., :]^T, dP^T[:, c0 ..] = V dO[c0 .., :]^T, each its own
         * group: P^T is computed while dP^T's MMAs run */
        float st[4][4] = {}, dp[4][4] = {}; /* zeroed: as in consume_split_keys */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W32::ss(st, wg_desc(blk.ks + sl * LK::slab + k16, 16, 1024),
                    wg_desc(qt + sl * LQ::slab + c0 * 64 + k16, 16, 1024), kk > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W32::ss(dp, wg_desc(blk.vs + sl * LK::slab + k16, 16, 1024),
                    wg_desc(gt + sl * LQ::slab + c0 * 64 + k16, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<1>(); /* S^T */
        wgmma_pin(st);
        const uint32_t allow = bwg_p(st, a, keys, i0, i1, c0, rv, g, tg);
        wgmma_wait<0>(); /* dP^T */
        wgmma_pin(dp);
        bwg_ds(st, dp, allow, a, c0, rv, tg);

        /* P^T and dS^T into shared memory: element (n, 2 r ..) is key row 16 wl + 8 r + g,
         * queries c0 + 8 n + 2 tg, + 1 (chunk c0 / 8 + n); then the other group's half */
        T *pb = blk.xs + (u & 1) * 2 * BK * BQ, *db = pb + BK * BQ;
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int o = LS::off(16 * wl + 8 * r + g, c0 / 8 + n) + 2 * tg;
                *(uint32_t *)(pb + o) = M::pack(st[n][2 * r], st[n][2 * r + 1]);
                *(uint32_t *)(db + o) = M::pack(dp[n][2 * r], dp[n][2 * r + 1]);
            }
        fence_proxy_async();
        named_barrier(1, 256);

        /* dQ[:, d0 ..] = dS K[:, d0 ..] first (its own group), then dV, dK over the group's
         * dims, all from shared memory */
        float dq[16][4];
        wgmma_pin(dv);
        wgmma_pin(dk);
        wgmma_fence();
#pragma unroll
        for (int x = 0; x < KB; x++)
            W128::template ss<1, 1>(dq, wg_desc(db + 16 * x * 64, BK * 128, 1024),
                                    wg_desc(blk.ks + 2 * cw * LK::slab + 16 * x * 64,
                                            LK::slab * 2, 1024),
                                    x > 0);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < KQ; kk++)
            W128::template ss<0, 1>(dv, wg_desc(pb + 16 * kk, 16, 1024),
                                    wg_desc(gt + 2 * cw * LQ::slab + 16 * kk * 64,
                                            LQ::slab * 2, 1024),
                                    1);
#pragma unroll
        for (int kk = 0; kk < KQ; kk++)
            W128::template ss<0, 1>(dk, wg_desc(db + 16 * kk, 16, 1024),
                                    wg_desc(qt + 2 * cw * LQ::slab + 16 * kk * 64,
                                            LQ::slab * 2, 1024),
                                    1);
        wgmma_commit();
        wgmma_wait<1>(); /* dQ's group */
        wgmma_pin(dq);
        bwg_dq_add<D>(a, dqacc, dq, blk.b, h, i0, d0, wl, g, tg);
        wgmma_wait<0>();
        wgmma_pin(dv);
        wgmma_pin(dk);
        mbar_arrive(blk.empty + s); /* this thread is done with stage s */
    }

    store_dk_dv<T, 16>(a, blk.b, blk.hk, keys.wj0, g, tg, dk, dv, d0); /* the warp's keys */
}

#endif /* FAI_WGMMA */

template <typename T, int D, bool DQ>
__global__ void __launch_bounds__(bwg_cfg<D>::threads, 1)
    fa_bwd_kernel_wgmma__sm90a(const fai_cuda_args a, const __grid_constant__ bwd_maps maps,
                               const float *delta, const float *lse2, float *dqacc,
                               const int *flag)
{
#ifdef FAI_WGMMA
    static_assert(bwg_cfg<D>::threads == 384 && bwg_cfg<D>::BQ == 64,
                  "a producer and two consumer groups; the producer's 128 threads copy 2 BQ "
                  "row values");
    if (*flag)
        return; /* non-finite input: the generic kernels run instead */
    using cfg = bwg_cfg<D, DQ>;
    using LK = typename cfg::LK;
    using LQ = typename cfg::LQ;
    constexpr int BK = cfg::BK, BQ = cfg::BQ, STAGES = cfg::STAGES, DP = cfg::DP;
    static_assert(DQ || !cfg::SPLIT_DIMS, "split dims: dQ's atomics only (the plan's rule)");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + (-smem_addr(smem_raw) & 1023u);
    bwg_block<T, D, DQ> blk;
    blk.ks = (T *)smem;
    blk.vs = blk.ks + BK * DP;
    blk.qs = (T *)(smem + cfg::q_off);
    blk.gs = (T *)(smem + cfg::g_off);
    blk.xs = (T *)(smem + cfg::ds_off);
    blk.dqs = (float *)(smem + cfg::dq_off);
    blk.rowv = (float *)(smem + cfg::rows_off);
    blk.full_kv = (uint64_t *)(smem + cfg::bars_off);
    blk.full = blk.full_kv + 1;
    blk.empty = blk.full + STAGES;

    /* the warp index from lane 0: then the compiler knows it (and every branch on it) is
     * warp-uniform, as wgmma needs */
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0),
              wg = warp >> 2;
    const int64_t bhk = blockIdx.y;
    blk.b = bhk / a.hk;
    blk.hk = bhk % a.hk;
    blk.j0 = (int64_t)blockIdx.x * BK;
    const int64_t j1 = blk.j0 + BK < a.sk ? blk.j0 + BK : a.sk;

    int64_t qhi; /* the query rows that may see any key of the block */
    fai_mask_query_span(&a.mask, a.sq, blk.j0, j1, &blk.qlo, &qhi);
    blk.qlo = blk.qlo / BQ * BQ;
    blk.ntiles = blk.qlo < qhi ? (int)((qhi - blk.qlo + BQ - 1) / BQ) : 0;
    blk.total = blk.ntiles * (int)a.group;

    if (tid == 0) {
        mbar_init(blk.full_kv, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(blk.full + s, 128);
            mbar_init(blk.empty + s, 256);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) { /* ------------------------------------------------ producer */
        setmaxnreg_dec<24>();
        if (blk.total == 0)
            return;
        const int c_b = (int)blk.b, c_hk = (int)blk.hk;
        if (tid == 0) {
            mbar_arrive_tx(blk.full_kv, 2 * cfg::kv_bytes);
            for (int sl = 0; sl < DP / 64; sl++) {
                tma_load_4d(blk.ks + sl * LK::slab, &maps.k, 64 * sl, (int)blk.j0, c_hk, c_b,
                            blk.full_kv);
                tma_load_4d(blk.vs + sl * LK::slab, &maps.v, 64 * sl, (int)blk.j0, c_hk, c_b,
                            blk.full_kv);
            }
        }
        for (int u = 0; u < blk.total; u++) {
            const int s = u % STAGES;
            const int64_t h = blk.head(a, u), i0 = blk.row(u);
            if (u >= STAGES) /* the consumers are done with tile u - STAGES */
                mbar_wait(blk.empty + s, (u / STAGES - 1) & 1);
            /* threads [0, 64) copy LSE_i log2(e), [64, 128) D_i; past Sq, +inf and 0: P = 0 */
            const int64_t i = i0 + (tid & (BQ - 1)), row = (blk.b * a.hq + h) * a.sq + i;
            float *rv = blk.rowv + s * 2 * BQ;
            if (tid < BQ)
                rv[tid] = i < a.sq ? lse2[row] : INFINITY;
            else
                rv[tid] = i < a.sq ? delta[row] : 0.0f;
            if (tid == 0) { /* its arrival carries the TMA bytes */
                mbar_arrive_tx(blk.full + s, 2 * cfg::q_bytes);
                T *qd = blk.qs + s * BQ * DP, *gd = blk.gs + s * BQ * DP;
                for (int sl = 0; sl < DP / 64; sl++) {
                    tma_load_4d(qd + sl * LQ::slab, &maps.q, 64 * sl, (int)i0, (int)h, c_b,
                                blk.full + s);
                    tma_load_4d(gd + sl * LQ::slab, &maps.dout, 64 * sl, (int)i0, (int)h, c_b,
                                blk.full + s);
                }
            } else {
                mbar_arrive(blk.full + s);
            }
        }
        return;
    }

    /* ------------------------------------------------------------ consumers */
    setmaxnreg_inc<240>();
    if constexpr (cfg::SPLIT_DIMS)
        consume_split_dims<T, D>(a, blk, dqacc, wg - 1, warp, lane);
    else
        consume_split_keys<T, D, DQ>(a, blk, &maps.dq, wg - 1, warp, lane);
#endif
}

/* ------------------------------------------------------------------ launch */

template <typename T, int D, bool DQ>
fai_cuda_result launch(const fai_cuda_args &a, const fai_cuda_bwd_ws &w, char *err, size_t n)
{
    using cfg = bwg_cfg<D, DQ>;
    bwd_maps maps = {};
    if (!tma_map_4d(&maps.q, a.tq, a.dtype, D, a.sq, a.hq, a.b, cfg::BQ) ||
        !tma_map_4d(&maps.dout, a.tdout, a.dtype, D, a.sq, a.hq, a.b, cfg::BQ) ||
        !tma_map_4d(&maps.k, a.tk, a.dtype, D, a.sk, a.hk, a.b, cfg::BK) ||
        !tma_map_4d(&maps.v, a.tv, a.dtype, D, a.sk, a.hk, a.b, cfg::BK) ||
        (cfg::STAGE_DQ && !tma_map_acc(&maps.dq, w.dqacc, D, a.sq, a.b * a.hq, cfg::BQ))) {
        snprintf(err, n, "backend cuda: wgmma backward: the driver refused a TMA tensor map");
        return FAI_CUDA_UNSUPPORTED;
    }
    auto k = fa_bwd_kernel_wgmma__sm90a<T, D, DQ>;
    const size_t sm = cfg::smem_bytes;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
        cudaSuccess)
        return fai_cuda_check_launch("wgmma backward: shared memory", err, n);
    const int64_t nkb = (a.sk + cfg::BK - 1) / cfg::BK;
    dim3 grid((unsigned)nkb, (unsigned)(a.b * a.hk));
    k<<<grid, cfg::threads, sm, (cudaStream_t)a.stream>>>(a, maps, w.delta, w.lse2, w.dqacc,
                                                         w.flag);
    return fai_cuda_check_launch("wgmma backward", err, n);
}

/* Whether tile t is D's instance: the plan's tiles (plan.cu says why), 128-key blocks over
 * 64-query steps at D 64, 96 (padded to 128 in shared memory) and 128, 64-key blocks at D 256;
 * 2 stages. */
template <int D> bool is_tile(const fai_cuda_tile &t)
{
    using cfg = bwg_cfg<D>;
    return t.bq == cfg::BQ && t.bk == cfg::BK && t.stages == cfg::STAGES;
}

template <typename T, bool DQ>
fai_cuda_result by_dim(const fai_cuda_args &a, const fai_cuda_tile &t, const fai_cuda_bwd_ws &w,
                       char *err, size_t n)
{
    switch (a.dqk) {
    case 64:
        if (is_tile<64>(t))
            return launch<T, 64, DQ>(a, w, err, n);
        break;
    case 96:
        if (is_tile<96>(t))
            return launch<T, 96, DQ>(a, w, err, n);
        break;
    case 128:
        if (is_tile<128>(t))
            return launch<T, 128, DQ>(a, w, err, n);
        break;
    case 256: /* dQ's atomics only: deterministic calls are not the plan's at D 256 */
        if constexpr (DQ)
            if (is_tile<256>(t))
                return launch<T, 256, true>(a, w, err, n);
        break;
    }
    return fai_cuda_no_instance("the wgmma backward", &a, &t, err, n);
}

} // namespace

fai_cuda_result fai_cuda_backward_wgmma(const fai_cuda_args *a, const fai_cuda_tile *t,
                                        const fai_cuda_bwd_ws *w, char *err, size_t n)
{
    if (a->dtype == FA_BF16)
        return a->deterministic ? by_dim<__nv_bfloat16, false>(*a, *t, *w, err, n)
                                : by_dim<__nv_bfloat16, true>(*a, *t, *w, err, n);
    return a->deterministic ? by_dim<__half, false>(*a, *t, *w, err, n)
                            : by_dim<__half, true>(*a, *t, *w, err, n);
}
