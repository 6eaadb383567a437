/* The oracle against exact answers, and its backward against central finite differences. */
#include "config.h"

#include <math.h>
#include <stdlib.h>

#include "harness.h"

/* Scores s_j = q . k_j with D = 1 and scale 1, one head; V = identity, so O_i is P_i itself. */
static void softmax_probe(const double *scores, int64_t n, const fa_params *p, double *out_row,
                          double *lse)
{
    ht_tensor q, k, v, o, l;
    ht_alloc(&q, FA_F64, 1, 1, 1, 1, SW_BSHD);
    ht_alloc(&k, FA_F64, 1, n, 1, 1, SW_BSHD);
    ht_alloc(&v, FA_F64, 1, n, 1, n, SW_BSHD);
    ht_alloc(&o, FA_F64, 1, 1, 1, n, SW_BSHD);
    ht_alloc_lse(&l, FA_F64, 1, 1, 1);
    ht_set(&q, 0, 0, 0, 0, 1.0);
    for (int64_t j = 0; j < n; j++) {
        ht_set(&k, 0, j, 0, 0, scores[j]);
        ht_set(&v, 0, j, 0, j, 1.0);
    }
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 1, p, &q.t, &k.t, &v.t, &o.t, &l.t), FA_OK);
    for (int64_t j = 0; j < n; j++)
        out_row[j] = ht_get(&o, 0, 0, 0, j);
    *lse = ht_get(&l, 0, 0, 0, 0);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o), ht_free(&l);
}

/* The article's §4.3: softmax([1, 2, 0, 3]) = [e^-2, e^-1, e^-3, 1] / sum. */
START_TEST(reference_worked_example)
{
    const double s[4] = {1, 2, 0, 3}, w[4] = {exp(-2.0), exp(-1.0), exp(-3.0), 1.0};
    double o[4], lse, sum = w[0] + w[1] + w[2] + w[3];
    fa_params p;
    fa_params_init(&p);
    p.scale = 1;
    softmax_probe(s, 4, &p, o, &lse);
    for (int j = 0; j < 4; j++)
        ck_assert_double_eq_tol(o[j], w[j] / sum, 4e-16);
    ck_assert_double_eq_tol(lse, 3 + log(sum), 1e-15);
}
END_TEST

/* Softcap and ALiBi in both orders, against the formulas written out: one query, keys at
 * distance j (top-left alignment), scale 1, cap 2, slope 0.5. */
START_TEST(reference_score_order_exact)
{
    const double s[5] = {1.5, -0.5, 3, 0.25, 2};
    const float slope[1] = {0.5f};
    for (int order = 0; order < 2; order++) {
        double o[5], lse, x[5], sum = 0;
        fa_params p;
        fa_params_init(&p);
        p.scale = 1;
        p.softcap = 2;
        p.alibi_slopes = slope;
        p.align = FA_ALIGN_TOP_LEFT;
        p.score_order = order ? FA_ALIBI_THEN_SOFTCAP : FA_SOFTCAP_THEN_ALIBI;
        softmax_probe(s, 5, &p, o, &lse);
        for (int j = 0; j < 5; j++) {
            x[j] = order ? 2 * tanh((s[j] - 0.5 * j) / 2) : 2 * tanh(s[j] / 2) - 0.5 * j;
            sum += exp(x[j]);
        }
        for (int j = 0; j < 5; j++)
            ck_assert_double_eq_tol(o[j], exp(x[j]) / sum, 1e-15);
        ck_assert_double_eq_tol(lse, log(sum), 1e-15);
    }
}
END_TEST

/* One logit 1000 above the rest: P is one-hot and exp never overflows. */
START_TEST(reference_one_hot)
{
    double s[7] = {1, -3, 2, 1000, 0.5, 999 - 800, 7}, o[7], lse;
    fa_params p;
    fa_params_init(&p);
    p.scale = 1;
    softmax_probe(s, 7, &p, o, &lse);
    for (int j = 0; j < 7; j++)
        ck_assert(o[j] == (j == 3 ? 1.0 : 0.0));
    ck_assert_double_eq_tol(lse, 1000, 1e-12);
}
END_TEST

/* q = 0 makes every score equal: O_i is the mean of the allowed v_j (causal: j <= i). */
START_TEST(reference_uniform_scores_mean)
{
    const int64_t S = 9, D = 5;
    ht_tensor q, k, v, o;
    ht_alloc(&q, FA_F64, 1, S, 1, D, SW_BSHD);
    ht_alloc(&k, FA_F64, 1, S, 1, D, SW_BSHD);
    ht_alloc(&v, FA_F64, 1, S, 1, D, SW_BSHD);
    ht_alloc(&o, FA_F64, 1, S, 1, D, SW_BSHD);
    ht_fill(&k, 1, -3, 3);
    ht_fill(&v, 2, -1, 1);
    for (int causal = 0; causal < 2; causal++) {
        fa_params p;
        fa_params_init(&p);
        p.causal = causal;
        ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 2, &p, &q.t, &k.t, &v.t, &o.t, NULL),
                         FA_OK);
        for (int64_t i = 0; i < S; i++)
            for (int64_t d = 0; d < D; d++) {
                int64_t n = causal ? i + 1 : S;
                double mean = 0;
                for (int64_t j = 0; j < n; j++)
                    mean += ht_get(&v, 0, j, 0, d);
                mean /= (double)n;
                ck_assert_double_eq_tol(ht_get(&o, 0, i, 0, d), mean, 1e-15);
            }
    }
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o);
}
END_TEST

