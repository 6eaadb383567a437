/*
 * Tensor-core forward on Hopper (sm_90a): warpgroup MMA (wgmma), TMA copies and warp
 * specialization, for f16 / bf16 storage, D = 64, 96, 128 or 256 (Dqk = Dv), the scale-only
 * score pipeline without dropout (the FAST case of fwd_mma.cu, which handles everything else).
 *
 * A block owns BQ = 64 NCW query rows of one (batch, head) and has 1 + NCW warpgroups (NCW = 2
 * or 3 consumers; the plan's tile says which):
 *
 *   producer   (warpgroup 0, its registers given away to the others): one thread issues the
 *              TMA copies of Q once and of K and V tile by tile into STAGES shared-memory
 *              stages, each completing on its `full` mbarrier; a stage's K is reloaded once
 *              the consumers have its S (`free_k`), its V once they have its P V (`free_v`).
 *              On tiles that not every row of the block fully sees, its 128 threads then scan
 *              V for non-finite elements (fwd_tile.cuh) and release the tile on `scanned`.
 *   consumers  (warpgroups 1 .. NCW, rows [0, 64), [64, 128), ...): per key tile of BK keys
 *                S  = Q K^T   D / 16 wgmma m64nBKk16, both operands from shared memory
 *                P  = the online softmax of fwd_tile.cuh, per warp, as in fwd_mma.cu
 *                O += P V     BK / 16 wgmma m64nDPk16 (DP: D padded to whole 64-column
 *                             slabs, wg_cfg), A = P in registers, B = V read transposed
 *                             (MN-major) from shared memory
 *              with tile t's P V in flight while tile t + 1's S and softmax run (the loop
 *              below).
 *
 * The consumers never wait for each other, only for data: while one runs its softmax, the
 * tensor cores serve the others' products. Tiles sit in shared memory in the 128-byte-
 * swizzled slab layout that TMA writes and wgmma reads (wgmma.cuh).
 */
#include "common.cuh"
#include "fwd_tile.cuh"
#include "wgmma.cuh"

#include "config.h"

#include <stdint.h>

