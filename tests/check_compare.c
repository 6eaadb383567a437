/*
 * fa_compare, the tolerance rule: candidates wrong by a realistic bug FAIL, candidates that are
 * merely rounded differently PASS. Each bug is produced by running a correct backend on a
 * subtly wrong problem, the way such bugs arise in a kernel.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { SQ = 150, SK = 170, H = 2, D = 64 };

typedef struct {
    ht_tensor q, k, v;     /* f32 inputs, exact in float64 */
    ht_tensor ref, lref;   /* float64 reference out, lse  */
    ht_tensor base, lbase; /* conventional f32: the yardstick */
} fixture;

static void fixture_make(fixture *f, fa_params *p, double lo, double hi)
{
    ht_alloc(&f->q, FA_F32, 1, SQ, H, D, SW_BSHD);
    ht_alloc(&f->k, FA_F32, 1, SK, H, D, SW_BSHD);
    ht_alloc(&f->v, FA_F32, 1, SK, H, D, SW_BSHD);
    ht_alloc(&f->ref, FA_F64, 1, SQ, H, D, SW_BSHD);
    ht_alloc(&f->base, FA_F32, 1, SQ, H, D, SW_BSHD);
    ht_alloc_lse(&f->lref, FA_F64, 1, SQ, H);
    ht_alloc_lse(&f->lbase, FA_F32, 1, SQ, H);
    ht_fill(&f->q, 1, lo, hi), ht_fill(&f->k, 2, lo, hi), ht_fill(&f->v, 3, 1, -1);
    fa_params_init(p);
    p->causal = 1;
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 2, p, &f->q.t64, &f->k.t64, &f->v.t64,
                                &f->ref.t, &f->lref.t), FA_OK);
    ck_assert_int_eq(ht_forward(FA_BACKEND_CONVENTIONAL, 2, p, &f->q.t, &f->k.t, &f->v.t,
                                &f->base.t, &f->lbase.t), FA_OK);
}

static void fixture_free(fixture *f)
{
    ht_free(&f->q), ht_free(&f->k), ht_free(&f->v), ht_free(&f->ref), ht_free(&f->lref);
    ht_free(&f->base), ht_free(&f->lbase);
}

static fa_comparison judge(const fixture *f, const ht_tensor *cand)
{
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&cand->t, &f->ref.t, &f->base.t, NULL, &c), FA_OK);
    return c;
}

/* A candidate computed by `be` on the fixture's inputs with params p (f32 storage). */
static void candidate(const fixture *f, fa_backend be, const fa_params *p, ht_tensor *out)
{
    ht_alloc(out, FA_F32, 1, SQ, H, D, SW_BSHD);
    ck_assert_int_eq(ht_forward(be, 2, p, &f->q.t, &f->k.t, &f->v.t, &out->t, NULL), FA_OK);
}

START_TEST(rounding_differences_pass)
{
    fixture f;
    fa_params p;
    fixture_make(&f, &p, 1, -1);
    ht_tensor tiled, rounded;
    candidate(&f, FA_BACKEND_TILED, &p, &tiled); /* another f32 summation order */
    fa_comparison c = judge(&f, &tiled);
    ck_assert_msg(c.pass, "tiled f32: %g vs %s", c.max_abs, c.rule);
    ck_assert(strstr(c.rule, "flash:") && c.bound > 0 && c.max_abs > 0);
    ht_alloc(&rounded, FA_F32, 1, SQ, H, D, SW_BSHD); /* the exact answer rounded to f32 */
    for (int64_t i = 0; i < SQ; i++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++)
                ht_set(&rounded, 0, i, h, d, ht_get(&f.ref, 0, i, h, d));
    ck_assert(judge(&f, &rounded).pass);
    /* the explicit rule on the same candidate */
    fa_tolerance tight = {0, 1e-9, 0}, loose = {0, 1e-5, 1e-5};
    ck_assert_int_eq(fa_compare(&tiled.t, &f.ref.t, NULL, &loose, &c), FA_OK);
    ck_assert(c.pass && strstr(c.rule, "explicit"));
    ck_assert_int_eq(fa_compare(&tiled.t, &f.ref.t, NULL, &tight, &c), FA_OK);
    ck_assert(!c.pass);
    ht_free(&tiled), ht_free(&rounded);
    fixture_free(&f);
}
END_TEST

