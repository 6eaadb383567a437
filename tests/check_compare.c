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

/* K and V (batch 1, BSHD) without keys [j0, j0 + 64): a key tile skipped. */
static void drop_keys(const ht_tensor *k, const ht_tensor *v, int64_t j0, ht_tensor *ka,
                      ht_tensor *va)
{
    const fa_tensor *t = &k->t;
    ht_alloc(ka, t->dtype, 1, t->seqlen - 64, t->heads, t->headdim, SW_BSHD);
    ht_alloc(va, t->dtype, 1, t->seqlen - 64, t->heads, t->headdim, SW_BSHD);
    for (int64_t j = 0, jj = 0; j < t->seqlen; j++) {
        if (j >= j0 && j < j0 + 64)
            continue;
        for (int64_t h = 0; h < t->heads; h++)
            for (int64_t d = 0; d < t->headdim; d++) {
                ht_set(ka, 0, jj, h, d, ht_get(k, 0, j, h, d));
                ht_set(va, 0, jj, h, d, ht_get(v, 0, j, h, d));
            }
        jj++;
    }
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
    fa_tolerance tight = {.atol = 1e-9}, loose = {.atol = 1e-5, .rtol = 1e-5};
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
    drop_keys(&f.k, &f.v, 64, &ka, &va);
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
    fa_tolerance neg = {.factor = 2, .atol = -1};
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
    ck_assert_msg(c.pass && c.max_abs == 0 && c.ref_max == 7.5,
                  "exact-size copy: max_abs %g, ref_max %g", c.max_abs, c.ref_max);
    free(exact);
    ht_free(&ref), ht_free(&cand), ht_free(&base);
}
END_TEST

/* ------------------------------------------------------------------ the statistics */

/* v rounded toward zero to dt (a truncating conversion): round to nearest, then one step
 * toward zero where that went past v. */
static double toward_zero(fa_dtype dt, double v)
{
    uint16_t bits;
    double r;
    fa_convert(&v, FA_F64, &bits, dt, 1);
    fa_convert(&bits, dt, &r, FA_F64, 1);
    if (fabs(r) > fabs(v)) {
        bits--; /* sign and magnitude: one step toward zero */
        fa_convert(&bits, dt, &r, FA_F64, 1);
    }
    return r;
}

/* A 16-bit problem of 2^16 outputs (B 1, S 256, H 4, D 64; Sk keys), inputs N(0, 1) rounded to
 * dt: the float64 reference, the conventional path in dt (the yardstick), the tiled path in dt
 * (an honest kernel). */
typedef struct {
    ht_tensor q, k, v, ref, lref, base, lbase, tiled;
} problem16;

enum { PS = 256, PH = 4, PD = 64 };

static void problem16_make(problem16 *f, fa_dtype dt, int64_t sk, uint64_t seed)
{
    ht_alloc(&f->q, dt, 1, PS, PH, PD, SW_BSHD);
    ht_alloc(&f->k, dt, 1, sk, PH, PD, SW_BSHD);
    ht_alloc(&f->v, dt, 1, sk, PH, PD, SW_BSHD);
    ht_fill(&f->q, seed, 1, -1), ht_fill(&f->k, seed + 1, 1, -1), ht_fill(&f->v, seed + 2, 1, -1);
    ht_alloc(&f->ref, FA_F64, 1, PS, PH, PD, SW_BSHD);
    ht_alloc_lse(&f->lref, FA_F64, 1, PS, PH);
    ht_alloc(&f->base, dt, 1, PS, PH, PD, SW_BSHD);
    ht_alloc_lse(&f->lbase, FA_F32, 1, PS, PH);
    ht_alloc(&f->tiled, dt, 1, PS, PH, PD, SW_BSHD);
    fa_params p;
    fa_params_init(&p);
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 2, &p, &f->q.t64, &f->k.t64, &f->v.t64,
                                &f->ref.t, &f->lref.t), FA_OK);
    ck_assert_int_eq(ht_forward(FA_BACKEND_CONVENTIONAL, 2, &p, &f->q.t, &f->k.t, &f->v.t,
                                &f->base.t, &f->lbase.t), FA_OK);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &p, &f->q.t, &f->k.t, &f->v.t, &f->tiled.t,
                                NULL), FA_OK);
}

