/*
 * Bias and keep-mask tensors (fa_params.bias, docs/DESIGN.md §1 step 2a): a mask equal to a
 * formula mask gives the formula's bits; broadcasting through dims of 1 and zero strides;
 * rows masked entirely; NaN in a bias; masked NaN in V kept out; the bias gradient against
 * finite differences and across thread counts; bad arguments refused with nothing written.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const fa_backend cpu_backends[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                           FA_BACKEND_TILED};

typedef struct {
    ht_tensor q, k, v, o, l, dout, dq, dk, dv;
} set;

static void set_alloc(set *x, fa_dtype dt, int64_t B, int64_t sq, int64_t sk, int64_t hq,
                      int64_t hk, int64_t d)
{
    ht_alloc(&x->q, dt, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->k, dt, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->v, dt, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->o, dt, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->dout, dt, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->dq, dt, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->dk, dt, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->dv, dt, B, sk, hk, d, SW_BSHD);
    ht_alloc_lse(&x->l, dt == FA_F64 ? FA_F64 : FA_F32, B, sq, hq);
    ht_fill(&x->q, 11, 1, -1);
    ht_fill(&x->k, 12, 1, -1);
    ht_fill(&x->v, 13, 1, -1);
    ht_fill(&x->dout, 14, 1, -1);
}

static void set_free(set *x)
{
    ht_free(&x->q), ht_free(&x->k), ht_free(&x->v), ht_free(&x->o), ht_free(&x->l);
    ht_free(&x->dout), ht_free(&x->dq), ht_free(&x->dk), ht_free(&x->dv);
}

static void run_forward(fa_backend be, int threads, const fa_params *p, set *x)
{
    ck_assert_msg(ht_forward(be, threads, p, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->l.t) == FA_OK,
                  "%s forward: %s", fa_backend_name(be), fa_last_error());
}

static void run_both(fa_backend be, int threads, const fa_params *p, set *x)
{
    run_forward(be, threads, p, x);
    ck_assert_msg(ht_backward(be, threads, p, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->l.t,
                              &x->dout.t, &x->dq.t, &x->dk.t, &x->dv.t) == FA_OK,
                  "%s backward: %s", fa_backend_name(be), fa_last_error());
}

static int same_bits(const ht_tensor *a, const ht_tensor *b)
{
    return a->nbytes == b->nbytes && memcmp(a->buf, b->buf, a->nbytes) == 0;
}

static void assert_same_results(const set *a, const set *b, int backward, const char *what)
{
    ck_assert_msg(same_bits(&a->o, &b->o), "%s: O differs", what);
    ck_assert_msg(same_bits(&a->l, &b->l), "%s: LSE differs", what);
    if (!backward)
        return;
    ck_assert_msg(same_bits(&a->dq, &b->dq), "%s: dQ differs", what);
    ck_assert_msg(same_bits(&a->dk, &b->dk), "%s: dK differs", what);
    ck_assert_msg(same_bits(&a->dv, &b->dv), "%s: dV differs", what);
}

/* The window of (left, right) around the bottom-right diagonal as a bias row: 0 where the key
 * is allowed, -inf where not (the definition of core/score.h, written out). */
static double window_entry(int64_t sq, int64_t sk, int64_t left, int64_t right, int64_t i,
                           int64_t j)
{
    const int64_t off = sk - sq;
    const int ok = (right < 0 || j <= i + off + right) && (left < 0 || j >= i + off - left);
    return ok ? 0.0 : -INFINITY;
}

/* A keep-mask (bool, broadcast over batch and heads: (1, Sq, 1, Sk)) equal to the causal mask
 * gives the causal results to the bit, forward and backward, on every CPU backend and dtype:
 * the masked scores are -inf, whose P is an exact 0. On aarch64 (NEON kernels, and OpenBLAS's
 * dgemm for the reference) the two runs' products round differently in the last bits (seen
 * under qemu: the causal run gives them other column ranges), so there the results are held
 * to 64 eps of the output's dtype instead; x86's kernels (AVX2, AVX-512, AMX) give the bits.
 * _i = 12: bf16 on emulated tile products, where the causal forward folds the score scale into
 * the max and the exp and the masked one (a bias) scales S where it is stored. */
START_TEST(keep_mask_equals_causal)
{
    static const fa_dtype dts[4] = {FA_F32, FA_F16, FA_BF16, FA_F64};
    const int emulated = _i == 12;
    if (emulated && ht_emulated_tiles_skipped())
        return;
    ht_kernels = emulated ? ht_emulated_tiles() : NULL;
    const fa_backend be = emulated ? FA_BACKEND_TILED : cpu_backends[_i / 4];
    const fa_dtype dt = emulated ? FA_BF16 : dts[_i % 4];
    const int64_t B = 2, sq = 150, sk = 170, H = 2, D = 64; /* AMX's tile products take D 64 */
    set a, b;
    set_alloc(&a, dt, B, sq, sk, H, 1, D);
    set_alloc(&b, dt, B, sq, sk, H, 1, D);
    ht_tensor mask;
    ht_alloc(&mask, FA_BOOL, 1, sq, 1, sk, SW_BSHD);
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < sk; j++)
            ht_set(&mask, 0, i, 0, j, window_entry(sq, sk, -1, 0, i, j));
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    run_both(be, 2, &p, &a);
    fa_params_init(&p);
    p.bias = &mask.t;
    run_both(be, 2, &p, &b);
