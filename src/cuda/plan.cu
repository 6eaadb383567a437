/*
 * The launch plan (plan.h): which kernels a call's forward and backward take, decided here
 * only. Each family has its rules, tested in order from the fastest; the first family whose
 * rules all hold runs, and `why` names the rule that sent the call past the faster ones (or,
 * for the fastest, what it took).
 *
 * The rules, and why each holds:
 *  - FA_CUDA_KERNEL (the context's choice, backend.c) caps the family: "mma" rules out wgmma,
 *    "generic" both tensor-core families.
 *  - Only the generic kernels read a bias tensor, a block mask, FP8 codes or a cache of another
 *    dtype than q's (plain_storage), walk a mask of two key runs (sink tokens) or a
 *    page table; only they leave the D_i the bias gradient's kernel reads.
 *  - The tensor-core kernels take f16/bf16 with Dqk = Dv at the head dims they are built for,
 *    and rows that start and step in whole 16-byte chunks (cp.async, ldmatrix, TMA).
 *  - The wgmma kernels (sm_90a image, a 9.0 device) take the scale-only score pipeline without
 *    dropout, and sizes that TMA's 32-bit coordinates and their grids reach.
 *
 * Then the family's tile for the head dim (tile_of; docs/notes/cuda.md has the runs).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common.cuh"
#include "plan.h"
#include "wgmma.cuh"

namespace {

/* Whether every tensor is of one storage dtype and the scores take no bias tensor or block
 * mask (FP8 q or an FP8 / 16-bit cache apart from q's, a bias and a block mask are the generic
 * kernels'). */
bool plain_storage(const fai_cuda_args &a)
{
    return a.q_dtype == a.dtype && a.kv_dtype == a.dtype && !a.bias.data && !a.blocks.listed;
}

/* Rows of every tensor in views[0..n) start on 16-byte boundaries and step in whole 16-byte
 * chunks (16-bit elements): what cp.async, ldmatrix and TMA need. */
bool aligned16(const fai_cuda_view *const *views, int n)
{
    for (int t = 0; t < n; t++)
        if ((uintptr_t)views[t]->data % 16 || views[t]->sb % 8 || views[t]->ss % 8 ||
            views[t]->sh % 8)
            return false;
    return true;
}

bool have_sm90a()
{
#ifdef FA_CUDA_HAVE_SM90A
    return device_is_sm90();
#else
    return false;
#endif
}

/* A family and the rule that chose it. */
struct family_choice {
    fai_cuda_family family;
    const char *why;
};

/* The rules that send a call to the generic kernels whatever its shape; NULL if none does. */
const char *generic_only(const fai_cuda_args &a)
{
    if (a.kernel == FAI_CUDA_KERNEL_GENERIC)
        return "FA_CUDA_KERNEL=generic";
    if (!plain_storage(a))
        return "a bias, a block mask, FP8 inputs or a cache dtype apart from q's (generic only)";
    if (a.mask.sink_keys > 0)
        return "sink tokens: two key runs a row (generic only)";
    if (a.page_size > 0)
        return "a paged K/V (generic only)";
    if (a.dtype != FA_BF16 && a.dtype != FA_F16)
        return "f32 or f64 storage (the tensor cores take f16 and bf16)";
    if (a.dqk != a.dv)
        return "Dqk != Dv (the tensor-core kernels take equal head dims)";
    return nullptr;
}

