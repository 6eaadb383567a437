/* The framework's GEMM loop: MR x NR tiles of C, each by the ISA's micro-kernel. The k loop
 * stays inside the micro-kernel, so every C element sums its products in index order. */
#include "config.h"

#include "simd/kernels.h"

void fai_gemm_f32(const fai_kernels_f32 *kt, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                  int accumulate, const float *cscale)
{
    for (int64_t i = 0; i < m; i += kt->mr) {
        const int64_t mr = m - i < kt->mr ? m - i : kt->mr;
        for (int64_t j = 0; j < n; j += kt->nr) {
            const int64_t nr = n - j < kt->nr ? n - j : kt->nr;
            kt->gemm(mr, nr, k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate,
                     cscale ? cscale + i : NULL);
        }
    }
}

void fai_gemm_at_f32(const fai_kernels_f32 *kt, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                     int accumulate, const float *cscale)
{
    for (int64_t i = 0; i < m; i += kt->mr) {
        const int64_t mr = m - i < kt->mr ? m - i : kt->mr;
        for (int64_t j = 0; j < n; j += kt->nr) {
            const int64_t nr = n - j < kt->nr ? n - j : kt->nr;
            kt->gemm_at(mr, nr, k, a + i, lda, b + j, ldb, c + i * ldc + j, ldc, accumulate,
                        cscale ? cscale + i : NULL);
        }
    }
}