#if defined(__aarch64__)
    const double eps = dt == FA_F64 ? 0x1p-52 : dt == FA_F32 ? 0x1p-23 : dt == FA_F16 ? 0x1p-10
                                                                                      : 0x1p-7;
    const ht_tensor *x[5] = {&a.o, &a.l, &a.dq, &a.dk, &a.dv}, *y[5] = {&b.o, &b.l, &b.dq, &b.dk,
                                                                      &b.dv};
    for (int t = 0; t < 5; t++)
        ck_assert_msg(ht_max_err(y[t], x[t]) <= 64 * eps * (1 + ht_max_abs(x[t])),
                      "%s: tensor %d %g apart", fa_backend_name(be), t, ht_max_err(y[t], x[t]));
#else
    assert_same_results(&a, &b, 1, fa_backend_name(be));
#endif
    ht_free(&mask);
    set_free(&a);
    set_free(&b);
}
END_TEST

/* An f32 bias of 0 / -inf equal to a sliding window (f16 storage, softcap and ALiBi on, so the
 * per-element pipeline runs): the window's bits, forward and backward, on the reference and
 * the conventional path, which visit every key of a row either way. The tiled rows sum P over
 * the tile's columns from the row's first allowed one, which the window moves and the bias
 * does not, so their sums group the same terms differently: there, within an f16 ulp. */
START_TEST(bias_equals_window)
{
    const fa_backend be = cpu_backends[_i];
    const int64_t B = 1, sq = 130, sk = 130, H = 2, D = 32, L = 37, R = 5;
    set a, b;
    set_alloc(&a, FA_F16, B, sq, sk, H, H, D);
    set_alloc(&b, FA_F16, B, sq, sk, H, H, D);
    ht_tensor bias;
    ht_alloc(&bias, FA_F32, B, sq, H, sk, SW_BHSD);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < sk; j++)
                ht_set(&bias, 0, i, h, j, window_entry(sq, sk, L, R, i, j));
    const float slopes[2] = {0.25f, 0.0625f};
    fa_params p;
    fa_params_init(&p);
    p.window_left = L;
    p.window_right = R;
    p.softcap = 3.0;
    p.alibi_slopes = slopes;
    run_both(be, 2, &p, &a);
    p.window_left = p.window_right = -1;
    p.bias = &bias.t;
    run_both(be, 2, &p, &b);
    if (be != FA_BACKEND_TILED) {
        assert_same_results(&a, &b, 1, fa_backend_name(be));
    } else {
        const ht_tensor *x[4] = {&a.o, &a.dq, &a.dk, &a.dv}, *y[4] = {&b.o, &b.dq, &b.dk, &b.dv};
        for (int t = 0; t < 4; t++)
            ck_assert_msg(ht_max_err(y[t], x[t]) <= 0x1p-10 * ht_max_abs(x[t]),
                          "tensor %d: %g apart (max %g)", t, ht_max_err(y[t], x[t]),
                          ht_max_abs(x[t]));
    }
    ht_free(&bias);
    set_free(&a);
    set_free(&b);
}
END_TEST

/* A bias of one row per batch and head for every head (heads 1) and for every batch through a
 * zero batch stride gives the bits of the same values repeated in a full (B, Sq, H, Sk) bias. */
START_TEST(broadcast_equals_repeated)
{
    const fa_backend be = cpu_backends[_i];
    const int64_t B = 2, sq = 70, sk = 90, H = 3, D = 24;
    set a, b;
    set_alloc(&a, FA_F32, B, sq, sk, H, H, D);
    set_alloc(&b, FA_F32, B, sq, sk, H, H, D);
    ht_tensor small, full;
    ht_alloc(&small, FA_F16, 1, sq, 1, sk, SW_BSHD);
    ht_alloc(&full, FA_F16, B, sq, H, sk, SW_BHSD);
    ht_fill(&small, 21, 2, -2);
    for (int64_t b0 = 0; b0 < B; b0++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t j = 0; j < sk; j++)
                    ht_set(&full, b0, i, h, j, ht_get(&small, 0, i, 0, j));
    fa_params p;
    fa_params_init(&p);
    p.bias = &full.t;
    run_both(be, 2, &p, &a);
    fa_tensor view = small.t; /* batch B at stride 0: the same rows for every batch */
    view.batch = B;
    view.batch_stride = 0;
    p.bias = &view;
    run_both(be, 2, &p, &b);
    assert_same_results(&a, &b, 1, "zero batch stride");
    p.bias = &small.t; /* batch 1: broadcast by the dim */
    run_both(be, 2, &p, &b);
    assert_same_results(&a, &b, 1, "dims of 1");
    ht_free(&small);
    ht_free(&full);
    set_free(&a);
    set_free(&b);
}
END_TEST

/* The tiled path against the float64 reference under the tolerance rule (the conventional
 * path its yardstick), outputs and gradients, the bias's included, for a random f16 bias before and after the cap, with ALiBi by distance or scaling the bias
 * (ggml), and a one-row (key padding) bias with some keys masked. */
