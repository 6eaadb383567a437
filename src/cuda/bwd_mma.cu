/*
 * Tensor-core backward for f16 / bf16 storage, Dqk = Dv in {32, 64, 96, 128} (FlashAttention-2's
 * schedule: parallel over key blocks, recomputation of P from the forward's LSE).
 *
 * A block owns BKV = 64 keys of one (batch, KV head); warp w owns keys [16 w, 16 w + 16) and
 * keeps dK, dV for them in registers across every query tile of every query head of the GQA
 * group, so dK and dV are written once, without atomics. Per query tile of BQ = 32 rows
 * (Q and dO tiles double-buffered with cp.async in swizzled shared memory):
 *
 *   S^T  = K Q^T       A = the warp's K rows (ldmatrix), B = Q rows (ldmatrix)
 *   P^T  = 2^(S^T scale log2(e) - LSE_i log2(e))    (LSE_i log2(e) precomputed; +inf for an
 *                                                    empty row, so P = 0 there)
 *   dP^T = V dO^T      A = the warp's V rows, B = dO rows
 *   dS^T = P^T (dP^T z - D_i) (1 - t^2) scale        z = keep / (1 - p), or 0 if dropped
 *   dV  += P~^T dO     P~^T = P^T z from registers as the A operand (as P in the forward)
 *   dK  += dS^T Q      dS^T from registers as the A operand
 *   dQ  += dS K        dS^T goes through shared memory (transposed by ldmatrix.trans); each
 *                      warp adds its 16-query x D/2 slice to an f32 accumulator with atomics,
 *                      or, when the context asks for determinism, dQ is left to
 *                      fa_bwd_dq_kernel_mma__sm80 below (per query block, keys in order).
 *
 * Masked pairs are dropped by selection (P = dS = 0 chosen, not computed), and the whole path
 * runs only when q, k, v and dout are finite (a pre-pass sets a device flag; the generic
 * kernels, launched behind the same flag, take the other case): with finite inputs a selected
 * 0 times any operand is 0, so the MMAs cannot carry a masked NaN or inf into another row.
 *
 * fai_cuda_backward_mma runs the Hopper kernel of bwd_wgmma.cu where the plan says so (D 64 to
 * 256, scale only; D 256 only there), the dK/dV kernel here elsewhere.
 */
#include "common.cuh"
#include "mma.cuh"

#include <stdint.h>

namespace {

constexpr int kBKV = 64, kBQ = 32, kWarps = 4, kThreads = 32 * kWarps;

template <typename T, int D> struct bwd_cfg {
    using L = layout<D>;
    static constexpr int dsp = kBQ + 8; /* dS^T row pitch (elements): 80 bytes, conflict-free */
    static constexpr size_t q_off = 2 * (size_t)kBKV * L::pitch * 2;          /* after K, V */
    static constexpr size_t g_off = q_off + 2 * (size_t)kBQ * L::pitch * 2;   /* dO x2 */
    static constexpr size_t ds_off = g_off + 2 * (size_t)kBQ * L::pitch * 2;
    static constexpr size_t smem_bytes = ds_off + (size_t)kBKV * dsp * 2;
};

/* Any non-finite element in q, k, v or dout sets *flag. One thread per row of 8 elements. */
template <typename T>
__global__ void fa_bwd_finite_check_kernel(const fai_cuda_args a, int *flag)
{
    using M = mma_t<T>;
    const fai_cuda_view *vs[4] = {&a.tq, &a.tk, &a.tv, &a.tdout};
    const int64_t heads[4] = {a.hq, a.hk, a.hk, a.hq}, seqs[4] = {a.sq, a.sk, a.sk, a.sq};
    const int64_t dims[4] = {a.dqk, a.dqk, a.dv, a.dv};
    for (int t = 0; t < 4; t++) {
        const int64_t rows = a.b * seqs[t] * heads[t], chunks = dims[t] / 8;
        for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < rows * chunks;
             x += (int64_t)gridDim.x * blockDim.x) {
            const int64_t row = x / chunks, c = x % chunks, h = row % heads[t],
                          s = (row / heads[t]) % seqs[t], b = row / (heads[t] * seqs[t]);
            const uint4 w = *(const uint4 *)(fai_at<T>(*vs[t], b, s, h) + 8 * c);
            const uint32_t wd[4] = {w.x, w.y, w.z, w.w};
            bool bad = false;
#pragma unroll
            for (int k = 0; k < 4; k++)
                bad |= M::nonfinite((uint16_t)wd[k]) || M::nonfinite((uint16_t)(wd[k] >> 16));
            if (bad)
                atomicOr(flag, 1);
        }
    }
}