namespace {

/* The TMA descriptors of Q, K and V: 4-d (d, s, h, b) views with boxes of 64 dims (one
 * 128-byte slab line) x BQ or BK rows. */
struct fwd_maps {
    CUtensorMap q, k, v;
};

/* D: the head dim; DP: D padded to whole 64-column slabs (96 -> 128), the width of the tiles in
 * shared memory and of the O accumulator. TMA fills the padding columns with zeros (they lie
 * past the tensor map's D): they add nothing to Q K^T, which runs D / 16 k-steps anyway, and
 * give O columns that are never stored. BQ: 64 rows a consumer warpgroup. The registers of the
 * 64 Ki of an SM: the producer keeps few (its one thread's TMA issues and the V scan), the
 * consumers take the rest, in steps of 8 (setmaxnreg): 40 + 2 x 232 or 32 + 3 x 160 per 128
 * threads. */
template <int D, int BQ_, int BK, int STAGES> struct wg_cfg {
    static constexpr int BQ = BQ_;
    static constexpr int NCW = BQ / 64;
    static_assert(BQ == 128 || BQ == 192, "wgmma forward: 2 or 3 consumer warpgroups");
    static constexpr int consumer_threads = 128 * NCW;
    static constexpr int threads = 128 + consumer_threads;
    static constexpr int producer_regs = NCW == 2 ? 40 : 32;
    static constexpr int consumer_regs = NCW == 2 ? 232 : 160;
    static_assert(128 * producer_regs + consumer_threads * consumer_regs <= 65536,
                  "wgmma forward: the register file");
    static constexpr int DP = (D + 63) / 64 * 64;
    using LQ = slab_layout<DP, BQ>;
    using LK = slab_layout<DP, BK>;
    static constexpr uint32_t q_bytes = BQ * DP * 2, kv_bytes = BK * DP * 2;
    /* Q, K x STAGES, V x STAGES (each a multiple of 8 KiB: 1024-byte aligned), the key flags
     * of each stage (16 bytes), then the mbarriers; 1 KiB of slack to align the start */
    static constexpr size_t flags_off = q_bytes + 2 * STAGES * (size_t)kv_bytes;
    static constexpr size_t bars_off = flags_off + 16 * STAGES;
    /* q, then per stage: K full, V full, V scanned, K free, V free */
    static constexpr int nbars = 1 + 5 * STAGES;
    static constexpr size_t smem_bytes = bars_off + 8 * nbars + 1024;
};

template <typename T, int D, int BQ_, int BK, int STAGES>
__global__ void __launch_bounds__(wg_cfg<D, BQ_, BK, STAGES>::threads, 1)
    fa_fwd_kernel_wgmma__sm90a(const fai_cuda_args a, const __grid_constant__ fwd_maps maps)
{
#ifdef FAI_WGMMA
    using cfg = wg_cfg<D, BQ_, BK, STAGES>;
    using LQ = typename cfg::LQ;
    using LK = typename cfg::LK;
    using M = mma_t<T>;
    constexpr int BQ = cfg::BQ, DP = cfg::DP, NT = BK / 8, DT = DP / 8, DS = D / 8, KQ = D / 16,
                  KP = BK / 16;
    using W = wgmma_op<T, BK>;
    using WO = wgmma_op<T, DP>;
    constexpr float kLog2e = FAI_LOG2E_F; /* base-2 units: core/recurrence.h */

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + (-smem_addr(smem_raw) & 1023u);
    T *qs = (T *)smem;
    T *ks = qs + BQ * DP;          /* [STAGES][BK * DP] */
    T *vs = ks + STAGES * BK * DP; /* [STAGES][BK * DP] */
    unsigned char *flags = smem + cfg::flags_off; /* [STAGES][16]: keys with non-finite V */
    uint64_t *bars = (uint64_t *)(smem + cfg::bars_off);
    uint64_t *full_q = bars, *full_k = bars + 1, *full_v = full_k + STAGES,
             *scanned = full_v + STAGES, *free_k = scanned + STAGES, *free_v = free_k + STAGES;
    const fai_mask mask = a.mask;

    /* the warp index from lane 0: then the compiler knows it (and every branch on it) is
     * warp-uniform, as wgmma needs */
    const int tid = threadIdx.x, lane = tid & 31, warp = __shfl_sync(0xffffffffu, tid >> 5, 0),
              wg = warp >> 2;
    const int64_t nqt = (a.sq + BQ - 1) / BQ;
    /* heavy tiles first: under a causal mask the last query tiles see the most keys */
    const int64_t qt = nqt - 1 - blockIdx.x;
    const int64_t i0 = qt * BQ, i1 = i0 + BQ < a.sq ? i0 + BQ : a.sq;
    const int64_t bh = blockIdx.y, b = bh / a.hq, h = bh % a.hq, hk = h / a.group;

    int64_t klo, khi; /* keys any row of the block may see */
    fai_mask_key_span(&mask, i0, i1, &klo, &khi);
    klo = klo / BK * BK; /* tiles on the grid of BK, as in fwd_mma.cu */
    const int ntiles = klo < khi ? (int)((khi - klo + BK - 1) / BK) : 0;
    /* tiles not fully allowed for the whole block get their V scanned (fwd_tile.cuh) */
    auto needs_scan = [&](int t) {
        const int64_t j0 = klo + (int64_t)t * BK;
        return fai_mask_classify(&mask, i0, i1, j0, j0 + BK) != FAI_TILE_FULL;
    };

    if (tid == 0) {
        mbar_init(full_q, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_k + s, 1);
            mbar_init(full_v + s, 1);
            mbar_init(scanned + s, 128);
            mbar_init(free_k + s, cfg::consumer_threads);
            mbar_init(free_v + s, cfg::consumer_threads);
        }
        fence_mbarrier_init();
    }
    __syncthreads();