START_TEST(bias_within_tolerance)
{
    const int place = _i & 1, by_slope = (_i >> 1) & 1, one_row = (_i >> 2) & 1;
    const int64_t B = 2, sq = 100, sk = 140, H = 2, D = 64;
    set ref, conv, tiled;
    set_alloc(&ref, FA_BF16, B, sq, sk, H, 1, D);
    set_alloc(&conv, FA_BF16, B, sq, sk, H, 1, D);
    set_alloc(&tiled, FA_BF16, B, sq, sk, H, 1, D);
    ht_tensor bias, grads[3];
    ht_alloc(&bias, FA_F16, B, one_row ? 1 : sq, H, sk, SW_BHSD);
    for (int g = 0; g < 3; g++)
        ht_alloc(&grads[g], FA_F32, B, one_row ? 1 : sq, H, sk, SW_BHSD);
    ht_fill(&bias, 31, 3, -3);
    for (int64_t j = 0; j < sk; j += 7) /* masked keys, the first row's too */
        ht_set(&bias, 0, 0, 1, j, -INFINITY);
    const float slopes[2] = {0.5f, 0.125f};
    fa_params p;
    fa_params_init(&p);
    p.bias = &bias.t;
    p.bias_place = place ? FA_BIAS_AFTER_SOFTCAP : FA_BIAS_AFTER_SCALE;
    p.softcap = 4.0;
    p.alibi_slopes = slopes;
    p.bias_by_slope = by_slope;
    set *sets[3] = {&ref, &conv, &tiled};
    for (int x = 0; x < 3; x++) {
        p.bias_grad = &grads[x].t;
        run_both(cpu_backends[x], 2, &p, sets[x]);
    }
    const ht_tensor *r[5] = {&ref.o, &ref.dq, &ref.dk, &ref.dv, &grads[0]},
                    *c[5] = {&conv.o, &conv.dq, &conv.dk, &conv.dv, &grads[1]},
                    *t[5] = {&tiled.o, &tiled.dq, &tiled.dk, &tiled.dv, &grads[2]};
    for (int x = 0; x < 5; x++) {
        fa_tolerance tol = {.factor = x == 0 ? 2 : 3};
        fa_comparison cmp;
        ck_assert_int_eq(fa_compare(&t[x]->t, &r[x]->t, &c[x]->t, &tol, &cmp), FA_OK);
        ck_assert_msg(cmp.pass, "case %d tensor %d: %s", _i, x, cmp.rule);
    }
    for (int g = 0; g < 3; g++)
        ht_free(&grads[g]);
    ht_free(&bias);
    set_free(&ref);
    set_free(&conv);
    set_free(&tiled);
}
END_TEST

/* A row that the bias masks entirely is empty (O = 0, LSE = -inf, or the sink's logit with a
 * sink; no gradient through it); NaN in an allowed bias entry makes its row NaN and only it;
 * NaN where the window masks changes nothing. */
START_TEST(masked_rows_and_nan)
{
    const fa_backend be = cpu_backends[_i % 3];
    const int with_sink = _i / 3;
    const int64_t sq = 40, sk = 60, D = 16;
    set x;
    set_alloc(&x, FA_F32, 1, sq, sk, 1, 1, D);
    ht_tensor bias;
    ht_alloc(&bias, FA_F32, 1, sq, 1, sk, SW_BSHD);
    ht_fill(&bias, 41, 1, -1);
    for (int64_t j = 0; j < sk; j++)
        ht_set(&bias, 0, 5, 0, j, -INFINITY); /* row 5: masked entirely */
    ht_set(&bias, 0, 9, 0, 3, NAN);            /* row 9: a NaN it sees */
    ht_set(&bias, 0, 12, 0, sk - 1, NAN);      /* row 12: a NaN the window hides */
    const float sink = 0.75f;
    fa_params p;
    fa_params_init(&p);
    p.bias = &bias.t;
    p.window_right = 0; /* causal, bottom-right: row 12 sees keys <= 32 */
    p.sink_logits = with_sink ? &sink : NULL;
    run_both(be, 1, &p, &x);
    ck_assert(ht_get(&x.l, 0, 5, 0, 0) == (with_sink ? (double)sink : -INFINITY));
    for (int64_t d = 0; d < D; d++) {
        ck_assert(ht_get(&x.o, 0, 5, 0, d) == 0.0);
        ck_assert(ht_get(&x.dq, 0, 5, 0, d) == 0.0);
        ck_assert(isnan(ht_get(&x.o, 0, 9, 0, d)));
        ck_assert(isfinite(ht_get(&x.o, 0, 12, 0, d)));
        ck_assert(isfinite(ht_get(&x.o, 0, 8, 0, d)));
    }
    ck_assert(isnan(ht_get(&x.l, 0, 9, 0, 0)));
    ck_assert(isfinite(ht_get(&x.l, 0, 12, 0, 0)));
    ht_free(&bias);
    set_free(&x);
}
END_TEST

/* NaN and inf in the V and K rows of keys that the bias masks for every row never reach the
 * fused paths' results (they skip masked keys by selection, as the window's), the bias
 * gradient's included (0 at masked keys): a bool key-padding mask, and an f32 one of 0 / -inf
 * with its gradient. */