/* lse2[(b hq + h) sq + i] = LSE in base-2 units (core/recurrence.h: fai_lse_base2_f32). */
__global__ void fa_bwd_lse2_kernel(const fai_cuda_args a, float *lse2)
{
    const int64_t n = a.b * a.hq * a.sq;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n;
         x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = x % a.sq, bh = x / a.sq, b = bh / a.hq, h = bh % a.hq;
        lse2[x] = fai_lse_base2_f32(fai_lse_get(a.tlse, a.lse_f64, b, h, i));
    }
}

/* dq = dq_acc (f32, already scaled) rounded to the storage type. */
template <typename T>
__global__ void fa_bwd_dq_store_kernel(const fai_cuda_args a, const float *acc, const int *flag)
{
    if (*flag)
        return;
    const int64_t n = a.b * a.hq * a.sq * a.dqk;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n;
         x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = x % a.dqk, r = x / a.dqk, i = r % a.sq, bh = r / a.sq,
                      b = bh / a.hq, h = bh % a.hq;
        fai_at<T>(a.tdq, b, i, h)[d] = fai_storage<T>::store(acc[x]);
    }
}

template <typename T, int D, bool FAST, bool DQ>
__global__ void __launch_bounds__(kThreads)
    fa_bwd_kernel_mma__sm80(const fai_cuda_args a, const float *delta, const float *lse2,
                            float *dqacc, const int *flag)
{
    if (*flag)
        return; /* non-finite input: the generic kernels run instead */
    using cfg = bwd_cfg<T, D>;
    using L = typename cfg::L;
    using M = mma_t<T>;
    constexpr int NQ = kBQ / 8, DT = D / 8, KD = D / 16, KQ = kBQ / 16;
    constexpr float kLog2e = FAI_LOG2E_F; /* base-2 units: core/recurrence.h */

    extern __shared__ __align__(128) unsigned char smem[];
    T *ks = (T *)smem, *vs = ks + kBKV * L::pitch;
    T *qs = (T *)(smem + cfg::q_off), *gs = (T *)(smem + cfg::g_off); /* [2][kBQ][pitch] */
    T *dss = (T *)(smem + cfg::ds_off);                                /* [kBKV][dsp] */
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3, sw = L::lane_swz(lane);
    const int64_t j0 = (int64_t)blockIdx.x * kBKV, j1 = j0 + kBKV < a.sk ? j0 + kBKV : a.sk;
    const int64_t wj0 = j0 + 16 * warp, wj1 = wj0 + 16 < j1 ? wj0 + 16 : j1;
    const float scale2 = (float)sc.scale * kLog2e;

    for (int64_t bhk = blockIdx.y; bhk < a.b * a.hk; bhk += gridDim.y) {
        const int64_t b = bhk / a.hk, hk = bhk % a.hk;
        const T *kg = fai_at<T>(a.tk, b, 0, hk), *vg = fai_at<T>(a.tv, b, 0, hk);

        int64_t qlo, qhi; /* query rows that may see any key of the block */
        fai_mask_query_span(&mask, a.sq, j0, j1, &qlo, &qhi);
        qlo = qlo / kBQ * kBQ;
        const int ntiles = qlo < qhi ? (int)((qhi - qlo + kBQ - 1) / kBQ) : 0;
        /* the queries that may see the thread's keys g, g + 8 (none for a key past Sk) */
        int64_t rlo[2], rhi[2];
#pragma unroll
        for (int r = 0; r < 2; r++)
            fai_mask_query_span(&mask, a.sq, wj0 + 8 * r + g, wj0 + 8 * r + g + 1, &rlo[r],
                                &rhi[r]);

        __syncthreads();
        tile_load<D, kBKV, kThreads>(ks, kg + j0 * a.tk.ss, a.tk.ss, a.sk - j0, tid);
        tile_load<D, kBKV, kThreads>(vs, vg + j0 * a.tv.ss, a.tv.ss, a.sk - j0, tid);
        cp_async_commit();

        float dk[DT][4], dv[DT][4];
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dk[d][e] = dv[d][e] = 0;

        const int total = ntiles * (int)a.group;
        /* query tile u of the group's sweep: head h = hk group + u / ntiles, rows from i0 */
        auto load_q = [&](int u) {
            const int64_t h = hk * a.group + u / ntiles, i0 = qlo + (int64_t)(u % ntiles) * kBQ;
            const T *qg = fai_at<T>(a.tq, b, 0, h), *dg = fai_at<T>(a.tdout, b, 0, h);
            T *qd = qs + (u & 1) * kBQ * L::pitch, *gd = gs + (u & 1) * kBQ * L::pitch;
            tile_load<D, kBQ, kThreads>(qd, qg + i0 * a.tq.ss, a.tq.ss, a.sq - i0, tid);
            tile_load<D, kBQ, kThreads>(gd, dg + i0 * a.tdout.ss, a.tdout.ss, a.sq - i0, tid);
            cp_async_commit();
        };
        if (total > 0)
            load_q(0);

        for (int u = 0; u < total; u++) {
            const int64_t h = hk * a.group + u / ntiles, i0 = qlo + (int64_t)(u % ntiles) * kBQ;
            const int64_t i1 = i0 + kBQ < a.sq ? i0 + kBQ : a.sq;
            const fai_dropout dr = fai_drop_head(a, b, h);
            if (u + 1 < total) {
                load_q(u + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const T *qt = qs + (u & 1) * kBQ * L::pitch, *gt = gs + (u & 1) * kBQ * L::pitch;
            /* over the warp's keys clipped to Sk ([wj0, wj1)) and the tile's rows clipped to
             * Sq ([i0, i1)): FULL says nothing of the padding rows of a last tile, which the
             * element loop below drops by its own j < Sk, i < Sq tests */
            const fai_tile_class wcls =
                wj0 < wj1 ? fai_mask_classify(&mask, i0, i1, wj0, wj1) : FAI_TILE_EMPTY;
            const float slope = a.slopes ? a.slopes[h] : 0.0f;
            const float *dl = delta + (b * a.hq + h) * a.sq, *ll = lse2 + (b * a.hq + h) * a.sq;

            float s[NQ][4], dp[NQ][4];
#pragma unroll
            for (int n = 0; n < NQ; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] = dp[n][e] = 0;
            if (wcls != FAI_TILE_EMPTY) {
                /* S^T = K Q^T and dP^T = V dO^T: rows = the warp's 16 keys, cols = queries */
#pragma unroll
                for (int kk = 0; kk < KD; kk++) {
                    uint32_t ka[4], va[4];
                    ldmatrix_x4(ka, ks + L::off_sw(16 * warp + (lane & 15), 2 * kk + (lane >> 4), sw));
                    ldmatrix_x4(va, vs + L::off_sw(16 * warp + (lane & 15), 2 * kk + (lane >> 4), sw));
#pragma unroll
                    for (int n = 0; n < NQ; n += 2) {
                        uint32_t qb[4], gb[4];
                        const int mi = lane >> 3;
                        const int row = 8 * n + 8 * (mi >> 1) + (lane & 7), ch = 2 * kk + (mi & 1);
                        ldmatrix_x4(qb, qt + L::off_sw(row, ch, sw));
                        ldmatrix_x4(gb, gt + L::off_sw(row, ch, sw));
                        M::run(s[n], ka, qb);
                        M::run(s[n + 1], ka, qb + 2);
                        M::run(dp[n], va, gb);
                        M::run(dp[n + 1], va, gb + 2);
                    }
                }
                /* P, dS; element (n, e) is key row 8 (e / 2) + g, query column 8 n + 2 tg +
                 * (e mod 2) */
                int lo_c[2], hi_c[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int64_t x = rlo[r] - i0, y = rhi[r] - i0;
                    lo_c[r] = x < 0 ? 0 : x > kBQ ? kBQ : (int)x;
                    hi_c[r] = y < 0 ? 0 : y > kBQ ? kBQ : (int)y;
                }
#pragma unroll
                for (int n = 0; n < NQ; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, c = 8 * n + 2 * tg + (e & 1);
                        const int64_t i = i0 + c, j = wj0 + 8 * r + g;
                        const bool ok = i < a.sq;
                        const float l2 = ok ? ll[i] : INFINITY, di = ok ? dl[i] : 0.0f;
                        float x, t = 0;
                        if (FAST)
                            x = s[n][e] * scale2 - l2;
                        else
                            x = fai_score_f32(&sc, s[n][e], slope, i, j, &t) * kLog2e - l2;
                        /* a padding key (j >= Sk, a zero K row) is dropped even in a FULL
                         * tile: its P = 2^(-LSE log2(e)) overflows f32 for LSE < -88 (and
                         * dS its 16-bit pack far sooner), and inf times the zero K row in
                         * dQ += dS K is NaN in every dQ row of the tile */
                        const bool allowed =
                            ok && j < a.sk &&
                            (wcls == FAI_TILE_FULL || (c >= lo_c[r] && c < hi_c[r]));
                        const float p = allowed ? ex2(x) : 0.0f;
                        float z = (float)a.keep_scale;
                        if (!FAST && dr.threshold && !fai_dropout_keep(&dr, i, j))
                            z = 0;
                        const float gds =
                            fai_dscore_f32(p, dp[n][e], z, di, t, !FAST && sc.softcap > 0);
                        s[n][e] = p * z;                                   /* P~ */
                        dp[n][e] = allowed ? (float)sc.scale * gds : 0.0f; /* dS */
                    }
                /* dV += P~^T dO, dK += dS^T Q: A from registers (k = queries), B = dO / Q
                 * rows transposed by ldmatrix.trans */
#pragma unroll
                for (int kk = 0; kk < KQ; kk++) {
                    uint32_t pa[4], da[4];
                    pa[0] = M::pack(s[2 * kk][0], s[2 * kk][1]);
                    pa[1] = M::pack(s[2 * kk][2], s[2 * kk][3]);
                    pa[2] = M::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pa[3] = M::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                    da[0] = M::pack(dp[2 * kk][0], dp[2 * kk][1]);
                    da[1] = M::pack(dp[2 * kk][2], dp[2 * kk][3]);
                    da[2] = M::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
                    da[3] = M::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
                    for (int d = 0; d < DT; d += 2) {
                        uint32_t gb[4], qb[4];
                        const int mi = lane >> 3;
                        const int row = 16 * kk + 8 * (mi & 1) + (lane & 7), ch = d + (mi >> 1);
                        ldmatrix_x4_trans(gb, gt + L::off_sw(row, ch, sw));
                        ldmatrix_x4_trans(qb, qt + L::off_sw(row, ch, sw));
                        M::run(dv[d], pa, gb);
                        M::run(dv[d + 1], pa, gb + 2);
                        M::run(dk[d], da, qb);
                        M::run(dk[d + 1], da, qb + 2);
                    }
                }
            }
            if (DQ) {
                /* dS^T to shared memory (zeros for an empty warp tile) */
#pragma unroll
                for (int n = 0; n < NQ; n++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        *(uint32_t *)(dss + (16 * warp + 8 * r + g) * cfg::dsp + 8 * n + 2 * tg) =
                            M::pack(dp[n][2 * r], dp[n][2 * r + 1]);
                __syncthreads();
                /* dQ (32 x D) = dS (32 x 64 keys) K (64 x D): warp w takes query m-tile w & 1
                 * and dims [D/2 (w >> 1), +D/2). A = dS rows from dS^T by ldmatrix.trans:
                 * matrices (keys 16kk.., queries 16m..), (16kk.., 16m+8..), (16kk+8.., 16m..),
                 * (16kk+8.., 16m+8..) are a0..a3 */
                constexpr int DH = DT / 2;
                static_assert(DH % 2 == 0, "dQ dims are taken in pairs of 8-column tiles");
                const int mq = warp & 1, dh = (warp >> 1) * DH;
                float acc[DH][4];
#pragma unroll
                for (int d = 0; d < DH; d++)
                    acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0;
#pragma unroll
                for (int kk = 0; kk < kBKV / 16; kk++) {
                    uint32_t da[4];
                    const int mi = lane >> 3;
                    ldmatrix_x4_trans(da, dss + (16 * kk + 8 * (mi >> 1) + (lane & 7)) * cfg::dsp +
                                              16 * mq + 8 * (mi & 1));
#pragma unroll
                    for (int d = 0; d < DH; d += 2) {
                        uint32_t kb[4];
                        ldmatrix_x4_trans(kb, ks + L::off_sw(16 * kk + 8 * (mi & 1) + (lane & 7),
                                                             dh + d + (mi >> 1), sw));
                        M::run(acc[d], da, kb);
                        M::run(acc[d + 1], da, kb + 2);
                    }
                }
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int64_t i = i0 + 16 * mq + 8 * r + g;
                    if (i >= a.sq)
                        continue;
                    float *dst = dqacc + ((b * a.hq + h) * a.sq + i) * D;
#pragma unroll
                    for (int d = 0; d < DH; d++) {
#if __CUDA_ARCH__ >= 900 /* one 8-byte reduction instead of two (sm_90's vector atomics) */
                        atomicAdd((float2 *)(dst + 8 * (dh + d) + 2 * tg),
                                  make_float2(acc[d][2 * r], acc[d][2 * r + 1]));
#else
                        atomicAdd(dst + 8 * (dh + d) + 2 * tg, acc[d][2 * r]);
                        atomicAdd(dst + 8 * (dh + d) + 2 * tg + 1, acc[d][2 * r + 1]);
#endif
                    }
                }
            }
            __syncthreads(); /* Q/dO buffer u & 1 and dS^T are reused */
        }
        cp_async_wait<0>();

        store_dk_dv<T, DT>(a, b, hk, wj0, g, tg, dk, dv); /* the warp's keys */
    }
}

/*
 * dQ without atomics (deterministic mode): a block owns 64 query rows of one head, warp w
 * rows [16 w, 16 w + 16), and walks the key tiles its rows may see, recomputing per tile
 *   S = Q K^T, dP = dO V^T  (A = Q, dO fragments kept in registers; B = K, V rows by ldmatrix)
 *   dS = P (dP z - D_i) (1 - t^2) scale, P = 2^(S scale log2(e) - LSE_i log2(e))
 *   dQ += dS K             (dS from registers as the A operand, K rows by ldmatrix.trans)
 * Each dQ element is summed by one thread in key order: bitwise repeatable.
 */
constexpr int kQB = 64, kKB = 64;

template <typename T, int D> struct dq_cfg {
    using L = layout<D>;
    static constexpr size_t kv_off = 2 * (size_t)kQB * L::pitch * 2; /* after Q, dO */
    static constexpr size_t smem_bytes = kv_off + 4 * (size_t)kKB * L::pitch * 2;
};

template <typename T, int D, bool FAST>
__global__ void __launch_bounds__(kThreads)
    fa_bwd_dq_kernel_mma__sm80(const fai_cuda_args a, const float *delta, const float *lse2,
                               const int *flag)
{
    if (*flag)
        return; /* non-finite input: the generic kernels run instead */
    using cfg = dq_cfg<T, D>;
    using L = typename cfg::L;
    using M = mma_t<T>;
    constexpr int NT = kKB / 8, DT = D / 8, KD = D / 16, KP = kKB / 16;
    constexpr float kLog2e = FAI_LOG2E_F; /* base-2 units: core/recurrence.h */

    extern __shared__ __align__(128) unsigned char smem[];
    T *qs = (T *)smem, *gs = qs + kQB * L::pitch;
    T *ks = (T *)(smem + cfg::kv_off), *vs = ks + 2 * kKB * L::pitch; /* [2][kKB][pitch] each */
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3, sw = L::lane_swz(lane);
    const int64_t nqb = (a.sq + kQB - 1) / kQB;
    const int64_t i0 = (nqb - 1 - blockIdx.x) * kQB, i1 = i0 + kQB < a.sq ? i0 + kQB : a.sq;
    const int64_t wi0 = i0 + 16 * warp, wi1 = wi0 + 16 < i1 ? wi0 + 16 : i1;
    const float scale2 = (float)sc.scale * kLog2e;

    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
        const fai_dropout dr = fai_drop_head(a, b, h);
        const float slope = a.slopes ? a.slopes[h] : 0.0f;
        const T *kg = fai_at<T>(a.tk, b, 0, hk), *vg = fai_at<T>(a.tv, b, 0, hk);
        int64_t klo, khi;
        fai_mask_key_span(&mask, i0, i1, &klo, &khi);
        klo = klo / kKB * kKB;
        const int ntiles = klo < khi ? (int)((khi - klo + kKB - 1) / kKB) : 0;
        /* the thread's rows wi0 + g + 8 r: LSE log2(e) (+inf when empty or past Sq) and D_i */
        float l2[2], di[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t i = wi0 + 8 * r + g;
            l2[r] = i < a.sq ? lse2[bh * a.sq + i] : INFINITY;
            di[r] = i < a.sq ? delta[bh * a.sq + i] : 0.0f;
        }

        __syncthreads();
        tile_load<D, kQB, kThreads>(qs, fai_at<T>(a.tq, b, 0, h) + i0 * a.tq.ss, a.tq.ss,
                                    a.sq - i0, tid);
        tile_load<D, kQB, kThreads>(gs, fai_at<T>(a.tdout, b, 0, h) + i0 * a.tdout.ss,
                                    a.tdout.ss, a.sq - i0, tid);
        cp_async_commit();
        auto load_kv = [&](int t) {
            const int64_t j0 = klo + (int64_t)t * kKB;
            tile_load<D, kKB, kThreads>(ks + (t & 1) * kKB * L::pitch, kg + j0 * a.tk.ss,
                                        a.tk.ss, a.sk - j0, tid);
            tile_load<D, kKB, kThreads>(vs + (t & 1) * kKB * L::pitch, vg + j0 * a.tv.ss,
                                        a.tv.ss, a.sk - j0, tid);
            cp_async_commit();
        };
        if (ntiles > 0)
            load_kv(0);

        float acc[DT][4];
#pragma unroll
        for (int d = 0; d < DT; d++)
            acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0;
        uint32_t qf[KD][4], gf[KD][4];

        for (int t = 0; t < ntiles; t++) {
            const int64_t j0 = klo + (int64_t)t * kKB;
            if (t + 1 < ntiles) {
                load_kv(t + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            if (t == 0)
#pragma unroll
                for (int kk = 0; kk < KD; kk++) {
                    ldmatrix_x4(qf[kk], qs + L::off_sw(16 * warp + (lane & 15), 2 * kk + (lane >> 4), sw));
                    ldmatrix_x4(gf[kk], gs + L::off_sw(16 * warp + (lane & 15), 2 * kk + (lane >> 4), sw));
                }
            const T *kt = ks + (t & 1) * kKB * L::pitch, *vt = vs + (t & 1) * kKB * L::pitch;
            const fai_tile_class wcls =
                wi0 < wi1 ? fai_mask_classify(&mask, wi0, wi1, j0, j0 + kKB) : FAI_TILE_EMPTY;
            if (wcls != FAI_TILE_EMPTY) {
                float s[NT][4], dp[NT][4];
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[n][e] = dp[n][e] = 0;
#pragma unroll
                for (int kk = 0; kk < KD; kk++)
#pragma unroll
                    for (int n = 0; n < NT; n += 2) {
                        uint32_t kb[4], vb[4];
                        const int mi = lane >> 3;
                        const int row = 8 * n + 8 * (mi >> 1) + (lane & 7), ch = 2 * kk + (mi & 1);
                        ldmatrix_x4(kb, kt + L::off_sw(row, ch, sw));
                        ldmatrix_x4(vb, vt + L::off_sw(row, ch, sw));
                        M::run(s[n], qf[kk], kb);
                        M::run(s[n + 1], qf[kk], kb + 2);
                        M::run(dp[n], gf[kk], vb);
                        M::run(dp[n + 1], gf[kk], vb + 2);
                    }
                int lo_c[2] = {0, 0}, hi_c[2] = {kKB, kKB};
                if (wcls == FAI_TILE_PARTIAL)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        int64_t x, y;
                        fai_mask_row(&mask, wi0 + 8 * r + g, &x, &y);
                        x -= j0, y -= j0;
                        lo_c[r] = x < 0 ? 0 : x > kKB ? kKB : (int)x;
                        hi_c[r] = y < 0 ? 0 : y > kKB ? kKB : (int)y;
                    }
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, c = 8 * n + 2 * tg + (e & 1);
                        const int64_t i = wi0 + 8 * r + g, j = j0 + c;
                        float x, t2 = 0;
                        if (FAST)
                            x = s[n][e] * scale2 - l2[r];
                        else
                            x = fai_score_f32(&sc, s[n][e], slope, i, j, &t2) * kLog2e - l2[r];
                        const bool allowed = c >= lo_c[r] && c < hi_c[r] && j < a.sk;
                        const float p = allowed ? ex2(x) : 0.0f;
                        float z = (float)a.keep_scale;
                        if (!FAST && dr.threshold && !fai_dropout_keep(&dr, i, j))
                            z = 0;
                        const float gds =
                            fai_dscore_f32(p, dp[n][e], z, di[r], t2, !FAST && sc.softcap > 0);
                        s[n][e] = allowed ? (float)sc.scale * gds : 0.0f; /* dS */
                    }
                /* dQ += dS K: dS tiles n = 2kk, 2kk+1 are the A fragment of key step kk */
#pragma unroll
                for (int kk = 0; kk < KP; kk++) {
                    uint32_t da[4];
                    da[0] = M::pack(s[2 * kk][0], s[2 * kk][1]);
                    da[1] = M::pack(s[2 * kk][2], s[2 * kk][3]);
                    da[2] = M::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    da[3] = M::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                    for (int d = 0; d < DT; d += 2) {
                        uint32_t kb[4];
                        const int mi = lane >> 3;
                        ldmatrix_x4_trans(kb, kt + L::off_sw(16 * kk + 8 * (mi & 1) + (lane & 7),
                                                             d + (mi >> 1), sw));
                        M::run(acc[d], da, kb);
                        M::run(acc[d + 1], da, kb + 2);
                    }
                }
            }
            __syncthreads(); /* K/V buffer t & 1 is reloaded next */
        }
        cp_async_wait<0>();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int64_t i = wi0 + 8 * r + g;
            if (i >= a.sq)
                continue;
            T *qr = fai_at<T>(a.tdq, b, i, h);
#pragma unroll
            for (int d = 0; d < DT; d++)
                *(uint32_t *)(qr + 8 * d + 2 * tg) = M::pack(acc[d][2 * r], acc[d][2 * r + 1]);
        }
    }
}