/* Off-by-one causal mask, wrong scale, a dropped key tile: each must FAIL. */
START_TEST(realistic_bugs_fail)
{
    fixture f;
    fa_params p;
    fixture_make(&f, &p, 1, -1);
    ht_tensor bug;

    fa_params off_by_one = p; /* each row also sees the next key */
    off_by_one.causal = 0;
    off_by_one.window_right = 1;
    candidate(&f, FA_BACKEND_TILED, &off_by_one, &bug);
    fa_comparison c = judge(&f, &bug);
    ck_assert_msg(!c.pass, "mask off by one passed: %g vs %s", c.max_abs, c.rule);
    ht_free(&bug);

    fa_params wrong_scale = p; /* 1/D instead of 1/sqrt(D) */
    wrong_scale.scale = 1.0 / D;
    candidate(&f, FA_BACKEND_TILED, &wrong_scale, &bug);
    ck_assert(!judge(&f, &bug).pass);
    ht_free(&bug);

    fa_params slightly = p; /* a scale off by 0.1%, e.g. a float constant typed short */
    slightly.scale = 1.001 / sqrt((double)D);
    candidate(&f, FA_BACKEND_TILED, &slightly, &bug);
    ck_assert(!judge(&f, &bug).pass);
    ht_free(&bug);

    fa_params dropped = p; /* keys [64, 128) skipped, as if a tile were classified empty */
    ht_alloc(&bug, FA_F32, 1, SQ, H, D, SW_BSHD);
    ht_tensor ka, va;
    ht_alloc(&ka, FA_F32, 1, SK - 64, H, D, SW_BSHD);
    ht_alloc(&va, FA_F32, 1, SK - 64, H, D, SW_BSHD);
    for (int64_t j = 0, jj = 0; j < SK; j++) {
        if (j >= 64 && j < 128)
            continue;
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) {
                ht_set(&ka, 0, jj, h, d, ht_get(&f.k, 0, j, h, d));
                ht_set(&va, 0, jj, h, d, ht_get(&f.v, 0, j, h, d));
            }
        jj++;
    }
    dropped.align = FA_ALIGN_TOP_LEFT; /* the same causal limit for rows < 64 */
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &dropped, &f.q.t, &ka.t, &va.t, &bug.t, NULL),
                     FA_OK);
    ck_assert(!judge(&f, &bug).pass);
    ht_free(&bug), ht_free(&ka), ht_free(&va);
    fixture_free(&f);
}
END_TEST

/* Logits in [90, 100]: softmax without the max subtraction overflows exp in f32; the NaN/inf it
 * produces is a non-finite mismatch, reported at the first position where it happens. */
START_TEST(missing_max_subtraction_fails)
{
    fixture f;
    fa_params p;
    const double a = sqrt(90 / 8.0), b = sqrt(100 / 8.0);
    fixture_make(&f, &p, a, b);
    ck_assert(judge(&f, &f.base).pass); /* the yardstick itself passes */
    ht_tensor naive;
    ht_alloc(&naive, FA_F32, 1, SQ, H, D, SW_BSHD);
    const float scale = 1.0f / 8.0f;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < SQ; i++) {
            float l = 0, acc[D];
            memset(acc, 0, sizeof acc);
            for (int64_t j = 0; j <= i + SK - SQ; j++) {
                float s = 0;
                for (int64_t d = 0; d < D; d++)
                    s += (float)ht_get(&f.q, 0, i, h, d) * (float)ht_get(&f.k, 0, j, h, d);
                float e = expf(s * scale); /* the bug: no - max */
                l += e;
                for (int64_t d = 0; d < D; d++)
                    acc[d] += e * (float)ht_get(&f.v, 0, j, h, d);
            }
            for (int64_t d = 0; d < D; d++)
                ht_set(&naive, 0, i, h, d, acc[d] / l);
        }
    fa_comparison c = judge(&f, &naive);
    ck_assert(!c.pass && c.nonfinite_mismatches > 0);
    ck_assert(isnan(c.worst_cand) || isinf(c.worst_cand));
    ht_free(&naive);
    fixture_free(&f);
}
END_TEST

START_TEST(compare_arguments)
{
    fixture f;
    fa_params p;
    fixture_make(&f, &p, 1, -1);
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&f.base.t, &f.ref.t, NULL, NULL, &c), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "baseline"));
    ck_assert_int_eq(fa_compare(&f.base.t, &f.lref.t, &f.base.t, NULL, &c), FA_ERR_SHAPE);
    fa_tolerance neg = {2, -1, 0};
    ck_assert_int_eq(fa_compare(&f.base.t, &f.ref.t, &f.base.t, &neg, &c), FA_ERR_INVALID_ARGUMENT);
    fixture_free(&f);
}
END_TEST