START_TEST(masked_nonfinite_kv)
{
    const fa_backend be = _i % 2 ? FA_BACKEND_TILED : FA_BACKEND_REFERENCE;
    const int with_grad = _i / 2;
    const int64_t sq = 50, sk = 80, D = 16;
    set x;
    set_alloc(&x, FA_F32, 1, sq, sk, 1, 1, D);
    ht_tensor mask, grad;
    ht_alloc(&mask, with_grad ? FA_F32 : FA_BOOL, 1, 1, 1, sk, SW_BSHD); /* key padding */
    ht_alloc(&grad, FA_F32, 1, 1, 1, sk, SW_BSHD);
    for (int64_t j = 0; j < sk; j++)
        ht_set(&mask, 0, 0, 0, j, j % 9 == 4 ? -INFINITY : 0);
    for (int64_t j = 4; j < sk; j += 9) {
        ht_set(&x.v, 0, j, 0, 3, NAN);
        ht_set(&x.k, 0, j, 0, 1, INFINITY);
    }
    fa_params p;
    fa_params_init(&p);
    p.bias = &mask.t;
    p.bias_grad = with_grad ? &grad.t : NULL;
    run_both(be, 2, &p, &x);
    for (int64_t j = 0; with_grad && j < sk; j++) {
        const double g = ht_get(&grad, 0, 0, 0, j);
        ck_assert_msg(j % 9 == 4 ? g == 0.0 : isfinite(g), "%s: dbias[%lld] = %g",
                      fa_backend_name(be), (long long)j, g);
    }
    ht_free(&grad);
    const ht_tensor *outs[4] = {&x.o, &x.dq, &x.dk, &x.dv};
    for (int t = 0; t < 4; t++)
        for (int64_t s = 0; s < outs[t]->t.seqlen; s++)
            for (int64_t d = 0; d < D; d++)
                ck_assert_msg(isfinite(ht_get(outs[t], 0, s, 0, d)), "%s: tensor %d row %lld",
                              fa_backend_name(be), t, (long long)s);
    ht_free(&mask);
    set_free(&x);
}
END_TEST

/* loss = sum O * dO of the f64 reference forward, for the bias as it is. */
static double loss_of(const fa_params *p, set *x)
{
    run_forward(FA_BACKEND_REFERENCE, 1, p, x);
    double sum = 0;
    for (int64_t b = 0; b < x->o.t.batch; b++)
        for (int64_t i = 0; i < x->o.t.seqlen; i++)
            for (int64_t h = 0; h < x->o.t.heads; h++)
                for (int64_t d = 0; d < x->o.t.headdim; d++)
                    sum += ht_get(&x->o, b, i, h, d) * ht_get(&x->dout, b, i, h, d);
    return sum;
}

/* d loss / d bias of every CPU backend against central differences of the f64 reference,
 * before and after a softcap, with the bias broadcast over heads (its gradient the sum over
 * them) and masked entries (gradient 0). */
START_TEST(bias_grad_finite_differences)
{
    const fa_backend be = cpu_backends[_i % 3];
    const int after_cap = _i / 3;
    const int64_t B = 1, sq = 6, sk = 9, H = 2, D = 5;
    set x;
    set_alloc(&x, FA_F64, B, sq, sk, H, H, D);
    ht_tensor bias, grad;
    ht_alloc(&bias, FA_F64, B, sq, 1, sk, SW_BSHD);
    ht_alloc(&grad, FA_F64, B, sq, 1, sk, SW_BSHD);
    ht_fill(&bias, 51, 1, -1);
    ht_set(&bias, 0, 2, 0, 4, -INFINITY);
    fa_params p;
    fa_params_init(&p);
    p.bias = &bias.t;
    p.softcap = 1.5;
    p.bias_place = after_cap ? FA_BIAS_AFTER_SOFTCAP : FA_BIAS_AFTER_SCALE;
    p.bias_grad = &grad.t;
    run_both(be, 1, &p, &x);
    const double eps = 1e-6;
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < sk; j++) {
            const double b0 = ht_get(&bias, 0, i, 0, j), got = ht_get(&grad, 0, i, 0, j);
            if (b0 == -INFINITY) {
                ck_assert_msg(got == 0.0, "masked entry (%lld, %lld): %g", (long long)i,
                              (long long)j, got);
                continue;
            }
            ht_set(&bias, 0, i, 0, j, b0 + eps);
            const double up = loss_of(&p, &x);
            ht_set(&bias, 0, i, 0, j, b0 - eps);
            const double down = loss_of(&p, &x);
            ht_set(&bias, 0, i, 0, j, b0);
            const double fd = (up - down) / (2 * eps);
            ck_assert_msg(fabs(got - fd) <= 1e-7 + 1e-6 * fabs(fd),
                          "%s (%lld, %lld): %.12g vs finite differences %.12g",
                          fa_backend_name(be), (long long)i, (long long)j, got, fd);
        }
    ht_free(&bias);
    ht_free(&grad);
    set_free(&x);
}
END_TEST

/* A gradient over no rows: a backward with B = 0 (the bias broadcast over batches, batch 1)
 * or with Sq = 0 (broadcast over rows, seqlen 1) still owns a bias gradient with entries,
 * each a sum over no term: 0 on every CPU backend, where the gradient held ones before. */