template <typename T, int D, bool FAST>
fai_cuda_result launch_dq(const fai_cuda_args &a, const fai_cuda_bwd_ws &w, char *err, size_t n)
{
    auto k = fa_bwd_dq_kernel_mma__sm80<T, D, FAST>;
    const size_t sm = dq_cfg<T, D>::smem_bytes;
    if (sm > 48 * 1024 &&
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
            cudaSuccess)
        return fai_cuda_check_launch("tensor-core dQ: shared memory", err, n);
    const int64_t nqb = (a.sq + kQB - 1) / kQB, bh = a.b * a.hq;
    dim3 grid((unsigned)nqb, (unsigned)(bh < 65535 ? bh : 65535));
    k<<<grid, kThreads, sm, (cudaStream_t)a.stream>>>(a, w.delta, w.lse2, w.flag);
    return fai_cuda_check_launch("tensor-core dQ", err, n);
}

template <typename T, int D, bool FAST, bool DQ>
fai_cuda_result launch(const fai_cuda_args &a, const fai_cuda_bwd_ws &w, char *err, size_t n)
{
    using cfg = bwd_cfg<T, D>;
    auto k = fa_bwd_kernel_mma__sm80<T, D, FAST, DQ>;
    const size_t sm = cfg::smem_bytes;
    if (sm > 48 * 1024 &&
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
            cudaSuccess)
        return fai_cuda_check_launch("tensor-core backward: shared memory", err, n);
    const int64_t nkb = (a.sk + kBKV - 1) / kBKV, bh = a.b * a.hk;
    dim3 grid((unsigned)nkb, (unsigned)(bh < 65535 ? bh : 65535));
    k<<<grid, kThreads, sm, (cudaStream_t)a.stream>>>(a, w.delta, w.lse2, w.dqacc, w.flag);
    return fai_cuda_check_launch("tensor-core backward", err, n);
}

