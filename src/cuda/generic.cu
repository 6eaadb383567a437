/*
 * The CUDA backend's generic path: exact docs/DESIGN.md §1 semantics for every storage dtype (f64
 * computes in f64, the others in f32) and any head dims up to 512, by FMA, one warp per attention
 * row. It is the path for f32/f64 storage, for head dims the tensor-core kernels do not cover, and
 * for strides they cannot load with 16-byte copies; it is also what the tensor-core forward is
 * checked against on the device, and the only path that reads a bias tensor (fa_params.bias,
 * forward and backward, and its gradient by fa_bias_grad_kernel), a block mask (forward and
 * backward) or FP8 storage (FP8 q, k, v, or an FP8 cache; forward). The backward is three
 * deterministic launches (no atomics): D_i = dO_i . O_i; dK, dV per key row (summing the GQA
 * group in registers); dQ per query row.
 *
 * Row-warp layout: lane L owns head-dim elements d = L + 32 c (c < NV) of the row's
 * accumulator, so a V row is read by the warp in one coalesced sweep; while scoring, lane L
 * owns key j0 + L of the current 32-key block, and the block's probabilities are broadcast
 * back one key at a time with a shuffle.
 */
#include "common.cuh"
#include "plan.h"

namespace {

constexpr int kWarps = 4; /* rows per block */

__device__ __forceinline__ int rescale(float *m, float b, float *al)
{
    return fai_online_rescale_f32(m, b, al);
}
__device__ __forceinline__ int rescale(double *m, double b, double *al)
{
    return fai_online_rescale_f64(m, b, al);
}
__device__ __forceinline__ int end(float m, float l, float sink, float ks, double *lse, float *f)
{
    return fai_online_end_f32(m, l, sink, ks, lse, f);
}
__device__ __forceinline__ int end(double m, double l, double sink, double ks, double *lse,
                                   double *f)
{
    return fai_online_end_f64(m, l, sink, ks, lse, f);
}
/* The score pipeline with the pair's bias entry (0 without a bias tensor: sc->bias NONE). */
__device__ __forceinline__ float score(const fai_score *sc, float dot, float slope, float bias,
                                       int64_t i, int64_t j, float *t)
{
    return fai_score_biased_f32(sc, dot, slope, bias, i, j, t);
}
__device__ __forceinline__ double score(const fai_score *sc, double dot, double slope,
                                        double bias, int64_t i, int64_t j, double *t)
{
    return fai_score_biased_f64(sc, dot, slope, bias, i, j, t);
}
__device__ __forceinline__ float fexp(float x) { return expf(x); }
__device__ __forceinline__ double fexp(double x) { return exp(x); }

/* x . y over n elements; in f32 in two levels, chunks of 16 terms apart and then the chunks
 * (rounding error growing with n / 16 + 16 rather than n: one running f32 sum at D = 128 put
 * dQ past 3x the conventional path's GEMM error). f64 keeps one running sum, as before (in
 * two levels one large-logit f64 forward crossed the tolerance floor, by the luck of its
 * roundings). D_i and dP go through it alike, so that where they cancel exactly on the CPU
 * they do here. */
template <typename C, typename X, typename Y>
__device__ __forceinline__ C dot2(const X *x, const Y *y, int64_t n)
{
    constexpr int64_t chunk = sizeof(C) == 4 ? 16 : INT64_MAX;
    C acc = 0;
    for (int64_t d0 = 0; d0 < n; d0 += chunk) {
        const int64_t d1 = n - d0 > chunk ? d0 + chunk : n;
        C part = 0;
        for (int64_t d = d0; d < d1; d++)
            part += (C)fai_storage<X>::load(x[d]) * (C)fai_storage<Y>::load(y[d]);
        acc += part;
    }
    return acc;
}

/* ------------------------------------------------------------------ forward */

/* Q: the storage of q; K: of k and v (Q, a cache's f16 / bf16 / FP8 under f32 / bf16 q, or FP8
 * q's format); O: of out (Q but for FP8 q). FP8 descales (a.descale): descale_q descale_k of
 * (b, kv head) multiplies the score scale (in double, then the pipeline's own rounding: the
 * host tiled path's fwd_qtile), descale_v the output's final factor once. */
template <typename Q, typename K, typename O, typename C, int NV>
__global__ void __launch_bounds__(kWarps * 32) fa_fwd_kernel_rowwarp(const fai_cuda_args a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const fai_mask mask = a.mask;
    fai_score sc = a.score;
    C *qs = (C *)smem + warp * a.dqk;
    const int64_t i = (int64_t)blockIdx.x * kWarps + warp;
    if (i >= a.sq)
        return; /* whole warps only; no block barrier below */
    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
        const fai_dropout dr = fai_drop_head(a, b, h);
        const int64_t dx = fai_descale_index(a, b, hk);
        if (a.descale)
            sc.scale = a.score.scale * a.descale[dx];
        const Q *qrow = fai_at<Q>(a.tq, b, i, h);
        __syncwarp();
        for (int64_t d = lane; d < a.dqk; d += 32)
            qs[d] = fai_storage<Q>::load(qrow[d]);
        __syncwarp();
        const C slope = a.slopes ? (C)a.slopes[h] : (C)0;
        C m = -INFINITY, l = 0, acc[NV];
#pragma unroll
        for (int c = 0; c < NV; c++)
            acc[c] = 0;
        fai_mask part[2]; /* the mask's parts in key order (core/score.h) */
        const int np = fai_mask_parts(&mask, part);
        for (int q = 0; q < np; q++) {
            int64_t lo, hi;
            fai_mask_row(&part[q], i, &lo, &hi);
            for (int64_t j0 = lo; j0 < hi; j0 += 32) {
                const int64_t j = j0 + lane;
                /* allowed: inside the window, listed by the block mask and not masked by the
                 * bias (-inf, a mask's 0): a masked key is dropped by selection, its K and V
                 * never read */
                C bias = 0;
                if (j < hi)
                    bias = fai_bias_get<C>(a.bias, b, h, i, j);
                const bool valid = j < hi && !(a.bias.data && fai_bias_masks((double)bias)) &&
                                   fai_block_listed(a.blocks, b, h, i, j);
                C s = -INFINITY;
                if (valid)
                    s = score(&sc, dot2<C>(qs, fai_kv_at<K>(a, a.tk, b, j, hk), a.dqk),
                              slope, bias, i, j, (C *)nullptr);
                C alpha;
                if (!rescale(&m, fai_warp_max(s), &alpha)) /* uniform: the max is the warp's */
                    continue;
                const C p = valid ? fexp(s - m) : (C)0;
                l = alpha * l + fai_warp_sum(p);
#pragma unroll
                for (int c = 0; c < NV; c++)
                    acc[c] *= alpha;
                const int kept = valid && (!dr.threshold || fai_dropout_keep(&dr, i, j));
                const int n = hi - j0 < 32 ? (int)(hi - j0) : 32;
                for (int t = 0; t < n; t++) {
                    const C pt = __shfl_sync(0xffffffffu, p, t);
                    if (!__shfl_sync(0xffffffffu, kept, t)) /* dropped: by selection */
                        continue;
                    const K *vr = fai_kv_at<K>(a, a.tv, b, j0 + t, hk);
#pragma unroll
                    for (int c = 0; c < NV; c++) {
                        const int64_t d = lane + 32 * c;
                        if (d < a.dv)
                            acc[c] += pt * fai_storage<K>::load(vr[d]);
                    }
                }
            }
        }
        double lse;
        C f;
        const C sink = a.sinks ? (C)a.sinks[h] : (C)-INFINITY;
        const int live = end(m, l, sink, (C)a.keep_scale, &lse, &f); /* 0: an empty row */
        if (a.descale)
            f *= (C)a.descale[a.descale_n + dx]; /* descale_v: 1 but for FP8 v */
        O *orow = fai_at<O>(a.tout, b, i, h);
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int64_t d = lane + 32 * c;
            if (d < a.dv)
                orow[d] = fai_storage<O>::store(live ? acc[c] * f : (C)0);
        }
        if (a.tlse.data && lane == 0)
            fai_lse_put(a.tlse, a.lse_f64, b, h, i, lse);
    }
}

