/*
 * The kernel sets of src/simd/, each ISA this CPU runs (others are skipped, and say so):
 * the GEMM micro-kernels against float64 on sizes below, at and above their MR x NR tile;
 * the summation-order contract the backward relies on (a C element's bits do not depend on
 * which other rows and columns are computed with it); and the vector exp over every float
 * <= 0 against float64 exp, with the bound it is documented to keep.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "base/dtype.h"
#include "simd/kernels.h"

/* The f32 set of ht_isas[i] (every set of the registry), or NULL where it cannot run here or
 * its f32 kernels are tested already (ht_isa_distinct: an earlier set's). */
static const fai_kernels_f32 *kernels_or_skip(int i)
{
    const fai_kernels_f32 *k = fai_kernels_for(ht_isas[i]);
    if (!k)
        fprintf(stderr, "check_kernels: %s kernels not runnable here: skipped\n",
                fa_isa_name(ht_isas[i]));
    else if (!ht_isa_distinct(i, FA_F32)) /* an earlier set's f32 kernels */
        return NULL;
    return k;
}

static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24) * 2 - 1);
}

START_TEST(gemm_matches_float64)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t ms[] = {1, 2, kt->mr - 1, kt->mr, kt->mr + 1, 2 * kt->mr + 3};
    const int64_t ns[] = {1, 3, kt->nr - 1, kt->nr, kt->nr + 1, 2 * kt->nr + 5};
    const int64_t ks[] = {0, 1, 7, 64, 129};
    uint64_t seed = 11;
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t c = 0; c < 5; c++)
                for (int acc = 0; acc < 3; acc++) { /* 2: accumulate onto rescaled rows */
                    const int64_t m = ms[a] > 0 ? ms[a] : 1, n = ns[b] > 0 ? ns[b] : 1, k = ks[c];
                    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;
                    float *A = malloc(sizeof(float) * (size_t)(m * lda + 1));
                    float *B = malloc(sizeof(float) * (size_t)(k * ldb + 1));
                    float *C = malloc(sizeof(float) * (size_t)(m * ldc + 1));
                    for (int64_t x = 0; x < m * lda; x++)
                        A[x] = rnd(&seed);
                    for (int64_t x = 0; x < k * ldb; x++)
                        B[x] = rnd(&seed);
                    for (int64_t x = 0; x < m * ldc; x++)
                        C[x] = rnd(&seed);
                    float *C0 = malloc(sizeof(float) * (size_t)(m * ldc + 1));
                    float *rs = malloc(sizeof(float) * (size_t)m);
                    for (int64_t i = 0; i < m; i++)
                        rs[i] = i % 3 == 1 ? 1.0f : (rnd(&seed) + 1.5f) / 2; /* 1 is exact */
                    memcpy(C0, C, sizeof(float) * (size_t)(m * ldc));
                    fai_gemm_f32(kt, m, n, k, A, lda, B, ldb, C, ldc, acc > 0, acc == 2 ? rs : NULL);
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < ldc; j++) {
                            if (j >= n) { /* padding between rows is never written */
                                ck_assert(C[i * ldc + j] == C0[i * ldc + j]);
                                continue;
                            }
                            const float c0 = acc == 2 ? C0[i * ldc + j] * rs[i] : C0[i * ldc + j];
                            double want = acc ? c0 : 0, mag = fabs(want);
                            for (int64_t p = 0; p < k; p++) {
                                want += (double)A[i * lda + p] * B[p * ldb + j];
                                mag += fabs((double)A[i * lda + p] * B[p * ldb + j]);
                            }
                            /* k + 1 roundings, each at most eps/2 of the running magnitude */
                            ck_assert_msg(fabs(C[i * ldc + j] - want) <= (k + 1) * 0x1p-24 * mag + 1e-30,
                                          "%s m%ld n%ld k%ld acc%d C[%ld][%ld] = %.9g, want %.9g",
                                          kt->gemm_name, (long)m, (long)n, (long)k, acc, (long)i,
                                          (long)j, C[i * ldc + j], want);
                        }
                    free(A), free(B), free(C), free(C0), free(rs);
                }
}
END_TEST

/* C[i][j]'s bits do not depend on the block it is computed in: the whole product, one row at
 * a time, and column windows agree bit for bit. The tiled backward recomputes single score
 * rows and relies on this to reproduce the forward's score tile exactly. */
START_TEST(gemm_element_independent_of_blocking)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t m = 2 * kt->mr + 1, n = 3 * kt->nr + 7, k = 77;
    float *A = malloc(sizeof(float) * m * k), *B = malloc(sizeof(float) * k * n);
    float *C = malloc(sizeof(float) * m * n), *R = malloc(sizeof(float) * n);
    uint64_t seed = 5;
    for (int64_t x = 0; x < m * k; x++)
        A[x] = rnd(&seed) * 40;
    for (int64_t x = 0; x < k * n; x++)
        B[x] = rnd(&seed);
    fai_gemm_f32(kt, m, n, k, A, k, B, n, C, n, 0, NULL);
    for (int64_t i = 0; i < m; i++) {
        fai_gemm_f32(kt, 1, n, k, A + i * k, k, B, n, R, n, 0, NULL);
        ck_assert(memcmp(R, C + i * n, sizeof(float) * n) == 0);
        for (int64_t c0 = 0; c0 < n; c0 += 13) { /* a window [c0, c0 + w) on its own */
            const int64_t w = n - c0 < 9 ? n - c0 : 9;
            fai_gemm_f32(kt, 1, w, k, A + i * k, k, B + c0, n, R, n, 0, NULL);
            ck_assert(memcmp(R, C + i * n + c0, sizeof(float) * w) == 0);
        }
    }
    free(A), free(B), free(C), free(R);
}
END_TEST

/* Without accumulate, cscale multiplies the finished product: each element is the unscaled
 * kernel result times the row's factor, rounded once (the forward's S = scale (Q K^T) must
 * have the bits of the score pipeline's multiply, which the backward repeats). */
START_TEST(gemm_store_scale_rounds_once)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t m = 2 * kt->mr + 1, n = 2 * kt->nr + 3, k = 45;
    float *A = malloc(sizeof(float) * m * k), *B = malloc(sizeof(float) * k * n);
    float *U = malloc(sizeof(float) * m * n), *S = malloc(sizeof(float) * m * n);
    float rs[64];
    uint64_t seed = 23;
    for (int64_t x = 0; x < m * k; x++)
        A[x] = rnd(&seed) * 30;
    for (int64_t x = 0; x < k * n; x++)
        B[x] = rnd(&seed);
    for (int64_t i = 0; i < m; i++)
        rs[i] = i == 1 ? 0.0883883476f : (rnd(&seed) + 1.5f) / 3; /* 1/sqrt(128) */
    fai_gemm_f32(kt, m, n, k, A, k, B, n, U, n, 0, NULL);
    fai_gemm_f32(kt, m, n, k, A, k, B, n, S, n, 0, rs);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float want = U[i * n + j] * rs[i];
            ck_assert_msg(memcmp(&want, &S[i * n + j], 4) == 0, "%s C[%ld][%ld] = %a, want %a",
                          kt->gemm_name, (long)i, (long)j, (double)S[i * n + j], (double)want);
        }
    free(A), free(B), free(U), free(S);
}
END_TEST

