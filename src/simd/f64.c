/*
 * The f64 storage path's kernels: portable double, the operations of an f32 set (kernels.h)
 * in the order the f32 sets keep (every sum in index order), so the tiled loop nest is one
 * text for both compute types.
 */
#include "config.h"

#include <math.h>

#include "base/dtype.h"
#include "core/fmath.h"
#include "core/gradient.h"
#include "simd/kernels.h"

#define F64_MR 8   /* rows per panel of the forward's packed Q */
#define F64_NR 256 /* a whole key tile per call, as the loop over a full row had it */

/* C (+)= A B over an mr x nr tile, A's element (i, p) at a[i ars + p acs]: per row, C's
 * initial value (0, or scaled on load), then the terms for p in order, then the store scale. */
static void gemm_rows_f64(int64_t ars, int64_t acs, int64_t mr, int64_t nr, int64_t k,
                          const double *a, const double *b, int64_t ldb, double *c, int64_t ldc,
                          int accumulate, const double *cscale)
{
    for (int64_t i = 0; i < mr; i++) {
        double *ci = c + i * ldc;
        for (int64_t j = 0; j < nr; j++)
            ci[j] = !accumulate ? 0 : cscale ? ci[j] * cscale[i] : ci[j];
        for (int64_t p = 0; p < k; p++) { /* p in order for every C element */
            const double aip = a[i * ars + p * acs], *bp = b + p * ldb;
#pragma GCC unroll 4
            for (int64_t j = 0; j < nr; j++)
                ci[j] += aip * bp[j];
        }
        for (int64_t j = 0; j < nr && !accumulate && cscale; j++)
            ci[j] *= cscale[i];
    }
}

static void fa_f64_gemm_ukernel_8x256__portable(int64_t mr, int64_t nr, int64_t k,
                                                const double *a, int64_t lda, const double *b,
                                                int64_t ldb, double *c, int64_t ldc,
                                                int accumulate, const double *cscale)
{
    gemm_rows_f64(lda, 1, mr, nr, k, a, b, ldb, c, ldc, accumulate, cscale);
}

static void fa_f64_gemm_at_ukernel_8x256__portable(int64_t mr, int64_t nr, int64_t k,
                                                   const double *a, int64_t lda, const double *b,
                                                   int64_t ldb, double *c, int64_t ldc,
                                                   int accumulate, const double *cscale)
{
    gemm_rows_f64(1, lda, mr, nr, k, a, b, ldb, c, ldc, accumulate, cscale);
}

static double fa_f64_expsum__portable_sleef(int64_t n, const double *x, double m, double *y)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += y[i] = fai_exp(x[i] - m);
    return sum;
}

static double fa_f64_max__portable(int64_t n, const double *x)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = fai_nanmax_f64(m, x[i]);
    return m;
}

static void fa_f64_transpose__portable(int64_t rows, int64_t cols, const double *src,
                                       int64_t lds, double *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

/* As the GEMM rounds an element: from 0, the terms in order. */
static void fa_f64_coldot__portable(int64_t n, int64_t k, const double *a, int64_t lda,
                                    const double *b, int64_t ldb, double *out)
{
    for (int64_t j = 0; j < n; j++) {
        double acc = 0;
        for (int64_t p = 0; p < k; p++)
            acc += a[p * lda + j] * b[p * ldb + j];
        out[j] = acc;
    }
}

static void fa_f64_dsoftmax__portable_sleef(int64_t n, const double *s, double lse,
                                            const double *dp, double di, double scale, double *p,
                                            double *ds)
{
    for (int64_t c = 0; c < n; c++) {
        p[c] = fai_exp(s[c] - lse);
        ds[c] = scale * fai_dscore_f64(p[c], dp[c], 1, di, 0, 0);
    }
}

static int fa_f64_finite__portable(int64_t n, const double *x)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad |= !(x[i] - x[i] == 0); /* inf - inf and NaN - NaN are NaN */
    return !bad;
}

static const fai_kernels_f64 portable = {
    .mr = F64_MR,
    .nr = F64_NR,
    .gemm = fa_f64_gemm_ukernel_8x256__portable,
    .gemm_at = fa_f64_gemm_at_ukernel_8x256__portable,
    .expsum = fa_f64_expsum__portable_sleef,
    .max = fa_f64_max__portable,
    .transpose = fa_f64_transpose__portable,
    .coldot = fa_f64_coldot__portable,
    .dsoftmax = fa_f64_dsoftmax__portable_sleef,
    .finite = fa_f64_finite__portable,
    .widen = fai_load_f64,
    .narrow = fai_store_f64,
};

const fai_kernels_f64 *fai_kernels_f64_portable(void) { return &portable; }
