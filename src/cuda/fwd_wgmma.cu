/*
 * Tensor-core forward on Hopper's warpgroup MMA (wgmma, sm_90a) for f16 / bf16 storage,
 * D = 64 or 128, the scale-only score pipeline without dropout (the FAST case of fwd_mma.cu,
 * which handles everything else).
 *
 * A block owns BQ = 64 NWG query rows of one (batch, head): NWG warpgroups of 4 warps, group w
 * owning rows [64 w, 64 w + 64), each warp 16 of them. Per key tile of BK keys:
 *
 *   S  = Q K^T     D / 16 wgmma m64nBKk16, A (the group's Q rows) and B (the K tile) read
 *                  from shared memory through descriptors; S lands in registers in the
 *                  m16n8 layout per warp, the layout fwd_tile.cuh's row code takes
 *   P  = the online softmax of fwd_tile.cuh, per warp, exactly as in fwd_mma.cu
 *   O += P V       BK / 16 wgmma m64nDk16, A = P converted to 16 bits in registers (the
 *                  accumulator layout of two n8 tiles is the A fragment of a k16 step), B = the
 *                  V tile from shared memory, read transposed (MN-major)
 *
 * Compared with mma.sync (fwd_mma.cu), one instruction covers 64 rows x N columns of a whole
 * warpgroup and reads its operands from shared memory itself: no ldmatrix, and the 128 query
 * rows of a block cost each thread 64 accumulators of S instead of 128.
 *
 * K and V tiles are double-buffered with cp.async by all threads: tile t + 1 is in flight
 * while tile t is computed. Tiles sit in shared memory in wgmma's 128-byte-swizzled slab
 * layout (wgmma.cuh). The recurrence, masking and the exact treatment of non-finite V under
 * masks are fwd_tile.cuh's.
 */
#include "common.cuh"
#include "fwd_tile.cuh"
#include "wgmma.cuh"

#include "config.h"

#include <stdint.h>