/* coldot's out[j] has the bits of the GEMM kernel's C element for the same column pair (the
 * backward's D_i must round as dP does), at widths around every vector length. */
START_TEST(coldot_rounds_as_gemm)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t k = 131, lda = 45, ldb = 47;
    float *a = malloc(sizeof(float) * k * lda), *b = malloc(sizeof(float) * k * ldb);
    float out[41], arow[131], bcol[131];
    uint64_t seed = 9;
    for (int64_t x = 0; x < k * lda; x++)
        a[x] = rnd(&seed) * 3;
    for (int64_t x = 0; x < k * ldb; x++)
        b[x] = rnd(&seed);
    for (int64_t n = 1; n <= 40; n++) {
        for (int64_t j = 0; j < 41; j++)
            out[j] = 1234.5f;
        kt->coldot(n, k, a, lda, b, ldb, out);
        for (int64_t j = n; j < 41; j++) /* beyond n: untouched */
            ck_assert(out[j] == 1234.5f);
        for (int64_t j = 0; j < n; j++) {
            for (int64_t p = 0; p < k; p++) {
                arow[p] = a[p * lda + j];
                bcol[p] = b[p * ldb + j];
            }
            float c;
            fai_gemm_f32(kt, 1, 1, k, arow, k, bcol, 1, &c, 1, 0, NULL);
            ck_assert_msg(memcmp(&c, &out[j], 4) == 0, "%s n=%ld out[%ld] = %a, GEMM %a",
                          kt->coldot_name, (long)n, (long)j, (double)out[j], (double)c);
        }
    }
    free(a), free(b);
}
END_TEST

/* dsoftmax: P from the exp kernel on (float)(s - lse) formed in double, dS = scale (P (dp - di))
 * in that order, for every length around the vector widths; nothing written beyond n. */
START_TEST(dsoftmax_matches_definition)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    uint64_t seed = 21;
    const double lse = 95.123456789012; /* large logits: the subtraction must be in double */
    for (int64_t n = 1; n <= 37; n++) {
        float s[40], dp[40], p[40], ds[40], x[40], want_p[40];
        for (int64_t c = 0; c < 40; c++) {
            s[c] = (float)(lse + rnd(&seed) * 8);
            dp[c] = rnd(&seed);
            p[c] = ds[c] = 1234.5f;
        }
        const float di = 0.3125f, scale = 0.125f;
        kt->dsoftmax(n, s, lse, dp, di, scale, p, ds);
        for (int64_t c = 0; c < n; c++)
            x[c] = (float)((double)s[c] - lse);
        kt->expsum(n, x, 0.0f, want_p);
        for (int64_t c = 0; c < 40; c++) {
            const float wp = c < n ? want_p[c] : 1234.5f;
            const float wds = c < n ? scale * (want_p[c] * (dp[c] - di)) : 1234.5f;
            ck_assert_msg(memcmp(&p[c], &wp, 4) == 0 && memcmp(&ds[c], &wds, 4) == 0,
                          "%s n=%ld c=%ld: p %a (want %a) ds %a (want %a)", kt->dsoftmax_name,
                          (long)n, (long)c, (double)p[c], (double)wp, (double)ds[c], (double)wds);
        }
    }
}
END_TEST

/* finite: false for one inf, -inf or NaN at any place, true for the extremes of the finite
 * floats; what lies beyond n is not read into the answer. */
START_TEST(finite_detects_each_position)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const float bad[3] = {INFINITY, -INFINITY, NAN};
    float x[41];
    for (int64_t n = 0; n <= 40; n++) {
        for (int64_t i = 0; i < 41; i++)
            x[i] = i % 3 == 0 ? 0x1.fffffep127f : i % 3 == 1 ? -0x1p-149f : 0.0f;
        x[n] = NAN; /* just past the end */
        ck_assert_msg(kt->finite(n, x), "%s n=%ld", kt->finite_name, (long)n);
        for (int64_t i = 0; i < n; i++)
            for (int b = 0; b < 3; b++) {
                const float keep = x[i];
                x[i] = bad[b];
                ck_assert_msg(!kt->finite(n, x), "%s n=%ld: %g at %ld", kt->finite_name,
                              (long)n, (double)bad[b], (long)i);
                x[i] = keep;
            }
    }
}
END_TEST

/* widen: every f16 and bf16 bit pattern (NaN payloads included) to the bits of the portable
 * conversion, then a short unaligned call with a partial vector; every FP8 code at every
 * lane and every tail length 0 .. 39; nothing written beyond n. */
START_TEST(widen_every_half)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t n = 65536;
    uint16_t *h = malloc(sizeof(uint16_t) * 65536);
    float *got = malloc(sizeof(float) * 65536), *want = malloc(sizeof(float) * 65536);
    for (int64_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)(i * 7919); /* every pattern once, in a shuffled order */
    const fa_dtype ds[2] = {FA_F16, FA_BF16};
    for (int d = 0; d < 2; d++) {
        for (int64_t i = 0; i < 65536; i++)
            got[i] = want[i] = 1234.5f;
        kt->widen(h, ds[d], n, got);
        fai_load_f32(h, ds[d], n, want);
        ck_assert_msg(memcmp(got, want, sizeof(float) * 65536) == 0, "%s %s",
                      kt->widen_name, fa_dtype_name(ds[d]));
        kt->widen(h + 1, ds[d], 3, got); /* short and unaligned */
        fai_load_f32(h + 1, ds[d], 3, want);
        ck_assert(memcmp(got, want, sizeof(float) * 4) == 0);
    }
    const fa_dtype fp8[2] = {FA_E4M3, FA_E5M2}; /* every code, each at every lane, and tails */
    uint8_t *c = (uint8_t *)h;
    for (int64_t i = 0; i < 4096; i++)
        c[i] = (uint8_t)(i * 37 + i / 256);
    for (int d = 0; d < 2; d++) {
        for (int64_t len = 0; len <= 40; len++) {
            const int64_t m = len == 40 ? 4096 : len;
            for (int64_t i = 0; i < 4097; i++)
                got[i] = want[i] = 1234.5f;
            kt->widen(c + 1, fp8[d], m, got);
            fai_load_f32(c + 1, fp8[d], m, want);
            ck_assert_msg(memcmp(got, want, sizeof(float) * 4097) == 0, "%s %s, %lld codes",
                          kt->widen_name, fa_dtype_name(fp8[d]), (long long)m);
        }
    }
    free(h), free(got), free(want);
}
END_TEST

/* narrow: the bits of the portable rounding (f16 NaN: any NaN; bf16: the same bits, NaN
 * included) for every 4369th float, and for every finite f16 or bf16 value's neighbourhood in
 * f32 (the value, the halfway point to the next one and one f32 ulp either side of it: where
 * ties to even decide; the last one is the overflow threshold), all in one call; then every
 * length 0 .. 40 over the last 40 points (the vector tails); nothing written beyond n. */