START_TEST(bias_grad_over_no_rows_is_zero)
{
    const fa_backend be = cpu_backends[_i % 3];
    const int no_batch = _i / 3 == 0;
    const int64_t B = no_batch ? 0 : 2, sq = no_batch ? 4 : 0, sk = 5, H = 2, D = 8;
    set x;
    set_alloc(&x, FA_F32, B, sq, sk, H, H, D);
    ht_tensor bias, grad;
    ht_alloc(&bias, FA_F32, 1, no_batch ? sq : 1, H, sk, SW_BSHD);
    ht_alloc(&grad, FA_F32, 1, no_batch ? sq : 1, H, sk, SW_BSHD);
    ht_fill(&bias, 71, 1, -1);
    ht_fill(&grad, 72, 1.5, 1); /* nonzero everywhere */
    fa_params p;
    fa_params_init(&p);
    p.bias = &bias.t;
    p.bias_grad = &grad.t;
    ck_assert_msg(ht_backward(be, 2, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t, &x.l.t, &x.dout.t,
                              &x.dq.t, &x.dk.t, &x.dv.t) == FA_OK,
                  "%s backward: %s", fa_backend_name(be), fa_last_error());
    ck_assert_msg(ht_max_abs(&grad) == 0, "%s, %s: the bias gradient is not 0",
                  fa_backend_name(be), no_batch ? "B = 0" : "Sq = 0");
    ht_free(&bias);
    ht_free(&grad);
    set_free(&x);
}
END_TEST

/* The tiled backend's results with a bias and its gradient are the same bits at 1 and 3
 * threads, in both backward plans (one pass and two). */
START_TEST(bias_bits_across_threads)
{
    const int64_t B = 2, sq = 200, sk = 230, H = 4, D = 32;
    set a, b;
    set_alloc(&a, FA_F32, B, sq, sk, H, 2, D);
    set_alloc(&b, FA_F32, B, sq, sk, H, 2, D);
    ht_tensor bias, ga, gb;
    ht_alloc(&bias, FA_BF16, 1, sq, H, sk, SW_BHSD);
    ht_alloc(&ga, FA_F32, 1, sq, H, sk, SW_BHSD);
    ht_alloc(&gb, FA_F32, 1, sq, H, sk, SW_BHSD);
    ht_fill(&bias, 61, 2, -2);
    fa_params p;
    fa_params_init(&p);
    p.bias = &bias.t;
    p.causal = 1;
    setenv("FA_BACKWARD_PASSES", _i ? "2" : "1", 1);
    p.bias_grad = &ga.t;
    run_both(FA_BACKEND_TILED, 1, &p, &a);
    p.bias_grad = &gb.t;
    run_both(FA_BACKEND_TILED, 3, &p, &b);
    unsetenv("FA_BACKWARD_PASSES");
    assert_same_results(&a, &b, 1, "1 vs 3 threads");
    ck_assert_msg(same_bits(&ga, &gb), "the bias gradient differs across thread counts");
    ht_free(&bias);
    ht_free(&ga);
    ht_free(&gb);
    set_free(&a);
    set_free(&b);
}
END_TEST

