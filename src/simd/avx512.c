/* AVX-512 (F) kernels. Built with -mavx512f -mavx512dq -mavx512bw -mavx512vl; called only when
 * the CPU and OS support them (src/simd/cpu.c). */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <sleef.h>

#include "simd/kernels.h"

#define MR 12
#define NR 32 /* two zmm of f32 */

/*
 * 12 x 32: 24 zmm accumulators; per k step two B loads and twelve A broadcasts feed 24 FMAs
 * (27 of the 32 registers). Measured against 8 x 32 and 14 x 32 in NOTES.md.
 *
 * The body is instantiated once per row count (ROWS a constant, every loop over rows fully
 * unrolled): with a variable row count the compiler keeps the accumulator arrays in memory,
 * which ran the kernel at less than half the FMA rate (perf annotate: a load, FMA and store
 * per term). Columns beyond nr are masked on load and store; rows beyond ROWS are not touched.
 */
static inline __attribute__((always_inline)) void
gemm_rows__avx512(const int ROWS, int64_t nr, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate)
{
    const __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    const __mmask16 m1 = nr >= 32 ? 0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; i++) {
        c0[i] = accumulate ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
        c1[i] = accumulate ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < k; p++) {
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);
        const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + p * ldb + 16);
#pragma GCC unroll 12
        for (int i = 0; i < ROWS; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * lda + p]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; i++) {
        _mm512_mask_storeu_ps(c + i * ldc, m0, c0[i]);
        _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1[i]);
    }
}

static void fa_f32_gemm_ukernel_12x32__avx512(int64_t mr, int64_t nr, int64_t k, const float *a,
                                             int64_t lda, const float *b, int64_t ldb, float *c,
                                             int64_t ldc, int accumulate)
{
#define ROWS_CASE(r)                                                                          \
    case r:                                                                                   \
        gemm_rows__avx512(r, nr, k, a, lda, b, ldb, c, ldc, accumulate);                      \
        break;
    switch (mr) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6)
        ROWS_CASE(7) ROWS_CASE(8) ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12)
    }
#undef ROWS_CASE
}

/* SLEEF's Sleef_expf16_u10avx512f: max error 1.0 ULP (SLEEF's documented bound; measured over
 * every float <= 0 by tests/check_simd.c). Sum: 16 lanes, then the lanes in order. */
static float fa_f32_expsum__avx512_sleef(int64_t n, const float *x, float m, float *y)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + i), vm));
        _mm512_mask_storeu_ps(y + i, mk, e);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(mk, e));
    }
    float lanes[16], sum = 0;
    _mm512_storeu_ps(lanes, vsum);
    for (int l = 0; l < 16; l++)
        sum += lanes[l];
    return sum;
}

/* Max with NaN kept: lanes that are NaN are collected in a mask and decide the result. */
static float fa_f32_scalemax__avx512(int64_t n, float *x, float scale)
{
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + i), vs);
        _mm512_mask_storeu_ps(x + i, mk, v);
        nan |= _mm512_mask_cmp_ps_mask(mk, v, v, _CMP_UNORD_Q);
        vmax = _mm512_mask_max_ps(vmax, mk, vmax, v);
    }
    return nan ? NAN : _mm512_reduce_max_ps(vmax);
}

static const fai_kernels_f32 avx512 = {
    FA_ISA_AVX512, "fa_f32_gemm_ukernel_12x32__avx512", "fa_f32_expsum__avx512_sleef", MR, NR,
    fa_f32_gemm_ukernel_12x32__avx512, fa_f32_expsum__avx512_sleef, fa_f32_scalemax__avx512,
};

const fai_kernels_f32 *fai_kernels_f32_avx512(void) { return &avx512; }