static void problem16_free(problem16 *f)
{
    ht_free(&f->q), ht_free(&f->k), ht_free(&f->v), ht_free(&f->ref), ht_free(&f->lref);
    ht_free(&f->base), ht_free(&f->lbase), ht_free(&f->tiled);
}

/* A candidate out: the reference with each element mapped by `f` (with its row's factor). */
static void mapped(const problem16 *pr, fa_dtype dt, double (*f)(fa_dtype, double, double),
                   const double *row_factor, ht_tensor *out)
{
    ht_alloc(out, dt, 1, PS, PH, PD, SW_BSHD);
    for (int64_t i = 0; i < PS; i++)
        for (int64_t h = 0; h < PH; h++)
            for (int64_t d = 0; d < PD; d++)
                ht_set(out, 0, i, h, d,
                       f(dt, ht_get(&pr->ref, 0, i, h, d), row_factor ? row_factor[i * PH + h] : 1));
}

static double rounded(fa_dtype dt, double x, double a) { return x * a; } /* ht_set rounds */
static double truncated(fa_dtype dt, double x, double a) { return toward_zero(dt, x * a); }

/* The verdict on cand (out) against the problem's reference and yardstick. */
static fa_comparison judged(const problem16 *pr, const ht_tensor *cand)
{
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&cand->t, &pr->ref.t, &pr->base.t, NULL, &c), FA_OK);
    return c;
}

/* Candidates that hide under a 16-bit dtype's noise, at 2^16 outputs: the max rule passes each,
 * and the statistic named FAILs it: the output rounded by truncation, scaled by 1.005, its
 * softmax denominator summed from P truncated to the dtype (scale); shifted by a quarter of
 * eps x max |ref| (bias). Honest candidates (the tiled path, the yardstick, the exact answer
 * rounded to nearest) pass every statistic. */