namespace {

template <int D, int BK, int NWG> struct wg_cfg {
    static constexpr int BQ = 64 * NWG;
    static constexpr int threads = 128 * NWG;
    using LQ = slab_layout<D, BQ>;
    using LK = slab_layout<D, BK>;
    /* Q, K x2, V x2 (each 1024-byte aligned: multiples of 8 KiB), then BK key flags; 1 KiB
     * of slack to align the dynamic shared memory's start */
    static constexpr size_t flags_off = (size_t)(BQ + 4 * BK) * D * 2;
    static constexpr size_t smem_bytes = flags_off + (BK + 31) / 32 * 4 + 1024;
};

template <typename T, int D, int BK, int NWG>
__global__ void __launch_bounds__(128 * NWG, 1) fa_fwd_kernel_wgmma__sm90a(const fai_cuda_args a)
{
#ifdef FAI_WGMMA
    using cfg = wg_cfg<D, BK, NWG>;
    using LQ = typename cfg::LQ;
    using LK = typename cfg::LK;
    using M = mma_t<T>;
    using W = wgmma_op<T, BK>;
    using WO = wgmma_op<T, D>;
    constexpr int BQ = cfg::BQ, NT = BK / 8, DT = D / 8, KQ = D / 16, KP = BK / 16;
    constexpr float kLog2e = 1.4426950408889634f;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + (-smem_addr(smem_raw) & 1023u);
    T *qs = (T *)smem;
    T *ks = qs + BQ * D; /* [2][BK * D] */
    T *vs = ks + 2 * BK * D; /* [2][BK * D] */
    unsigned char *bad = smem + cfg::flags_off; /* BK bits: keys with a non-finite V element */
    const fai_mask mask = a.mask;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int64_t nqt = (a.sq + BQ - 1) / BQ;
    /* heavy tiles first: under a causal mask the last query tiles see the most keys */
    const int64_t qt = nqt - 1 - blockIdx.x;
    const int64_t i0 = qt * BQ, i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
    /* the group's rows [gi0, gi1) and the warp's [wi0, wi1) */
    const int64_t gi0 = i0 + 64 * wg, gi1 = gi0 + 64 < i1 ? gi0 + 64 : i1;
    const int64_t wi0 = gi0 + 16 * (warp & 3), wi1 = wi0 + 16 < i1 ? wi0 + 16 : i1;
    fwd_rows rows = {mask, a.score, fai_drop_of(a), 0.0f, (float)a.score.scale * kLog2e,
                     wi0, 0, 0, lane >> 2, lane & 3};

    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
        rows.b = b, rows.h = h;
        const T *qg = fai_at<T>(a.tq, b, 0, h), *kg = fai_at<T>(a.tk, b, 0, hk),
                *vg = fai_at<T>(a.tv, b, 0, hk);

        int64_t klo, khi; /* keys any row of the block may see */
        fai_mask_key_span(&mask, i0, i1, &klo, &khi);
        klo = klo / BK * BK; /* tiles on the grid of BK, as in fwd_mma.cu */
        const int ntiles = klo < khi ? (int)((khi - klo + BK - 1) / BK) : 0;

        __syncthreads(); /* the previous (b, h)'s readers are done with shared memory */
        /* Q tile, rows past Sq zero-filled */
        tile_load<D, BQ, cfg::threads, LQ>(qs, qg + i0 * a.tq.ss, a.tq.ss, a.sq - i0, tid);
        cp_async_commit();
        auto load_kv = [&](int t) {
            const int64_t j0 = klo + (int64_t)t * BK;
            T *kd = ks + (t & 1) * BK * D, *vd = vs + (t & 1) * BK * D;
            tile_load<D, BK, cfg::threads, LK>(kd, kg + j0 * a.tk.ss, a.tk.ss, a.sk - j0, tid);
            tile_load<D, BK, cfg::threads, LK>(vd, vg + j0 * a.tv.ss, a.tv.ss, a.sk - j0, tid);
            cp_async_commit();
        };
        if (ntiles > 0)
            load_kv(0);

        float o[1][DT][4];
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
        for (int d = 0; d < DT; d++)
            o[0][d][0] = o[0][d][1] = o[0][d][2] = o[0][d][3] = 0;

        for (int t = 0; t < ntiles; t++) {
            const int64_t j0 = klo + (int64_t)t * BK;
            if (t + 1 < ntiles) {
                load_kv(t + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            fence_proxy_async(); /* this thread's cp.async data, before wgmma reads it */
            __syncthreads();
            const T *kt = ks + (t & 1) * BK * D;
            T *vt = vs + (t & 1) * BK * D;

            /* scan V for non-finite values where P = 0 may meet them (fwd_tile.cuh) */
            const fai_tile_class bcls = fai_mask_classify(&mask, i0, i1, j0, j0 + BK);
            bool fix = false;
            if (bcls != FAI_TILE_FULL)
                fix = fwd_scan_v<T, D, BK, cfg::threads>(
                    vt, bad, tid, [](int r, int ch) { return LK::off(r, ch); });

            /* wgmma is collective over the group: it skips a tile only when none of its 64
             * rows sees it; a warp none of whose rows does takes part masked (PARTIAL) */
            const fai_tile_class gcls =
                gi0 < gi1 ? fai_mask_classify(&mask, gi0, gi1, j0, j0 + BK) : FAI_TILE_EMPTY;
            if (gcls != FAI_TILE_EMPTY) {
                /* S = Q K^T */
                float s[1][NT][4];
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < KQ; kk++) {
                    const int sl = kk >> 2, k16 = (kk & 3) * 16;
                    const uint64_t da = wg_desc(qs + sl * LQ::slab + 64 * 64 * wg + k16, 16, 1024);
                    const uint64_t db = wg_desc(kt + sl * LK::slab + k16, 16, 1024);
                    W::ss(s[0], da, db, kk > 0);
                }
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_pin(s[0]);

                const fai_tile_class wcls =
                    wi0 < wi1 ? fai_mask_classify(&mask, wi0, wi1, j0, j0 + BK) : FAI_TILE_EMPTY;
                bool live[2];
                uint32_t pos[2];
                fwd_softmax<1, NT, DT, BK, true>(rows, s, o, m, l, live, pos, j0,
                                                 wcls == FAI_TILE_EMPTY ? FAI_TILE_PARTIAL : wcls,
                                                 fix);
                /* O += P V: P's accumulator tiles n = 2 kk, 2 kk + 1 are the A fragment of
                 * k-step kk (as in fwd_mma.cu) */
                uint32_t pa[KP][4];
#pragma unroll
                for (int kk = 0; kk < KP; kk++) {
                    pa[kk][0] = M::pack(s[0][2 * kk][0], s[0][2 * kk][1]);
                    pa[kk][1] = M::pack(s[0][2 * kk][2], s[0][2 * kk][3]);
                    pa[kk][2] = M::pack(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
                    pa[kk][3] = M::pack(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
                }
                wgmma_pin(o[0]);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < KP; kk++)
                    WO::rs(o[0], pa[kk], wg_desc(vt + 16 * kk * 64, BK * 128, 1024));
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_pin(o[0]);
                if (fix)
                    fwd_add_back<T, 1, DT, BK, true>(rows, o, live, pos, bad, j0, vg, a.tv.ss);
            }
            __syncthreads(); /* buffer t & 1 is reloaded by the next iteration */
        }
        cp_async_wait<0>(); /* the Q copy when there was no tile */

        fwd_store<T, 1, DT>(a, rows, o, m, l);
    }
#endif
}

template <typename T, int D, int BK, int NWG>
fai_cuda_result launch(const fai_cuda_args &a, char *err, size_t n)
{
    using cfg = wg_cfg<D, BK, NWG>;
    auto k = fa_fwd_kernel_wgmma__sm90a<T, D, BK, NWG>;
    const size_t sm = cfg::smem_bytes;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
        cudaSuccess)
        return fai_cuda_check_launch("wgmma forward: shared memory", err, n);
    const int64_t nqt = (a.sq + cfg::BQ - 1) / cfg::BQ, bh = a.b * a.hq;
    dim3 grid((unsigned)nqt, (unsigned)(bh < 65535 ? bh : 65535));
    k<<<grid, cfg::threads, sm, (cudaStream_t)a.stream>>>(a);
    return fai_cuda_check_launch("wgmma forward", err, n);
}

/* FA_CUDA_WG=NWGxBK chooses the configuration for the tile experiment (temporary). */
template <typename T, int D>
fai_cuda_result by_cfg(const fai_cuda_args &a, char *err, size_t n)
{
    const char *e = getenv("FA_CUDA_WG");
    if (e && strcmp(e, "2x64") == 0)
        return launch<T, D, 64, 2>(a, err, n);
    if (e && strcmp(e, "3x64") == 0)
        return launch<T, D, 64, 3>(a, err, n);
    return launch<T, D, 128, 2>(a, err, n);
}

template <typename T>
fai_cuda_result by_dim(const fai_cuda_args &a, char *err, size_t n)
{
    return a.dqk == 64 ? by_cfg<T, 64>(a, err, n) : by_cfg<T, 128>(a, err, n);
}

/* Whether the wgmma kernel applies: a build with the sm_90a image, a 9.0 device, 16-bit
 * storage, Dqk = Dv in {64, 128}, the scale-only pipeline without dropout, every row 16-byte
 * aligned (base and strides) for cp.async. */
bool applies(const fai_cuda_args &a)
{
#ifndef FA_CUDA_HAVE_SM90A
    return false;
#endif
    if (a.kernel != FAI_CUDA_KERNEL_AUTO)
        return false;
    if (a.dtype != FA_BF16 && a.dtype != FA_F16)
        return false;
    if (a.dqk != a.dv || (a.dqk != 64 && a.dqk != 128))
        return false;
    if (a.score.softcap != 0 || a.slopes != nullptr || a.drop_threshold != 0)
        return false;
    const fai_cuda_view *vs[4] = {&a.tq, &a.tk, &a.tv, &a.tout};
    for (int t = 0; t < 4; t++) {
        if ((uintptr_t)vs[t]->data % 16 != 0)
            return false;
        if (vs[t]->sb % 8 || vs[t]->ss % 8 || vs[t]->sh % 8)
            return false;
    }
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
}

} // namespace

fai_cuda_result fai_cuda_forward_wgmma(const fai_cuda_args *a, char *err, size_t n)
{
    if (!applies(*a))
        return FAI_CUDA_UNSUPPORTED;
    if (a->sq == 0 || a->b * a->hq == 0)
        return FAI_CUDA_OK;
    return a->dtype == FA_BF16 ? by_dim<__nv_bfloat16>(*a, err, n) : by_dim<__half>(*a, err, n);
}
