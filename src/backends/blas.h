/* The backends' only door to BLAS (backends/blas.c), used by the reference and the
 * conventional path. */
#ifndef FAI_BACKENDS_BLAS_H
#define FAI_BACKENDS_BLAS_H

#include "backends/problem.h"

/* C = alpha op(A) op(B) + beta C, row-major; f64 if wide, else f32. Call only inside
 * fai_with_serial_blas, and only when fai_blas_dims_fit. */
void fai_blas_gemm(int wide, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                   const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                   int64_t ldc);
int fai_blas_dims_fit(const fai_problem *pr);
/* Runs run(ctx, pr) with OpenBLAS on one thread, serialized against other such runs. */
fa_status fai_with_serial_blas(fa_status (*run)(fa_context *, const fai_problem *),
                               fa_context *ctx, const fai_problem *pr);

#endif
