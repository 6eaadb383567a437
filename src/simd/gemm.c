/* The framework's GEMM loop: MR x NR tiles of C, each by the set's micro-kernel. The k loop
 * stays inside the micro-kernel, so every C element sums its products in index order.
 * FAI_GEMM_LOOP(T, slot, a_tile) defines one form: a_tile is where A's tile of C row i starts
 * (A row-major: row i; stored transposed: column i). */
#include "config.h"

#include "simd/kernels.h"

#define FAI_GEMM_LOOP(name, T, slot, a_tile)                                                    \
    void name(const fai_kernels_##T *kt, int64_t m, int64_t n, int64_t k, const FT_##T *a,       \
              int64_t lda, const FT_##T *b, int64_t ldb, FT_##T *c, int64_t ldc, int accumulate, \
              const FT_##T *cscale)                                                             \
    {                                                                                           \
        for (int64_t i = 0; i < m; i += kt->mr) {                                               \
            const int64_t mr = m - i < kt->mr ? m - i : kt->mr;                                 \
            for (int64_t j = 0; j < n; j += kt->nr) {                                           \
                const int64_t nr = n - j < kt->nr ? n - j : kt->nr;                             \
                kt->slot(mr, nr, k, a_tile, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate,  \
                         cscale ? cscale + i : NULL);                                           \
            }                                                                                   \
        }                                                                                       \
    }

#define FT_f32 float
#define FT_f64 double
FAI_GEMM_LOOP(fai_gemm_f32, f32, gemm, a + i * lda)
FAI_GEMM_LOOP(fai_gemm_at_f32, f32, gemm_at, a + i)
FAI_GEMM_LOOP(fai_gemm_f64, f64, gemm, a + i * lda)
FAI_GEMM_LOOP(fai_gemm_at_f64, f64, gemm_at, a + i)
