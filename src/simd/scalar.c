/* The portable f32 kernels: plain C, compiled without ISA flags. The reference point of every
 * other kernel set. */
#include "config.h"

#include <math.h>

#include "base/dtype.h"
#include "core/fmath.h"
#include "core/gradient.h"
#include "simd/kernels.h"

#define SCALAR_MR 4
#define SCALAR_NR 16

/*
 * Each term is one multiply-add rounded to float from double: the product of two floats is
 * exact in double (24 + 24 bits < 53), the sum is formed in double and the running value is a
 * float again after every term, so splitting k over calls (C accumulated between them) gives
 * the same bits, as the framework's selection paths need. Without FMA (baseline x86-64 has
 * none) float arithmetic rounds product and sum apart; that put the scalar set's dK error in
 * the backend sweep at 8.54e-07 against a bound of 7.93e-07 (D=64, 256 keys).
 */
static void gemm_rows__scalar(int64_t ars, int64_t acs, int64_t mr, int64_t nr, int64_t k,
                              const float *a, const float *b, int64_t ldb, float *c, int64_t ldc,
                              int accumulate, const float *cscale)
{
    float acc[SCALAR_MR][SCALAR_NR];
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++)
            acc[i][j] = !accumulate ? 0.0f : cscale ? c[i * ldc + j] * cscale[i] : c[i * ldc + j];
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * ldb;
        for (int64_t i = 0; i < mr; i++) {
            const double ai = a[i * ars + p * acs];
            for (int64_t j = 0; j < nr; j++)
                acc[i][j] = (float)(acc[i][j] + ai * bp[j]);
        }
    }
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++)
            c[i * ldc + j] = !accumulate && cscale ? acc[i][j] * cscale[i] : acc[i][j];
}

static void fa_f32_gemm_ukernel_4x16__scalar(int64_t mr, int64_t nr, int64_t k, const float *a,
                                             int64_t lda, const float *b, int64_t ldb, float *c,
                                             int64_t ldc, int accumulate, const float *cscale)
{
    gemm_rows__scalar(lda, 1, mr, nr, k, a, b, ldb, c, ldc, accumulate, cscale);
}

static void fa_f32_gemm_at_ukernel_4x16__scalar(int64_t mr, int64_t nr, int64_t k, const float *a,
                                                int64_t lda, const float *b, int64_t ldb,
                                                float *c, int64_t ldc, int accumulate,
                                                const float *cscale)
{
    gemm_rows__scalar(1, lda, mr, nr, k, a, b, ldb, c, ldc, accumulate, cscale);
}

/* Sixteen running sums, one per residue of i mod 16, then those in order: the AVX-512 kernel's
 * order, whose rounding error grows with n / 16 rather than n (Bk is up to 256 keys). */
static float fa_f32_expsum__scalar_sleef(int64_t n, const float *x, float m, float *y)
{
    float lanes[16] = {0}, sum = 0;
    for (int64_t i = 0; i < n; i++) {
        y[i] = fai_expf(x[i] - m);
        lanes[i % 16] += y[i];
    }
    for (int l = 0; l < 16; l++)
        sum += lanes[l];
    return sum;
}

static float fa_f32_max__scalar(int64_t n, const float *x)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = fai_nanmax_f32(m, x[i]);
    return m;
}

void fai_transpose_f32_portable(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                float *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

/* As the scalar GEMM rounds an element: each multiply-add formed in double, rounded to float. */
static void fa_f32_coldot__scalar(int64_t n, int64_t k, const float *a, int64_t lda,
                                  const float *b, int64_t ldb, float *out)
{
    for (int64_t j = 0; j < n; j++) {
        float acc = 0;
        for (int64_t p = 0; p < k; p++)
            acc = (float)(acc + (double)a[p * lda + j] * b[p * ldb + j]);
        out[j] = acc;
    }
}

static void fa_f32_dsoftmax__scalar(int64_t n, const float *s, double lse, const float *dp,
                                    float di, float scale, float *p, float *ds)
{
    for (int64_t c = 0; c < n; c++) {
        p[c] = fai_expf((float)((double)s[c] - lse));
        ds[c] = scale * fai_dscore_f32(p[c], dp[c], 1, di, 0, 0);
    }
}

int fai_finite_f32_portable(int64_t n, const float *x)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad |= !(x[i] - x[i] == 0); /* inf - inf and NaN - NaN are NaN */
    return !bad;
}

