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
 *   x  = S * scale * log2(e)      (or the full pipeline of docs/DESIGN.md §1, then * log2(e)):
 *                                 base-2 logits
 *   mask, row max m (4-lane quad shuffles), P = exp2(x - m), l += rowsum P
 *   O  = alpha O + P V   P converted to 16-bit in registers *is* the A operand of the second
 *                        MMA (the accumulator layout of m16n8 equals the A layout of m16k16
 *                        two n-tiles at a time), V fragments by ldmatrix.trans
 *
 * K and V tiles are double-buffered with cp.async: tile t + 1 is in flight while tile t is
 * computed. The shared-memory rows are XOR-swizzled in 16-byte chunks so that the 8 row
 * addresses of every ldmatrix phase hit 8 different bank groups.
 *
 * The row work between the GEMMs (mask, online softmax, the exact terms of non-finite V
 * elements) and the final store live in fwd_tile.cuh, shared with the wgmma kernel.
 */
#include "common.cuh"
#include "fwd_tile.cuh"
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
    constexpr float kLog2e = FAI_LOG2E_F; /* base-2 units: core/recurrence.h */

    extern __shared__ __align__(128) unsigned char smem[];
    T *qs = (T *)smem;
    T *ks = qs + BQ * L::pitch;     /* [2][BK][pitch] */
    T *vs = ks + 2 * BK * L::pitch; /* [2][BK][pitch] */
    unsigned char *bad = smem + cfg::flags_off; /* BK bits: keys with a non-finite V element */
    const fai_mask mask = a.mask;

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
        const fwd_rows rows = {mask, a.score, fai_drop_head(a, b, h), a.slopes ? a.slopes[h] : 0.0f,
                               scale2, wi0, b, h, g, tg};
        const T *qg = fai_at<T>(a.tq, b, 0, h), *kg = fai_at<T>(a.tk, b, 0, hk),
                *vg = fai_at<T>(a.tv, b, 0, hk);

        int64_t klo, khi; /* keys any row of the block may see */
        fai_mask_key_span(&mask, i0, i1, &klo, &khi);
        /* tiles start at a multiple of BK: then every thread's key pair (j, j+1) has j even
         * and j / 4 in common, so one Philox call covers both (and extra keys are masked) */
        klo = klo / BK * BK;
        const int ntiles = klo < khi ? (int)((khi - klo + BK - 1) / BK) : 0;

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

            /* scan V for non-finite values where P = 0 may meet them (fwd_tile.cuh) */
            const fai_tile_class bcls = fai_mask_classify(&mask, i0, i1, j0, j0 + BK);
            bool fix = false;
            if (bcls != FAI_TILE_FULL || (!FAST && rows.dr.threshold))
                fix = fwd_scan_v<T, D, BK, cfg::threads>(
                    vt, bad, tid, [](int r, int ch) { return L::off(r, ch); });

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
                bool live[R];
                uint32_t pos[R];
                fwd_softmax<MT, NT, DT, BK, FAST>(rows, s, o, m, l, live, pos, j0, wcls, fix);
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
                if (fix)
                    fwd_add_back<T, MT, DT, BK, FAST>(rows, o, live, pos, bad, j0, vg, a.tv.ss);
            }
            __syncthreads(); /* buffer t & 1 is reloaded by the next iteration */
        }
        cp_async_wait<0>(); /* the Q copy when there was no tile */

        fwd_store<T, MT, DT>(a, rows, o, m, l);
    }
}

/* ------------------------------------------------------------------ launch */

template <typename T, int D, int BK, int WARPS, int MT>
fai_cuda_result launch(const fai_cuda_args &a, char *err, size_t n)
{
    using cfg = fwd_cfg<T, D, BK, WARPS, MT>;
    const bool fast = fai_cuda_scale_only(a);
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

/* The plan's tile (plan.cu says why each): 4 warps x 2 m-tiles = 128 rows x 64 keys at
 * D <= 128, 4 x 1 = 64 rows x 32 keys at D = 256. */
template <typename T>
fai_cuda_result by_tile(const fai_cuda_args &a, const fai_cuda_tile &t, char *err, size_t n)
{
    if (t.bq == 128 && t.bk == 64)
        switch (a.dqk) {
        case 32: return launch<T, 32, 64, 4, 2>(a, err, n);
        case 64: return launch<T, 64, 64, 4, 2>(a, err, n);
        case 96: return launch<T, 96, 64, 4, 2>(a, err, n);
        case 128: return launch<T, 128, 64, 4, 2>(a, err, n);
        }
    if (t.bq == 64 && t.bk == 32 && a.dqk == 256)
        return launch<T, 256, 32, 4, 1>(a, err, n);
    return fai_cuda_no_instance("the mma.sync forward", &a, &t, err, n);
}

} // namespace

fai_cuda_result fai_cuda_forward_mma(const fai_cuda_args *a, const fai_cuda_tile *t, char *err,
                                     size_t n)
{
    if (a->sq == 0 || a->b * a->hq == 0)
        return FAI_CUDA_OK;
    return a->dtype == FA_BF16 ? by_tile<__nv_bfloat16>(*a, *t, err, n)
                               : by_tile<__half>(*a, *t, err, n);
}
