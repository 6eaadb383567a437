/*
 * The tile products of simd/kernels.h (fai_kernels_bf16) in portable C, for the tests only:
 * attached to this CPU's best kernel set, they let the tiled backend's bf16 tile paths (the
 * forward's strips on qk, expsum and pv, the backward's five products, their packing, padding, key
 * tile alignment and finiteness) run on every machine, where the AMX set runs only on CPUs
 * with AMX. They keep the contract's layouts and its freedom: each product sums a chunk of 32
 * terms in double and rounds once to f32 (a chunk's order is the hardware's business, so the
 * chunk boundaries are part of the bits, as they may be on AMX); subnormal bf16 inputs read as
 * 0 and subnormal sums flush to 0, as TDPBF16PS does; P is formed by the AVX512_BF16 set's exp
 * (a scalar replica) and rounded to bf16 once.
 */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "base/dtype.h"
#include "simd/exp_poly.h"
#include "simd/kernels.h"

/* A bf16 as the tiles read it (subnormals as 0: a bf16 is the high half of an f32), and an
 * f32 as they store it. */
static float tile_in(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return fabsf(x) < 0x1p-126f ? 0 * x : x;
}

static float tile_out(double x)
{
    const float f = (float)x;
    return fabsf(f) < 0x1p-126f ? 0 * f : f;
}

static void pack_kt(int64_t n, int64_t d, const uint16_t *k, int64_t ldk, uint16_t *kt, int64_t ldt)
{
    for (int64_t j = 0; j < ldt; j++)
        for (int64_t p = 0; p < d; p++)
            kt[((p / 2) * ldt + j) * 2 + p % 2] = j < n ? k[j * ldk + p] : 0;
}

static void pack_v(int64_t n, int64_t nk, int64_t dv, const uint16_t *v, int64_t ldv,
                   uint16_t *vt)
{
    for (int64_t j = 0; j < nk; j++)
        for (int64_t c = 0; c < dv; c++)
            vt[((j / 2) * dv + c) * 2 + j % 2] = j < n ? v[j * ldv + c] : 0;
}

/* c + sum_p a[p] B[p][j] over p < k (B as pairs along p, ldb pairs a pair row), a chunk of 32
 * at a time, each chunk's sum rounded once onto c. */
static float chunks(float c, const uint16_t *a, int64_t k, const uint16_t *b, int64_t ldb,
                    int64_t j)
{
    for (int64_t p0 = 0; p0 < k; p0 += 32) {
        double t = c;
        for (int64_t p = p0; p < p0 + 32 && p < k; p++)
            t += (double)tile_in(a[p]) * tile_in(b[((p / 2) * ldb + j) * 2 + p % 2]);
        c = tile_out(t);
    }
    return c;
}

static void qk(int64_t m, int64_t c0, int64_t c1, int64_t d, const uint16_t *q, int64_t ldq,
               const uint16_t *kt, int64_t ldt, float *s, int64_t lds, const float *scale)
{
    const int64_t j0 = c0 / 16 * 16, j1 = (c1 + 15) / 16 * 16, m16 = (m + 15) / 16 * 16;
    for (int64_t r = 0; r < m16; r++)
        for (int64_t j = j0; j < j1; j++) {
            const float x = chunks(0, q + r * ldq, d, kt, ldt, j);
            s[r * lds + j] = scale ? x * *scale : x;
        }
}

static void gemm(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                 const uint16_t *b, int64_t ldb, float *c, int64_t ldc, int accumulate)
{
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++)
            c[r * ldc + j] = chunks(accumulate ? c[r * ldc + j] : 0, a + r * lda, k, b, ldb, j);
}

/*
 * exp(d) for P as the AVX512_BF16 set's exp_p__avx512bf16 forms it, one lane in scalar C (its
 * comment has the derivation and the bound): d clamped at -86 (below, 0; NaN passes), n the
 * integer nearest d log2e (the product unrounded inside an FMA with 1.5 * 2^23, which a
 * subtraction removes again), f = fl(d log2e - n) by one FMA, 2^f = 1 + f e(f) with e the
 * cubic of simd/exp_poly.h in Horner form, times 2^n. The FMAs are fmaf; the steps rounded
 * on their own go through a volatile float, so that no contraction fuses them. With it the
 * tile paths and tiles_expsum_within_bound run the algorithm itself on every machine, where
 * the kernel runs only on AVX512_BF16 CPUs.
 */
static float exp_p(float d)
{
    if (d < -86.0f)
        return 0;
    if (!(d <= 128.0f)) /* NaN stays NaN and +inf gives NaN (f = inf - inf), as in the kernel;
                         * d > 0 never comes from a row's max, and overflows */
        return isnan(d) || isinf(d) ? d - d : INFINITY;
    const volatile float t = fmaf(d, FAI_LOG2E_F, 0x1.8p23f);
    const float n = t - 0x1.8p23f, f = fmaf(d, FAI_LOG2E_F, -n);
    float e = fmaf(FAI_EXP2_E3, f, FAI_EXP2_E2);
    e = fmaf(e, f, FAI_EXP2_E1);
    e = fmaf(e, f, FAI_EXP2_E0);
    return ldexpf(fmaf(e, f, 1.0f), (int)n);
}

/* P = bf16(exp(y - m)) with y = fl(scale x) and y - m each rounded on its own, and the sum of
 * the exps before rounding in the kernel's order: 16 lanes (element c in lane c % 16), then
 * their tree (the halves added, 8 + 8, 4 + 4, 2 + 2, 1 + 1). */
static float expsum(int64_t n, const float *x, float scale, float m, uint16_t *p)
{
    float lane[16] = {0};
    for (int64_t c = 0; c < n; c++) {
        const volatile float y = scale * x[c];
        const volatile float d = y - m;
        const float e = exp_p(d);
        p[c] = fai_f64_to_bf16(e);
        lane[c % 16] += e;
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            lane[i] += lane[i + w];
    return lane[0];
}

static void pv(int64_t m, int64_t nk, int64_t dv, const uint16_t *p, int64_t ldp,
               const uint16_t *vt, float *acc, int64_t ldacc, const float *a, void *scratch)
{
    (void)scratch;
    for (int64_t r = 0; r < m; r++)
        for (int64_t x = 0; x < dv; x++)
            acc[r * ldacc + x] = chunks(a[r] * acc[r * ldacc + x], p + r * ldp, nk, vt, dv, x);
}

static const fai_kernels_bf16 emulated = {
    .rows = 16,
    .keys = 32,
    .dqk_step = 32,
    .dv_step = 16,
    FAI_KERNEL(pack_kt, pack_kt),
    FAI_KERNEL(pack_v, pack_v),
    FAI_KERNEL(qk, qk),
    FAI_KERNEL(expsum, expsum),
    FAI_KERNEL(pv, pv),
    FAI_KERNEL(gemm, gemm),
};

static fai_kernels_f32 with_tiles;

static void with_tiles_fill(void)
{
    with_tiles = *fai_kernels_for(fai_isa_best(NULL));
    with_tiles.bf16 = &emulated;
}

int ht_emulated_tiles_skipped(void)
{
    const char *e = getenv("FA_TEST_EMULATED_TILES");
    return e && strcmp(e, "0") == 0;
}

const fai_kernels_f32 *ht_emulated_tiles(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, with_tiles_fill);
    return &with_tiles;
}
