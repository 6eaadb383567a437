/*
 * Tensor-core backward on Hopper (sm_90a): wgmma, TMA and warp specialization, for f16 / bf16
 * storage, Dqk = Dv = 64, 96 (padded to 128 in shared memory, as in fwd_wgmma.cu) or 128, the
 * scale-only score pipeline without dropout (the FAST case of bwd_mma.cu, whose kernels handle
 * everything else). The same schedule as bwd_mma.cu:
 * parallel over key blocks, P recomputed from the forward's LSE, dK and dV held in registers
 * across every query tile of the GQA group and written once.
 *
 * A block owns BK = 128 keys of one (batch, KV head) and has three warpgroups:
 *
 *   producer   (warpgroup 0, its registers given to the others): one thread loads K and V by
 *              TMA once, then Q and dO tile by tile (BQ = 64 rows) into STAGES stages; the
 *              group's 128 threads copy the tile's LSE_i log2(e) and D_i beside them. A stage
 *              completes on its `full` mbarrier (128 arrivals and the TMA bytes) and is
 *              reloaded when the consumers have released it on `empty`.
 *   consumers  (warpgroups 1 and 2, keys [0, 64) and [64, 128) of the block), per query tile:
 *                S^T  = K Q^T     wgmma m64n64k16, K rows and Q rows both K-major
 *                dP^T = V dO^T    the same with V and dO
 *                P^T  = 2^(S^T scale log2(e) - LSE_i log2(e)),  dS^T = P^T (dP^T - D_i) scale
 *                dV  += P^T dO    wgmma m64n128k16, A = P^T from registers, dO MN-major
 *                dK  += dS^T Q    the same with dS^T and Q
 *                dQ  += dS K      dS^T through shared memory: at D 96 and 128 both groups'
 *                                 (one named barrier), group c taking dims [64 c, 64 c + 64)
 *                                 over the block's 128 keys; at D 64 each group its own (a
 *                                 barrier of its own), all dims over its own 64 keys. wgmma
 *                                 m64n64k16 with A = dS^T read MN-major (transposed) and
 *                                 B = K read MN-major; the f32 sums go to the accumulator of
 *                                 the workspace by atomics, or, in deterministic mode, dQ is
 *                                 left to bwd_mma.cu's ordered kernel.
 *
 * As in bwd_mma.cu, masked pairs are dropped by selection and the kernel runs only when q, k,
 * v and dout are finite (the pre-pass's flag), so a selected 0 times any operand is 0.
 * Consumers meet only at the dS^T barrier; the dS^T buffer alternates between two copies, so
 * a group writing tile u + 2 cannot overwrite what the other still reads for tile u (it has
 * passed the barrier of tile u + 1, which the reader reaches only after its dQ of tile u).
 */
#include "common.cuh"
#include "wgmma.cuh"

#include "config.h"

#include <stdint.h>

