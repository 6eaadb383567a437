/*
 * The library's only door to BLAS: row-major GEMM in f32 or f64, and the rule under which it
 * is called. Backends that call BLAS thread over independent work themselves and run each GEMM
 * on its caller's thread, so that no GEMM's summation order depends on how many threads
 * OpenBLAS would split it over (multi-threaded SGEMM results differ with the thread count).
 * OpenBLAS's thread count is process-wide: fai_with_serial_blas sets it to 1 for the duration
 * of a call and restores it after, and serializes such calls so that one cannot restore it
 * while another still runs.
 */
#include "config.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>

#include "backends/blas.h"

void fai_blas_gemm(int wide, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                   const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                   int64_t ldc)
{
    if (m == 0 || n == 0)
        return;
    const enum CBLAS_TRANSPOSE A = ta ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE B = tb ? CblasTrans : CblasNoTrans;
    if (wide)
        cblas_dgemm(CblasRowMajor, A, B, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb,
                    beta, c, (int)ldc);
    else
        cblas_sgemm(CblasRowMajor, A, B, (int)m, (int)n, (int)k, (float)alpha, a, (int)lda, b,
                    (int)ldb, (float)beta, c, (int)ldc);
}

int fai_blas_dims_fit(const fai_problem *pr)
{
    return pr->sq <= INT_MAX && pr->sk <= INT_MAX && pr->dqk <= INT_MAX && pr->dv <= INT_MAX;
}

static pthread_mutex_t blas_threads_lock = PTHREAD_MUTEX_INITIALIZER;

fa_status fai_with_serial_blas(fa_status (*run)(fa_context *, const fai_problem *),
                               fa_context *ctx, const fai_problem *pr)
{
    pthread_mutex_lock(&blas_threads_lock);
#if defined(HAVE_OPENBLAS_SET_NUM_THREADS) && defined(HAVE_OPENBLAS_GET_NUM_THREADS)
    const int saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
#endif
    fa_status s = run(ctx, pr);
#if defined(HAVE_OPENBLAS_SET_NUM_THREADS) && defined(HAVE_OPENBLAS_GET_NUM_THREADS)
    openblas_set_num_threads(saved);
#endif
    pthread_mutex_unlock(&blas_threads_lock);
    return s;
}