/* ------------------------------------------------------------------ backward */

/* D_i = dO_i . O_i, in the compute type, one thread per row, summed by dot2: the order of
 * dP = dO_i . v_j, so that where O_i = z v_j exactly (one allowed key,
 * P = 1, z a power of two) D_i and z dP cancel exactly, as on the CPU. work[(b hq + h) sq + i] */
template <typename S, typename C>
__global__ void __launch_bounds__(kWarps * 32) fa_bwd_delta_kernel(const fai_cuda_args a)
{
    const int64_t i = (int64_t)blockIdx.x * kWarps * 32 + threadIdx.x;
    if (i >= a.sq)
        return;
    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq;
        const S *o = fai_at<S>(a.tout, b, i, h), *g = fai_at<S>(a.tdout, b, i, h);
        ((C *)a.work)[bh * a.sq + i] = dot2<C>(g, o, a.dv);
    }
}

/*
 * One allowed pair (i, j) (the window's, the block mask's and the bias's: callers skip a
 * masked pair by selection, never calling this): P = exp(s - LSE) (the subtraction in double,
 * as the CPU paths), the dropout-scaled P~ that multiplies dO into dV, and dS = scale * P (dP z - D_i) (1 - t^2) that
 * multiplies q into dK and k into dQ (docs/DESIGN.md §1's backward). Returns 0 if the row is empty
 * (LSE -inf: every gradient through it is 0).
 */
template <typename S, typename C>
__device__ __forceinline__ int pair_grads(const fai_score &sc, const fai_dropout &dr,
                                          C keep_scale, int64_t i, int64_t j, C sdot, C dp,
                                          double lse, C di, C slope, C bias, C *pt, C *ds)
{
    if (lse == -INFINITY)
        return 0;
    C t = 0;
    const C s = score(&sc, sdot, slope, bias, i, j, &t);
    const C p = fexp((C)((double)s - lse));
    const C z = (dr.threshold && !fai_dropout_keep(&dr, i, j)) ? (C)0 : keep_scale;
    *pt = p * z;
    *ds = (C)sc.scale * fai_dscore(p, dp, z, di, t, sc.softcap > 0);
    return 1;
}

