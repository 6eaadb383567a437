/* Hopper's building blocks: warpgroup MMA (wgmma) wrappers and shared-memory
 * matrix descriptors, mbarriers, TMA copies, setmaxnreg, named barriers, and the
 * 128-byte-swizzled tile layout that TMA writes and wgmma reads. Internal to src/cuda/.
 *
 * The device side exists only in the sm_90a device pass (FAI_WGMMA); the kernels that use it
 * compile to an empty body elsewhere, and the host launches them only on a 9.0 device of a
 * build that has the sm_90a image (device_is_sm90, FA_CUDA_HAVE_SM90A). The host side (tensor
 * maps, the device check) is in every pass. */
#ifndef FAI_CUDA_WGMMA_CUH
#define FAI_CUDA_WGMMA_CUH

#include "mma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FAI_WGMMA 1
#endif

namespace {

/*
 * The tile layout wgmma reads with 128-byte swizzling: a tile of ROWS rows x D 16-bit elements
 * (D a multiple of 64) is D / 64 slabs, slab k holding columns [64 k, 64 k + 64) of every row
 * as one 128-byte line per row, the ROWS lines one after another. Within each group of 8 lines (a 1024-byte
 * swizzle atom, which must start 1024-byte aligned), 16-byte chunk c of line r sits at chunk
 * position c ^ (r mod 8) -- the address bits [4, 7) XOR bits [7, 10), which is what the
 * hardware undoes when the descriptor says 128-byte swizzle, and what TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B from a box of 64 columns.
 */
template <int D, int ROWS> struct slab_layout {
    static_assert(D % 64 == 0, "slab_layout: D is a multiple of 64");
    static constexpr int slab = ROWS * 64; /* elements */
    /* element offset of chunk ch (8 elements) of row r */
    __device__ static int off(int r, int ch)
    {
        return (ch >> 3) * slab + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
    }
};

/* ------------------------------------------------------------------ host side */

/* cuTensorMapEncodeTiled through the runtime (no link against the driver library). */
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 f = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            p = nullptr;
        }
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return f;
}

/* The 4-d TMA map of view t (s rows, h heads) with boxes of 64 dims x rows rows. */
inline bool tma_map_4d(CUtensorMap *m, const fai_cuda_view &t, int dtype, int64_t d,
                       int64_t s, int64_t h, int64_t b, int rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc)
        return false;
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)s, (cuuint64_t)h, (cuuint64_t)b};
    const cuuint64_t strides[3] = {(cuuint64_t)t.ss * 2, (cuuint64_t)t.sh * 2,
                                   (cuuint64_t)t.sb * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, one[4] = {1, 1, 1, 1};
    const CUtensorMapDataType type =
        dtype == FA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return enc(m, type, 4, t.data, dims, strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The 3-d TMA map of an f32 accumulator of bh heads x s rows x d columns (contiguous), with
 * boxes of 32 columns (128 bytes, 128-byte swizzle) x rows rows, for reduce-adds into it. */
inline bool tma_map_acc(CUtensorMap *m, float *acc, int64_t d, int64_t s, int64_t bh, int rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc)
        return false;
    const cuuint64_t dims[3] = {(cuuint64_t)d, (cuuint64_t)s, (cuuint64_t)bh};
    const cuuint64_t strides[2] = {(cuuint64_t)d * 4, (cuuint64_t)(s * d) * 4};
    const cuuint32_t box[3] = {32, (cuuint32_t)rows, 1}, one[3] = {1, 1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, acc, dims, strides, box, one,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Whether the current device is a 9.0 (Hopper) one, the only target of the sm_90a image. */
inline bool device_is_sm90()
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
}

#ifdef FAI_WGMMA

/*
 * Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63): start
 * address, leading-dimension byte offset (LBO) and stride-dimension byte offset (SBO), each in
 * 16-byte units.
 *   K-major operand (Q and K in S = Q K^T: rows of M or N, K contiguous): SBO = 1024, the step
 *     from one 8-row atom to the next; LBO is unused while an instruction's 16 K-elements stay
 *     inside one 128-byte line. The k-th 16-element step of a slab starts 32 k bytes in: the
 *     hardware applies the swizzle to the address it forms, so an offset start inside the
 *     atom reads the right chunks.
 *   MN-major operand (V in O += P V: rows of K = keys, N = value dims contiguous, transposed
 *     by the instruction's trans-b): LBO = the step from one 64-column slab to the next along
 *     N, SBO = 1024, the step from 8 keys to the next 8. An MN-major A (trans-a) is read the
 *     same way, M in the place of N.
 */
__device__ __forceinline__ uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    const uint64_t a = smem_addr(p);
    return ((a & 0x3ffff) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 |
           1ull << 62;
}

/* wgmma.fence before the first wgmma of a group whose accumulators or A registers other
 * instructions wrote; commit closes a group; wait<N> until at most N groups are pending. */
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Pins accumulator registers in program order around the asynchronous MMAs: the compiler may
 * not move an access of d across this point (the MMA writes d behind its back until the
 * wait). */
template <int NT> __device__ __forceinline__ void wgmma_pin(float (&d)[NT][4])
{
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[n][e])::"memory");
}