START_TEST(statistics_catch_16bit_bugs)
{
    const fa_dtype dt = _i ? FA_F16 : FA_BF16;
    problem16 pr;
    problem16_make(&pr, dt, PS, 40);
    const char *name = fa_dtype_name(dt);
    fa_comparison c = judged(&pr, &pr.tiled);
    ck_assert_msg(c.pass, "%s tiled: %s; %s", name, c.rule, ht_stats(&c));
    c = judged(&pr, &pr.base);
    ck_assert_msg(c.pass, "%s yardstick: %s", name, ht_stats(&c));
    ht_tensor x;
    mapped(&pr, dt, rounded, NULL, &x);
    c = judged(&pr, &x);
    ck_assert_msg(c.pass, "%s rounded to nearest: %s", name, ht_stats(&c));
    ht_free(&x);

    mapped(&pr, dt, truncated, NULL, &x);
    c = judged(&pr, &x);
    ck_assert_msg(!(c.failed & FA_CMP_MAX) && (c.failed & FA_CMP_SCALE),
                  "%s truncated: max %g (bound %g); %s", name, c.max_abs, c.bound, ht_stats(&c));
    ht_free(&x);

    double scales[PS * PH];
    for (int i = 0; i < PS * PH; i++)
        scales[i] = 1.005;
    mapped(&pr, dt, rounded, scales, &x);
    c = judged(&pr, &x); /* in f16, 5 ulps: the max rule sees it too */
    ck_assert_msg((dt == FA_F16 || !(c.failed & FA_CMP_MAX)) && (c.failed & FA_CMP_SCALE),
                  "%s x 1.005: max %g (bound %g); %s", name, c.max_abs, c.bound, ht_stats(&c));
    ht_free(&x);

    /* each row's denominator summed from P = exp(s - max) truncated to dt: out x l / l~ */
    const double sc = 1 / sqrt((double)PD);
    for (int64_t i = 0; i < PS; i++)
        for (int64_t h = 0; h < PH; h++) {
            double s[PS], m = -INFINITY, l = 0, lt = 0;
            for (int64_t j = 0; j < PS; j++) {
                s[j] = 0;
                for (int64_t d = 0; d < PD; d++)
                    s[j] += ht_get(&pr.q, 0, i, h, d) * ht_get(&pr.k, 0, j, h, d);
                s[j] *= sc;
                m = s[j] > m ? s[j] : m;
            }
            for (int64_t j = 0; j < PS; j++) {
                l += exp(s[j] - m);
                lt += toward_zero(dt, exp(s[j] - m));
            }
            scales[i * PH + h] = l / lt;
        }
    mapped(&pr, dt, rounded, scales, &x);
    c = judged(&pr, &x);
    ck_assert_msg(!(c.failed & FA_CMP_MAX) && (c.failed & FA_CMP_SCALE),
                  "%s biased denominator: max %g (bound %g); %s", name, c.max_abs, c.bound,
                  ht_stats(&c));
    ht_free(&x);

    /* every output shifted by a quarter of the floor */
    ht_alloc(&x, dt, 1, PS, PH, PD, SW_BSHD);
    const double shift = 0.25 * (dt == FA_BF16 ? 0x1p-7 : 0x1p-10) * ht_max_abs(&pr.ref);
    for (int64_t i = 0; i < PS; i++)
        for (int64_t h = 0; h < PH; h++)
            for (int64_t d = 0; d < PD; d++)
                ht_set(&x, 0, i, h, d, ht_get(&pr.ref, 0, i, h, d) + shift);
    c = judged(&pr, &x);
    ck_assert_msg(!(c.failed & FA_CMP_MAX) && (c.failed & FA_CMP_BIAS),
                  "%s shifted: max %g (bound %g); %s", name, c.max_abs, c.bound, ht_stats(&c));
    /* the max rule alone passes it */
    const fa_tolerance max_only = {.factor = 2, .max_only = 1};
    ck_assert_int_eq(fa_compare(&x.t, &pr.ref.t, &pr.base.t, &max_only, &c), FA_OK);
    ck_assert_msg(c.pass && isinf(c.bias_bound), "%s shifted, max only: %s", name, c.rule);
    ht_free(&x);

    /* the allowance is the storage dtype's, the yardstick's: a systematic 1e-4 (under f16's
     * allowance of 1.2e-4, a tenth of bf16's) in a candidate saved as f32 passes */
    ht_alloc(&x, FA_F32, 1, PS, PH, PD, SW_BSHD);
    for (int64_t i = 0; i < PS; i++)
        for (int64_t h = 0; h < PH; h++)
            for (int64_t d = 0; d < PD; d++)
                ht_set(&x, 0, i, h, d, ht_get(&pr.ref, 0, i, h, d) * (1 + 1e-4));
    c = judged(&pr, &x);
    ck_assert_msg(c.pass, "%s x (1 + 1e-4) saved as f32: %s", name, ht_stats(&c));
    ht_free(&x);
    problem16_free(&pr);
}
END_TEST

/* f32, where the max rule is tight: noise spread evenly up to just inside the max bound (a
 * kernel whose every element is as bad as the yardstick's worst) FAILs the RMS error and the
 * decorrelation. */
START_TEST(statistics_catch_spread_noise)
{
    fixture f;
    fa_params p;
    fixture_make(&f, &p, 1, -1);
    fa_comparison c = judge(&f, &f.base);
    const double a = 0.95 * c.bound;
    ht_tensor x;
    ht_alloc(&x, FA_F32, 1, SQ, H, D, SW_BSHD);
    uint64_t st = 7;
    for (int64_t i = 0; i < SQ; i++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t d = 0; d < D; d++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                const double u = (double)(st >> 11) * 0x1p-53 * 2 - 1; /* [-1, 1) */
                ht_set(&x, 0, i, h, d, ht_get(&f.ref, 0, i, h, d) + a * u);
            }
    c = judge(&f, &x);
    ck_assert_msg(!(c.failed & FA_CMP_MAX) && (c.failed & FA_CMP_RMS) &&
                      (c.failed & FA_CMP_DECORR),
                  "spread noise: max %g (bound %g); %s", c.max_abs, c.bound, ht_stats(&c));
    ht_free(&x);
    fixture_free(&f);
}
END_TEST