namespace {

/* The TMA descriptors of Q and dO (boxes of 64 dims x BQ rows) and of K and V (x BK rows). */
struct bwd_maps {
    CUtensorMap q, dout, k, v;
};

/* D: the head dim; DP: D padded to whole 64-column slabs (96 -> 128), the width of the tiles in
 * shared memory and of dK, dV. TMA fills the padding with zeros (past the tensor map's D):
 * S^T and dP^T run D / 16 k-steps, and the padding columns of dK, dV and dQ are never stored. */
template <int D, bool DQ = true> struct bwg_cfg {
    static constexpr int BK = 128, BQ = 64, STAGES = 2, threads = 384;
    static constexpr int DP = (D + 63) / 64 * 64;
    using LK = slab_layout<DP, BK>; /* K, V */
    using LQ = slab_layout<DP, BQ>; /* Q, dO tiles */
    using LS = slab_layout<64, BK>; /* dS^T: the block's keys x the tile's 64 queries */
    static constexpr uint32_t kv_bytes = BK * DP * 2, q_bytes = BQ * DP * 2,
                              ds_bytes = BK * BQ * 2;
    /* K, V, Q x STAGES, dO x STAGES, dS^T x 2 with DQ (multiples of 8 KiB: 1024-byte aligned), the
     * per-stage row values (LSE_i log2(e), D_i: 2 BQ floats), the mbarriers; 1 KiB of slack to
     * align the start */
    static constexpr size_t q_off = 2 * (size_t)kv_bytes;
    static constexpr size_t g_off = q_off + STAGES * (size_t)q_bytes;
    static constexpr size_t ds_off = g_off + STAGES * (size_t)q_bytes;
    static constexpr size_t rows_off = ds_off + (DQ ? 2 : 0) * (size_t)ds_bytes;
    static constexpr size_t bars_off = rows_off + STAGES * 2 * BQ * sizeof(float);
    static constexpr int nbars = 1 + 2 * STAGES; /* K and V, then per stage full, empty */
    static constexpr size_t smem_bytes = bars_off + 8 * nbars + 1024;
};

template <typename T, int D, bool DQ>
__global__ void __launch_bounds__(bwg_cfg<D>::threads, 1)
    fa_bwd_kernel_wgmma__sm90a(const fai_cuda_args a, const __grid_constant__ bwd_maps maps,
                               const float *delta, const float *lse2, float *dqacc,
                               const int *flag)
{
#ifdef FAI_WGMMA
    static_assert(bwg_cfg<D>::BK == 128 && bwg_cfg<D>::BQ == 64 && bwg_cfg<D>::threads == 384,
                  "two consumer groups of 64 keys; the producer's 128 threads copy 2 BQ values");
    if (*flag)
        return; /* non-finite input: the generic kernels run instead */
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
    constexpr float kLog2e = FAI_LOG2E_F; /* base-2 units: core/recurrence.h */

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + (-smem_addr(smem_raw) & 1023u);
    T *ks = (T *)smem, *vs = ks + BK * DP;
    T *qs = (T *)(smem + cfg::q_off), *gs = (T *)(smem + cfg::g_off); /* [STAGES][BQ * DP] */
    T *dss = (T *)(smem + cfg::ds_off);                                /* [2][BK * BQ] */
    float *rowv = (float *)(smem + cfg::rows_off); /* [STAGES][LSE_i log2(e) x BQ, D_i x BQ] */
    uint64_t *bars = (uint64_t *)(smem + cfg::bars_off);
    uint64_t *full_kv = bars, *full = bars + 1, *empty = full + STAGES;
    const fai_mask mask = a.mask;

    /* the warp index from lane 0: then the compiler knows it (and every branch on it) is
     * warp-uniform, as wgmma needs */
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0),
              wg = warp >> 2;
    const int64_t j0 = (int64_t)blockIdx.x * BK, j1 = j0 + BK < a.sk ? j0 + BK : a.sk;
    const int64_t bhk = blockIdx.y, b = bhk / a.hk, hk = bhk % a.hk;

    int64_t qlo, qhi; /* query rows that may see any key of the block */
    fai_mask_query_span(&mask, a.sq, j0, j1, &qlo, &qhi);
    qlo = qlo / BQ * BQ;
    const int ntiles = qlo < qhi ? (int)((qhi - qlo + BQ - 1) / BQ) : 0;
    const int total = ntiles * (int)a.group;
    /* query tile u of the GQA group's sweep: head hk group + u / ntiles, its rows from
     * qlo + (u mod ntiles) BQ */
    auto tile_head = [&](int u) { return hk * a.group + u / ntiles; };
    auto tile_row = [&](int u) { return qlo + (int64_t)(u % ntiles) * BQ; };

    if (tid == 0) {
        mbar_init(full_kv, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full + s, 128);
            mbar_init(empty + s, 256);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) { /* ------------------------------------------------ producer */
        setmaxnreg_dec<24>();
        if (total == 0)
            return;
        const int c_b = (int)b, c_hk = (int)hk;
        if (tid == 0) {
            mbar_arrive_tx(full_kv, 2 * cfg::kv_bytes);
            for (int sl = 0; sl < DP / 64; sl++) {
                tma_load_4d(ks + sl * LK::slab, &maps.k, 64 * sl, (int)j0, c_hk, c_b, full_kv);
                tma_load_4d(vs + sl * LK::slab, &maps.v, 64 * sl, (int)j0, c_hk, c_b, full_kv);
            }
        }
        for (int u = 0; u < total; u++) {
            const int s = u % STAGES;
            const int64_t h = tile_head(u), i0 = tile_row(u);
            if (u >= STAGES) /* the consumers are done with tile u - STAGES */
                mbar_wait(empty + s, (u / STAGES - 1) & 1);
            /* threads [0, 64) copy LSE_i log2(e), [64, 128) D_i; past Sq, +inf and 0: P = 0 */
            const int64_t i = i0 + (tid & (BQ - 1)), row = (b * a.hq + h) * a.sq + i;
            float *rv = rowv + s * 2 * BQ;
            if (tid < BQ)
                rv[tid] = i < a.sq ? lse2[row] : INFINITY;
            else
                rv[tid] = i < a.sq ? delta[row] : 0.0f;
            if (tid == 0) { /* its arrival carries the TMA bytes */
                mbar_arrive_tx(full + s, 2 * cfg::q_bytes);
                T *qd = qs + s * BQ * DP, *gd = gs + s * BQ * DP;
                for (int sl = 0; sl < DP / 64; sl++) {
                    tma_load_4d(qd + sl * LQ::slab, &maps.q, 64 * sl, (int)i0, (int)h, c_b,
                                full + s);
                    tma_load_4d(gd + sl * LQ::slab, &maps.dout, 64 * sl, (int)i0, (int)h, c_b,
                                full + s);
                }
            } else {
                mbar_arrive(full + s);
            }
        }
        return;
    }