START_TEST(narrow_rounds_as_portable)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t cap = (1 << 20) + 5 * 0x7f80;
    float *x = malloc(sizeof(float) * (size_t)cap);
    uint16_t *got = malloc(sizeof(uint16_t) * (size_t)(cap + 1));
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)(cap + 1));
    const fa_dtype dts[2] = {FA_F16, FA_BF16};
    for (int t = 0; t < 2; t++) {
        const int bf = dts[t] == FA_BF16;
        const uint32_t inf = bf ? 0x7f80u : 0x7c00u; /* the first non-finite bit pattern */
        int64_t n = 0;
        for (uint64_t u = 0; u <= 0xffffffffu; u += 257 * 17) {
            uint32_t v = (uint32_t)u;
            memcpy(&x[n++], &v, 4);
        }
        uint32_t h = 0;
        for (; h < inf && n + 5 <= cap; h++) {
            const uint16_t h0 = (uint16_t)h, h1 = (uint16_t)(h + 1);
            const float a = (float)(bf ? fai_bf16_to_f64(h0) : fai_f16_to_f64(h0));
            const float b = (float)(bf ? fai_bf16_to_f64(h1) : fai_f16_to_f64(h1));
            /* exact: a, b and the midpoint fit in f32; past the largest finite value (b = inf)
             * the midpoint is the overflow threshold, half its ulp above it */
            const float ulp = h1 < inf ? b - a : a - x[n - 5];
            const float mid = a + ulp / 2;
            const float pts[5] = {a, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid};
            for (int k = 0; k < 5; k++)
                x[n++] = pts[k];
        }
        ck_assert(h == inf); /* every finite value got its points */
        for (int64_t len = -1; len <= 40; len++) { /* -1: all n points from x */
            const float *src = len < 0 ? x : x + n - 40;
            const int64_t m = len < 0 ? n : len;
            got[m] = want[m] = 0xabcd;
            kt->narrow(got, dts[t], m, src);
            fai_store_f32(want, dts[t], m, src);
            ck_assert(got[m] == 0xabcd);
            for (int64_t i = 0; i < m; i++) {
                const int nan_g = (got[i] & 0x7c00u) == 0x7c00u && (got[i] & 0x3ffu);
                const int nan_w = (want[i] & 0x7c00u) == 0x7c00u && (want[i] & 0x3ffu);
                ck_assert_msg(bf ? got[i] == want[i] : nan_g == nan_w && (nan_g || got[i] == want[i]),
                              "%s %s: %a -> %04x, portable %04x", kt->narrow_name,
                              fa_dtype_name(dts[t]), (double)src[i], got[i], want[i]);
            }
        }
    }
    free(x), free(got), free(want);
}
END_TEST

/* The transpose moves every element to its place and writes nothing else, at sizes below, at
 * and above the ISAs' register blocks (4, 8, 16) with leading dimensions wider than the data. */
START_TEST(transpose_exact)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t sizes[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 33, 64};
    uint64_t seed = 3;
    for (size_t a = 0; a < 11; a++)
        for (size_t b = 0; b < 11; b++) {
            const int64_t rows = sizes[a], cols = sizes[b], lds = cols + 3, ldd = rows + 5;
            float *src = malloc(sizeof(float) * (size_t)(rows * lds));
            float *dst = malloc(sizeof(float) * (size_t)(cols * ldd));
            for (int64_t x = 0; x < rows * lds; x++)
                src[x] = rnd(&seed);
            for (int64_t x = 0; x < cols * ldd; x++)
                dst[x] = 1234.5f;
            kt->transpose(rows, cols, src, lds, dst, ldd);
            for (int64_t c = 0; c < cols; c++)
                for (int64_t r = 0; r < ldd; r++)
                    ck_assert_msg(dst[c * ldd + r] == (r < rows ? src[r * lds + c] : 1234.5f),
                                  "%s %ldx%ld: dst[%ld][%ld]", kt->transpose_name, (long)rows,
                                  (long)cols, (long)c, (long)r);
            free(src), free(dst);
        }
}
END_TEST

/* Splitting k over calls (C accumulated in between) gives the bits of one call: the selection
 * paths of the tiled backend form a product from runs of its terms and rely on this. */
START_TEST(gemm_k_split_same_bits)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t m = kt->mr + 1, n = kt->nr + 3, k = 77, cuts[4] = {0, 1, 31, 77};
    float *A = malloc(sizeof(float) * m * k), *B = malloc(sizeof(float) * k * n);
    float *C1 = malloc(sizeof(float) * m * n), *C2 = malloc(sizeof(float) * m * n);
    uint64_t seed = 23;
    for (int64_t x = 0; x < m * k; x++)
        A[x] = rnd(&seed) * 7;
    for (int64_t x = 0; x < k * n; x++)
        B[x] = rnd(&seed);
    fai_gemm_f32(kt, m, n, k, A, k, B, n, C1, n, 0, NULL);
    for (int c = 0; c < 3; c++) /* terms [cuts[c], cuts[c + 1]) */
        fai_gemm_f32(kt, m, n, cuts[c + 1] - cuts[c], A + cuts[c], k, B + cuts[c] * n, n, C2, n,
                     c > 0, NULL);
    ck_assert_msg(memcmp(C1, C2, sizeof(float) * m * n) == 0, "%s", kt->gemm_name);
    free(A), free(B), free(C1), free(C2);
}
END_TEST

/* gemm_at (A stored transposed) gives the bits of gemm on the transposed copy of A, for sizes
 * around the register block, with and without accumulation. */
START_TEST(gemm_at_matches_gemm_on_transpose)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    const int64_t ms[] = {1, kt->mr - 1, kt->mr, 2 * kt->mr + 3}, n = 2 * kt->nr + 5, k = 67;
    uint64_t seed = 17;
    for (size_t a = 0; a < 4; a++)
        for (int acc = 0; acc < 4; acc++) { /* 2, 3: row factors on C's load, on the store */
            const int64_t m = ms[a] > 0 ? ms[a] : 1, lda_t = m + 3;
            float rs[64];
            for (int64_t i = 0; i < m; i++)
                rs[i] = (rnd(&seed) + 1.5f) / 2;
            float *At = malloc(sizeof(float) * (size_t)(k * lda_t)), *A = malloc(sizeof(float) * (size_t)(m * k));
            float *B = malloc(sizeof(float) * (size_t)(k * n));
            float *C1 = malloc(sizeof(float) * (size_t)(m * n)), *C2 = malloc(sizeof(float) * (size_t)(m * n));
            for (int64_t x = 0; x < k * lda_t; x++)
                At[x] = rnd(&seed) * 5;
            for (int64_t x = 0; x < k * n; x++)
                B[x] = rnd(&seed);
            for (int64_t x = 0; x < m * n; x++)
                C1[x] = C2[x] = rnd(&seed);
            for (int64_t i = 0; i < m; i++)
                for (int64_t p = 0; p < k; p++)
                    A[i * k + p] = At[p * lda_t + i];
            const int accumulate = acc % 2;
            fai_gemm_at_f32(kt, m, n, k, At, lda_t, B, n, C1, n, accumulate, acc >= 2 ? rs : NULL);
            fai_gemm_f32(kt, m, n, k, A, k, B, n, C2, n, accumulate, acc >= 2 ? rs : NULL);
            ck_assert_msg(memcmp(C1, C2, sizeof(float) * (size_t)(m * n)) == 0, "%s m=%ld acc=%d",
                          kt->gemm_at_name, (long)m, acc);
            free(At), free(A), free(B), free(C1), free(C2);
        }
}
END_TEST