/* Each bad bias argument: its own status, and no output written. */
START_TEST(bad_bias_arguments)
{
    const int64_t B = 2, sq = 8, sk = 10, H = 2, D = 8;
    set x;
    set_alloc(&x, FA_F32, B, sq, sk, H, H, D);
    ht_tensor bias, wrong_sk, wrong_b, mask, grad, grad16;
    ht_alloc(&bias, FA_F32, B, sq, H, sk, SW_BSHD);
    ht_alloc(&wrong_sk, FA_F32, B, sq, H, sk + 1, SW_BSHD);
    ht_alloc(&wrong_b, FA_F32, 3, sq, H, sk, SW_BSHD);
    ht_alloc(&mask, FA_BOOL, B, sq, H, sk, SW_BSHD);
    ht_alloc(&grad, FA_F32, B, sq, H, sk, SW_BSHD);
    ht_alloc(&grad16, FA_F16, B, sq, H, sk, SW_BSHD);
    const float slopes[2] = {1, 1};
    fa_tensor grad_on_bias = grad.t; /* an output on an input's bytes */
    grad_on_bias.data = bias.t.data;
    struct {
        const fa_tensor *bias;
        fa_tensor *grad;
        int place, by_slope, with_slopes;
        fa_status want;
        const char *says;
    } cases[] = {
        {&wrong_sk.t, NULL, 0, 0, 0, FA_ERR_SHAPE, "params->bias->headdim"},
        {&wrong_b.t, NULL, 0, 0, 0, FA_ERR_SHAPE, "params->bias->batch"},
        {&bias.t, NULL, 7, 0, 0, FA_ERR_INVALID_ARGUMENT, "params->bias_place"},
        {&bias.t, NULL, 0, 1, 0, FA_ERR_INVALID_ARGUMENT, "params->alibi_slopes"},
        {NULL, NULL, 0, 1, 1, FA_ERR_INVALID_ARGUMENT, "params->bias_by_slope"},
        {NULL, &grad.t, 0, 0, 0, FA_ERR_INVALID_ARGUMENT, "params->bias_grad"},
        {&mask.t, &grad.t, 0, 0, 0, FA_ERR_INVALID_ARGUMENT, "keep-mask"},
        {&bias.t, &grad16.t, 0, 0, 0, FA_ERR_DTYPE, "params->bias_grad->dtype"},
        {&bias.t, &grad_on_bias, 0, 0, 0, FA_ERR_STRIDE, "params->bias_grad"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fa_params p;
        fa_params_init(&p);
        p.bias = cases[c].bias;
        p.bias_grad = cases[c].grad;
        p.bias_place = (fa_bias_place)cases[c].place;
        p.bias_by_slope = cases[c].by_slope;
        p.alibi_slopes = cases[c].with_slopes ? slopes : NULL;
        ht_poison(&x.dq), ht_poison(&x.dk), ht_poison(&x.dv), ht_poison(&grad);
        const fa_status st = ht_backward(FA_BACKEND_TILED, 1, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t,
                                         &x.l.t, &x.dout.t, &x.dq.t, &x.dk.t, &x.dv.t);
        ck_assert_msg(st == cases[c].want, "case %zu: %s (%s)", c, fa_status_string(st),
                      fa_last_error());
        ck_assert_msg(strstr(fa_last_error(), cases[c].says), "case %zu: '%s' lacks '%s'", c,
                      fa_last_error(), cases[c].says);
        ck_assert(ht_is_poisoned(&x.dq) && ht_is_poisoned(&x.dk) && ht_is_poisoned(&x.dv));
        ck_assert(ht_is_poisoned(&grad));
    }
    /* calls of sequences take no bias */
    fa_params p;
    fa_params_init(&p);
    fa_tensor bias1 = bias.t; /* the packed sequences' batch: 1 */
    bias1.batch = 1;
    p.bias = &bias1;
    const int32_t cu[2] = {0, sq};
    const fa_indices cuq = {cu, FA_INDEX_INT32, 2};
    fa_tensor q1 = x.q.t, k1 = x.k.t, v1 = x.v.t, o1 = x.o.t;
    q1.batch = k1.batch = v1.batch = o1.batch = 1;
    const int32_t cuk_v[2] = {0, sk};
    const fa_indices cuk = {cuk_v, FA_INDEX_INT32, 2};
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 1);
    ht_poison(&x.o);
    ck_assert_int_eq(fa_forward_varlen(ctx, &p, &q1, &k1, &v1, &cuq, &cuk, &o1, NULL),
                     FA_ERR_UNSUPPORTED);
    ck_assert(ht_is_poisoned(&x.o));
    fa_context_destroy(ctx);
    ht_free(&bias), ht_free(&wrong_sk), ht_free(&wrong_b), ht_free(&mask);
    ht_free(&grad), ht_free(&grad16);
    set_free(&x);
}
END_TEST

/* A random block mask of q_block x kv_block blocks keeping each block with probability
 * `density` (split between the partial and the full lists), and the same mask expanded into a
 * bool keep-mask (1, Sq, heads, Sk). */
typedef struct {
    fa_block_mask bm;
    int32_t *num, *idx, *fnum, *fidx;
    ht_tensor keep;
} blocks;

static void blocks_make(blocks *x, int64_t heads, int64_t sq, int64_t sk, int64_t qb, int64_t kb,
                        double density, uint64_t seed)
{
    const int64_t nq = (sq + qb - 1) / qb, nk = (sk + kb - 1) / kb, rows = heads * nq;
    x->num = calloc((size_t)rows, 4), x->fnum = calloc((size_t)rows, 4);
    x->idx = calloc((size_t)(rows * nk), 4), x->fidx = calloc((size_t)(rows * nk), 4);
    ht_alloc(&x->keep, FA_BOOL, 1, sq, heads, sk, SW_BSHD);
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < sk; j++)
                ht_set(&x->keep, 0, i, h, j, -INFINITY);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = nk - 1; c >= 0; c--) { /* listed in descending order: any order goes */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(seed >> 11) * 0x1p-53;
            if (u >= density)
                continue;
            if (u < density / 2)
                x->idx[r * nk + x->num[r]++] = (int32_t)c;
            else
                x->fidx[r * nk + x->fnum[r]++] = (int32_t)c;
            const int64_t h = r / nq, i0 = r % nq * qb, j0 = c * kb;
            for (int64_t i = i0; i < i0 + qb && i < sq; i++)
                for (int64_t j = j0; j < j0 + kb && j < sk; j++)
                    ht_set(&x->keep, 0, i, h, j, 0);
        }
    x->bm = (fa_block_mask){1,
                            heads,
                            qb,
                            kb,
                            {x->num, FA_INDEX_INT32, rows},
                            {x->idx, FA_INDEX_INT32, rows * nk},
                            {x->fnum, FA_INDEX_INT32, rows},
                            {x->fidx, FA_INDEX_INT32, rows * nk}};
}

static void blocks_free(blocks *x)
{
    free(x->num), free(x->idx), free(x->fnum), free(x->fidx);
    ht_free(&x->keep);
}

/* A block mask of every density from 0 to 1 gives the bits of the same mask as a dense bool
 * keep-mask, forward and backward, with a causal window on top, on every CPU backend; block
 * sizes that cut across the tiles, the mask broadcast over batch (and over heads when the
 * case says so). The tiled path skips the key tiles no row of a query tile sees; with key
 * blocks of whole vectors (64 keys) it narrows each strip to its listed blocks, and its sums
 * may then group differently from the dense mask's: there, within 2^-20 of the largest. */
