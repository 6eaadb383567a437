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
 */
#include "config.h"

#include <stdint.h>

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

} // namespace

extern "C" fai_cuda_plan fai_cuda_plan_forward(const fai_cuda_args *pa)
{
    const fai_cuda_args &a = *pa;
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
    if (a.dqk != 64 && a.dqk != 128)
        return {FAI_CUDA_MMA, "wgmma forward: D 64 and 128 only"};
    if (!fai_cuda_scale_only(a))
        return {FAI_CUDA_MMA, "softcap, ALiBi or dropout (wgmma: the scale-only pipeline)"};
    if (a.sq >= INT32_MAX || a.sk >= INT32_MAX || a.b * a.hq > 65535)
        return {FAI_CUDA_MMA, "sizes past TMA's coordinates or the wgmma grid"};
    return {FAI_CUDA_WGMMA, "wgmma: 16-bit, D 64/128, scale only, sm_90a"};
}

extern "C" fai_cuda_plan fai_cuda_plan_backward(const fai_cuda_args *pa)
{
    const fai_cuda_args &a = *pa;
    if (const char *why = generic_only(a))
        return {FAI_CUDA_GENERIC, why};
    if (a.dqk != 32 && a.dqk != 64 && a.dqk != 96 && a.dqk != 128)
        return {FAI_CUDA_GENERIC, "backward head dim not in {32, 64, 96, 128}"};
    const fai_cuda_view *rows[7] = {&a.tq, &a.tk, &a.tv, &a.tdout, &a.tdq, &a.tdk, &a.tdv};
    if (!aligned16(rows, 7))
        return {FAI_CUDA_GENERIC, "rows not in whole 16-byte chunks"};
    if (a.kernel == FAI_CUDA_KERNEL_MMA)
        return {FAI_CUDA_MMA, "FA_CUDA_KERNEL=mma"};
    if (!have_sm90a())
        return {FAI_CUDA_MMA, "no sm_90a image or not a 9.0 device"};
    if (a.dqk != 128)
        return {FAI_CUDA_MMA, "wgmma backward: D 128 only"};
    if (!fai_cuda_scale_only(a))
        return {FAI_CUDA_MMA, "softcap, ALiBi or dropout (wgmma: the scale-only pipeline)"};
    if (a.sq >= INT32_MAX || a.sk >= INT32_MAX || a.b * a.hk > 65535 ||
        (a.sq / 64 + 1) * a.group >= INT32_MAX)
        return {FAI_CUDA_MMA, "sizes past TMA's coordinates or the wgmma grid"};
    return {FAI_CUDA_WGMMA, "wgmma: 16-bit, D 128, scale only, sm_90a"};
}