template <typename T, int D>
fai_cuda_result by_mode(const fai_cuda_args &a, const fai_cuda_plan &p, const fai_cuda_bwd_ws &w,
                        char *err, size_t n)
{
    const bool fast = fai_cuda_scale_only(a);
    /* dK, dV, and dQ's sums unless deterministic: the Hopper kernel where the plan takes it */
    fai_cuda_result r;
    if (p.family == FAI_CUDA_WGMMA) {
        r = fai_cuda_backward_wgmma(&a, &p.tile, &w, err, n);
    } else if (p.tile.bq != kBQ || p.tile.bk != kBKV) {
        return fai_cuda_no_instance("the mma.sync backward", &a, &p.tile, err, n);
    } else {
        if (a.deterministic)
            r = fast ? launch<T, D, true, false>(a, w, err, n)
                     : launch<T, D, false, false>(a, w, err, n);
        else
            r = fast ? launch<T, D, true, true>(a, w, err, n)
                     : launch<T, D, false, true>(a, w, err, n);
    }
    if (r != FAI_CUDA_OK || !a.deterministic)
        return r;
    /* deterministic mode: dQ by its own ordered kernel */
    return fast ? launch_dq<T, D, true>(a, w, err, n) : launch_dq<T, D, false>(a, w, err, n);
}