/*
 * The tiles, one place. Each family's launcher has an instance of each tile named here.
 *   wgmma forward: 128 query rows (two consumer warpgroups of 64) x 128-key tiles, 2 stages,
 *     at D 96 (padded to 128 in shared memory) and 128 (D 64 below). At D = 128, bf16,
 *     N = 8192 non-causal: 489 TFLOP/s; 3 stages the same (488: the producer is never the
 *     limit); 64-key tiles x 4 stages 384 (twice the barrier round trips and softmax
 *     bookkeeping per key). D = 256: 64-key tiles (O alone is 128 registers a consumer
 *     thread; S over 128 keys would be 64 more), 2 stages: Q 64 KiB + 2 x (K + V) 128 KiB of
 *     shared memory.
 *     D = 64: 192 query rows (three consumer warpgroups, 160 registers a thread), 128-key
 *     tiles: at two consumers the kernel is latency-bound (ncu: tensor pipe 31%, 0.55 eligible
 *     warps a scheduler); H200, bf16, B 2, H 32, against 128 rows in the same run: N 8192
 *     x1.14 (296 -> 337 TFLOP/s), causal x1.05, causal N 16384 x1.07, N 2048 x1.00. At 160
 *     registers ptxas spills 90 bytes (S, P and O of the overlapped tiles are 128).
 *   mma.sync forward: 4 warps x 2 m-tiles = 128 query rows, 64-key tiles for D <= 128 (4 x 1
 *     = 64 rows ran at 0.4x FA2: one ldmatrix.x4 per two MMAs saturated shared memory);
 *     D = 256: 4 warps x 1 m-tile = 64 rows, 32-key tiles (the O accumulator alone is 128
 *     registers), Q read from shared memory at every k-step.
 *   wgmma backward (D 64, 96 padded to 128, 128; 256): 128-key blocks (two consumer
 *     warpgroups of 64 keys, dK and dV in registers) over 64-query steps, 2 stages: H100,
 *     bf16, N 8192, B 2: 319 TFLOP/s at D 128, 214 at D 64, 255 at D 96. D = 256: 64-key
 *     blocks (dK and dV of 64 keys are 256 registers a consumer thread: the two warpgroups
 *     split the dims), 2 stages: K, V 64 KiB + 2 x (Q + dO) 128 KiB + P^T, dS^T x 2 32 KiB,
 *     the most that fits in 227 KiB; 245 TFLOP/s (H 8).
 *   mma.sync backward: 64-key blocks over 32-query steps, 4 warps.
 */
fai_cuda_tile tile_of(fai_cuda_family f, bool forward, int64_t d)
{
    switch (f) {
    case FAI_CUDA_WGMMA:
        if (forward)
            return d == 256  ? fai_cuda_tile{128, 64, 2}
                   : d == 64 ? fai_cuda_tile{192, 128, 2}
                             : fai_cuda_tile{128, 128, 2};
        return d == 256 ? fai_cuda_tile{64, 64, 2} : fai_cuda_tile{64, 128, 2};
    case FAI_CUDA_MMA:
        if (forward)
            return d == 256 ? fai_cuda_tile{64, 32, 0} : fai_cuda_tile{128, 64, 0};
        return {32, 64, 0};
    case FAI_CUDA_GENERIC: break;
    }
    return {0, 0, 0};
}

family_choice family_forward(const fai_cuda_args &a)
{
    if (const char *why = generic_only(a))
        return {FAI_CUDA_GENERIC, why};
    if (a.dqk != 32 && a.dqk != 64 && a.dqk != 96 && a.dqk != 128 && a.dqk != 256)
        return {FAI_CUDA_GENERIC, "head dim not in {32, 64, 96, 128, 256}"};
    const fai_cuda_view *rows[4] = {&a.tq, &a.tk, &a.tv, &a.tout};
    if (!aligned16(rows, 4))
        return {FAI_CUDA_GENERIC, "rows not in whole 16-byte chunks"};
    if (a.kernel == FAI_CUDA_KERNEL_MMA)
        return {FAI_CUDA_MMA, "FA_CUDA_KERNEL=mma"};
    if (!have_sm90a())
        return {FAI_CUDA_MMA, "no sm_90a image or not a 9.0 device"};
    if (a.dqk == 32)
        return {FAI_CUDA_MMA, "wgmma forward: D 64, 96, 128 and 256"};
    if (!fai_cuda_scale_only(a))
        return {FAI_CUDA_MMA, "softcap, ALiBi or dropout (wgmma: the scale-only pipeline)"};
    if (a.sq >= INT32_MAX || a.sk >= INT32_MAX || a.b * a.hq > 65535)
        return {FAI_CUDA_MMA, "sizes past TMA's coordinates or the wgmma grid"};
    return {FAI_CUDA_WGMMA, "wgmma: 16-bit, D 64/96/128/256, scale only, sm_90a"};
}