    /* ------------------------------------------------------------ consumers */
    setmaxnreg_inc<240>();
    const int cw = wg - 1; /* keys [64 cw, 64 cw + 64) of the block */
    const int wl = warp & 3, g = lane >> 2, tg = lane & 3;
    /* the warp's keys [wj0, wj1): rows 16 wl .. 16 wl + 15 of the group's accumulators */
    const int64_t wj0 = j0 + 64 * cw + 16 * wl, wj1 = wj0 + 16 < a.sk ? wj0 + 16 : a.sk;
    /* the queries that may see the thread's keys g, g + 8 (none for a key past Sk) */
    int rlo[2], rhi[2]; /* (Sq < 2^31) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int64_t x, y;
        fai_mask_query_span(&mask, a.sq, wj0 + 8 * r + g, wj0 + 8 * r + g + 1, &x, &y);
        rlo[r] = (int)x;
        rhi[r] = (int)y;
    }
    const float scale = (float)a.score.scale, scale2 = scale * kLog2e;
    const T *kw = ks + 64 * 64 * cw, *vw = vs + 64 * 64 * cw; /* the group's rows of each slab */

    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[d][e] = dv[d][e] = 0;

    if (total > 0)
        mbar_wait(full_kv, 0);
    for (int u = 0; u < total; u++) {
        const int s = u % STAGES;
        const int64_t h = tile_head(u), i0 = tile_row(u), i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
        const T *qt = qs + s * BQ * DP, *gt = gs + s * BQ * DP;
        const float *rv = rowv + s * 2 * BQ;
        mbar_wait(full + s, (u / STAGES) & 1);

        /* S^T = K Q^T, dP^T = V dO^T */
        float st[NQ][4], dp[NQ][4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W64::ss(st, wg_desc(kw + sl * LK::slab + k16, 16, 1024),
                    wg_desc(qt + sl * LQ::slab + k16, 16, 1024), kk > 0);
        }
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W64::ss(dp, wg_desc(vw + sl * LK::slab + k16, 16, 1024),
                    wg_desc(gt + sl * LQ::slab + k16, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_pin(st);
        wgmma_pin(dp);

        /* P^T and dS^T, written over st and dp; element (n, e) is key row 8 (e / 2) + g of the
         * warp, query column 8 n + 2 tg + (e mod 2). FULL over the warp's keys clipped to Sk
         * and the tile's rows clipped to Sq says nothing of the padding, which the c < qn
         * (i < Sq) and 8 r + g < kn (j < Sk) tests drop. */
        const fai_tile_class wcls =
            wj0 < wj1 ? fai_mask_classify(&mask, i0, i1, wj0, wj1) : FAI_TILE_EMPTY;
        const int qn = (int)(i1 - i0), kn = (int)(wj1 - wj0); /* rows, keys inside Sq, Sk */
        int lo_c[2], hi_c[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int x = rlo[r] - (int)i0, y = rhi[r] - (int)i0;
            lo_c[r] = x < 0 ? 0 : x > BQ ? BQ : x;
            hi_c[r] = y < 0 ? 0 : y > BQ ? BQ : y;
        }
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, c = 8 * n + 2 * tg + (e & 1);
                const bool allowed = c < qn && 8 * r + g < kn &&
                                     (wcls == FAI_TILE_FULL || (c >= lo_c[r] && c < hi_c[r]));
                const float p = allowed ? ex2(st[n][e] * scale2 - rv[c]) : 0.0f;
                st[n][e] = p;
                dp[n][e] = allowed ? scale * fai_dscore_f32(p, dp[n][e], 1.0f, rv[BQ + c], 0.0f, 0)
                                   : 0.0f;
            }

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
        T *dsb = dss + (u & 1) * BK * BQ;
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
            constexpr int SPLIT_DIMS = DP == 128;
            static_assert(DP == 64 || DP == 128, "dQ: one slab, or the groups' halves of two");
            if (SPLIT_DIMS)
                named_barrier(1, 256);
            else
                named_barrier(2 + cw, 128);
            constexpr int KS = SPLIT_DIMS ? KB : KB / 2; /* k-steps over keys */
            const int k0 = SPLIT_DIMS ? 0 : KS * cw;   /* the first */
            const T *kd = ks + (SPLIT_DIMS ? cw * LK::slab : 0);
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
            mbar_arrive(empty + s); /* this thread is done with stage s */

            /* dq[n][e]: query row 16 wl + 8 (e / 2) + g, dim d0 + 8 n + 2 tg + (e mod 2), of
             * which the first nd tiles are the head's (the rest: D's padding) */
            const int d0 = SPLIT_DIMS ? 64 * cw : 0;
            const int nd = D % 64 == 0 || d0 + 64 <= D ? 8 : (D - d0) / 8;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int64_t i = i0 + 16 * wl + 8 * r + g;
                if (i >= a.sq)
                    continue;
                float *dst = dqacc + ((b * a.hq + h) * a.sq + i) * D + d0 + 2 * tg;
#pragma unroll
                for (int n = 0; n < 8; n++)
                    if (n < nd)
                        atomicAdd((float2 *)(dst + 8 * n),
                                  make_float2(dq[n][2 * r], dq[n][2 * r + 1]));
            }
        } else {
            wgmma_wait<0>();
            wgmma_pin(dv);
            wgmma_pin(dk);
            mbar_arrive(empty + s);
        }
    }

    store_dk_dv<T, DT, DS>(a, b, hk, wj0, g, tg, dk, dv); /* the warp's keys */
