/*
 * Every backend against the float64 reference over the shape/feature sweep of docs/DESIGN.md §4,
 * forward (out, LSE) and backward (dq, dk, dv), in every storage dtype, under the tolerance
 * rule (fa_compare): the tiled path's max error is at most 2x (3x for gradients) the
 * conventional path's error in the same dtype on the same inputs, plus a floor. The
 * conventional path itself is held to fixed bounds in f64 and f32, where rounding is small
 * enough that any semantic slip (a mask off by one, a wrong scale) stands out.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

/* Sizes relative to the tiled backend's tiles for the case's head dims. */
#define BQ(x) (100000 + (x))
#define BK(x) (200000 + (x))

static const ht_sweep_case cases[] = {
    /* b  sq       sk       hq hk dqk  dv  causal wl  wr  TL softcap alibi p    layout order sink_tokens */
    {1, 1, 1, 1, 1, 16, 16, 0, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {2, 2, 3, 2, 1, 8, 8, 1, -1, -1, 0, 0, 0, 0, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 3, 2, 1, 1, 5, 7, 1, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0}, /* row 0 sees no key */
    {1, BK(-1), BK(-1), 1, 1, 64, 64, 1, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, BK(0), BK(0), 2, 2, 64, 64, 1, -1, -1, 0, 0, 0, 0.2, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, BK(1), BK(1), 1, 1, 64, 64, 0, 5, 3, 0, 0, 0, 0, HT_PADDED, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, BQ(-1), 97, 1, 1, 32, 32, 0, -1, -1, 0, 0, 0, 0, HT_PADDED, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, BQ(0), 113, 2, 1, 32, 32, 1, -1, -1, 1, 0, 1, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, BQ(1), 127, 1, 1, 32, 48, 1, -1, -1, 0, 5, 0, 0, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 97, 113, 4, 2, 59, 111, 0, 16, 8, 0, 10, 1, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 127, 1025, 2, 1, 16, 16, 1, -1, -1, 1, 0, 0, 0.3, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 1025, 127, 1, 1, 16, 16, 1, -1, -1, 0, 0, 1, 0, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0}, /* 898 empty rows */
    {2, 113, 97, 4, 1, 59, 59, 0, 0, 0, 0, 0, 0, 0.5, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},  /* MQA, one key per row */
    {1, 129, 129, 2, 2, 111, 59, 0, -1, 0, 0, 0, 0, 0, HT_PADDED, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 65, 200, 1, 1, 128, 128, 0, 20, -1, 0, 3, 1, 0.1, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0}, /* everything at once */
    {1, 200, 65, 2, 1, 24, 40, 1, -1, -1, 1, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 5, 1, 1, 1, 4, 4, 1, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0}, /* only the last row sees the key */
    {1, 257, 257, 2, 2, 64, 64, 0, -1, -1, 0, 0, 0, 0, HT_PADDED, FA_SOFTCAP_THEN_ALIBI, 0},
    /* MQA: dK and dV sum 8 heads' terms (summed in one chain over the group's rows, the f32
     * gradients carried 3-4.5x the conventional error, past the 3x rule) */
    {2, 128, 128, 8, 1, 64, 64, 1, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {3, 61, 67, 6, 3, 19, 23, 1, 7, -1, 0, 2, 1, 0.15, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 90, 90, 2, 1, 32, 32, 1, -1, -1, 0, 2, 1, 0.1, HT_BSHD, FA_ALIBI_THEN_SOFTCAP, 0},
    /* decode shapes (the tiled forward's decode path: group x Sq <= 16, no dropout), keys over
     * several 512-key chunks: GQA at D=128; MQA with a window whose edge differs per query
     * position, odd head dims; causal with softcap and ALiBi over two chunks (the per-element
     * pipeline, whose key index is the chunk's offset plus the column) */
    {1, 1, 1537, 8, 2, 128, 128, 1, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
    {2, 3, 1100, 4, 1, 80, 72, 0, 600, 0, 0, 0, 0, 0, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0},
    {1, 4, 700, 4, 2, 33, 17, 1, -1, -1, 0, 5, 1, 0, HT_PADDED, FA_ALIBI_THEN_SOFTCAP, 0},
    /* sink tokens (the last column): the first keys beside a window, over several tiles and
     * decode chunks; sinks that end inside a key tile whose later keys the window holds;
     * sinks over a chunk boundary (600 > 512) */
    {1, 300, 300, 2, 1, 32, 32, 1, 40, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 5},
    {2, 150, 200, 4, 2, 24, 16, 0, 30, 10, 1, 4, 1, 0.2, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 70},
    {2, 3, 1600, 4, 1, 64, 64, 1, 700, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 4},
    {1, 2, 1300, 8, 2, 32, 32, 1, 100, -1, 0, 3, 1, 0, HT_PADDED, FA_ALIBI_THEN_SOFTCAP, 600},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

static const fa_dtype dtypes[4] = {FA_F64, FA_F32, FA_F16, FA_BF16};

static int64_t resolve(int64_t x, int64_t bq, int64_t bk)
{
    return x >= 200000 - 1000 ? bk + (x - 200000) : x >= 100000 - 1000 ? bq + (x - 100000) : x;
}

/* Runs forward and backward of `be` on the bundle's inputs into its outputs. */
static void run(fa_backend be, const fa_params *p, ht_bundle *x)
{
    fa_status s = ht_forward(be, 2, p, &x->q.t, &x->k.t, &x->v.t, &x->out.t, &x->lse.t);
    ck_assert_msg(s == FA_OK, "%s forward: %s", fa_backend_name(be), fa_last_error());
    s = ht_backward(be, 2, p, &x->q.t, &x->k.t, &x->v.t, &x->out.t, &x->lse.t, &x->dout.t,
                    &x->dq.t, &x->dk.t, &x->dv.t);
    ck_assert_msg(s == FA_OK, "%s backward: %s", fa_backend_name(be), fa_last_error());
}

/* The reference on the exact float64 twins of the bundle's inputs. */
static void run_reference(const fa_params *p, ht_bundle *in, ht_bundle *ref)
{
    fa_status s = ht_forward(FA_BACKEND_REFERENCE, 2, p, &in->q.t64, &in->k.t64, &in->v.t64,
                             &ref->out.t, &ref->lse.t);
    ck_assert_msg(s == FA_OK, "reference forward: %s", fa_last_error());
    s = ht_backward(FA_BACKEND_REFERENCE, 2, p, &in->q.t64, &in->k.t64, &in->v.t64, &ref->out.t,
                    &ref->lse.t, &in->dout.t64, &ref->dq.t, &ref->dk.t, &ref->dv.t);
    ck_assert_msg(s == FA_OK, "reference backward: %s", fa_last_error());
}

static void compare(const char *what, const char *label, const ht_tensor *conv,
                    const ht_tensor *tiled, const ht_tensor *ref, fa_dtype dt, int grad)
{
    double ec = ht_max_err(conv, ref), mx = ht_max_abs(ref);
    ck_assert_msg(isfinite(ec), "%s %s: conventional error %g", label, what, ec);
    /* fixed bounds for the yardstick itself where its rounding is small */
    if (dt == FA_F64)
        ck_assert_msg(ec <= 1e-10 * (1 + mx), "%s %s: conventional f64 error %g", label, what, ec);
    if (dt == FA_F32)
        ck_assert_msg(ec <= 1e-4 * (1 + mx), "%s %s: conventional f32 error %g", label, what, ec);
    const fa_tolerance tol = {grad ? 3 : 2, 0, 0};
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&tiled->t, &ref->t, &conv->t, &tol, &c), FA_OK);
    ck_assert_msg(c.pass, "%s %s: tiled error %.3g > %s", label, what, c.max_abs, c.rule);
}

/* Inputs drawn N(0, 1) (or uniform [lo, hi) for the large-logit case) and rounded to dt; the
 * backward gets an LSE of lse_dt, but f64 where ALiBi reaches past 128 keys: its bias grows
 * with the distance, so |LSE| reaches slope x Sq (128 in case 7), and an f32 LSE is then good
 * to |LSE| 2^-24 only, which the backward's P = exp(s - LSE) carries to every gradient of the
 * row, as in backends_large_logits below (measured, case 7 dV: 1.14e-5 from an f32 LSE, 7.6e-6
 * from an f64 one, against a bound of 1.06e-5). */
static void sweep_one(const ht_sweep_case *c, fa_dtype dt, int idx, double lo, double hi,
                      double kscale, fa_dtype lse_dt)
{
    int64_t bq, bk;
    ht_tiles(c->dqk, c->dv, dt, &bq, &bk);
    const int64_t sq = resolve(c->sq, bq, bk), sk = resolve(c->sk, bq, bk);
    if (c->alibi && (sq > 128 || sk > 128))
        lse_dt = FA_F64;
    const float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f, 0.004f};
    fa_params p;
    fa_params_init(&p);
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.align = c->top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    p.softcap = c->softcap;
    p.alibi_slopes = c->alibi ? slopes : NULL;
    p.dropout_p = c->dropout;
    p.dropout_seed = 0xfeedface12345678ull + (uint64_t)idx;
    p.dropout_offset = 3;
    p.score_order = c->order;
    p.sink_tokens = c->sink_tokens;

    ht_bundle conv, tiled, ref;
    ht_bundle_alloc(&conv, dt, c, sq, sk, c->layout, lse_dt);
    ht_bundle_alloc(&tiled, dt, c, sq, sk, c->layout, lse_dt); /* outputs strided like the inputs */
    ht_bundle_alloc(&ref, FA_F64, c, sq, sk, HT_BSHD, FA_F64);
    ht_fill(&conv.q, 1000 + idx, lo, hi);
    ht_fill(&conv.k, 2000 + idx, lo * kscale, hi * kscale);
    ht_fill(&conv.v, 3000 + idx, -1, 1);
    ht_fill(&conv.dout, 4000 + idx, -1, 1);
    /* the tiled run reads the same values through the conventional bundle's inputs */
    run(FA_BACKEND_CONVENTIONAL, &p, &conv);
    run_reference(&p, &conv, &ref);
    /* the tiled path with every kernel set this CPU runs; where its forward takes the decode
     * path, once more with FA_DECODE=0 (the tiles); bf16 last on emulated tile products
     * (tests/tiles_emulated.c: the AMX paths' framework, on any CPU) */
    const int decode = ht_decode_keys(2, &p, &conv.q.t, &conv.k.t, &conv.v.t) > 0;
    for (int t = 0; t <= 2 * ht_nisas; t++) {
        const int emulated = t == 2 * ht_nisas, tiles_too = t >= ht_nisas && !emulated;
        /* the emulated tiles only where the tile products take the forward (else its bf16
         * runs the best set's f32 kernels, done above): Dqk a multiple of 32, Dv of 16 (the
         * backward takes them where Dv is a multiple of 32 too, else the f32 kernels) */
        if (emulated ? ht_emulated_tiles_skipped() || dt != FA_BF16 || c->dqk % 32 || c->dv % 16
                     : !ht_isa_runs(ht_isas[t % ht_nisas]) || (tiles_too && !decode))
            continue;
        ht_bundle in = conv;
        in.out = tiled.out, in.lse = tiled.lse, in.dq = tiled.dq, in.dk = tiled.dk, in.dv = tiled.dv;
        ht_isa = emulated ? FA_ISA_AUTO : ht_isas[t % ht_nisas];
        ht_kernels = emulated ? ht_emulated_tiles() : NULL;
        if (tiles_too || emulated)
            setenv("FA_DECODE", "0", 1);
        run(FA_BACKEND_TILED, &p, &in);
        unsetenv("FA_DECODE");
        ht_isa = FA_ISA_AUTO;
        ht_kernels = NULL;
        char label[200];
        snprintf(label, sizeof label, "case %d %s %s%s (B%ld Sq%ld Sk%ld H%ld/%ld D%ld/%ld)", idx,
                 fa_dtype_name(dt), emulated ? "emulated-tiles" : fa_isa_name(ht_isas[t % ht_nisas]),
                 decode && !emulated ? tiles_too ? " tiles" : " decode" : "", (long)c->b,
                 (long)sq, (long)sk, (long)c->hq, (long)c->hk, (long)c->dqk, (long)c->dv);
        compare("out", label, &conv.out, &tiled.out, &ref.out, dt, 0);
        compare("lse", label, &conv.lse, &tiled.lse, &ref.lse, dt, 0);
        compare("dq", label, &conv.dq, &tiled.dq, &ref.dq, dt, 1);
        compare("dk", label, &conv.dk, &tiled.dk, &ref.dk, dt, 1);
        compare("dv", label, &conv.dv, &tiled.dv, &ref.dv, dt, 1);
    }
    ht_bundle_free(&conv), ht_bundle_free(&tiled), ht_bundle_free(&ref);
}

START_TEST(backends_match_reference)
{
    const fa_dtype dt = dtypes[_i % 4]; /* lo > hi below: N(0, 1) inputs */
    sweep_one(&cases[_i / 4], dt, _i / 4, 1, -1, 1, dt == FA_F64 ? FA_F64 : FA_F32);
}
END_TEST

/*
 * Logits in [90, 100] (XNNPACK's range): exp(90) overflows f32, so a path that skipped the max
 * subtraction would return inf/NaN. q, k entries in [a, b] with a^2 sqrt(D) = 90 and
 * b^2 sqrt(D) = 100 make every scaled score s = q.k / sqrt(D) fall in [90, 100].
 */
START_TEST(backends_large_logits)
{
    static const ht_sweep_case big[2] = {
        {1, 70, 90, 2, 1, 64, 64, 0, -1, -1, 0, 0, 0, 0, HT_BSHD, FA_SOFTCAP_THEN_ALIBI, 0},
        {1, 90, 70, 1, 1, 64, 32, 1, -1, -1, 0, 0, 0, 0.2, HT_BHSD, FA_SOFTCAP_THEN_ALIBI, 0},
    };
    const double a = sqrt(90 / 8.0), b = sqrt(100 / 8.0); /* sqrt(D) = 8 */
    /* An f32 LSE near 100 is only good to 4e-6, and the backward's P = exp(s - LSE) carries
     * that error to every gradient of the row (the conventional yardstick never stores one):
     * at these logits the gradients are held to the rule with an f64 LSE. */
    sweep_one(&big[_i / 4], dtypes[_i % 4], 100 + _i / 4, a, b, 1, FA_F64);
}
END_TEST

Suite *make_backends_suite(void)
{
    Suite *s = suite_create("backends");
    TCase *tc = ht_tcase_create("sweep");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, backends_match_reference, 0, 4 * NCASES);
    tcase_add_loop_test(tc, backends_large_logits, 0, 8);
    suite_add_tcase(s, tc);
    return s;
}