/*
 * Decode's products against float64 on stored keys (f32, f16, bf16; head dims below, at and
 * past the vector widths, a key stride with a gap), and their grouping contract: a score's
 * bits do not depend on which rows and keys share the call, P V's on how the keys are split
 * or the rows grouped.
 */
static void fill_stored(void *dst, fa_dtype dt, int64_t n, uint64_t *seed)
{
    float *f = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t x = 0; x < n; x++)
        f[x] = rnd(seed);
    fai_store_f32(dst, dt, n, f);
    free(f);
}

static double stored_at(const void *src, fa_dtype dt, int64_t x)
{
    float f;
    fai_load_f32((const char *)src + x * (int64_t)fai_dtype_size(dt), dt, 1, &f);
    return f;
}

START_TEST(decode_products_match_float64)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    static const fa_dtype dts[3] = {FA_F32, FA_F16, FA_BF16};
    static const int64_t ds[] = {1, 15, 16, 64, 80, 128, 129};
    uint64_t seed = 23;
    for (int t = 0; t < 3; t++)
        for (size_t a = 0; a < sizeof ds / sizeof *ds; a++) {
            const fa_dtype dt = dts[t];
            const int64_t d = ds[a], nr = 7, n = 150, ldk = d + 5, ldq = d + 1, lds = n + 3;
            const size_t es = fai_dtype_size(dt);
            float *q = malloc(sizeof(float) * (size_t)(nr * ldq));
            void *k = malloc(es * (size_t)(n * ldk));
            const size_t sb = sizeof(float) * (size_t)(nr * lds), ab = sizeof(float) * (size_t)(nr * ldk);
            float *s = malloc(sb), *s2 = malloc(sb);
            float *p = malloc(sizeof(float) * (size_t)(nr * lds));
            float *acc = malloc(ab), *acc2 = malloc(ab);
            for (int64_t x = 0; x < nr * ldq; x++)
                q[x] = rnd(&seed);
            fill_stored(k, dt, n * ldk, &seed);
            for (int64_t x = 0; x < nr * lds; x++)
                p[x] = (rnd(&seed) + 1) / 2, s[x] = s2[x] = -7;
            for (int64_t x = 0; x < nr * ldk; x++)
                acc[x] = acc2[x] = rnd(&seed);
            const float scale = 0.375f;
            kt->dot_rows(nr, n, d, q, ldq, k, ldk, dt, s, lds, &scale);
            kt->pv_rows(nr, n, d, p, lds, k, ldk, dt, acc, ldk); /* V = the same rows */
            for (int64_t r = 0; r < nr; r++)
                for (int64_t c = 0; c < lds; c++) {
                    if (c >= n) {
                        ck_assert_msg(s[r * lds + c] == -7, "%s wrote past its keys",
                                      kt->dot_rows_name);
                        continue;
                    }
                    double ref = 0, mag = 0;
                    for (int64_t x = 0; x < d; x++) {
                        const double term = (double)q[r * ldq + x] * stored_at(k, dt, c * ldk + x);
                        ref += term, mag += fabs(term);
                    }
                    ref *= scale, mag *= scale;
                    const double err = fabs(s[r * lds + c] - ref);
                    ck_assert_msg(err <= 1e-6 * (mag + 1), "%s %s d=%ld (%ld,%ld): %g vs %g",
                                  kt->dot_rows_name, fa_dtype_name(dt), (long)d, (long)r, (long)c,
                                  (double)s[r * lds + c], ref);
                }
            for (int64_t r = 0; r < nr; r++)
                for (int64_t x = 0; x < ldk; x++) {
                    if (x >= d) {
                        ck_assert_msg(acc[r * ldk + x] == acc2[r * ldk + x], "%s wrote past dv",
                                      kt->pv_rows_name);
                        continue;
                    }
                    double ref = acc2[r * ldk + x], mag = fabs(ref);
                    for (int64_t c = 0; c < n; c++) {
                        const double term = (double)p[r * lds + c] * stored_at(k, dt, c * ldk + x);
                        ref += term, mag += fabs(term);
                    }
                    ck_assert_msg(fabs(acc[r * ldk + x] - ref) <= 1e-6 * (mag + 1),
                                  "%s %s dv=%ld (%ld,%ld): %g vs %g", kt->pv_rows_name,
                                  fa_dtype_name(dt), (long)d, (long)r, (long)x,
                                  (double)acc[r * ldk + x], ref);
                }
            /* grouping: rows 0-2 and 3-6 apart, keys in runs of 1, 3 and the rest */
            const int64_t runs[3] = {1, 3, n - 4};
            for (int64_t r0 = 0; r0 < nr; r0 += 3)
                for (int64_t c0 = 0, u = 0; u < 3; c0 += runs[u++]) {
                    const int64_t m = nr - r0 < 3 ? nr - r0 : 3;
                    const char *kc = (const char *)k + (size_t)(c0 * ldk) * es;
                    kt->dot_rows(m, runs[u], d, q + r0 * ldq, ldq, kc, ldk, dt, s2 + r0 * lds + c0,
                                 lds, &scale);
                    kt->pv_rows(m, runs[u], d, p + r0 * lds + c0, lds, kc, ldk, dt, acc2 + r0 * ldk,
                                ldk);
                }
            ck_assert_msg(!memcmp(s, s2, sb),
                          "%s %s d=%ld: scores depend on the grouping", kt->dot_rows_name,
                          fa_dtype_name(dt), (long)d);
            ck_assert_msg(!memcmp(acc, acc2, ab),
                          "%s %s d=%ld: P V depends on the key split", kt->pv_rows_name,
                          fa_dtype_name(dt), (long)d);
            free(q), free(k), free(s), free(s2), free(p), free(acc), free(acc2);
        }
}
END_TEST

/*
 * Every float x <= 0 (2^31 of them, -0 and -inf included): expsum's y = exp(x - 0) against
 * float64 exp. SLEEF documents its u10 functions as within 1.0 ULP; the measured maximum over
 * the whole domain must stay within that, and the sum must be the sum of the y in a fixed order.
 *
 * One test for every distinct expsum of the sets this CPU runs: sets that share a kernel
 * (AMX and AVX512_BF16 keep the AVX-512 set's f32 slots) test it once, and each float's
 * float64 exp and its ULP are formed once for all kernels. (Per set, with the reference formed
 * per set, this test took 294 of check_flashattn's 400 s on a Xeon that runs five sets.)
 */
#define EXP_KERNELS 8

/* The ULP of the exact e in units of the last place of e's binade (subnormals: 2^-149). */
static double ulp_of(double e)
{
    if (e == 0)
        return 0x1p-149;
    int ex;
    frexp(e, &ex);
    return ldexp(1.0, (ex - 1 < -126 ? -126 : ex - 1) - 23);
}