    if (wg == 0) { /* ------------------------------------------------ producer */
        setmaxnreg_dec<cfg::producer_regs>();
        if (ntiles == 0)
            return;
        const int c_h = (int)h, c_hk = (int)hk, c_b = (int)b;
        if (tid == 0) {
            mbar_arrive_tx(full_q, cfg::q_bytes);
            for (int sl = 0; sl < DP / 64; sl++)
                tma_load_4d(qs + sl * LQ::slab, &maps.q, 64 * sl, (int)i0, c_h, c_b, full_q);
        }
        for (int t = 0; t < ntiles; t++) {
            const int s = t % STAGES;
            const int j0 = (int)(klo + (int64_t)t * BK);
            T *kd = ks + s * BK * DP, *vd = vs + s * BK * DP;
            /* the consumers are done with tile t - STAGES's K (its S is in), then with its V */
            if (tid == 0) {
                if (t >= STAGES)
                    mbar_wait(free_k + s, (t / STAGES - 1) & 1);
                mbar_arrive_tx(full_k + s, cfg::kv_bytes);
                for (int sl = 0; sl < DP / 64; sl++)
                    tma_load_4d(kd + sl * LK::slab, &maps.k, 64 * sl, j0, c_hk, c_b, full_k + s);
            }
            if (t >= STAGES)
                mbar_wait(free_v + s, (t / STAGES - 1) & 1);
            if (tid == 0) {
                mbar_arrive_tx(full_v + s, cfg::kv_bytes);
                for (int sl = 0; sl < DP / 64; sl++)
                    tma_load_4d(vd + sl * LK::slab, &maps.v, 64 * sl, j0, c_hk, c_b, full_v + s);
            }
            if (needs_scan(t)) {
                unsigned char *bad = flags + 16 * s;
                if (tid < 4)
                    ((uint32_t *)bad)[tid] = 0;
                mbar_wait(full_v + s, (t / STAGES) & 1);
                named_barrier(1, 128); /* the flags are clear */
                fwd_scan_v_part<T, D, BK, 128>(vd, bad, tid,
                                               [](int r, int ch) { return LK::off(r, ch); });
                mbar_arrive(scanned + s);
            }
        }
        return;
    }

    /* ------------------------------------------------------------ consumers */
    setmaxnreg_inc<cfg::consumer_regs>();
    const int cw = wg - 1; /* 0 .. NCW - 1: rows [64 cw, 64 cw + 64) of the block */
    /* the warp's rows [wi0, wi1) */
    const int64_t wi0 = i0 + 64 * cw + 16 * (warp & 3), wi1 = wi0 + 16 < i1 ? wi0 + 16 : i1;
    const fwd_rows rows = {mask, a.score, fai_drop_head(a, b, h), 0.0f, (float)a.score.scale * kLog2e,
                           wi0, b, h, lane >> 2, lane & 3};
    const T *vg = fai_at<T>(a.tv, b, 0, hk);