/* ------------------------------------------------------------------ mbarriers and TMA */

/* A shared-memory mbarrier: init (by one thread, then fence_mbarrier_init and a block barrier),
 * arrive, arrive announcing tx bytes that a TMA copy will complete, and the wait for the
 * phase of the given parity to complete. */
__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                     smem_addr(b))
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::
                     "r"(smem_addr(b)),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* TMA: the box of tensor map m at coordinates (c0, c1, c2, c3) into shared memory at dst,
 * completing tx bytes on barrier b. */
__device__ __forceinline__ void tma_load_4d(void *dst, const void *m, int c0, int c1, int c2,
                                            int c3, uint64_t *b)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(smem_addr(dst)),
                 "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(b))
                 : "memory");
}

/* TMA reduce-add: the f32 box of map m at (c0, c1, c2) += the box at src (shared memory, in
 * the map's swizzled layout; rows past the map's bounds are dropped), in this thread's bulk
 * group; commit closes the group; wait_read<N> until at most N groups still read shared
 * memory, wait<N> until at most N are incomplete. */
__device__ __forceinline__ void tma_reduce_add_3d(const void *m, const void *src, int c0, int c1,
                                                  int c2)
{
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
                 " [%0, {%1, %2, %3}], [%4];\n" ::"l"(m),
                 "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(src))
                 : "memory");
}
__device__ __forceinline__ void bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Hand registers between warpgroups (the block's allocation must start capped: launch bounds
 * with a minimum of one block). */