/* dK_j, dV_j: one warp per key row of a KV head, summing over the group's query heads. */
template <typename S, typename C, int NV>
__global__ void __launch_bounds__(kWarps * 32) fa_bwd_dkdv_kernel_rowwarp(const fai_cuda_args a, const int *gate)
{
    if (gate && !*gate)
        return; /* the tensor-core kernel has this problem */
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;
    C *ks = (C *)smem + warp * (a.dqk + a.dv), *vs = ks + a.dqk;
    const int64_t j = (int64_t)blockIdx.x * kWarps + warp;
    if (j >= a.sk)
        return;
    fai_mask part[2]; /* the mask's parts (core/score.h): rows [ilo[q], ihi[q]) see key j in q */
    int64_t ilo[2], ihi[2];
    const int np = fai_mask_parts(&mask, part);
    for (int q = 0; q < np; q++)
        fai_mask_query_span(&part[q], a.sq, j, j + 1, &ilo[q], &ihi[q]);
    for (int64_t bh = blockIdx.y; bh < a.b * a.hk; bh += gridDim.y) {
        const int64_t b = bh / a.hk, hk = bh % a.hk;
        __syncwarp();
        for (int64_t d = lane; d < a.dqk; d += 32)
            ks[d] = fai_storage<S>::load(fai_at<S>(a.tk, b, j, hk)[d]);
        for (int64_t d = lane; d < a.dv; d += 32)
            vs[d] = fai_storage<S>::load(fai_at<S>(a.tv, b, j, hk)[d]);
        __syncwarp();
        C dk[NV], dv[NV];
#pragma unroll
        for (int c = 0; c < NV; c++)
            dk[c] = dv[c] = 0;
        for (int64_t h = hk * a.group; h < (hk + 1) * a.group; h++) {
            const fai_dropout dr = fai_drop_head(a, b, h);
            const C slope = a.slopes ? (C)a.slopes[h] : (C)0;
            const C *delta = (const C *)a.work + (b * a.hq + h) * a.sq;
            for (int q = 0; q < np; q++)
                for (int64_t i0 = ilo[q]; i0 < ihi[q]; i0 += 32) {
                    const int64_t i = i0 + lane;
                    C pt = 0, ds = 0;
                    int live = 0;
                    const C bias = i < ihi[q] ? fai_bias_get<C>(a.bias, b, h, i, j) : (C)0;
                    if (i < ihi[q] && !(a.bias.data && fai_bias_masks((double)bias)) &&
                        fai_block_listed(a.blocks, b, h, i, j))
                        live = pair_grads<S, C>(
                            sc, dr, (C)a.keep_scale, i, j,
                            dot2<C>(ks, fai_at<S>(a.tq, b, i, h), a.dqk),
                            dot2<C>(vs, fai_at<S>(a.tdout, b, i, h), a.dv),
                            fai_lse_get(a.tlse, a.lse_f64, b, h, i), delta[i], slope, bias, &pt,
                            &ds);
                    const int n = ihi[q] - i0 < 32 ? (int)(ihi[q] - i0) : 32;
                    /* Two-level summation: the chunk's 32 terms apart, then into the total.
                     * One running sum over thousands of rows grows its rounding error with
                     * their count (f32: past 3x the conventional path's GEMM error at a GQA
                     * group of 4 x 333 rows). */
                    C pk[NV], pv[NV];
#pragma unroll
                    for (int c = 0; c < NV; c++)
                        pk[c] = pv[c] = 0;
                    for (int t = 0; t < n; t++) {
                        const C pt_t = __shfl_sync(0xffffffffu, pt, t);
                        const C ds_t = __shfl_sync(0xffffffffu, ds, t);
                        if (!__shfl_sync(0xffffffffu, live, t))
                            continue;
                        const S *qr = fai_at<S>(a.tq, b, i0 + t, h),
                                *gr = fai_at<S>(a.tdout, b, i0 + t, h);
#pragma unroll
                        for (int c = 0; c < NV; c++) {
                            const int64_t d = lane + 32 * c;
                            if (d < a.dqk)
                                pk[c] += ds_t * fai_storage<S>::load(qr[d]);
                            if (d < a.dv)
                                pv[c] += pt_t * fai_storage<S>::load(gr[d]);
                        }
                    }
#pragma unroll
                    for (int c = 0; c < NV; c++)
                        dk[c] += pk[c], dv[c] += pv[c];
                }
        }
        S *dkr = fai_at<S>(a.tdk, b, j, hk), *dvr = fai_at<S>(a.tdv, b, j, hk);
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int64_t d = lane + 32 * c;
            if (d < a.dqk)
                dkr[d] = fai_storage<S>::store(dk[c]);
            if (d < a.dv)
                dvr[d] = fai_storage<S>::store(dv[c]);
        }
    }
}