family_choice family_backward(const fai_cuda_args &a)
{
    if (const char *why = generic_only(a))
        return {FAI_CUDA_GENERIC, why};
    if (a.dqk != 32 && a.dqk != 64 && a.dqk != 96 && a.dqk != 128 && a.dqk != 256)
        return {FAI_CUDA_GENERIC, "backward head dim not in {32, 64, 96, 128, 256}"};
    const fai_cuda_view *rows[7] = {&a.tq, &a.tk, &a.tv, &a.tdout, &a.tdq, &a.tdk, &a.tdv};
    if (!aligned16(rows, 7))
        return {FAI_CUDA_GENERIC, "rows not in whole 16-byte chunks"};
    /* where wgmma does not take the call: mma.sync, which stops at D 128 */
    const fai_cuda_family below = a.dqk == 256 ? FAI_CUDA_GENERIC : FAI_CUDA_MMA;
    if (a.kernel == FAI_CUDA_KERNEL_MMA)
        return {below, "FA_CUDA_KERNEL=mma"};
    if (!have_sm90a())
        return {below, "no sm_90a image or not a 9.0 device"};
    if (a.dqk == 32)
        return {FAI_CUDA_MMA, "wgmma backward: D 64, 96, 128 and 256"};
    if (!fai_cuda_scale_only(a))
        return {below, "softcap, ALiBi or dropout (wgmma: the scale-only pipeline)"};
    if (a.dqk == 256 && a.deterministic)
        return {FAI_CUDA_GENERIC, "deterministic at D 256 (the ordered dQ kernel stops at 128)"};
    if (a.sq >= INT32_MAX || a.sk >= INT32_MAX || a.b * a.hk > 65535 ||
        (a.sq / 64 + 1) * a.group >= INT32_MAX)
        return {below, "sizes past TMA's coordinates or the wgmma grid"};
    return {FAI_CUDA_WGMMA, "wgmma: 16-bit, D 64/96/128/256, scale only, sm_90a"};
}

/* The family's rules for a's forward (forward) or backward, then its tile. */
fai_cuda_plan decide(const fai_cuda_args &a, bool forward)
{
    const family_choice c = forward ? family_forward(a) : family_backward(a);
    return {c.family, c.why, tile_of(c.family, forward, a.dqk)};
}

} // namespace

extern "C" fai_cuda_plan fai_cuda_plan_forward(const fai_cuda_args *a)
{
    return decide(*a, true);
}

extern "C" fai_cuda_plan fai_cuda_plan_backward(const fai_cuda_args *a)
{
    return decide(*a, false);
}

extern "C" int fai_cuda_plan_format(const fai_cuda_plan *p, char *buf, size_t n)
{
    static const char *const names[] = {"generic", "mma", "wgmma"};
    if (p->family == FAI_CUDA_GENERIC)
        return snprintf(buf, n, "generic (%s)", p->why);
    return snprintf(buf, n, "%s q%d k%d x%d (%s)", names[p->family], p->tile.bq, p->tile.bk,
                    p->tile.stages, p->why);
}

extern "C" fai_cuda_result fai_cuda_no_instance(const char *what, const fai_cuda_args *a,
                                                const fai_cuda_tile *t, char *err, size_t n)
{
    snprintf(err, n,
             "backend cuda: %s has no instance of D %lld with tile q%d k%d x%d (the launch "
             "plan names a tile its launcher does not compile)",
             what, (long long)a->dqk, t->bq, t->bk, t->stages);
    return FAI_CUDA_UNSUPPORTED;
}

extern "C" void fai_cuda_plan_describe(int kernel, char *buf, size_t n)
{
    static const int64_t dims[4] = {64, 96, 128, 256};
    size_t used = 0;
    for (int x = 0; x < 4 && used < n; x++) {
        const int64_t d = dims[x], s = 4096;
        fai_cuda_args a;
        memset(&a, 0, sizeof a);
        a.dtype = a.q_dtype = a.kv_dtype = FA_BF16;
        a.b = a.hq = a.hk = a.group = 1;
        a.sq = a.sk = s, a.dqk = a.dv = d;
        a.kernel = kernel;
        const fai_cuda_view v = {(void *)(uintptr_t)4096, s * d, d, d}; /* BSHD, aligned */
        a.tq = a.tk = a.tv = a.tout = a.tdout = a.tdq = a.tdk = a.tdv = v;
        char f[160], b[160];
        const fai_cuda_plan pf = fai_cuda_plan_forward(&a), pb = fai_cuda_plan_backward(&a);
        fai_cuda_plan_format(&pf, f, sizeof f);
        fai_cuda_plan_format(&pb, b, sizeof b);
        const int k = snprintf(buf + used, n - used, "%scuda_plan_bf16_d%lld=fwd:%s,bwd:%s",
                               x ? " " : "", (long long)d, f, b);
        used += k > 0 ? (size_t)k : 0;
    }
}