START_TEST(expsum_exhaustive_nonpositive)
{
    const fai_kernels_f32 *kts[EXP_KERNELS];
    int nk = 0;
    for (int i = 0; i < ht_nisas; i++) {
        const fai_kernels_f32 *kt = kernels_or_skip(i);
        int seen = !kt;
        for (int j = 0; j < nk && !seen; j++)
            seen = kts[j]->expsum == kt->expsum;
        if (!seen) {
            ck_assert(nk < EXP_KERNELS);
            kts[nk++] = kt;
        }
    }
    ck_assert(nk > 0); /* the portable set runs everywhere */
    const uint32_t first = 0x80000000u, last = 0xff800000u; /* -0 ... -inf */
    const int64_t chunk = 1 << 16;
    /* Under emulation (qemu, the cross-built NEON run) every float would take hours:
     * FA_TEST_EXP_STRIDE=k tests every k-th float instead, and says so. */
    const char *stride_env = getenv("FA_TEST_EXP_STRIDE");
    const int64_t stride = stride_env && atoll(stride_env) > 1 ? atoll(stride_env) : 1;
    double worst[EXP_KERNELS] = {0};
    float worst_x[EXP_KERNELS] = {0};
    int bad_sum[EXP_KERNELS] = {0};
#pragma omp parallel
    {
        float *x = malloc(sizeof(float) * chunk), *y = malloc(sizeof(float) * chunk * nk);
        double *e = malloc(sizeof(double) * chunk), *u = malloc(sizeof(double) * chunk);
        double my_worst[EXP_KERNELS] = {0};
        float my_x[EXP_KERNELS] = {0};
#pragma omp for schedule(dynamic, 16)
        for (int64_t base = first; base <= (int64_t)last; base += chunk * stride) {
            const int64_t left = ((int64_t)last - base) / stride + 1;
            const int64_t n = left < chunk ? left : chunk;
            for (int64_t t = 0; t < n; t++) {
                uint32_t w = (uint32_t)(base + t * stride < (int64_t)last ? base + t * stride : last);
                memcpy(&x[t], &w, 4);
                e[t] = exp((double)x[t]);
                u[t] = ulp_of(e[t]);
            }
            for (int k = 0; k < nk; k++) {
                float *yk = y + k * chunk;
                const float s = kts[k]->expsum(n, x, 0.0f, yk);
                for (int64_t t = 0; t < n; t++) {
                    const double err = fabs((double)yk[t] - e[t]) / u[t];
                    if (err > my_worst[k]) {
                        my_worst[k] = err;
                        my_x[k] = x[t];
                    }
                }
                if (!(s >= 0) || (n > 0 && !(s >= yk[0])))
#pragma omp atomic write
                    bad_sum[k] = 1;
            }
        }
#pragma omp critical
        for (int k = 0; k < nk; k++)
            if (my_worst[k] > worst[k]) {
                worst[k] = my_worst[k];
                worst_x[k] = my_x[k];
            }
        free(x), free(y), free(e), free(u);
    }
    for (int k = 0; k < nk; k++) {
        const fai_kernels_f32 *kt = kts[k];
        fprintf(stderr, "check_kernels: %s: max error over %s floats <= 0: %.3f ULP (at x = %a)\n",
                kt->expsum_name, stride > 1 ? "every FA_TEST_EXP_STRIDE-th of the" : "all",
                worst[k], (double)worst_x[k]);
        ck_assert_msg(worst[k] <= 1.0, "%s: %.3f ULP at x = %a", kt->expsum_name, worst[k],
                      (double)worst_x[k]);
        ck_assert_msg(!bad_sum[k], "%s: the sum is negative or below its first term",
                      kt->expsum_name);
        /* x > 0 reaches the kernel too (the backward's s - LSE rounds above 0; a caller's LSE
         * may be anything): every 97th float up to the overflow threshold, within the same
         * bound, and inf above it, NaN for NaN */
        double above = 0;
        const uint32_t top = 0x42b17218u; /* 88.7228394 = the largest x with finite expf(x) */
        float xs[256], ys[256];
        for (uint32_t w = 1; w <= top;) {
            int64_t n = 0;
            for (; n < 256 && w <= top; n++, w += 97)
                memcpy(&xs[n], &w, 4);
            kt->expsum(n, xs, 0.0f, ys);
            for (int64_t t = 0; t < n; t++) {
                const double ex = exp((double)xs[t]);
                const double err = fabs((double)ys[t] - ex) / ulp_of(ex);
                above = err > above ? err : above;
            }
        }
        ck_assert_msg(above <= 1.0, "%s: %.3f ULP for x > 0", kt->expsum_name, above);
        const float over[4] = {88.7229f, 100.0f, INFINITY, NAN};
        kt->expsum(4, over, 0.0f, ys);
        ck_assert(ys[0] == INFINITY && ys[1] == INFINITY && ys[2] == INFINITY && isnan(ys[3]));
        /* the sum of a short vector, exactly as the kernel defines it: here all terms are 1 */
        float ones[37], z[37];
        memset(ones, 0, sizeof ones);
        ck_assert(kt->expsum(37, ones, 0.0f, z) == 37.0f);
    }
}
END_TEST

/* max: the largest element, NaN if any is NaN (at every position, so in every running maximum
 * and every tail), -inf for none, for every length up to past three times 64 (the AVX-512
 * kernel's four-vector step); elements beyond n are not read into it. */
START_TEST(max_matches_definition)
{
    const fai_kernels_f32 *kt = kernels_or_skip(_i);
    if (!kt)
        return;
    uint64_t seed = 3;
    float x[210];
    for (int64_t n = 0; n <= 200; n++)
        for (int64_t nan_at = -1; nan_at < n; nan_at++) {
            for (int64_t i = 0; i < 210; i++)
                x[i] = rnd(&seed) * 1000;
            for (int64_t i = n; i < 210; i++)
                x[i] = i % 2 ? INFINITY : NAN; /* outside: must not count */
            if (nan_at >= 0)
                x[nan_at] = NAN;
            float m = kt->max(n, x), want = -INFINITY;
            for (int64_t i = 0; i < n; i++)
                want = x[i] > want || x[i] != x[i] ? x[i] : want;
            ck_assert_msg(m == want || (isnan(m) && isnan(want)), "%s n=%ld: %g vs %g",
                          kt->gemm_name, (long)n, m, want);
        }
}
END_TEST

/* ------------------------------------------------------------------ bf16 tile products */

/* The sets of tile products under test, _i: 0 AMX's, 1 AVX512_BF16's (each where this CPU runs
 * it), 2 the portable ones the tests run the tile paths on elsewhere (tests/tiles_emulated.c),
 * held to the same contract. The f32 set they belong to, or NULL (skipped). */
enum { TILE_SETS = 3 };

static const fai_kernels_f32 *tile_set_or_skip(int i)
{
    if (i == 2)
        return ht_emulated_tiles_skipped() ? NULL : ht_emulated_tiles();
    const fa_isa isa = i == 0 ? FA_ISA_AMX : FA_ISA_AVX512BF16;
    const fai_kernels_f32 *k = fai_kernels_for(isa);
    if (!k) {
        fprintf(stderr, "check_kernels: %s tile products not runnable here: skipped\n",
                fa_isa_name(isa));
        return NULL;
    }
    ck_assert_ptr_nonnull(k->bf16);
    return k;
}