/* dQ_i: one warp per query row. */
template <typename S, typename C, int NV>
__global__ void __launch_bounds__(kWarps * 32) fa_bwd_dq_kernel_rowwarp(const fai_cuda_args a, const int *gate)
{
    if (gate && !*gate)
        return; /* the tensor-core kernel has this problem */
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;
    C *qs = (C *)smem + warp * (a.dqk + a.dv), *gs = qs + a.dqk;
    const int64_t i = (int64_t)blockIdx.x * kWarps + warp;
    if (i >= a.sq)
        return;
    for (int64_t bh = blockIdx.y; bh < a.b * a.hq; bh += gridDim.y) {
        const int64_t b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
        const fai_dropout dr = fai_drop_head(a, b, h);
        __syncwarp();
        for (int64_t d = lane; d < a.dqk; d += 32)
            qs[d] = fai_storage<S>::load(fai_at<S>(a.tq, b, i, h)[d]);
        for (int64_t d = lane; d < a.dv; d += 32)
            gs[d] = fai_storage<S>::load(fai_at<S>(a.tdout, b, i, h)[d]);
        __syncwarp();
        const C slope = a.slopes ? (C)a.slopes[h] : (C)0;
        const double lse = fai_lse_get(a.tlse, a.lse_f64, b, h, i);
        const C di = ((const C *)a.work)[bh * a.sq + i];
        C dq[NV];
#pragma unroll
        for (int c = 0; c < NV; c++)
            dq[c] = 0;
        fai_mask part[2]; /* the mask's parts in key order (core/score.h) */
        const int np = fai_mask_parts(&mask, part);
        for (int q = 0; q < np; q++) {
            int64_t lo, hi;
            fai_mask_row(&part[q], i, &lo, &hi);
            for (int64_t j0 = lo; j0 < hi; j0 += 32) {
                const int64_t j = j0 + lane;
                C pt = 0, ds = 0;
                int live = 0;
                const C bias = j < hi ? fai_bias_get<C>(a.bias, b, h, i, j) : (C)0;
                if (j < hi && !(a.bias.data && fai_bias_masks((double)bias)) &&
                    fai_block_listed(a.blocks, b, h, i, j))
                    live = pair_grads<S, C>(sc, dr, (C)a.keep_scale, i, j,
                                            dot2<C>(qs, fai_at<S>(a.tk, b, j, hk), a.dqk),
                                            dot2<C>(gs, fai_at<S>(a.tv, b, j, hk), a.dv), lse, di,
                                            slope, bias, &pt, &ds);
                const int n = hi - j0 < 32 ? (int)(hi - j0) : 32;
                C part[NV]; /* two-level summation, as in dK and dV */
#pragma unroll
                for (int c = 0; c < NV; c++)
                    part[c] = 0;
                for (int t = 0; t < n; t++) {
                    const C ds_t = __shfl_sync(0xffffffffu, ds, t);
                    if (!__shfl_sync(0xffffffffu, live, t))
                        continue;
                    const S *kr = fai_at<S>(a.tk, b, j0 + t, hk);
#pragma unroll
                    for (int c = 0; c < NV; c++) {
                        const int64_t d = lane + 32 * c;
                        if (d < a.dqk)
                            part[c] += ds_t * fai_storage<S>::load(kr[d]);
                    }
                }
#pragma unroll
                for (int c = 0; c < NV; c++)
                    dq[c] += part[c];
            }
        }
        S *dqr = fai_at<S>(a.tdq, b, i, h);
#pragma unroll
        for (int c = 0; c < NV; c++) {
            const int64_t d = lane + 32 * c;
            if (d < a.dqk)
                dqr[d] = fai_storage<S>::store(dq[c]);
        }
    }
}

/* ------------------------------------------------------------------ the sink gradient */

constexpr int kSinkThreads = 256;

/* grad[h] += sum over the rows of head h (block h) of fai_dsink_term_f64, D_i = dO_i . O_i in
 * double: each thread's rows in order, then a fixed tree over the threads, so the sum is the
 * same at every run. */