/* L = sum(dO * O): its gradient is what fa_backward returns for cotangent dO. */
static double loss(const fa_params *p, ht_tensor *q, ht_tensor *k, ht_tensor *v, ht_tensor *o,
                   const ht_tensor *dout)
{
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 1, p, &q->t, &k->t, &v->t, &o->t, NULL),
                     FA_OK);
    double L = 0;
    for (int64_t s = 0; s < o->t.seqlen; s++)
        for (int64_t h = 0; h < o->t.heads; h++)
            for (int64_t d = 0; d < o->t.headdim; d++)
                L += ht_get(dout, 0, s, h, d) * ht_get(o, 0, s, h, d);
    return L;
}

/* Central differences, step 1e-5 (truncation ~1e-10, cancellation ~1e-11 at these sizes). */
static void fd_check(ht_tensor *x, const ht_tensor *g, const fa_params *p, ht_tensor *q,
                     ht_tensor *k, ht_tensor *v, ht_tensor *o, const ht_tensor *dout,
                     const char *name)
{
    const double eps = 1e-5;
    for (int64_t s = 0; s < x->t.seqlen; s++)
        for (int64_t h = 0; h < x->t.heads; h++)
            for (int64_t d = 0; d < x->t.headdim; d++) {
                double x0 = ht_get(x, 0, s, h, d);
                ht_set(x, 0, s, h, d, x0 + eps);
                double lp = loss(p, q, k, v, o, dout);
                ht_set(x, 0, s, h, d, x0 - eps);
                double lm = loss(p, q, k, v, o, dout);
                ht_set(x, 0, s, h, d, x0);
                double num = (lp - lm) / (2 * eps), got = ht_get(g, 0, s, h, d);
                ck_assert_msg(fabs(num - got) <= 1e-7 * (1 + fabs(num)),
                              "%s[s=%ld h=%ld d=%ld]: analytic %.12g, numeric %.12g", name,
                              (long)s, (long)h, (long)d, got, num);
            }
}

static const struct fd_case {
    int causal;
    int64_t wl, wr;
    double softcap, dropout;
    int alibi;
    fa_align align;
    fa_score_order order;
} fd_cases[] = {
    {0, -1, -1, 0, 0, 0, FA_ALIGN_BOTTOM_RIGHT, FA_SOFTCAP_THEN_ALIBI},
    {1, -1, -1, 0, 0, 0, FA_ALIGN_BOTTOM_RIGHT, FA_SOFTCAP_THEN_ALIBI},
    {0, 2, 1, 1.5, 0, 1, FA_ALIGN_TOP_LEFT, FA_SOFTCAP_THEN_ALIBI},
    {1, 3, -1, 0, 0.4, 1, FA_ALIGN_TOP_LEFT, FA_SOFTCAP_THEN_ALIBI},
    {0, -1, 0, 2.0, 0.25, 0, FA_ALIGN_BOTTOM_RIGHT, FA_SOFTCAP_THEN_ALIBI},
    {1, 4, -1, 1.25, 0.1, 1, FA_ALIGN_BOTTOM_RIGHT, FA_ALIBI_THEN_SOFTCAP},
};

START_TEST(reference_backward_finite_differences)
{
    const struct fd_case *c = &fd_cases[_i];
    const int64_t Sq = 5, Sk = 7, Hq = 2, Hk = 1, D = 3, Dv = 4;
    ht_tensor q, k, v, o, l, dout, dq, dk, dv;
    ht_alloc(&q, FA_F64, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc(&k, FA_F64, 1, Sk, Hk, D, SW_BHSD);
    ht_alloc(&v, FA_F64, 1, Sk, Hk, Dv, SW_BSHD);
    ht_alloc(&o, FA_F64, 1, Sq, Hq, Dv, SW_BSHD);
    ht_alloc(&dout, FA_F64, 1, Sq, Hq, Dv, SW_BSHD);
    ht_alloc(&dq, FA_F64, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc(&dk, FA_F64, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&dv, FA_F64, 1, Sk, Hk, Dv, SW_BSHD);
    ht_alloc_lse(&l, FA_F64, 1, Sq, Hq);
    ht_fill(&q, 10 + _i, -1.5, 1.5);
    ht_fill(&k, 20 + _i, -1.5, 1.5);
    ht_fill(&v, 30 + _i, -1, 1);
    ht_fill(&dout, 40 + _i, -1, 1);
    const float slopes[2] = {0.25f, 0.0625f};
    fa_params p;
    fa_params_init(&p);
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.softcap = c->softcap;
    p.dropout_p = c->dropout;
    p.dropout_seed = 99;
    p.alibi_slopes = c->alibi ? slopes : NULL;
    p.align = c->align;
    p.score_order = c->order;
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 1, &p, &q.t, &k.t, &v.t, &o.t, &l.t), FA_OK);
    ck_assert_int_eq(ht_backward(FA_BACKEND_REFERENCE, 2, &p, &q.t, &k.t, &v.t, &o.t, &l.t,
                                 &dout.t, &dq.t, &dk.t, &dv.t),
                     FA_OK);
    fd_check(&q, &dq, &p, &q, &k, &v, &o, &dout, "dq");
    fd_check(&k, &dk, &p, &q, &k, &v, &o, &dout, "dk");
    fd_check(&v, &dv, &p, &q, &k, &v, &o, &dout, "dv");
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o), ht_free(&l);
    ht_free(&dout), ht_free(&dq), ht_free(&dk), ht_free(&dv);
}
END_TEST