/* One key block of 64 dropped from 16384 keys (a tile classified empty), bf16 and f16, at 2^16
 * outputs: the max rule's floor hides it; the statistics do not. */
START_TEST(statistics_catch_dropped_block)
{
    const fa_dtype dt = _i ? FA_F16 : FA_BF16;
    enum { SKL = 16384, J0 = 4096 };
    problem16 pr;
    problem16_make(&pr, dt, SKL, 41);
    ht_tensor ka, va, x;
    drop_keys(&pr.k, &pr.v, J0, &ka, &va);
    ht_alloc(&x, dt, 1, PS, PH, PD, SW_BSHD);
    fa_params p;
    fa_params_init(&p);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &p, &pr.q.t, &ka.t, &va.t, &x.t, NULL), FA_OK);
    fa_comparison c = judged(&pr, &x);
    ck_assert_msg((c.failed & FA_CMP_RMS) && (c.failed & FA_CMP_DECORR), "%s dropped block: max %g (bound %g); %s", fa_dtype_name(dt), c.max_abs,
                  c.bound, ht_stats(&c));
    c = judged(&pr, &pr.tiled);
    ck_assert_msg(c.pass, "%s tiled, 16k keys: %s", fa_dtype_name(dt), ht_stats(&c));
    ht_free(&ka), ht_free(&va), ht_free(&x);
    problem16_free(&pr);
}
END_TEST

/* The LSE of a 16-bit kernel held to its own dtype (docs/DESIGN.md §4), bf16 and f16: against
 * the conventional path in f32 with the allowances FA_LSE16_ALLOWANCE(_REL), A in all, the
 * tiled path's LSE passes, and so does the reference shifted by 0.9 A (which fails with none:
 * the allowance is what admits it); shifted by 4 A (about 8e-5 here: a softmax denominator
 * 0.008% off) or by log 2, it fails; a negative or infinite allowance is refused by name. */
START_TEST(lse_held_to_its_own_dtype)
{
    const fa_dtype dt = _i ? FA_F16 : FA_BF16;
    problem16 pr;
    problem16_make(&pr, dt, PS, 42);
    fa_params p;
    fa_params_init(&p);
    ht_bundle b; /* the problem's inputs, for the f32 yardstick */
    memset(&b, 0, sizeof b);
    b.q = pr.q, b.k = pr.k, b.v = pr.v, b.lse = pr.lbase;
    ht_tensor y, tiled, x;
    fa_tolerance own = {.factor = 2};
    ck_assert(ht_lse_yardstick(&p, &b, dt, &y, &own));
    ck_assert(own.allowance == FA_LSE16_ALLOWANCE && own.allowance_rel == FA_LSE16_ALLOWANCE_REL);
    ht_alloc(&tiled, dt, 1, PS, PH, PD, SW_BSHD);
    ht_alloc_lse(&x, FA_F32, 1, PS, PH);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &p, &pr.q.t, &pr.k.t, &pr.v.t, &tiled.t,
                                &x.t), FA_OK);
    const fa_tolerance none = {.factor = 2};
    const double a = FA_LSE16_ALLOWANCE + FA_LSE16_ALLOWANCE_REL * ht_max_abs(&pr.lref);
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&x.t, &pr.lref.t, &y.t, &own, &c), FA_OK);
    ck_assert_msg(c.pass && strstr(c.rule, "(allowance)"), "%s tiled LSE: %s; %s",
                  fa_dtype_name(dt), c.rule, ht_stats(&c));
    const double shifts[] = {0.9 * a, 4 * a, M_LN2};
    for (int k = 0; k < 3; k++) {
        for (int64_t i = 0; i < PS; i++)
            for (int64_t h = 0; h < PH; h++)
                ht_set(&x, 0, i, h, 0, ht_get(&pr.lref, 0, i, h, 0) + shifts[k]);
        ck_assert_int_eq(fa_compare(&x.t, &pr.lref.t, &y.t, &own, &c), FA_OK);
        ck_assert_msg(c.pass == (k == 0), "%s LSE + %g: %s; %s", fa_dtype_name(dt), shifts[k],
                      c.rule, ht_stats(&c));
        if (k == 0) {
            ck_assert_int_eq(fa_compare(&x.t, &pr.lref.t, &y.t, &none, &c), FA_OK);
            ck_assert_msg(!c.pass, "%s LSE + %g, no allowance: %s", fa_dtype_name(dt),
                          shifts[k], ht_stats(&c));
        }
    }
    const fa_tolerance bad[5] = {{.factor = 2, .allowance = -1e-6},
                                 {.factor = 2, .allowance = INFINITY},
                                 {.factor = 2, .allowance = NAN},
                                 {.factor = 2, .allowance_rel = -1e-6},
                                 {.factor = 2, .allowance_rel = INFINITY}};
    for (int k = 0; k < 5; k++) {
        ck_assert_int_eq(fa_compare(&x.t, &pr.lref.t, &y.t, &bad[k], &c),
                         FA_ERR_INVALID_ARGUMENT);
        ck_assert(strstr(fa_last_error(), "allowance"));
    }
    ht_free(&y), ht_free(&tiled), ht_free(&x);
    problem16_free(&pr);
}
END_TEST