#endif
}

/* ------------------------------------------------------------------ launch */

template <typename T, int D, bool DQ>
fai_cuda_result launch(const fai_cuda_args &a, const fai_cuda_bwd_ws &w, char *err, size_t n)
{
    using cfg = bwg_cfg<D, DQ>;
    bwd_maps maps;
    if (!tma_map_4d(&maps.q, a.tq, a.dtype, D, a.sq, a.hq, a.b, cfg::BQ) ||
        !tma_map_4d(&maps.dout, a.tdout, a.dtype, D, a.sq, a.hq, a.b, cfg::BQ) ||
        !tma_map_4d(&maps.k, a.tk, a.dtype, D, a.sk, a.hk, a.b, cfg::BK) ||
        !tma_map_4d(&maps.v, a.tv, a.dtype, D, a.sk, a.hk, a.b, cfg::BK)) {
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

/* The plan's tile (plan.cu says why): 128-key blocks over 64-query steps, 2 stages, at D 64, 96
 * (padded to 128 in shared memory) and 128. */
template <typename T, bool DQ>
fai_cuda_result by_dim(const fai_cuda_args &a, const fai_cuda_bwd_ws &w, char *err, size_t n)
{
    switch (a.dqk) {
    case 64: return launch<T, 64, DQ>(a, w, err, n);
    case 96: return launch<T, 96, DQ>(a, w, err, n);
    default: return launch<T, 128, DQ>(a, w, err, n);
    }
}

} // namespace

fai_cuda_result fai_cuda_backward_wgmma(const fai_cuda_args *a, const fai_cuda_tile *t,
                                        const fai_cuda_bwd_ws *w, char *err, size_t n)
{
    using cfg = bwg_cfg<128>;
    if ((a->dqk != 64 && a->dqk != 96 && a->dqk != 128) || t->bq != cfg::BQ || t->bk != cfg::BK ||
        t->stages != cfg::STAGES)
        return fai_cuda_no_instance("the wgmma backward", a, t, err, n);
    if (a->dtype == FA_BF16)
        return a->deterministic ? by_dim<__nv_bfloat16, false>(*a, *w, err, n)
                                : by_dim<__nv_bfloat16, true>(*a, *w, err, n);
    return a->deterministic ? by_dim<__half, false>(*a, *w, err, n)
                            : by_dim<__half, true>(*a, *w, err, n);
}