/*
 * The reference's two evaluations of docs/DESIGN.md §1 agree: kv heads 0 and 1 hold the same values
 * except a NaN in a key row no query may see (top-left causal, key >= Sq), which sends head 1's
 * group to the row-by-row path while head 0's takes the blocked GEMM path.
 */
START_TEST(reference_blocked_matches_rows)
{
    const int64_t sq = 70, sk = 150, D = 24, Dv = 20;
    ht_tensor q, k, v, o, l, dout, dq, dk, dv;
    ht_alloc(&q, FA_F64, 1, sq, 2, D, SW_BSHD);
    ht_alloc(&k, FA_F64, 1, sk, 2, D, SW_BSHD);
    ht_alloc(&v, FA_F64, 1, sk, 2, Dv, SW_BSHD);
    ht_alloc(&o, FA_F64, 1, sq, 2, Dv, SW_BSHD);
    ht_alloc(&dout, FA_F64, 1, sq, 2, Dv, SW_BSHD);
    ht_alloc(&dq, FA_F64, 1, sq, 2, D, SW_BSHD);
    ht_alloc(&dk, FA_F64, 1, sk, 2, D, SW_BSHD);
    ht_alloc(&dv, FA_F64, 1, sk, 2, Dv, SW_BSHD);
    ht_alloc_lse(&l, FA_F64, 1, sq, 2);
    ht_tensor *in[4] = {&q, &k, &v, &dout};
    for (int t = 0; t < 4; t++) {
        ht_fill(in[t], 50 + t, 1, -1);
        for (int64_t s = 0; s < in[t]->t.seqlen; s++)
            for (int64_t d = 0; d < in[t]->t.headdim; d++)
                ht_set(in[t], 0, s, 1, d, ht_get(in[t], 0, s, 0, d));
    }
    ht_set(&k, 0, sk - 1, 1, 3, NAN);
    const float slopes[2] = {0.125f, 0.125f};
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.align = FA_ALIGN_TOP_LEFT;
    p.softcap = 3;
    p.alibi_slopes = slopes;
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 2, &p, &q.t, &k.t, &v.t, &o.t, &l.t), FA_OK);
    ck_assert_int_eq(ht_backward(FA_BACKEND_REFERENCE, 2, &p, &q.t, &k.t, &v.t, &o.t, &l.t,
                                 &dout.t, &dq.t, &dk.t, &dv.t), FA_OK);
    const ht_tensor *res[5] = {&o, &l, &dq, &dk, &dv};
    const char *name[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int t = 0; t < 5; t++)
        for (int64_t s = 0; s < res[t]->t.seqlen; s++)
            for (int64_t d = 0; d < res[t]->t.headdim; d++) {
                if (t == 3 && s == sk - 1)
                    continue; /* dk of the poisoned row: 0 in both, compared below */
                double a = ht_get(res[t], 0, s, 0, d), b = ht_get(res[t], 0, s, 1, d);
                ck_assert_msg(fabs(a - b) <= 1e-14 * (1 + fabs(a)), "%s[%ld][%ld]: %.17g vs %.17g",
                              name[t], (long)s, (long)d, a, b);
            }
    ck_assert(ht_get(&dk, 0, sk - 1, 1, 3) == 0 && ht_get(&dk, 0, sk - 1, 0, 3) == 0);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o), ht_free(&l);
    ht_free(&dout), ht_free(&dq), ht_free(&dk), ht_free(&dv);
}
END_TEST

Suite *make_reference_suite(void)
{
    Suite *s = suite_create("reference");
    TCase *tc = ht_tcase_create("exact");
    tcase_add_test(tc, reference_worked_example);
    tcase_add_test(tc, reference_one_hot);
    tcase_add_test(tc, reference_score_order_exact);
    tcase_add_test(tc, reference_uniform_scores_mean);
    tcase_add_test(tc, reference_blocked_matches_rows);
    tcase_add_loop_test(tc, reference_backward_finite_differences, 0,
                        (int)(sizeof fd_cases / sizeof *fd_cases));
    suite_add_tcase(s, tc);
    return s;
}