/* fa_lse_rule, the LSE's yardstick and allowances (docs/DESIGN.md §4), as a table; its
 * refusals by name. */
START_TEST(lse_rule_table)
{
    const fa_profile *b2 = fa_profile_find("flashinfer"); /* a base-2 LSE */
    ck_assert(b2 && b2->lse_base2);
    static const struct {
        int base2;
        fa_dtype storage, lse;
        int fp8;
        fa_dtype yardstick;
        double allowance, rel;
    } rows[] = {
        {0, FA_BF16, FA_F32, 0, FA_F32, 0x1p-16, 0x1p-20},
        {0, FA_F16, FA_F64, 0, FA_F32, 0x1p-16, 0x1p-20},
        {1, FA_BF16, FA_F32, 0, FA_F32, 0x1p-16 * 1.4426950408889634, 0x1p-20},
        {0, FA_BF16, FA_F32, 1, FA_BF16, 0, 0}, /* FP8 inputs */
        {0, FA_F16, FA_F16, 0, FA_F16, 0, 0},   /* an LSE saved in 16 bits */
        {0, FA_F32, FA_F32, 0, FA_F32, 0, 0},
        {0, FA_F64, FA_F64, 0, FA_F64, 0, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        fa_dtype y = FA_E5M2;
        fa_tolerance t = {.factor = 3, .allowance = 9, .allowance_rel = 9};
        ck_assert_int_eq(fa_lse_rule(rows[i].base2 ? b2 : NULL, rows[i].storage, rows[i].lse,
                                     rows[i].fp8, &y, &t),
                         FA_OK);
        ck_assert_msg(y == rows[i].yardstick && t.allowance == rows[i].allowance &&
                          t.allowance_rel == rows[i].rel && t.factor == 3,
                      "row %zu: yardstick %s, allowances %g, %g", i, fa_dtype_name(y),
                      t.allowance, t.allowance_rel);
    }
    fa_dtype y;
    fa_tolerance t;
    ck_assert_int_eq(fa_lse_rule(NULL, FA_BF16, FA_F32, 0, NULL, &t), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "yardstick"));
    ck_assert_int_eq(fa_lse_rule(NULL, FA_BF16, FA_F32, 0, &y, NULL), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "tol"));
    ck_assert_int_eq(fa_lse_rule(NULL, FA_BOOL, FA_F32, 0, &y, &t), FA_ERR_DTYPE);
    ck_assert(strstr(fa_last_error(), "storage"));
    ck_assert_int_eq(fa_lse_rule(NULL, FA_BF16, (fa_dtype)99, 0, &y, &t), FA_ERR_DTYPE);
    ck_assert(strstr(fa_last_error(), "lse_dtype"));
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
    tcase_add_loop_test(tc, statistics_catch_16bit_bugs, 0, 2);
    tcase_add_test(tc, statistics_catch_spread_noise);
    tcase_add_loop_test(tc, statistics_catch_dropped_block, 0, 2);
    tcase_add_loop_test(tc, lse_held_to_its_own_dtype, 0, 2);
    tcase_add_test(tc, lse_rule_table);
    suite_add_tcase(s, tc);
    return s;
}
