/* Device-side helpers shared by the CUDA translation units: storage conversions, warp
 * reductions, element addressing. Internal to src/cuda/. */
#ifndef FAI_CUDA_COMMON_CUH
#define FAI_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flashattn.h"
#include "launch.h"
#include "plan.h"
#include "core/gradient.h"
#include "core/philox.h"
#include "core/recurrence.h"
#include "core/score.h"

/* Storage <-> compute: loads are exact, stores round to nearest even once (docs/DESIGN.md §1). */
template <typename S> struct fai_storage;
template <> struct fai_storage<float> {
    __device__ static float load(float x) { return x; }
    __device__ static float store(float x) { return x; }
};
template <> struct fai_storage<double> {
    __device__ static double load(double x) { return x; }
    __device__ static double store(double x) { return x; }
};
template <> struct fai_storage<__half> {
    __device__ static float load(__half x) { return __half2float(x); }
    __device__ static __half store(float x) { return __float2half_rn(x); }
};
template <> struct fai_storage<__nv_bfloat16> {
    __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
    __device__ static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

/*
 * FP8 storage (the OCP formats, base/dtype.c): a code widened to f32 exactly, by bit arithmetic
 * (no table: a per-lane lookup in constant memory would serialize over distinct codes). e4m3
 * ("e4m3fn"): bias 7, 3 fraction bits, S.1111.111 NaN, no infinity; e5m2: bias 15, 2 fraction
 * bits, exponent 31 infinity (fraction 0) or NaN. Normal codes: the exponent rebased to f32's
 * (+120, +112) and the fraction moved to the top of f32's; subnormal codes: fraction x 2^-9
 * (2^-16), exact. The sign is applied last (-0 and -NaN as the host's tables). Input only:
 * nothing is stored in FP8 on the device.
 */
struct fai_e4m3 {
    unsigned char c;
};
struct fai_e5m2 {
    unsigned char c;
};

__host__ __device__ __forceinline__ float fai_bits_f32(unsigned u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

__host__ __device__ __forceinline__ float fai_e4m3_to_f32(unsigned c)
{
    const unsigned e = (c >> 3) & 15u, m = c & 7u;
    float a;
    if ((c & 0x7fu) == 0x7fu)
        a = fai_bits_f32(0x7fc00000u);
    else if (e == 0)
        a = (float)m * 0x1p-9f;
    else
        a = fai_bits_f32(((e + 120u) << 23) | (m << 20));
    return (c & 0x80u) ? -a : a;
}

__host__ __device__ __forceinline__ float fai_e5m2_to_f32(unsigned c)
{
    const unsigned e = (c >> 2) & 31u, m = c & 3u;
    float a;
    if (e == 31)
        a = fai_bits_f32(m ? 0x7fc00000u : 0x7f800000u);
    else if (e == 0)
        a = (float)m * 0x1p-16f;
    else
        a = fai_bits_f32(((e + 112u) << 23) | (m << 21));
    return (c & 0x80u) ? -a : a;
}

template <> struct fai_storage<fai_e4m3> {
    __device__ static float load(fai_e4m3 x) { return fai_e4m3_to_f32(x.c); }
};
template <> struct fai_storage<fai_e5m2> {
    __device__ static float load(fai_e5m2 x) { return fai_e5m2_to_f32(x.c); }
};

template <typename S>
__device__ __forceinline__ S *fai_at(const fai_cuda_view &t, int64_t b, int64_t s, int64_t h)
{
    return (S *)t.data + b * t.sb + s * t.ss + h * t.sh;
}

/* Key row j of batch b, kv head hk of k or v (t): through the page table where K/V are pages
 * (launch.h); only the generic kernels read pages. */
template <typename S>
__device__ __forceinline__ S *fai_kv_at(const fai_cuda_args &a, const fai_cuda_view &t,
                                        int64_t b, int64_t j, int64_t hk)
{
    if (!a.table)
        return fai_at<S>(t, b, j, hk);
    return fai_at<S>(t, a.table[b * a.table_stride + j / a.page_size], j % a.page_size, hk);
}

/* core's per-element formulas by type, for the templates: the NaN-sticky max (core/fmath.h)
 * and dS (core/gradient.h). */
__device__ __forceinline__ float fai_nanmax(float m, float x) { return fai_nanmax_f32(m, x); }
__device__ __forceinline__ double fai_nanmax(double m, double x) { return fai_nanmax_f64(m, x); }
__device__ __forceinline__ float fai_dscore(float p, float dp, float z, float di, float t,
                                            int capped)
{
    return fai_dscore_f32(p, dp, z, di, t, capped);
}
__device__ __forceinline__ double fai_dscore(double p, double dp, double z, double di, double t,
                                             int capped)
{
    return fai_dscore_f64(p, dp, z, di, t, capped);
}

__device__ __forceinline__ float fai_dbias(float p, float dp, float z, float di, float t,
                                           int capped, int after_cap, float factor)
{
    return fai_dbias_f32(p, dp, z, di, t, capped, after_cap, factor);
}
__device__ __forceinline__ double fai_dbias(double p, double dp, double z, double di, double t,
                                            int capped, int after_cap, double factor)
{
    return fai_dbias_f64(p, dp, z, di, t, capped, after_cap, factor);
}

/* The bias entry of (b, h, i, j) in the compute type C (launch.h: a broadcast dim has stride 0,
 * so it reads index 0): loads are exact but for an f64 bias under f32 compute, which rounds
 * once, as the host's f32 paths do; a keep-mask's 0 is -inf, anything else 0 (base/dtype.c).
 * 0 without a bias. */
template <typename C>
__device__ __forceinline__ C fai_bias_get(const fai_cuda_bias_view &t, int64_t b, int64_t h,
                                          int64_t i, int64_t j)
{
    if (!t.data)
        return (C)0;
    const int64_t e = b * t.sb + i * t.ss + h * t.sh + j;
    switch (t.dtype) {
    case FA_F32: return (C)((const float *)t.data)[e];
    case FA_F64: return (C)((const double *)t.data)[e];
    case FA_F16: return (C)__half2float(((const __half *)t.data)[e]);
    case FA_BF16: return (C)__bfloat162float(((const __nv_bfloat16 *)t.data)[e]);
    default: return ((const unsigned char *)t.data)[e] ? (C)0 : (C)-INFINITY;
    }
}

/* Whether the block mask lists key j's block for row i's block of (b, h) (true without one):
 * a key it does not list is masked, by selection, on top of the window and the bias. */
__device__ __forceinline__ bool fai_block_listed(const fai_cuda_block_view &m, int64_t b,
                                                 int64_t h, int64_t i, int64_t j)
{
    if (!m.listed)
        return true;
    const int64_t bb = m.batch == 1 ? 0 : b, hh = m.heads == 1 ? 0 : h;
    return m.listed[((bb * m.heads + hh) * m.q_blocks + i / m.q_block) * m.kv_blocks +
                    j / m.kv_block] != 0;
}

/* The FP8 descales' index of (b, kv head hk) (launch.h). */
__device__ __forceinline__ int64_t fai_descale_index(const fai_cuda_args &a, int64_t b,
                                                     int64_t hk)
{
    return a.descale_per_head ? (a.seq0 + b) * a.hk + hk : 0;
}

/* The max over a warp, each lane's own value taken into the other's (a NaN sticks). */
template <typename C> __device__ __forceinline__ C fai_warp_max(C x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fai_nanmax(__shfl_xor_sync(0xffffffffu, x, o), x);
    return x;
}

template <typename C> __device__ __forceinline__ C fai_warp_sum(C x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* LSE element (b, h, i): f32 or f64 storage. */
__device__ __forceinline__ void fai_lse_put(const fai_cuda_view t, int f64, int64_t b, int64_t h,
                                            int64_t i, double x)
{
    if (f64)
        *fai_at<double>(t, b, i, h) = x;
    else
        *fai_at<float>(t, b, i, h) = (float)x;
}

__device__ __forceinline__ double fai_lse_get(const fai_cuda_view t, int f64, int64_t b,
                                              int64_t h, int64_t i)
{
    return f64 ? *fai_at<double>(t, b, i, h) : (double)*fai_at<float>(t, b, i, h);
}

/* The dropout stream of head (b, h) (core/philox.h): one Philox call, made once per head where
 * a kernel starts on it. The parameters are copied out of the kernel parameter first (taking
 * the address of a __global__ parameter would copy it to local memory). */
__device__ __forceinline__ fai_dropout fai_drop_head(const fai_cuda_args &a, int64_t b, int64_t h)
{
    const fai_dropout_params p = a.drop;
    return fai_dropout_make(&p, (uint64_t)((a.seq0 + b) * a.hq + h));
}

/* Records a launch failure in err; returns the result code. */
static inline fai_cuda_result fai_cuda_check_launch(const char *what, char *err, size_t n)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return FAI_CUDA_OK;
    snprintf(err, n, "backend cuda: %s: %s", what, cudaGetErrorString(e));
    return FAI_CUDA_DEVICE_ERROR;
}

/* The tensor-core backward (bwd_mma.cu) and its workspace, carved from fai_cuda_args.work:
 * D_i and LSE_i log2(e) (f32, B Hq Sq each), the f32 dQ accumulator (B Hq Sq Dqk; NULL in
 * deterministic mode), and the non-finite-input flag that chooses between it and the generic
 * kernels on the device. */
typedef struct {
    float *delta, *lse2, *dqacc;
    int *flag;
} fai_cuda_bwd_ws;

fai_cuda_result fai_cuda_backward_mma_prepare(const fai_cuda_args *a, const fai_cuda_bwd_ws *w,
                                              char *err, size_t n);
/* The tensor-core backward of plan p (its family MMA or WGMMA). */
fai_cuda_result fai_cuda_backward_mma(const fai_cuda_args *a, const fai_cuda_plan *p,
                                      const fai_cuda_bwd_ws *w, char *err, size_t n);
/* The Hopper backward kernel (bwd_wgmma.cu: dK, dV, and dQ's sums unless deterministic),
 * run by fai_cuda_backward_mma where the plan (plan.h) takes it, with the plan's tile. */
fai_cuda_result fai_cuda_backward_wgmma(const fai_cuda_args *a, const fai_cuda_tile *t,
                                        const fai_cuda_bwd_ws *w, char *err, size_t n);

/* Whether the score pipeline is the scale alone and dropout is off: the FAST variants, and
 * the only case of the wgmma kernels. */
static inline bool fai_cuda_scale_only(const fai_cuda_args &a)
{
    return a.score.softcap == 0 && a.slopes == nullptr && a.drop.threshold == 0;
}

/* The tensor-core forwards, wgmma (fwd_wgmma.cu, Hopper) and mma.sync (fwd_mma.cu), run where
 * the plan (plan.h) takes them, with its tile t. */
fai_cuda_result fai_cuda_forward_wgmma(const fai_cuda_args *a, const fai_cuda_tile *t, char *err,
                                       size_t n);
fai_cuda_result fai_cuda_forward_mma(const fai_cuda_args *a, const fai_cuda_tile *t, char *err,
                                     size_t n);

#endif