static const fai_kernels_bf16 *tiles_or_skip(int i)
{
    const fai_kernels_f32 *k = tile_set_or_skip(i);
    return k ? k->bf16 : NULL;
}

/* The packing (the AVX512_BF16 set's, AMX's too) takes only AVX-512 (BW): _i = 1 tests it
 * wherever that runs, AVX512_BF16 or not. */
static const fai_kernels_bf16 *packs_or_skip(int i)
{
#if FA_HAVE_AVX512BF16_KERNELS
    if (i == 1 && fai_cpu_supports(FA_ISA_AVX512))
        return fai_kernels_avx512bf16()->bf16;
#endif
    return i == 1 ? NULL : tiles_or_skip(i);
}

/* Every element of the packed K^T (pairs of dims) and V (pairs of keys) against the layouts'
 * formulas, the padding zero, at key counts on and off the vector and pair grids, K's row
 * stride even (the 32-bit transpose) and odd (the element loop), V's columns on and off the
 * 32-column grid. */
START_TEST(tiles_packs_match_layout)
{
    const fai_kernels_bf16 *t = packs_or_skip(_i);
    if (!t)
        return;
    static const int64_t ns[] = {1, 15, 16, 17, 63, 200}, ds[] = {32, 64, 128, 16, 48, 80};
    uint16_t *src = malloc((size_t)(200 * 140) * 2), *dst = malloc((size_t)(224 * 128) * 2);
    for (int64_t x = 0; x < 200 * 140; x++)
        src[x] = (uint16_t)(x * 40503u >> 3); /* any bits: packing moves them unchanged */
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int odd = 0; odd < 2; odd++) {
                const int64_t n = ns[a], d = ds[b], ld = d + 6 + odd, ldt = (n + 31) / 32 * 32;
                if (b < 3) { /* K^T: d is a multiple of 32 there */
                    t->pack_kt(n, d, src, ld, dst, ldt);
                    for (int64_t j = 0; j < ldt; j++)
                        for (int64_t p = 0; p < d; p++)
                            ck_assert_msg(dst[((p / 2) * ldt + j) * 2 + p % 2] ==
                                              (j < n ? src[j * ld + p] : 0),
                                          "%s n%ld d%ld ld%ld j%ld p%ld", t->pack_kt_name,
                                          (long)n, (long)d, (long)ld, (long)j, (long)p);
                }
                t->pack_v(n, ldt, d, src, ld, dst); /* V: dv a multiple of 16 */
                for (int64_t j = 0; j < ldt; j++)
                    for (int64_t c = 0; c < d; c++)
                        ck_assert_msg(dst[((j / 2) * d + c) * 2 + j % 2] ==
                                          (j < n ? src[j * ld + c] : 0),
                                      "%s n%ld dv%ld ld%ld j%ld c%ld", t->pack_v_name, (long)n,
                                      (long)d, (long)ld, (long)j, (long)c);
            }
    free(src), free(dst);
}
END_TEST

/*
 * S = Q K^T on tiles: every element of rows [0, m) and columns [c0, c1) within f32 summation's
 * bound of the exact sum of its d exact products ((d + 2) 2^-24 sum |q k|, then the scale's
 * one rounding), for m and the column range on and off the 16 x 16 tile grid, d 32 .. 128,
 * K's rows read at a stride and its padding columns zero.
 */
START_TEST(tiles_qk_matches_float64)
{
    const fai_kernels_bf16 *t = tiles_or_skip(_i);
    if (!t)
        return;
    static const int64_t ds[] = {32, 64, 128}, ms[] = {1, 2, 15, 16, 17, 18, 40};
    static const int64_t ranges[][3] = {{7, 0, 7},     {64, 0, 64},    {100, 3, 97},
                                        {200, 37, 150}, {96, 5, 30}};
    uint64_t seed = 21;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 7; b++)
            for (int c = 0; c < 5; c++) {
                const int64_t d = ds[a], m = ms[b], n = ranges[c][0], c0 = ranges[c][1],
                              c1 = ranges[c][2], ldk = d + 6, ldt = (n + 31) / 32 * 32;
                const int64_t mq = (m + 15) / 16 * 16, lds = ldt + 8;
                uint16_t *q = malloc((size_t)(mq * d) * 2), *k = malloc((size_t)(n * ldk) * 2);
                uint16_t *kt = malloc((size_t)(ldt * d) * 2);
                float *s = malloc((size_t)(mq * lds) * sizeof(float));
                for (int64_t x = 0; x < mq * d; x++)
                    q[x] = fai_f64_to_bf16(rnd(&seed) * 3);
                for (int64_t x = 0; x < n * ldk; x++)
                    k[x] = fai_f64_to_bf16(rnd(&seed) * 3);
                t->pack_kt(n, d, k, ldk, kt, ldt);
                for (int64_t j = n; j < ldt; j++)
                    for (int64_t p = 0; p < d; p++)
                        ck_assert_int_eq(kt[((p / 2) * ldt + j) * 2 + p % 2], 0);
                const float scale = 0.125f * 1.1f;
                for (int scaled = 0; scaled < 2; scaled++) {
                    t->qk(m, c0, c1, d, q, d, kt, ldt, s, lds, scaled ? &scale : NULL);
                    for (int64_t r = 0; r < m; r++)
                        for (int64_t j = c0; j < c1; j++) {
                            double exact = 0, mag = 0;
                            for (int64_t p = 0; p < d; p++) {
                                const double x = fai_bf16_to_f64(q[r * d + p]) *
                                                 fai_bf16_to_f64(k[j * ldk + p]);
                                exact += x;
                                mag += fabs(x);
                            }
                            const double f = scaled ? scale : 1;
                            const double bound = (double)(d + 2) * 0x1p-24 * mag * f +
                                                 0x1p-24 * fabs(exact * f);
                            ck_assert_msg(fabs(s[r * lds + j] - exact * f) <= bound,
                                          "d%ld m%ld [%ld, %ld) r%ld j%ld scaled %d: %.9g vs %.9g",
                                          (long)d, (long)m, (long)c0, (long)c1, (long)r,
                                          (long)j, scaled, s[r * lds + j], exact * f);
                        }
                }
                free(q), free(k), free(kt), free(s);
            }
}
END_TEST

/* The relative bound of the tiles' exp (kernels.h: fai_expsum_bf16) at y = fl(scale x), m. */
static double tiles_exp_bound(double y, double m)
{
    return 0x1p-17 + 0x1p-23 * fabs(y - m);
}

/*
 * The tiles' P, p = exp(y - m) rounded to bf16 with y = fl(scale x), and the sum before
 * rounding, against exp in double, for lengths on and off the 16-lane grid, scales 1,
 * 1/sqrt(128) and 3.7, m the largest y, scores down to the exp's underflow, -inf and NaN:
 * each P within the bound before its rounding to bf16 (or 0 where exp(y - m) < 2^-124), the
 * sum within it plus its additions' roundings; nothing written past n; the same bits with P
 * written over the scores, and from fl(scale x) with scale 1 (a strip that folds its scale
 * into this kernel and one that scales S first agree). Then the values themselves, unrounded,
 * through the sum of 16 equal ones (exact: each addition doubles) and of one (whose P must be
 * that value rounded), at 2^15 points of y - m from -130 to 0 around m = 0, 3, -40, 1e6,
 * -1e10 and bf16's lowest (a mask added as it: about -3.4e38, where exp(y - m) is 1 at
 * y = m), for both entries, held to the bound (the AVX512_BF16 kernel's cubic, its last
 * coefficient dropped, was off by 8.5e-4 in a float simulation; a reduction by fl(m log2e),
 * which overflows at bf16's lowest, gives NaN there).
 */