template <typename S> __global__ void fa_sink_grad_kernel(const fai_cuda_args a, double *grad)
{
    __shared__ double part[kSinkThreads];
    const int64_t h = blockIdx.x;
    const double sink = a.sinks[h];
    double acc = 0;
    for (int64_t t = threadIdx.x; sink != -INFINITY && t < a.b * a.sq; t += kSinkThreads) {
        const int64_t b = t / a.sq, i = t % a.sq;
        const S *o = fai_at<S>(a.tout, b, i, h), *g = fai_at<S>(a.tdout, b, i, h);
        double di = 0;
        for (int64_t d = 0; d < a.dv; d++)
            di += (double)fai_storage<S>::load(o[d]) * (double)fai_storage<S>::load(g[d]);
        acc += fai_dsink_term_f64(sink, fai_lse_get(a.tlse, a.lse_f64, b, h, i), di);
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = kSinkThreads / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        grad[h] += part[0];
}

/* ------------------------------------------------------------------ the bias gradient */

constexpr int kBiasGradThreads = 128;

/*
 * d loss / d bias (core/gradient.h, fai_dbias): one thread per element (gb, gi, gh, j) of the
 * gradient, which sums, in the order (b, h, i), the terms of every pair (b, h, i, j) that reads
 * that bias entry (a broadcast dim's every index, else its own; the reference's order). Each
 * term is recomputed: s from q_i . k_j and the bias entry (the forward's pipeline), P =
 * exp(s - LSE_i) with the forward's LSE, dP = dO_i . v_j (dot2, as the dK/dV and dQ kernels),
 * the dropout factor z, and D_i from the workspace, where the generic backward's delta kernel
 * left it (so this runs after it, on the same args). A pair that the window, the block mask or
 * the bias masks, or a row that is empty (LSE -inf), adds nothing, by selection (no K/V of a
 * masked key is read): such an entry's gradient is 0. Terms in the compute type C, their sum in double, one
 * store per element: no atomics, the same bits at every run.
 */
template <typename S, typename C>
__global__ void __launch_bounds__(kBiasGradThreads) fa_bias_grad_kernel(const fai_cuda_args a)
{
    const fai_cuda_bias_view g = a.bias_grad, bv = a.bias;
    const fai_mask mask = a.mask;
    const fai_score sc = a.score;
    const int capped = sc.softcap > 0, after = sc.bias == FAI_BIAS_AFTER_CAP;
    const int64_t n = g.b * g.s * g.h * g.sk;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % g.sk, r = e / g.sk;
        const int64_t gi = r % g.s, gh = (r / g.s) % g.h, gb = r / (g.s * g.h);
        const int64_t b0 = bv.b == 1 ? 0 : gb, b1 = bv.b == 1 ? a.b : gb + 1;
        const int64_t h0 = bv.h == 1 ? 0 : gh, h1 = bv.h == 1 ? a.hq : gh + 1;
        const int64_t i0 = bv.s == 1 ? 0 : gi, i1 = bv.s == 1 ? a.sq : gi + 1;
        double acc = 0;
        for (int64_t b = b0; b < b1; b++)
            for (int64_t h = h0; h < h1; h++) {
                const int64_t hk = h / a.group;
                const fai_dropout dr = fai_drop_head(a, b, h);
                const C slope = a.slopes ? (C)a.slopes[h] : (C)0;
                const C factor = sc.bias_by_slope ? slope : (C)1;
                const C *delta = (const C *)a.work + (b * a.hq + h) * a.sq;
                const S *kr = fai_at<S>(a.tk, b, j, hk), *vr = fai_at<S>(a.tv, b, j, hk);
                for (int64_t i = i0; i < i1; i++) {
                    if (!fai_mask_allows(&mask, i, j) || !fai_block_listed(a.blocks, b, h, i, j))
                        continue;
                    const C bias = fai_bias_get<C>(bv, b, h, i, j);
                    if (fai_bias_masks((double)bias))
                        continue;
                    const double lse = fai_lse_get(a.tlse, a.lse_f64, b, h, i);
                    if (lse == -INFINITY)
                        continue;
                    C t = 0;
                    const C s = score(&sc, dot2<C>(fai_at<S>(a.tq, b, i, h), kr, a.dqk), slope,
                                      bias, i, j, &t);
                    const C p = fexp((C)((double)s - lse));
                    const C z = (dr.threshold && !fai_dropout_keep(&dr, i, j)) ? (C)0
                                                                               : (C)a.keep_scale;
                    const C dp = dot2<C>(fai_at<S>(a.tdout, b, i, h), vr, a.dv);
                    acc += (double)fai_dbias(p, dp, z, delta[i], t, capped, after, factor);
                }
            }
        const int64_t at = gb * g.sb + gi * g.ss + gh * g.sh + j;
        if (g.dtype == FA_F64)
            ((double *)g.data)[at] = acc;
        else
            ((float *)g.data)[at] = (float)acc;
    }
}

/* ------------------------------------------------------------------ appending to a cache */

/* Rows (n, kv head) of kn, vn to key rows at + n of k, v, as stored (T: an unsigned integer of
 * the element's size: the bits are copied). One block per row and head. */
template <typename T> __global__ void fa_append_kernel(const fai_cuda_args a, int64_t at)
{
    const int64_t n = blockIdx.x;
    for (int64_t hk = blockIdx.y; hk < a.hk; hk += gridDim.y) {
        const T *ks = fai_at<T>(a.tkn, 0, n, hk), *vs = fai_at<T>(a.tvn, 0, n, hk);
        T *kd = fai_kv_at<T>(a, a.tk, 0, at + n, hk), *vd = fai_kv_at<T>(a, a.tv, 0, at + n, hk);
        for (int64_t d = threadIdx.x; d < a.dqk; d += blockDim.x)
            kd[d] = ks[d];
        for (int64_t d = threadIdx.x; d < a.dv; d += blockDim.x)
            vd[d] = vs[d];
    }
}

/* ------------------------------------------------------------------ launch */

constexpr int64_t kMaxGridY = 65535;

dim3 grid_for(int64_t rows, int64_t heads)
{
    return dim3((unsigned)((rows + kWarps - 1) / kWarps),
                (unsigned)(heads < kMaxGridY ? heads : kMaxGridY));
}