/*
 * Rows are read in chunks (compare.c): rows of 130 (two whole chunks of 64 and a tail of 2),
 * strided, in f32 against an f64 reference, one element off at a time at the chunks' edges
 * and in other rows; the candidate's error and the baseline's are each found at their size
 * and position. Then a tensor over a buffer of exactly its size (the last row ends at the
 * buffer's end, where a chunk read past a row would show under ASan and valgrind).
 */
START_TEST(chunk_edges_reached)
{
    enum { B = 2, S = 3, HH = 2, DD = 130 };
    ht_tensor ref, cand, base;
    ht_alloc(&ref, FA_F64, B, S, HH, DD, SW_BSHD);
    ht_alloc(&cand, FA_F32, B, S, HH, DD, SW_PADDED);
    ht_alloc(&base, FA_F32, B, S, HH, DD, SW_BHSD);
    ht_fill(&ref, 5, -1, 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < HH; h++)
                for (int64_t d = 0; d < DD; d++) {
                    /* multiples of 2^-10: exact in f32, and so are v + 0.5 and v - 0.25 */
                    const double v = round(ht_get(&ref, b, s, h, d) * 1024) / 1024;
                    ht_set(&ref, b, s, h, d, v);
                    ht_set(&cand, b, s, h, d, v);
                    ht_set(&base, b, s, h, d, v);
                }
    static const int64_t at[][4] = {{0, 0, 0, 0},  {0, 0, 0, 63}, {0, 0, 1, 64},
                                    {1, 2, 0, 127}, {1, 1, 1, 128}, {1, 2, 1, 129}};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        const int64_t *w = at[i];
        const double v = ht_get(&ref, w[0], w[1], w[2], w[3]);
        fa_comparison c;
        ht_set(&cand, w[0], w[1], w[2], w[3], v + 0.5);
        ht_set(&base, w[0], w[1], w[2], w[3], v - 0.25);
        ck_assert_int_eq(fa_compare(&cand.t, &ref.t, &base.t, NULL, &c), FA_OK);
        ck_assert_msg(c.max_abs == 0.5 && c.baseline_err == 0.25 &&
                          memcmp(c.worst, w, sizeof c.worst) == 0,
                      "element %ld,%ld,%ld,%ld: max_abs %g baseline_err %g at %ld,%ld,%ld,%ld",
                      (long)w[0], (long)w[1], (long)w[2], (long)w[3], c.max_abs, c.baseline_err,
                      (long)c.worst[0], (long)c.worst[1], (long)c.worst[2], (long)c.worst[3]);
        ck_assert_msg(ht_max_err(&cand, &ref) == 0.5 && ht_max_err(&base, &ref) == 0.25,
                      "the harness's max error misses element %ld,%ld,%ld,%ld", (long)w[0],
                      (long)w[1], (long)w[2], (long)w[3]);
        ht_set(&cand, w[0], w[1], w[2], w[3], v);
        ht_set(&base, w[0], w[1], w[2], w[3], v);
    }
    ht_set(&ref, 1, 2, 1, 129, 7.5); /* the largest |ref|, in the last tail */
    ck_assert(ht_max_abs(&ref) == 7.5);
    float *exact = malloc((size_t)(B * S * HH * DD) * sizeof *exact);
    ck_assert_ptr_nonnull(exact);
    fa_tensor t;
    fa_tensor_init(&t, exact, FA_F32, B, S, HH, DD, 0); /* contiguous BSHD, as ref.buf64 */
    for (int64_t x = 0; x < B * S * HH * DD; x++)
        exact[x] = (float)ref.buf64[x];
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&t, &ref.t, &t, NULL, &c), FA_OK);
    ck_assert_msg(c.pass && c.max_abs == 0, "exact-size copy: max_abs %g", c.max_abs);
    free(exact);
    ht_free(&ref), ht_free(&cand), ht_free(&base);
}
END_TEST

Suite *make_compare_suite(void)
{
    Suite *s = suite_create("compare");
    TCase *tc = ht_tcase_create("compare");
    tcase_add_test(tc, rounding_differences_pass);
    tcase_add_test(tc, realistic_bugs_fail);
    tcase_add_test(tc, missing_max_subtraction_fails);
    tcase_add_test(tc, compare_arguments);
    tcase_add_test(tc, chunk_edges_reached);
    suite_add_tcase(s, tc);
    return s;
}