START_TEST(tiles_expsum_within_bound)
{
    const fai_kernels_f32 *set = tile_set_or_skip(_i);
    if (!set)
        return;
    const fai_kernels_bf16 *t = set->bf16;
    static const int64_t ns[] = {1, 15, 16, 17, 100, 256};
    static const float scales[] = {1.0f, 0x1.6a09e6p-4f, 3.7f};
    uint64_t seed = 31;
    float x[256], y[256];
    uint16_t p[256 + 8], q[256];
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 3; b++) {
            const int64_t n = ns[a];
            const float scale = scales[b];
            float m = -INFINITY; /* the row's largest y, as the forward's */
            for (int64_t c = 0; c < n; c++) {
                x[c] = rnd(&seed) * 40 - (c % 7 == 3 ? 60 : 0);
                m = fmaxf(m, scale * x[c]);
            }
            if (n > 16) {
                x[5] = -INFINITY;
                x[n - 1] = b == 2 ? NAN : x[n - 1];
            }
            for (int64_t c = 0; c < n + 8; c++)
                p[c] = 0xabcd;
            const float sum = t->expsum(n, x, scale, m, p);
            double want = 0, bound = 0;
            for (int64_t c = 0; c < n; c++) {
                y[c] = scale * x[c];
                const double e = exp((double)y[c] - m), got = fai_bf16_to_f64(p[c]);
                const double rel = tiles_exp_bound(y[c], m);
                want += e;
                bound += e > 0 ? (rel + (double)n * 0x1p-24) * e + 0x1p-124 : 0; /* -inf: 0 */
                ck_assert_msg(isnan(e) ? isnan(got)
                                       : fabs(got - e) <= (0x1p-8 + 2 * rel) * e ||
                                             (e < 0x1p-124 && got <= 0x1p-124),
                              "%s n%ld scale %g: p[%ld] %.9g vs exp %.9g", t->expsum_name,
                              (long)n, (double)scale, (long)c, got, e);
            }
            ck_assert_msg(isnan(want) ? isnan(sum) : fabs(sum - want) <= bound,
                          "%s n%ld scale %g: sum %.9g vs %.9g", t->expsum_name, (long)n,
                          (double)scale, sum, want);
            for (int64_t c = n; c < n + 8; c++)
                ck_assert_msg(p[c] == 0xabcd, "%s n%ld: p[%ld] written", t->expsum_name,
                              (long)n, (long)c);
            const float prescaled = t->expsum(n, y, 1.0f, m, q);
            ck_assert_msg(memcmp(&prescaled, &sum, sizeof sum) == 0 &&
                              memcmp(q, p, (size_t)n * sizeof *p) == 0,
                          "%s n%ld scale %g: from fl(scale x) with scale 1 differs",
                          t->expsum_name, (long)n, (double)scale);
            memcpy(y, x, sizeof x); /* P over the scores: the same bits */
            const float over = t->expsum(n, y, scale, m, (uint16_t *)y);
            ck_assert_msg(memcmp(&over, &sum, sizeof sum) == 0 &&
                              memcmp(y, p, (size_t)n * sizeof *p) == 0,
                          "%s n%ld scale %g: P written over x differs", t->expsum_name, (long)n,
                          (double)scale);
        }
    static const float ms[] = {0.0f, 3.0f, -40.0f, 1e6f, -1e10f, -0x1.fep127f};
    double worst = 0; /* of error / bound */
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < 1 << 15; i++) {
            const float m = ms[k], v = m - 130.0f * (float)i / (1 << 15);
            float xs[16];
            for (int c = 0; c < 16; c++)
                xs[c] = v;
            const double e = exp((double)v - m), rel = tiles_exp_bound(v, m);
            const double got16 = t->expsum(16, xs, 1.0f, m, p) / 16.0;
            const float got1 = t->expsum(1, xs, 1.0f, m, p);
            ck_assert_msg(p[0] == fai_f64_to_bf16(got1), "%s m %g y %a: P %#x is not %a rounded",
                          t->expsum_name, (double)m, (double)v, p[0], (double)got1);
            for (int g = 0; g < 2; g++) {
                const double got = g ? got1 : got16;
                if (e < 0x1p-124 && got <= 0x1p-124)
                    continue;
                worst = fabs(got - e) / (rel * e) > worst ? fabs(got - e) / (rel * e) : worst;
                ck_assert_msg(fabs(got - e) <= rel * e, "%s m %g y %a (%s): %.9g vs %.9g",
                              t->expsum_name, (double)m, (double)v, g ? "tail" : "16 lanes",
                              got, e);
            }
        }
    fprintf(stderr, "check_kernels: %s: exp for P within %.3g of the bound (y - m in [-130, 0])\n",
            t->expsum_name, worst);
}
END_TEST

/*
 * acc = diag(a) acc + P V on tiles, P bf16 as given: rows [0, m) within f32 summation's bound
 * of the exact result; P's columns from nk on (NaN here) never read, nor its rows past m
 * (NaN up to the next 16) reaching any row; rows of acc from m on untouched, bit for bit (they
 * belong to other strips); V's padding keys zero.
 */