template <typename Q, typename K, typename O, typename C, int NV>
fai_cuda_result run_forward(const fai_cuda_args &a, char *err, size_t n)
{
    cudaStream_t st = (cudaStream_t)a.stream;
    const size_t sm = (size_t)kWarps * a.dqk * sizeof(C);
    fa_fwd_kernel_rowwarp<Q, K, O, C, NV><<<grid_for(a.sq, a.b * a.hq), kWarps * 32, sm, st>>>(a);
    return fai_cuda_check_launch("generic forward", err, n);
}

/* The tensor-core backward's workspace (fai_cuda_bwd_ws), in floats before the flag: D_i and
 * LSE_i log2(e) (B Hq Sq each), then, from a 16-byte boundary (the wgmma backward's TMA
 * reduce-adds need one; cudaMallocAsync's base has it), the f32 dQ accumulator (B Hq Sq Dqk),
 * which deterministic mode does without. fai_cuda_backward_workspace sizes it, run_backward
 * carves it. */
int64_t mma_dq_offset(const fai_cuda_args &a)
{
    return (2 * a.b * a.hq * a.sq + 3) / 4 * 4;
}

int64_t mma_ws_floats(const fai_cuda_args &a)
{
    return mma_dq_offset(a) + (a.deterministic ? 0 : a.dqk * (a.b * a.hq * a.sq));
}

/*
 * The backward. With the tensor-core kernel (16-bit storage, its head dims and alignment) the
 * generic dK/dV and dQ kernels are launched behind its device-side flag and return at once
 * unless some input was non-finite. (Deterministic mode: the tensor-core path computes dQ with
 * its own ordered kernel instead of atomics.)
 */
template <typename S, typename C, int NV>
fai_cuda_result run_backward(const fai_cuda_args &a, char *err, size_t n)
{
    cudaStream_t st = (cudaStream_t)a.stream;
    const size_t sm = (size_t)kWarps * (a.dqk + a.dv) * sizeof(C);
    const fai_cuda_plan plan = fai_cuda_plan_backward(&a);
    const bool mma = a.sq > 0 && a.sk > 0 && plan.family != FAI_CUDA_GENERIC;
    const int64_t bhs = a.b * a.hq * a.sq;
    float *ws = (float *)a.work;
    fai_cuda_bwd_ws w = {ws, ws + bhs, a.deterministic ? nullptr : ws + mma_dq_offset(a),
                         (int *)(ws + mma_ws_floats(a))};
    fai_cuda_result r;
    if (mma && (r = fai_cuda_backward_mma_prepare(&a, &w, err, n)) != FAI_CUDA_OK)
        return r;
    if (a.sq > 0) {
        const int64_t bh = a.b * a.hq;
        fa_bwd_delta_kernel<S, C><<<dim3((unsigned)((a.sq + kWarps * 32 - 1) / (kWarps * 32)),
                                         (unsigned)(bh < kMaxGridY ? bh : kMaxGridY)),
                                    kWarps * 32, 0, st>>>(a);
        if ((r = fai_cuda_check_launch("backward D = dO . O", err, n)) != FAI_CUDA_OK)
            return r;
    }
    if (mma && (r = fai_cuda_backward_mma(&a, &plan, &w, err, n)) != FAI_CUDA_OK)
        return r;
    const int *gate = mma ? w.flag : nullptr;
    if (a.sq > 0) {
        fa_bwd_dq_kernel_rowwarp<S, C, NV><<<grid_for(a.sq, a.b * a.hq), kWarps * 32, sm, st>>>(
            a, gate);
        if ((r = fai_cuda_check_launch("generic backward dQ", err, n)) != FAI_CUDA_OK)
            return r;
    }
    if (a.sk > 0) {
        fa_bwd_dkdv_kernel_rowwarp<S, C, NV>
            <<<grid_for(a.sk, a.b * a.hk), kWarps * 32, sm, st>>>(a, gate);
        if ((r = fai_cuda_check_launch("generic backward dK dV", err, n)) != FAI_CUDA_OK)
            return r;
    }
    return FAI_CUDA_OK;
}

/* NV (accumulators per lane) = ceil(D / 32) rounded up to a power of two, D <= 512. */
template <typename S, typename C, template <typename, typename, int> class Run>
fai_cuda_result by_width(const fai_cuda_args &a, char *err, size_t n)
{
    const int64_t d = a.dqk > a.dv ? a.dqk : a.dv;
    if (d <= 32)
        return Run<S, C, 1>::go(a, err, n);
    if (d <= 64)
        return Run<S, C, 2>::go(a, err, n);
    if (d <= 128)
        return Run<S, C, 4>::go(a, err, n);
    if (d <= 256)
        return Run<S, C, 8>::go(a, err, n);
    return Run<S, C, 16>::go(a, err, n);
}