template <typename T>
fai_cuda_result run(const fai_cuda_args &a, const fai_cuda_plan &p, const fai_cuda_bwd_ws &w,
                    char *err, size_t n)
{
    cudaStream_t st = (cudaStream_t)a.stream;
    fai_cuda_result r;
    switch (a.dqk) {
    case 32: r = by_mode<T, 32>(a, p, w, err, n); break;
    case 64: r = by_mode<T, 64>(a, p, w, err, n); break;
    case 96: r = by_mode<T, 96>(a, p, w, err, n); break;
    /* D 256: the wgmma kernel alone (the plan sends it no deterministic call) */
    case 256: r = fai_cuda_backward_wgmma(&a, &p.tile, &w, err, n); break;
    default: r = by_mode<T, 128>(a, p, w, err, n); break;
    }
    if (r != FAI_CUDA_OK || a.deterministic)
        return r;
    fa_bwd_dq_store_kernel<T><<<1024, 256, 0, st>>>(a, w.dqacc, w.flag);
    return fai_cuda_check_launch("tensor-core backward: dQ store", err, n);
}

} // namespace

fai_cuda_result fai_cuda_backward_mma_prepare(const fai_cuda_args *a, const fai_cuda_bwd_ws *w,
                                              char *err, size_t n)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    cudaError_t e = cudaMemsetAsync(w->flag, 0, sizeof(int), st);
    if (e == cudaSuccess && !a->deterministic)
        e = cudaMemsetAsync(w->dqacc, 0, (size_t)(a->b * a->hq * a->sq * a->dqk) * sizeof(float),
                            st);
    if (e != cudaSuccess) {
        snprintf(err, n, "backend cuda: backward workspace: %s", cudaGetErrorString(e));
        return FAI_CUDA_DEVICE_ERROR;
    }
    if (a->dtype == FA_BF16)
        fa_bwd_finite_check_kernel<__nv_bfloat16><<<1024, 256, 0, st>>>(*a, w->flag);
    else
        fa_bwd_finite_check_kernel<__half><<<1024, 256, 0, st>>>(*a, w->flag);
    fai_cuda_result r = fai_cuda_check_launch("backward: finiteness pre-pass", err, n);
    if (r != FAI_CUDA_OK)
        return r;
    fa_bwd_lse2_kernel<<<1024, 256, 0, st>>>(*a, w->lse2);
    return fai_cuda_check_launch("backward: LSE log2(e)", err, n);
}

fai_cuda_result fai_cuda_backward_mma(const fai_cuda_args *a, const fai_cuda_plan *p,
                                      const fai_cuda_bwd_ws *w, char *err, size_t n)
{
    return a->dtype == FA_BF16 ? run<__nv_bfloat16>(*a, *p, *w, err, n)
                               : run<__half>(*a, *p, *w, err, n);
}