START_TEST(tiles_pv_matches_float64)
{
    const fai_kernels_bf16 *t = tiles_or_skip(_i);
    if (!t)
        return;
    static const int64_t dvs[] = {16, 48, 64, 128, 96}, ms[] = {1, 2, 16, 17, 18, 35};
    static const int64_t ranges[][3] = {{5, 0, 5}, {64, 0, 64}, {90, 13, 77}, {256, 30, 250}};
    uint64_t seed = 23;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 4; c++) {
                const int64_t dv = dvs[a], m = ms[b], n = ranges[c][0], c0 = ranges[c][1],
                              c1 = ranges[c][2], ldv = dv + 2, nk = (n + 31) / 32 * 32;
                const int64_t ldp = nk + 32, rows = m + 3, mq = (m + 15) / 16 * 16;
                uint16_t *v = malloc((size_t)(n * ldv) * 2), *vt = malloc((size_t)(nk * dv) * 2);
                uint16_t *p = malloc((size_t)(mq * ldp) * 2);
                float *acc = malloc((size_t)(rows * dv) * sizeof(float));
                float *acc0 = malloc((size_t)(rows * dv) * sizeof(float)), af[40];
                void *scratch = malloc((size_t)(16 * dv) * sizeof(float));
                for (int64_t x = 0; x < n * ldv; x++)
                    v[x] = fai_f64_to_bf16(rnd(&seed) * 2);
                for (int64_t r = 0; r < mq; r++) /* 0x7fc0: a bf16 NaN */
                    for (int64_t j = 0; j < ldp; j++)
                        p[r * ldp + j] = r >= m || j >= nk            ? 0x7fc0
                                         : j >= c0 && j < c1          ? fai_f64_to_bf16((rnd(&seed) + 1) / 2)
                                                                      : 0;
                for (int64_t x = 0; x < rows * dv; x++)
                    acc[x] = acc0[x] = rnd(&seed) * 4;
                for (int64_t r = 0; r < m; r++)
                    af[r] = (rnd(&seed) + 1.5f) / 2.5f;
                t->pack_v(n, nk, dv, v, ldv, vt);
                for (int64_t j = n; j < nk; j++)
                    for (int64_t x = 0; x < dv; x++)
                        ck_assert_int_eq(vt[((j / 2) * dv + x) * 2 + j % 2], 0);
                t->pv(m, nk, dv, p, ldp, vt, acc, dv, af, scratch);
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t x = 0; x < dv; x++) {
                        const float got = acc[r * dv + x];
                        if (r >= m) {
                            ck_assert_msg(memcmp(&got, &acc0[r * dv + x], 4) == 0,
                                          "row %ld past m %ld changed", (long)r, (long)m);
                            continue;
                        }
                        double exact = (double)(af[r] * acc0[r * dv + x]), mag = fabs(exact);
                        for (int64_t j = c0; j < c1; j++) {
                            const double y =
                                fai_bf16_to_f64(p[r * ldp + j]) * fai_bf16_to_f64(v[j * ldv + x]);
                            exact += y;
                            mag += fabs(y);
                        }
                        const double bound = (double)(nk + 4) * 0x1p-24 * mag;
                        ck_assert_msg(fabs(got - exact) <= bound,
                                      "dv%ld m%ld [%ld, %ld) r%ld x%ld: %.9g vs %.9g (bound %.3g)",
                                      (long)dv, (long)m, (long)c0, (long)c1, (long)r, (long)x,
                                      got, exact, bound);
                    }
                free(v), free(vt), free(p), free(acc), free(acc0), free(scratch);
            }
}
END_TEST

/*
 * The backward's tile GEMM, C (+)= A B: every element of rows [0, m) within f32 summation's
 * bound of the exact sum of its k exact products (plus C's old value with accumulate), for m
 * on and off the 16-row grid, n across one to several 64-column blocks, k 32 .. 96, B packed
 * from rows at a stride (pack_v's pairs of rows); rows of C from m on untouched, bit for bit
 * (the dQ rows of the next block), and A's padding rows never reach a stored row.
 */
START_TEST(tiles_gemm_matches_float64)
{
    const fai_kernels_bf16 *t = tiles_or_skip(_i);
    if (!t)
        return;
    static const int64_t ms[] = {1, 2, 15, 16, 17, 18, 40}, ns[] = {16, 48, 64, 128, 80, 96};
    static const int64_t ks[] = {32, 96};
    uint64_t seed = 29;
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 2; c++)
                for (int accumulate = 0; accumulate < 2; accumulate++) {
                    const int64_t m = ms[a], n = ns[b], k = ks[c], mup = (m + 15) / 16 * 16;
                    const int64_t lda = k + 32, ldsrc = n + 6, ldc = n + 3, rows = m + 5;
                    uint16_t *am = malloc((size_t)(mup * lda) * 2);
                    uint16_t *src = malloc((size_t)(k * ldsrc) * 2);
                    uint16_t *bp = malloc((size_t)(k * n) * 2);
                    float *cm = malloc((size_t)(rows * ldc) * sizeof(float));
                    float *c0 = malloc((size_t)(rows * ldc) * sizeof(float));
                    for (int64_t x = 0; x < mup * lda; x++) /* padding rows: large, any sign */
                        am[x] = fai_f64_to_bf16(x / lda < m ? rnd(&seed) * 3 : 1e30 * rnd(&seed));
                    for (int64_t x = 0; x < k * ldsrc; x++)
                        src[x] = fai_f64_to_bf16(rnd(&seed) * 3);
                    for (int64_t x = 0; x < rows * ldc; x++)
                        cm[x] = c0[x] = rnd(&seed) * 8;
                    t->pack_v(k, k, n, src, ldsrc, bp);
                    t->gemm(m, n, k, am, lda, bp, n, cm, ldc, accumulate);
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t j = 0; j < ldc; j++) {
                            const float got = cm[r * ldc + j];
                            if (r >= m || j >= n) {
                                ck_assert_msg(memcmp(&got, &c0[r * ldc + j], 4) == 0,
                                              "%s m%ld n%ld: C[%ld][%ld] outside changed",
                                              t->gemm_name, (long)m, (long)n, (long)r, (long)j);
                                continue;
                            }
                            double exact = accumulate ? c0[r * ldc + j] : 0, mag = fabs(exact);
                            for (int64_t p = 0; p < k; p++) {
                                const double y = fai_bf16_to_f64(am[r * lda + p]) *
                                                 fai_bf16_to_f64(src[p * ldsrc + j]);
                                exact += y;
                                mag += fabs(y);
                            }
                            const double bound = (double)(k + 2) * 0x1p-24 * mag;
                            ck_assert_msg(fabs(got - exact) <= bound,
                                          "%s m%ld n%ld k%ld acc%d r%ld j%ld: %.9g vs %.9g",
                                          t->gemm_name, (long)m, (long)n, (long)k, accumulate,
                                          (long)r, (long)j, got, exact);
                        }
                    free(am), free(src), free(bp), free(cm), free(c0);
                }
}
END_TEST

Suite *make_kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = ht_tcase_create("kernels");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, gemm_matches_float64, 0, ht_nisas);
    tcase_add_loop_test(tc, gemm_element_independent_of_blocking, 0, ht_nisas);
    tcase_add_loop_test(tc, gemm_store_scale_rounds_once, 0, ht_nisas);
    tcase_add_loop_test(tc, gemm_at_matches_gemm_on_transpose, 0, ht_nisas);
    tcase_add_loop_test(tc, gemm_k_split_same_bits, 0, ht_nisas);
    tcase_add_loop_test(tc, transpose_exact, 0, ht_nisas);
    tcase_add_loop_test(tc, coldot_rounds_as_gemm, 0, ht_nisas);
    tcase_add_loop_test(tc, dsoftmax_matches_definition, 0, ht_nisas);
    tcase_add_loop_test(tc, finite_detects_each_position, 0, ht_nisas);
    tcase_add_loop_test(tc, widen_every_half, 0, ht_nisas);
    tcase_add_loop_test(tc, narrow_rounds_as_portable, 0, ht_nisas);
    tcase_add_loop_test(tc, max_matches_definition, 0, ht_nisas);
    tcase_add_loop_test(tc, decode_products_match_float64, 0, ht_nisas);
    tcase_add_test(tc, expsum_exhaustive_nonpositive);
    tcase_add_loop_test(tc, tiles_packs_match_layout, 0, TILE_SETS);
    tcase_add_loop_test(tc, tiles_qk_matches_float64, 0, TILE_SETS);
    tcase_add_loop_test(tc, tiles_expsum_within_bound, 0, TILE_SETS);
    tcase_add_loop_test(tc, tiles_pv_matches_float64, 0, TILE_SETS);
    tcase_add_loop_test(tc, tiles_gemm_matches_float64, 0, TILE_SETS);
    suite_add_tcase(s, tc);
    return s;
}