template <typename S, typename C, int NV> struct Fwd {
    static fai_cuda_result go(const fai_cuda_args &a, char *e, size_t n)
    {
        return run_forward<S, S, S, C, NV>(a, e, n);
    }
};
/* The forward over a cache of storage K apart from q's. */
template <typename K> struct FwdCache {
    template <typename S, typename C, int NV> struct Run {
        static fai_cuda_result go(const fai_cuda_args &a, char *e, size_t n)
        {
            return run_forward<S, K, S, C, NV>(a, e, n);
        }
    };
};
/* The forward of FP8 q, k and v (format F) into out of storage S. */
template <typename F> struct FwdFp8 {
    template <typename S, typename C, int NV> struct Run {
        static fai_cuda_result go(const fai_cuda_args &a, char *e, size_t n)
        {
            return run_forward<F, F, S, C, NV>(a, e, n);
        }
    };
};
template <typename S, typename C, int NV> struct Bwd {
    static fai_cuda_result go(const fai_cuda_args &a, char *e, size_t n)
    {
        return run_backward<S, C, NV>(a, e, n);
    }
};

fai_cuda_result unsupported_dtypes(const fai_cuda_args &a, char *err, size_t n)
{
    snprintf(err, n, "backend cuda: q dtype %d, k/v dtype %d, out dtype %d: no kernel takes "
                     "this combination", a.q_dtype, a.kv_dtype, a.dtype);
    return FAI_CUDA_UNSUPPORTED;
}

/* A cache of storage K under f32 or bf16 q. */
template <typename K>
fai_cuda_result forward_cache_under(const fai_cuda_args &a, char *err, size_t n)
{
    switch (a.dtype) {
    case FA_F32: return by_width<float, float, FwdCache<K>::template Run>(a, err, n);
    case FA_BF16: return by_width<__nv_bfloat16, float, FwdCache<K>::template Run>(a, err, n);
    default: return unsupported_dtypes(a, err, n);
    }
}

/* An f16, bf16 or FP8 cache under f32 or bf16 q (the API layer allows no other pair; bf16 under
 * bf16 is no cache dtype). Every other combination is refused, never read as another. */
fai_cuda_result forward_by_cache_dtype(const fai_cuda_args &a, char *err, size_t n)
{
    const fai_cuda_result r = fai_cuda_supported(&a, err, n);
    if (r != FAI_CUDA_OK)
        return r;
    switch (a.kv_dtype) {
    case FA_F16: return forward_cache_under<__half>(a, err, n);
    case FA_BF16:
        return a.dtype == FA_F32 ? forward_cache_under<__nv_bfloat16>(a, err, n)
                                 : unsupported_dtypes(a, err, n);
    case FA_E4M3: return forward_cache_under<fai_e4m3>(a, err, n);
    case FA_E5M2: return forward_cache_under<fai_e5m2>(a, err, n);
    default: return unsupported_dtypes(a, err, n);
    }
}

/* FP8 q, k and v of format F into out of f32, f16, bf16 (computed in f32) or f64 (in f64). */
template <typename F>
fai_cuda_result forward_fp8_into(const fai_cuda_args &a, char *err, size_t n)
{
    switch (a.dtype) {
    case FA_F32: return by_width<float, float, FwdFp8<F>::template Run>(a, err, n);
    case FA_F64: return by_width<double, double, FwdFp8<F>::template Run>(a, err, n);
    case FA_F16: return by_width<__half, float, FwdFp8<F>::template Run>(a, err, n);
    case FA_BF16: return by_width<__nv_bfloat16, float, FwdFp8<F>::template Run>(a, err, n);
    default: return unsupported_dtypes(a, err, n);
    }
}

fai_cuda_result forward_fp8(const fai_cuda_args &a, char *err, size_t n)
{
    const fai_cuda_result r = fai_cuda_supported(&a, err, n);
    if (r != FAI_CUDA_OK)
        return r;
    if (a.kv_dtype != a.q_dtype)
        return unsupported_dtypes(a, err, n);
    return a.q_dtype == FA_E4M3 ? forward_fp8_into<fai_e4m3>(a, err, n)
                                : forward_fp8_into<fai_e5m2>(a, err, n);
}

template <template <typename, typename, int> class Run>
fai_cuda_result by_dtype(const fai_cuda_args &a, char *err, size_t n)
{
    const fai_cuda_result r = fai_cuda_supported(&a, err, n);
    if (r != FAI_CUDA_OK)
        return r;
    if (a.q_dtype != a.dtype || a.kv_dtype != a.dtype)
        return unsupported_dtypes(a, err, n);
    switch (a.dtype) {
    case FA_F32: return by_width<float, float, Run>(a, err, n);
    case FA_F64: return by_width<double, double, Run>(a, err, n);
    case FA_F16: return by_width<__half, float, Run>(a, err, n);
    case FA_BF16: return by_width<__nv_bfloat16, float, Run>(a, err, n);
    default: return unsupported_dtypes(a, err, n);
    }
}

} // namespace

extern "C" fai_cuda_result fai_cuda_supported(const fai_cuda_args *a, char *err, size_t n)
{
    if (a->dqk <= 512 && a->dv <= 512)
        return FAI_CUDA_OK;
    snprintf(err, n,
             "backend cuda: head dims %lld/%lld; the CUDA backend supports head dims up to 512",
             (long long)a->dqk, (long long)a->dv);
    return FAI_CUDA_UNSUPPORTED;
}