/* Decode's products (simd/kernels.h), a piece of a key row at a time widened into a buffer
 * (exact). Each multiply-add formed in double and rounded to float, as the scalar GEMM rounds;
 * dot_rows sums p = 0, 1, ..., d-1 in order. */
#define PORTABLE_PIECE 64

void fai_dot_rows_f32_portable(int64_t nr, int64_t n, int64_t d, const float *q, int64_t ldq,
                               const void *k, int64_t ldk, fa_dtype kd, float *s, int64_t lds,
                               const float *scale)
{
    float piece[PORTABLE_PIECE];
    for (int64_t c = 0; c < n; c++) {
        for (int64_t r = 0; r < nr; r++)
            s[r * lds + c] = 0;
        for (int64_t p0 = 0; p0 < d; p0 += PORTABLE_PIECE) {
            const int64_t m = d - p0 < PORTABLE_PIECE ? d - p0 : PORTABLE_PIECE;
            fai_load_f32((const char *)k + fai_dtype_bytes(kd, c * ldk + p0), kd, m, piece);
            for (int64_t r = 0; r < nr; r++) {
                float acc = s[r * lds + c];
                for (int64_t p = 0; p < m; p++)
                    acc = (float)(acc + (double)q[r * ldq + p0 + p] * piece[p]);
                s[r * lds + c] = acc;
            }
        }
        for (int64_t r = 0; scale && r < nr; r++)
            s[r * lds + c] *= *scale;
    }
}

void fai_pv_rows_f32_portable(int64_t nr, int64_t n, int64_t dv, const float *p, int64_t ldp,
                              const void *v, int64_t ldv, fa_dtype vd, float *acc, int64_t lda)
{
    float piece[PORTABLE_PIECE];
    for (int64_t c = 0; c < n; c++)
        for (int64_t p0 = 0; p0 < dv; p0 += PORTABLE_PIECE) {
            const int64_t m = dv - p0 < PORTABLE_PIECE ? dv - p0 : PORTABLE_PIECE;
            fai_load_f32((const char *)v + fai_dtype_bytes(vd, c * ldv + p0), vd, m, piece);
            for (int64_t r = 0; r < nr; r++) {
                const double w = p[r * ldp + c];
                float *a = acc + r * lda + p0;
                for (int64_t e = 0; e < m; e++)
                    a[e] = (float)(a[e] + w * piece[e]);
            }
        }
}

static const fai_kernels_f32 scalar = {
    .isa = FA_ISA_SCALAR,
    .mr = SCALAR_MR,
    .nr = SCALAR_NR,
    FAI_KERNEL(gemm, fa_f32_gemm_ukernel_4x16__scalar),
    FAI_KERNEL(gemm_at, fa_f32_gemm_at_ukernel_4x16__scalar),
    FAI_KERNEL(expsum, fa_f32_expsum__scalar_sleef),
    FAI_KERNEL(max, fa_f32_max__scalar),
    FAI_KERNEL(transpose, fai_transpose_f32_portable),
    FAI_KERNEL(coldot, fa_f32_coldot__scalar),
    FAI_KERNEL(dsoftmax, fa_f32_dsoftmax__scalar),
    FAI_KERNEL(finite, fai_finite_f32_portable),
    FAI_KERNEL(widen, fai_load_f32),
    FAI_KERNEL(narrow, fai_store_f32),
    FAI_KERNEL(dot_rows, fai_dot_rows_f32_portable),
    FAI_KERNEL(pv_rows, fai_pv_rows_f32_portable),
};

const fai_kernels_f32 *fai_kernels_scalar(void) { return &scalar; }