START_TEST(block_mask_equals_dense_mask)
{
    static const double density[5] = {0, 0.25, 0.5, 0.75, 1};
    const fa_backend be = cpu_backends[_i % 3];
    const int narrowed = _i >= 6 && be == FA_BACKEND_TILED;
    const int64_t B = 2, sq = 200, sk = 260, H = 2, D = 32, mh = (_i / 3) % 2 ? 1 : H;
    const int64_t kb = _i >= 6 ? 64 : 40;
    for (int d = 0; d < 5; d++) {
        set a, b;
        set_alloc(&a, FA_F32, B, sq, sk, H, 1, D);
        set_alloc(&b, FA_F32, B, sq, sk, H, 1, D);
        blocks x;
        blocks_make(&x, mh, sq, sk, 48, kb, density[d], 71 + (uint64_t)d);
        fa_params p;
        fa_params_init(&p);
        p.causal = 1;
        p.block_mask = &x.bm;
        run_both(be, 2, &p, &a);
        p.block_mask = NULL;
        p.bias = &x.keep.t;
        run_both(be, 2, &p, &b);
        char what[64];
        snprintf(what, sizeof what, "%s density %g", fa_backend_name(be), density[d]);
        if (!narrowed) {
            assert_same_results(&a, &b, 1, what);
        } else {
            const ht_tensor *x1[5] = {&a.o, &a.l, &a.dq, &a.dk, &a.dv},
                            *x2[5] = {&b.o, &b.l, &b.dq, &b.dk, &b.dv};
            for (int t = 0; t < 5; t++)
                ck_assert_msg(ht_max_err(x1[t], x2[t]) <= 0x1p-20 * (1 + ht_max_abs(x2[t])),
                              "%s: tensor %d %g apart", what, t, ht_max_err(x1[t], x2[t]));
        }
        if (density[d] == 0) /* every row empty */
            ck_assert(ht_max_abs(&a.o) == 0 && ht_get(&a.l, 0, 7, 0, 0) == -INFINITY);
        blocks_free(&x);
        set_free(&a);
        set_free(&b);
    }
}
END_TEST

/* A bias and a block mask together, with a causal window (16-key blocks: the tiled strips
 * narrow to their listed blocks, and rows left of those see nothing of them): the tiled path
 * against the reference under the tolerance rule, outputs and gradients, the bias's too. */
START_TEST(bias_and_block_mask_together)
{
    const int64_t B = 1, sq = 150, sk = 190, H = 2, D = 32;
    set ref, conv, tiled;
    set_alloc(&ref, FA_F32, B, sq, sk, H, H, D);
    set_alloc(&conv, FA_F32, B, sq, sk, H, H, D);
    set_alloc(&tiled, FA_F32, B, sq, sk, H, H, D);
    blocks x;
    blocks_make(&x, H, sq, sk, 32, 16, 0.6, 91);
    const int64_t nq = (sq + 31) / 32, nk = (sk + 15) / 16;
    for (int64_t h = 0; h < H; h++) { /* query block 0 lists only the last key block, which its
                                         causal rows (keys <= i + 40) never reach */
        x.num[h * nq] = 1, x.fnum[h * nq] = 0;
        x.idx[h * nq * nk] = (int32_t)(nk - 1);
    }
    ht_tensor bias, grads[3];
    ht_alloc(&bias, FA_F16, B, sq, 1, sk, SW_BSHD);
    ht_fill(&bias, 92, 1, -1);
    for (int g = 0; g < 3; g++)
        ht_alloc(&grads[g], FA_F32, B, sq, 1, sk, SW_BSHD);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.bias = &bias.t;
    p.block_mask = &x.bm;
    set *sets[3] = {&ref, &conv, &tiled};
    for (int s = 0; s < 3; s++) {
        p.bias_grad = &grads[s].t;
        run_both(cpu_backends[s], 2, &p, sets[s]);
    }
    const ht_tensor *r[5] = {&ref.o, &ref.dq, &ref.dk, &ref.dv, &grads[0]},
                    *c[5] = {&conv.o, &conv.dq, &conv.dk, &conv.dv, &grads[1]},
                    *t[5] = {&tiled.o, &tiled.dq, &tiled.dk, &tiled.dv, &grads[2]};
    for (int k = 0; k < 5; k++) {
        fa_tolerance tol = {.factor = k == 0 ? 2 : 3};
        fa_comparison cmp;
        ck_assert_int_eq(fa_compare(&t[k]->t, &r[k]->t, &c[k]->t, &tol, &cmp), FA_OK);
        ck_assert_msg(cmp.pass, "tensor %d: %s", k, cmp.rule);
    }
    for (int g = 0; g < 3; g++)
        ht_free(&grads[g]);
    ht_free(&bias);
    blocks_free(&x);
    set_free(&ref), set_free(&conv), set_free(&tiled);
}
END_TEST

