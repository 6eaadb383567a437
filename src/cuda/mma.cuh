/* The tensor-core building blocks shared by the forward and backward kernels: PTX wrappers
 * (cp.async, ldmatrix, mma.sync m16n8k16, ex2) and the swizzled shared-memory tile layout.
 * Internal to src/cuda/. */
#ifndef FAI_CUDA_MMA_CUH
#define FAI_CUDA_MMA_CUH

#include "common.cuh"

namespace {

/* ------------------------------------------------------------------ PTX wrappers */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 2^x, flushing subnormal results to 0 (ex2.approx: 2 ulp; exp2f adds a subnormal path) */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* 16 bytes global -> shared, asynchronously; with pred false the 16 bytes are zero-filled and
 * nothing is read. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool pred)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Orders this thread's earlier ordinary shared-memory writes before later reads of the
 * async proxy (wgmma operands); a no-op below sm_90, where nothing reads through that proxy. */
__device__ __forceinline__ void fence_proxy_async()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

template <typename T> struct mma_t;
template <> struct mma_t<__nv_bfloat16> {
    /* d += a b, m16n8k16, bf16 in, f32 accumulate */
    __device__ static void run(float *d, const uint32_t *a, const uint32_t *b)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    /* non-finite: exponent all ones */
    __device__ static bool nonfinite(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u; }
};
template <> struct mma_t<__half> {
    __device__ static void run(float *d, const uint32_t *a, const uint32_t *b)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    __device__ static uint32_t pack(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    __device__ static bool nonfinite(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u; }
};

/* Rows g and g + 8 of a warp's m16 accumulators of dK and dV (DT tiles of 8 columns in the
 * m16n8 layout, lane g = lane / 4, tg = lane mod 4; the first DS of them dims d0 .. of the
 * head, the rest padding) to key rows j0 + g and j0 + 8 + g of KV head hk, rounded to T; rows
 * at or past Sk are not written. Both backwards end with it. */
template <typename T, int DT, int DS = DT>
__device__ __forceinline__ void store_dk_dv(const fai_cuda_args &a, int64_t b, int64_t hk,
                                            int64_t j0, int g, int tg,
                                            const float (&dk)[DT][4], const float (&dv)[DT][4],
                                            int d0 = 0)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t j = j0 + 8 * r + g;
        if (j >= a.sk)
            continue;
        T *kr = fai_at<T>(a.tdk, b, j, hk) + d0, *vr = fai_at<T>(a.tdv, b, j, hk) + d0;
#pragma unroll
        for (int d = 0; d < DS; d++) {
            *(uint32_t *)(kr + 8 * d + 2 * tg) = mma_t<T>::pack(dk[d][2 * r], dk[d][2 * r + 1]);
            *(uint32_t *)(vr + 8 * d + 2 * tg) = mma_t<T>::pack(dv[d][2 * r], dv[d][2 * r + 1]);
        }
    }
}

/* ------------------------------------------------------------------ shared-memory layout */

/*
 * A tile row of D 16-bit elements is D/8 chunks of 16 bytes, stored in a row of P chunks
 * (P = D/8 rounded up to a power of two, so D = 96 uses rows of 16 chunks). Chunk c of row r
 * sits at chunk position c ^ swz(r):
 *   P >= 8:  swz(r) = r mod 8. Rows are >= 128 bytes, so the 8 rows r0..r0+7 (r0 = 0 mod 8)
 *            that one ldmatrix phase reads at one logical chunk c land on the 8 distinct
 *            positions c ^ 0..7 of one 128-byte window: 8 different bank groups.
 *   P == 4:  rows are 64 bytes, two rows per 128-byte line; swz(r) = (r / 2) mod 4 gives rows
 *            r0..r0+7 the byte offsets 64 (r mod 2) + 16 (c ^ (r/2 mod 4)) within their line:
 *            8 distinct values, again 8 different bank groups.
 * The XOR stays inside [0, P) since c < P and swz(r) < P.
 */
template <int D> struct layout {
    static constexpr int chunks = D / 8;
    static constexpr int P = chunks <= 4 ? 4 : chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
    static constexpr int pitch = P * 8; /* elements */
    __device__ static int off(int r, int c)
    {
        const int s = P >= 8 ? (r & 7) : ((r >> 1) & 3);
        return r * pitch + ((c ^ s) << 3);
    }
    /* The ldmatrix rows of a lane are always (lane mod 8) modulo 8, so swz(r) is a per-lane
     * constant: pass it in (lane_swz), and the row and chunk terms stay plain additions the
     * compiler folds into immediates instead of a register per unrolled address. */
    __device__ static int lane_swz(int lane) { return P >= 8 ? (lane & 7) : ((lane & 7) >> 1); }
    __device__ static int off_sw(int r, int c, int sw) { return r * pitch + ((c ^ sw) << 3); }
};

/*
 * Rows [0, ROWS) of a tile into its swizzled shared-memory image with cp.async: row r comes
 * from src + r * ss and is zero-filled when r >= nvalid. When the THREADS threads cover whole
 * rows in steps of a multiple of 8, each thread keeps one chunk column and one swizzle, so its
 * addresses are a base plus constant steps (no per-chunk division or 64-bit multiply).
 */
template <int D, int ROWS, int THREADS, typename T>
__device__ __forceinline__ void tile_load(T *dst, const T *src, int64_t ss, int64_t nvalid,
                                          int tid)
{
    using L = layout<D>;
    constexpr int CH = D / 8;
    if constexpr (THREADS % CH == 0 && (THREADS / CH) % 8 == 0 && ROWS % (THREADS / CH) == 0) {
        constexpr int RS = THREADS / CH;
        const int r0 = tid / CH, ch = tid % CH;
        T *d = dst + L::off(r0, ch); /* rows r0 + k RS share r0's swizzle: RS = 0 mod 8 */
        const T *s = src + r0 * ss + ch * 8;
        const int64_t step = RS * ss;
        /* a rolled loop with running pointers: unrolled, the compiler would hold every row's
         * address in registers across the main loop, which the kernels cannot spare */
#pragma unroll 1
        for (int r = r0; r < ROWS; r += RS, d += RS * L::pitch, s += step)
            cp_async16(d, r < nvalid ? s : src, r < nvalid);
    } else {
        for (int c = tid; c < ROWS * CH; c += THREADS) {
            const int r = c / CH, ch = c % CH;
            const bool ok = r < nvalid;
            cp_async16(dst + L::off(r, ch), ok ? src + r * ss + ch * 8 : src, ok);
        }
    }
}

} // namespace

#endif