extern "C" fai_cuda_result fai_cuda_sink_grad(const fai_cuda_args *a, double *grad, char *err,
                                              size_t n)
{
    if (a->hq == 0)
        return FAI_CUDA_OK;
    cudaStream_t st = (cudaStream_t)a->stream;
    const unsigned heads = (unsigned)a->hq;
    switch (a->dtype) {
    case FA_F32: fa_sink_grad_kernel<float><<<heads, kSinkThreads, 0, st>>>(*a, grad); break;
    case FA_F64: fa_sink_grad_kernel<double><<<heads, kSinkThreads, 0, st>>>(*a, grad); break;
    case FA_F16: fa_sink_grad_kernel<__half><<<heads, kSinkThreads, 0, st>>>(*a, grad); break;
    default: fa_sink_grad_kernel<__nv_bfloat16><<<heads, kSinkThreads, 0, st>>>(*a, grad); break;
    }
    return fai_cuda_check_launch("the sink gradient", err, n);
}

extern "C" fai_cuda_result fai_cuda_bias_grad(const fai_cuda_args *a, char *err, size_t n)
{
    const fai_cuda_bias_view &g = a->bias_grad;
    const int64_t total = g.b * g.s * g.h * g.sk;
    if (!g.data || total == 0)
        return FAI_CUDA_OK;
    const int64_t want = (total + kBiasGradThreads - 1) / kBiasGradThreads;
    const unsigned blocks = (unsigned)(want < (1 << 20) ? want : (1 << 20)); /* grid-stride */
    cudaStream_t st = (cudaStream_t)a->stream;
    switch (a->dtype) {
    case FA_F32: fa_bias_grad_kernel<float, float><<<blocks, kBiasGradThreads, 0, st>>>(*a); break;
    case FA_F64:
        fa_bias_grad_kernel<double, double><<<blocks, kBiasGradThreads, 0, st>>>(*a);
        break;
    case FA_F16: fa_bias_grad_kernel<__half, float><<<blocks, kBiasGradThreads, 0, st>>>(*a); break;
    default:
        fa_bias_grad_kernel<__nv_bfloat16, float><<<blocks, kBiasGradThreads, 0, st>>>(*a);
        break;
    }
    return fai_cuda_check_launch("the bias gradient", err, n);
}

extern "C" fai_cuda_result fai_cuda_append(const fai_cuda_args *a, int64_t n, int64_t at,
                                           char *err, size_t errn)
{
    if (n == 0 || a->hk == 0)
        return FAI_CUDA_OK;
    const dim3 grid((unsigned)n, (unsigned)(a->hk < kMaxGridY ? a->hk : kMaxGridY));
    cudaStream_t st = (cudaStream_t)a->stream;
    switch (a->kv_dtype) {
    case FA_F64: fa_append_kernel<unsigned long long><<<grid, 128, 0, st>>>(*a, at); break;
    case FA_F32: fa_append_kernel<unsigned int><<<grid, 128, 0, st>>>(*a, at); break;
    case FA_F16:
    case FA_BF16: fa_append_kernel<unsigned short><<<grid, 128, 0, st>>>(*a, at); break;
    case FA_E4M3:
    case FA_E5M2: fa_append_kernel<unsigned char><<<grid, 128, 0, st>>>(*a, at); break;
    default:
        snprintf(err, errn, "backend cuda: appending to a cache of dtype %d", a->kv_dtype);
        return FAI_CUDA_UNSUPPORTED;
    }
    return fai_cuda_check_launch("appending to the cache", err, errn);
}

extern "C" fai_cuda_result fai_cuda_forward(const fai_cuda_args *a, char *err, size_t n)
{
    const fai_cuda_plan p = fai_cuda_plan_forward(a);
    switch (p.family) {
    case FAI_CUDA_WGMMA: return fai_cuda_forward_wgmma(a, &p.tile, err, n);
    case FAI_CUDA_MMA: return fai_cuda_forward_mma(a, &p.tile, err, n);
    case FAI_CUDA_GENERIC: break; /* FP8, a cache dtype, a bias, a block mask, any shape */
    }
    if (a->sq == 0 || a->b * a->hq == 0)
        return FAI_CUDA_OK;
    if (a->q_dtype == FA_E4M3 || a->q_dtype == FA_E5M2)
        return forward_fp8(*a, err, n);
    return a->kv_dtype != a->dtype ? forward_by_cache_dtype(*a, err, n) : by_dtype<Fwd>(*a, err, n);
}

extern "C" fai_cuda_result fai_cuda_backward(const fai_cuda_args *a, char *err, size_t n)
{
    if (a->b * a->hq == 0)
        return FAI_CUDA_OK;
    return by_dtype<Bwd>(*a, err, n);
}

extern "C" size_t fai_cuda_backward_workspace(const fai_cuda_args *a)
{
    const size_t bhs = (size_t)(a->b * a->hq * a->sq);
    if (a->sq > 0 && a->sk > 0 && fai_cuda_plan_backward(a).family != FAI_CUDA_GENERIC) /* + the flag */
        return (size_t)mma_ws_floats(*a) * sizeof(float) + 16;
    return bhs * (a->dtype == FA_F64 ? sizeof(double) : sizeof(float));
}