template <int N> __device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* A barrier among the `threads` threads (a multiple of 32) that use barrier id (1 .. 15). */
__device__ __forceinline__ void named_barrier(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#define FAI_D4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define FAI_D32 FAI_D4(0), FAI_D4(1), FAI_D4(2), FAI_D4(3)
#define FAI_D64 FAI_D32, FAI_D4(4), FAI_D4(5), FAI_D4(6), FAI_D4(7)
#define FAI_D128 FAI_D64, FAI_D4(8), FAI_D4(9), FAI_D4(10), FAI_D4(11), FAI_D4(12), FAI_D4(13), \
                 FAI_D4(14), FAI_D4(15)
#define FAI_D256 FAI_D128, FAI_D4(16), FAI_D4(17), FAI_D4(18), FAI_D4(19), FAI_D4(20), \
                 FAI_D4(21), FAI_D4(22), FAI_D4(23), FAI_D4(24), FAI_D4(25), FAI_D4(26), \
                 FAI_D4(27), FAI_D4(28), FAI_D4(29), FAI_D4(30), FAI_D4(31)
#define FAI_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FAI_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
                "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FAI_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
                "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "   \
                "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "   \
                "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
                "%62, %63}"
#define FAI_R128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
                 "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
                 "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, " \
                 "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, " \
                 "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, " \
                 "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, " \
                 "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

/*
 * d (m64 x N, f32, the warpgroup's accumulator: warp w of the group holds rows 16 w .. 16 w +
 * 15 in the m16n8 layout, d[n][e] as in fwd_tile.cuh) = (acc ? d : 0) + A B, one k16 step.
 *   ss: A (64 x 16) and B (16 x N) both from shared memory, K-major unless TA / TB say
 *       MN-major (transposed: A stored as its K rows, M contiguous; B as K rows, N
 *       contiguous).
 *   rs: A from registers (the m16k16 A fragment of the warp's 16 rows), B MN-major;
 *             always accumulates.
 * The accumulate flag is a run-time predicate (the first step of a product starts from 0).
 */
template <typename T, int N> struct wgmma_op;

#define FAI_WGMMA_OPS(TYPE, PTXT)                                                                \
    template <> struct wgmma_op<TYPE, 32> {                                                      \
        template <int TA = 0, int TB = 0>                                                        \
        __device__ static void ss(float (&d)[4][4], uint64_t a, uint64_t b, int acc)            \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTXT "." PTXT " " FAI_R16 \
                         ", %16, %17, p, 1, 1, %19, %20;\n}\n"                                   \
                         : FAI_D32                                                               \
                         : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));                         \
        }                                                                                        \
    };                                                                                           \
    template <> struct wgmma_op<TYPE, 64> {                                                      \
        template <int TA = 0, int TB = 0>                                                        \
        __device__ static void ss(float (&d)[8][4], uint64_t a, uint64_t b, int acc)            \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTXT "." PTXT " " FAI_R32 \
                         ", %32, %33, p, 1, 1, %35, %36;\n}\n"                                   \
                         : FAI_D64                                                               \
                         : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));                         \
        }                                                                                        \
        __device__ static void rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b)          \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTXT "." PTXT " " FAI_R32 \
                         ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                         \
                         : FAI_D64                                                               \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));         \
        }                                                                                        \
    };                                                                                           \
    template <> struct wgmma_op<TYPE, 128> {                                                     \
        template <int TA = 0, int TB = 0>                                                        \
        __device__ static void ss(float (&d)[16][4], uint64_t a, uint64_t b, int acc)           \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTXT "." PTXT " " FAI_R64 \
                         ", %64, %65, p, 1, 1, %67, %68;\n}\n"                                   \
                         : FAI_D128                                                              \
                         : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));                         \
        }                                                                                        \
        __device__ static void rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b)         \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTXT "." PTXT " " FAI_R64 \
                         ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                         \
                         : FAI_D128                                                              \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));         \
        }                                                                                        \
    };                                                                                           \
    template <> struct wgmma_op<TYPE, 256> {                                                     \
        template <int TA = 0, int TB = 0>                                                        \
        __device__ static void ss(float (&d)[32][4], uint64_t a, uint64_t b, int acc)           \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                          \
                         "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTXT "." PTXT " "        \
                         FAI_R128 ", %128, %129, p, 1, 1, %131, %132;\n}\n"                     \
                         : FAI_D256                                                              \
                         : "l"(a), "l"(b), "r"(acc), "n"(TA), "n"(TB));                         \
        }                                                                                        \
        __device__ static void rs(float (&d)[32][4], const uint32_t (&a)[4], uint64_t b)         \
        {                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                          \
                         "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTXT "." PTXT " "        \
                         FAI_R128 ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"          \
                         : FAI_D256                                                              \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));         \
        }                                                                                        \
    };

FAI_WGMMA_OPS(__nv_bfloat16, "bf16")
FAI_WGMMA_OPS(__half, "f16")

#undef FAI_WGMMA_OPS
#undef FAI_D4
#undef FAI_D32
#undef FAI_D64
#undef FAI_D128
#undef FAI_D256
#undef FAI_R16
#undef FAI_R32
#undef FAI_R64
#undef FAI_R128

#endif /* FAI_WGMMA */

} // namespace

#endif