/* Each bad block mask: its own status and message, and no output written. */
START_TEST(bad_block_masks)
{
    const int64_t B = 1, sq = 64, sk = 80, H = 2, D = 8;
    set x;
    set_alloc(&x, FA_F32, B, sq, sk, H, H, D);
    blocks good;
    blocks_make(&good, H, sq, sk, 32, 32, 0.5, 5); /* 2 x 3 blocks per head */
    int32_t num[4] = {1, 1, 1, 1}, idx[12] = {0}, fnum[4] = {1, 0, 0, 0}, fidx[12] = {0};
    struct {
        int what;
        fa_status want;
        const char *says;
    } cases[] = {
        {0, FA_ERR_INVALID_ARGUMENT, "kv_indices[0] = 3 is outside [0, 3)"},
        {1, FA_ERR_INVALID_ARGUMENT, "listed twice"},
        {2, FA_ERR_INVALID_ARGUMENT, "full_kv_indices[0] = 0: key block 0 is listed twice"},
        {3, FA_ERR_INVALID_ARGUMENT, "kv_num_blocks[2] = 4"},
        {4, FA_ERR_SHAPE, "kv_indices.count"},
        {5, FA_ERR_SHAPE, "params->block_mask->batch"},
        {6, FA_ERR_INVALID_ARGUMENT, "block sizes"},
        {7, FA_ERR_SHAPE, "params->block_mask->heads"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fa_block_mask bm = good.bm;
        memset(idx, 0, sizeof idx), memset(fidx, 0, sizeof fidx);
        for (int r = 0; r < 4; r++)
            num[r] = 1, fnum[r] = 0, idx[r * 3] = r % 3;
        bm.kv_num_blocks = (fa_indices){num, FA_INDEX_INT32, 4};
        bm.kv_indices = (fa_indices){idx, FA_INDEX_INT32, 12};
        bm.full_kv_num_blocks = (fa_indices){fnum, FA_INDEX_INT32, 4};
        bm.full_kv_indices = (fa_indices){fidx, FA_INDEX_INT32, 12};
        switch (cases[c].what) {
        case 0: idx[0] = 3; break;
        case 1: num[1] = 2, idx[3] = 1, idx[4] = 1; break;
        case 2: fnum[0] = 1, fidx[0] = 0; break;
        case 3: num[2] = 4; break;
        case 4: bm.kv_indices.count = 11; break;
        case 5: bm.batch = 3; break;
        case 6: bm.q_block = 0; break;
        case 7: bm.heads = 3; break;
        }
        fa_params p;
        fa_params_init(&p);
        p.block_mask = &bm;
        ht_poison(&x.o), ht_poison(&x.dq);
        fa_status st = ht_forward(FA_BACKEND_TILED, 1, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t, NULL);
        ck_assert_msg(st == cases[c].want, "case %zu: %s (%s)", c, fa_status_string(st),
                      fa_last_error());
        ck_assert_msg(strstr(fa_last_error(), cases[c].says), "case %zu: '%s' lacks '%s'", c,
                      fa_last_error(), cases[c].says);
        ck_assert(ht_is_poisoned(&x.o));
        st = ht_backward(FA_BACKEND_REFERENCE, 1, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t, &x.l.t,
                         &x.dout.t, &x.dq.t, &x.dk.t, &x.dv.t);
        ck_assert_int_eq(st, cases[c].want);
        ck_assert(ht_is_poisoned(&x.dq));
        /* checked even where nothing is to compute: no keys (whose gradients are 0 but are
         * not written), and no batch */
        fa_tensor k0 = x.k.t, v0 = x.v.t, dk0 = x.dk.t, dv0 = x.dv.t, q0 = x.q.t, o0 = x.o.t;
        k0.seqlen = v0.seqlen = dk0.seqlen = dv0.seqlen = 0;
        if (cases[c].what != 0 && cases[c].what != 1 && cases[c].what != 4) {
            st = ht_backward(FA_BACKEND_TILED, 1, &p, &x.q.t, &k0, &v0, &x.o.t, &x.l.t,
                             &x.dout.t, &x.dq.t, &dk0, &dv0);
            ck_assert_msg(st != FA_OK, "case %zu, Sk 0: %s", c, fa_last_error());
            ck_assert(ht_is_poisoned(&x.dq));
        }
        q0.batch = o0.batch = 0;
        st = ht_forward(FA_BACKEND_TILED, 1, &p, &q0, &x.k.t, &x.v.t, &o0, NULL);
        ck_assert_msg(st != FA_OK || cases[c].what == 5, "case %zu, B 0: accepted", c);
    }
    blocks_free(&good);
    set_free(&x);
}
END_TEST

Suite *make_masks_suite(void)
{
    Suite *s = suite_create("masks");
    TCase *tc = ht_tcase_create("bias tensors");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, keep_mask_equals_causal, 0, 13);
    tcase_add_loop_test(tc, bias_equals_window, 0, 3);
    tcase_add_loop_test(tc, broadcast_equals_repeated, 0, 3);
    tcase_add_loop_test(tc, bias_within_tolerance, 0, 8);
    tcase_add_loop_test(tc, masked_rows_and_nan, 0, 6);
    tcase_add_loop_test(tc, masked_nonfinite_kv, 0, 4);
    tcase_add_loop_test(tc, bias_grad_finite_differences, 0, 6);
    tcase_add_loop_test(tc, bias_grad_over_no_rows_is_zero, 0, 6);
    tcase_add_loop_test(tc, bias_bits_across_threads, 0, 2);
    tcase_add_test(tc, bad_bias_arguments);
    tcase_add_loop_test(tc, block_mask_equals_dense_mask, 0, 12);
    tcase_add_test(tc, bad_block_masks);
    tcase_add_test(tc, bias_and_block_mask_together);
    suite_add_tcase(s, tc);
    return s;
}