    float o[1][DT][4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
    for (int d = 0; d < DT; d++)
        o[0][d][0] = o[0][d][1] = o[0][d][2] = o[0][d][3] = 0;

    uint32_t scan_par = 0; /* bit s: parity of stage s's next `scanned` phase */
    /* Whether tile t's V scan flagged a key (waiting for the scan, on tiles that have one;
     * called once per tile, in order) */
    auto flagged = [&](int t) {
        if (!needs_scan(t))
            return false;
        const int s = t % STAGES;
        mbar_wait(scanned + s, (scan_par >> s) & 1);
        scan_par ^= 1u << s;
        const uint4 f = *(const uint4 *)(flags + 16 * s);
        return (f.x | f.y | f.z | f.w) != 0;
    };
    /* issue S = Q K^T of tile t into sc (one committed group; not waited for) */
    auto issue_s = [&](int t, float(&sc)[1][NT][4]) {
        const int s = t % STAGES;
        const T *kt = ks + s * BK * DP;
        mbar_wait(full_k + s, (t / STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KQ; kk++) {
            const int sl = kk >> 2, k16 = (kk & 3) * 16;
            W::ss(sc[0], wg_desc(qs + sl * LQ::slab + 64 * 64 * cw + k16, 16, 1024),
                  wg_desc(kt + sl * LK::slab + k16, 16, 1024), kk > 0);
        }
        wgmma_commit();
    };
    /* tile t's softmax over sc (fwd_tile.cuh), O's factor into alpha; whether O takes one */
    auto softmax = [&](int t, float(&sc)[1][NT][4], bool fix, bool(&live)[2], uint32_t(&pos)[2],
                       float(&alpha)[2]) {
        const int64_t j0 = klo + (int64_t)t * BK;
        const fai_tile_class wcls =
            wi0 < wi1 ? fai_mask_classify(&mask, wi0, wi1, j0, j0 + BK) : FAI_TILE_EMPTY;
        return fwd_softmax_p<1, NT, BK, true>(rows, sc, m, l, live, pos, alpha, j0,
                                              wcls == FAI_TILE_EMPTY ? FAI_TILE_PARTIAL : wcls,
                                              fix);
    };

    /*
     * The tiles in a pipeline of two (FA3's intra-warpgroup overlap): while the tensor cores
     * add tile t's P V into O, the threads run tile t + 1's softmax, whose S they issued just
     * before. O takes tile t + 1's factor only once P_t V_t is in (fwd_rescale after the
     * wait), and tile t's flagged keys are added back before that, at tile t's scale. Every
     * tile of the block's span runs, masked: a tile none of the group's rows sees gives P = 0
     * (its V scanned: the tile is not FULL for the block).
     */
    float sc[1][NT][4];
    bool live[2], fix = false;
    uint32_t pos[2];
    uint32_t pa[KP][4];
    /* P (in sc) as the A fragments of O += P V: accumulator tiles n = 2 kk, 2 kk + 1 are
     * k-step kk's (as in fwd_mma.cu) */
    auto pack_p = [&] {
#pragma unroll
        for (int kk = 0; kk < KP; kk++) {
            pa[kk][0] = M::pack(sc[0][2 * kk][0], sc[0][2 * kk][1]);
            pa[kk][1] = M::pack(sc[0][2 * kk][2], sc[0][2 * kk][3]);
            pa[kk][2] = M::pack(sc[0][2 * kk + 1][0], sc[0][2 * kk + 1][1]);
            pa[kk][3] = M::pack(sc[0][2 * kk + 1][2], sc[0][2 * kk + 1][3]);
        }
    };
    /* issue O += P V of tile t (one committed group) */
    auto issue_pv = [&](int t) {
        const int s = t % STAGES;
        const T *vt = vs + s * BK * DP;
        wgmma_pin(o[0]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KP; kk++)
            WO::rs(o[0], pa[kk], wg_desc(vt + 16 * kk * 64, BK * 128, 1024));
        wgmma_commit();
    };
    /* after tile t's P V is in: its flagged keys added back, its V released */
    auto retire = [&](int t) {
        const int s = t % STAGES;
        if (fix)
            fwd_add_back<T, 1, DT, BK, true, DS>(rows, o, live, pos, flags + 16 * s,
                                                 klo + (int64_t)t * BK, vg, a.tv.ss);
        mbar_arrive(free_v + s); /* this thread is done with stage s's V */
    };

    if (ntiles > 0) {
        float alpha[2];
        mbar_wait(full_q, 0);
        issue_s(0, sc);
        wgmma_wait<0>();
        wgmma_pin(sc[0]);
        mbar_arrive(free_k); /* tile 0's K: its S is in */
        fix = flagged(0);
        softmax(0, sc, fix, live, pos, alpha); /* O is 0: no factor to apply */
    }
    /* every tile but the last: its P V in flight beside the next one's S and softmax (no
     * branch between the issues and the waits: ptxas then keeps the MMAs asynchronous) */
    for (int t = 0; t + 1 < ntiles; t++) {
        pack_p();
        mbar_wait(full_v + t % STAGES, (t / STAGES) & 1);
        issue_s(t + 1, sc);
        issue_pv(t);
        bool live_n[2];
        uint32_t pos_n[2];
        float alpha_n[2];
        wgmma_wait<1>(); /* S_{t+1}; P_t V_t may still run */
        wgmma_pin(sc[0]);
        mbar_arrive(free_k + (t + 1) % STAGES);
        const bool fix_n = flagged(t + 1);
        const bool factor = softmax(t + 1, sc, fix_n, live_n, pos_n, alpha_n);
        wgmma_wait<0>();
        wgmma_pin(o[0]);
        retire(t);
        if (factor)
            fwd_rescale<1, DT>(o, alpha_n);
        fix = fix_n;
#pragma unroll
        for (int r = 0; r < 2; r++)
            live[r] = live_n[r], pos[r] = pos_n[r];
    }
    if (ntiles > 0) {
        pack_p();
        mbar_wait(full_v + (ntiles - 1) % STAGES, ((ntiles - 1) / STAGES) & 1);
        issue_pv(ntiles - 1);
        wgmma_wait<0>();
        wgmma_pin(o[0]);
        retire(ntiles - 1);
    }
    fwd_store<T, 1, DT, DS>(a, rows, o, m, l);
#endif
}

/* ------------------------------------------------------------------ launch */

template <typename T, int D, int BQ, int BK, int STAGES>
fai_cuda_result launch(const fai_cuda_args &a, char *err, size_t n)
{
    using cfg = wg_cfg<D, BQ, BK, STAGES>;
    fwd_maps maps;
    if (!tma_map_4d(&maps.q, a.tq, a.dtype, D, a.sq, a.hq, a.b, cfg::BQ) ||
        !tma_map_4d(&maps.k, a.tk, a.dtype, D, a.sk, a.hk, a.b, BK) ||
        !tma_map_4d(&maps.v, a.tv, a.dtype, D, a.sk, a.hk, a.b, BK)) {
        snprintf(err, n, "backend cuda: wgmma forward: the driver refused a TMA tensor map");
        return FAI_CUDA_UNSUPPORTED;
    }
    auto k = fa_fwd_kernel_wgmma__sm90a<T, D, BQ, BK, STAGES>;
    const size_t sm = cfg::smem_bytes;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
        cudaSuccess)
        return fai_cuda_check_launch("wgmma forward: shared memory", err, n);
    const int64_t nqt = (a.sq + cfg::BQ - 1) / cfg::BQ;
    dim3 grid((unsigned)nqt, (unsigned)(a.b * a.hq));
    k<<<grid, cfg::threads, sm, (cudaStream_t)a.stream>>>(a, maps);
    return fai_cuda_check_launch("wgmma forward", err, n);
}

/* The plan's tile (plan.cu says why each): 192 query rows x 128 keys at D 64, 128 x 128 at D 96
 * and 128, 128 x 64 at D 256, 2 stages. */
template <typename T>
fai_cuda_result by_tile(const fai_cuda_args &a, const fai_cuda_tile &t, char *err, size_t n)
{
    if (t.bq == 192 && t.bk == 128 && t.stages == 2 && a.dqk == 64)
        return launch<T, 64, 192, 128, 2>(a, err, n);
    if (t.bq == 128 && t.bk == 128 && t.stages == 2)
        switch (a.dqk) {
        case 96: return launch<T, 96, 128, 128, 2>(a, err, n);
        case 128: return launch<T, 128, 128, 128, 2>(a, err, n);
        }
    if (t.bq == 128 && t.bk == 64 && t.stages == 2 && a.dqk == 256)
        return launch<T, 256, 128, 64, 2>(a, err, n);
    return fai_cuda_no_instance("the wgmma forward", &a, &t, err, n);
}

} // namespace

fai_cuda_result fai_cuda_forward_wgmma(const fai_cuda_args *a, const fai_cuda_tile *t,
                                       char *err, size_t n)
{
    if (a->sq == 0 || a->b * a->hq == 0)
        return FAI_CUDA_OK;
    return a->dtype == FA_BF16 ? by_tile<__nv_bfloat16>(*a, *t, err, n)
                               : by_tile<__half>(*a, *t, err, n);
}
