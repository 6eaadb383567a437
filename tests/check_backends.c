/*
 * Every backend against the float64 reference over the shape/feature sweep of docs/DESIGN.md §4
 * (the cases marked SW_BACKENDS in tests/sweep_cases.c, large logits among them), forward
 * (out, LSE) and backward (dq, dk, dv), in every storage dtype, under the tolerance
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

static const fa_dtype dtypes[4] = {FA_F64, FA_F32, FA_F16, FA_BF16};

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

/* The honest-candidate tally of statistics_honest_sweep: candidates judged, those that
 * failed (the first one's verdict in words), and each test's largest ratio of its statistic to
 * its bound (the max error's too). NULL outside it. */
typedef struct {
    long n, failed;
    double worst[5]; /* max, bias, scale, RMS, decorrelation */
    char first[1024];
} tally;
static tally *honest;

static void tally_add(tally *t, const fa_comparison *c)
{
    const double r[5] = {c->bound > 0 ? c->max_abs / c->bound : 0, fabs(c->bias) / c->bias_bound,
                         fabs(c->scale - 1) / c->scale_bound, c->rms / c->rms_bound,
                         c->decorr / c->decorr_bound};
    t->n++;
    for (int i = 0; i < 5; i++)
        t->worst[i] = r[i] > t->worst[i] ? r[i] : t->worst[i];
}

static void compare(const char *what, const char *label, const ht_tensor *conv,
                    const ht_tensor *tiled, const ht_tensor *ref, fa_dtype dt, int grad,
                    const fa_tolerance *lse_tol)
{
    double ec = ht_max_err(conv, ref), mx = ht_max_abs(ref);
    ck_assert_msg(isfinite(ec), "%s %s: conventional error %g", label, what, ec);
    /* fixed bounds for the yardstick itself where its rounding is small */
    if (dt == FA_F64)
        ck_assert_msg(ec <= 1e-10 * (1 + mx), "%s %s: conventional f64 error %g", label, what, ec);
    if (dt == FA_F32)
        ck_assert_msg(ec <= 1e-4 * (1 + mx), "%s %s: conventional f32 error %g", label, what, ec);
    const fa_tolerance tol = {.factor = grad ? 3 : 2,
                              .allowance = lse_tol ? lse_tol->allowance : 0,
                              .allowance_rel = lse_tol ? lse_tol->allowance_rel : 0};
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&tiled->t, &ref->t, &conv->t, &tol, &c), FA_OK);
    if (honest) /* counted, all of them judged: the sweep asserts at its end */
        tally_add(honest, &c);
    if (c.pass)
        return;
    char verdict[1024]; /* in words only when it failed: the sweep judges thousands */
    snprintf(verdict, sizeof verdict, "%s %s: tiled error %.3g, %s; %s", label, what, c.max_abs,
             c.rule, ht_stats(&c));
    if (honest) {
        if (!honest->failed++)
            snprintf(honest->first, sizeof honest->first, "%s", verdict);
        return;
    }
    ck_assert_msg(0, "%s", verdict);
}

/*
 * One case in one dtype: sizes relative to the tiles resolved against the tiled backend's for
 * the case's head dims and dtype (ht_tiles), inputs drawn as the case says (sw_draw) and
 * rounded to dt, the LSE in sw_lse_dtype's dtype.
 */
static void sweep_one(const sw_case *c, fa_dtype dt)
{
    int64_t bq, bk;
    ht_tiles(c->dims.dqk, c->dims.dv, dt, &bq, &bk);
    const sw_dims d = sw_dims_of(c, bq, bk);
    const fa_dtype lse_dt = sw_lse_dtype(c, &d, dt);
    fa_params p;
    sw_params(c, &p);

    ht_bundle conv, tiled, ref;
    ht_bundle_alloc(&conv, dt, &d, c->layout, lse_dt);
    ht_bundle_alloc(&tiled, dt, &d, c->layout, lse_dt); /* outputs strided like the inputs */
    ht_bundle_alloc(&ref, FA_F64, &d, SW_BSHD, FA_F64);
    ht_bundle_draw(&conv, c);
    /* the tiled run reads the same values through the conventional bundle's inputs */
    run(FA_BACKEND_CONVENTIONAL, &p, &conv);
    run_reference(&p, &conv, &ref);
    ht_tensor lse_y; /* the LSE held to its own dtype: f32 for the 16-bit dtypes */
    fa_tolerance lse_tol;
    const int own_lse = ht_lse_yardstick(&p, &conv, dt, &lse_y, &lse_tol);
    /* the tiled path with every distinct kernel set this CPU runs (ht_isa_tested); where its
     * forward takes the decode path, once more with FA_DECODE=0 (the tiles); bf16 last on
     * emulated tile products (tests/tiles_emulated.c: the AMX paths' framework, on any CPU) */
    const int decode = ht_decode_keys(2, &p, &conv.q.t, &conv.k.t, &conv.v.t) > 0;
    int sets_run = 0; /* of the CPU's kernel sets (ht_isa_tested: each distinct one once) */
    for (int t = 0; t <= 2 * ht_nisas; t++) {
        const int emulated = t == 2 * ht_nisas, tiles_too = t >= ht_nisas && !emulated;
        /* the emulated tiles only where the tile products take the forward (else its bf16
         * runs the best set's f32 kernels, done above): Dqk a multiple of 32, Dv of 16 (the
         * backward takes them where Dv is a multiple of 32 too, else the f32 kernels) */
        if (emulated ? ht_emulated_tiles_skipped() || dt != FA_BF16 || d.dqk % 32 || d.dv % 16
                     : !ht_isa_tested(t % ht_nisas, dt) || (tiles_too && !decode))
            continue;
        ht_bundle in = conv;
        in.out = tiled.out, in.lse = tiled.lse, in.dq = tiled.dq, in.dk = tiled.dk, in.dv = tiled.dv;
        ht_isa = emulated ? FA_ISA_AUTO : ht_isas[t % ht_nisas];
        ht_kernels = emulated ? ht_emulated_tiles() : NULL;
        if (tiles_too || emulated)
            setenv("FA_DECODE", "0", 1);
        run(FA_BACKEND_TILED, &p, &in);
        sets_run += !emulated && !tiles_too;
        unsetenv("FA_DECODE");
        ht_isa = FA_ISA_AUTO;
        ht_kernels = NULL;
        char label[200];
        snprintf(label, sizeof label, "%s %s %s%s (B%ld Sq%ld Sk%ld H%ld/%ld D%ld/%ld)", c->name,
                 fa_dtype_name(dt), emulated ? "emulated-tiles" : fa_isa_name(ht_isas[t % ht_nisas]),
                 decode && !emulated ? tiles_too ? " tiles" : " decode" : "", (long)d.b,
                 (long)d.sq, (long)d.sk, (long)d.hq, (long)d.hk, (long)d.dqk, (long)d.dv);
        compare("out", label, &conv.out, &tiled.out, &ref.out, dt, 0, NULL);
        compare("lse", label, own_lse ? &lse_y : &conv.lse, &tiled.lse, &ref.lse,
                own_lse ? FA_F32 : dt, 0, &lse_tol);
        compare("dq", label, &conv.dq, &tiled.dq, &ref.dq, dt, 1, NULL);
        compare("dk", label, &conv.dk, &tiled.dk, &ref.dk, dt, 1, NULL);
        compare("dv", label, &conv.dv, &tiled.dv, &ref.dv, dt, 1, NULL);
    }
    ck_assert_msg(sets_run > 0, "%s %s: no kernel set ran", c->name, fa_dtype_name(dt));
    ht_bundle_free(&conv), ht_bundle_free(&tiled), ht_bundle_free(&ref);
    if (own_lse)
        ht_free(&lse_y);
}

/* The cases marked SW_BACKENDS (make_backends_suite). */
static const sw_case *sweep[64];
static int nsweep;

START_TEST(backends_match_reference)
{
    sweep_one(sweep[_i / 4], dtypes[_i % 4]);
}
END_TEST

/*
 * The sweep holds every feature it is there to test, as the library receives it (sw_params'
 * fa_params, sw_dims_of's sizes): the sweep above hands the same params to the reference and to
 * the paths it judges, so a mapping that dropped a switch (softcap, say) or a table edit that
 * lost the last case of one would leave it green while it tested less.
 */
START_TEST(backends_sweep_covers_features)
{
    static const char *const feature[] = {
        "causal (bottom-right)", "causal top-left", "a left window bound", "a right window bound",
        "sink tokens",           "softcap",         "ALiBi",               "ALiBi before softcap",
        "dropout",               "GQA",             "MQA",                 "Dqk != Dv",
        "BHSD",                  "padded rows",     "large logits",        "Sq != Sk",
        "decode (Sq <= 4, Sk > 512)",
    };
    enum { N = (int)(sizeof feature / sizeof *feature) };
    int seen[N] = {0};
    for (int i = 0; i < nsweep; i++) {
        const sw_case *c = sweep[i];
        fa_params p;
        sw_params(c, &p);
        const sw_dims d = sw_dims_of(c, 64, 128); /* tiles of any size */
        const int has[N] = {
            p.causal && p.align == FA_ALIGN_BOTTOM_RIGHT,
            p.causal && p.align == FA_ALIGN_TOP_LEFT,
            p.window_left >= 0,
            p.window_right >= 0,
            p.sink_tokens > 0 && p.window_left >= 0,
            p.softcap > 0,
            p.alibi_slopes != NULL,
            p.alibi_slopes && p.softcap > 0 && p.score_order == FA_ALIBI_THEN_SOFTCAP,
            p.dropout_p > 0,
            d.hk > 1 && d.hq > d.hk,
            d.hk == 1 && d.hq > 1,
            d.dqk != d.dv,
            c->layout == SW_BHSD,
            c->layout == SW_PADDED,
            c->logits[0] >= 90,
            d.sq != d.sk,
            d.sq <= 4 && d.sk > 512,
        };
        for (int f = 0; f < N; f++)
            seen[f] |= has[f];
    }
    for (int f = 0; f < N; f++)
        ck_assert_msg(seen[f], "no case of the sweep has %s", feature[f]);
}
END_TEST

/*
 * docs/DESIGN.md §4's false-FAIL rate of the statistics: honest candidates (the tiled path,
 * every kernel set this CPU runs, every dtype; out, LSE, dQ, dK, dV) on random problems of
 * varied shapes and masks must all pass. FA_HONEST_CASES problems (default 12; the counts of
 * docs/notes/oracle.md are FA_HONEST_CASES=150); every candidate is judged, then the count,
 * the failures and each test's largest statistic / bound are printed, and the test fails if
 * any failed (naming the first).
 */
START_TEST(statistics_honest_sweep)
{
    static const int64_t sqs[] = {1, 37, 128, 256, 300}, sks[] = {64, 200, 513, 1024};
    static const int64_t hs[][2] = {{2, 2}, {4, 1}, {4, 2}};
    static const int64_t ds[][2] = {{32, 32}, {64, 64}, {128, 128}, {59, 59}, {96, 64}};
    const char *env = getenv("FA_HONEST_CASES");
    const int n = env ? atoi(env) : 12;
    tally t = {0};
    honest = &t;
    for (int i = 0; i < n; i++) {
        sw_case c = {.name = "honest", .seed = 5000 + i};
        c.dims = (sw_dims){.b = 1 + i % 2, .sq = sqs[i % 5], .sk = sks[(i / 5) % 4],
                           .hq = hs[i % 3][0], .hk = hs[i % 3][1], .dqk = ds[(i / 3) % 5][0],
                           .dv = ds[(i / 3) % 5][1]};
        c.causal = i % 4 == 1 || i % 4 == 2;
        c.top_left = i % 4 == 2;
        if (i % 7 == 3) /* a window instead of the causal mask */
            c.causal = c.top_left = 0, c.window = (sw_window)SW_WINDOW(40 + i, i % 2 ? -1 : 9);
        c.layout = i % 6 == 5 ? SW_BHSD : SW_BSHD;
        for (int k = 0; k < 4; k++)
            sweep_one(&c, dtypes[k]);
    }
    honest = NULL;
    fprintf(stderr,
            "statistics_honest_sweep: %d problems, %ld honest candidates, %ld failed; largest "
            "statistic / bound: max %.3f, bias %.3f, scale %.3f, rms %.3f, decorr %.3f\n",
            n, t.n, t.failed, t.worst[0], t.worst[1], t.worst[2], t.worst[3], t.worst[4]);
    ck_assert_msg(t.failed == 0, "%ld of %ld honest candidates failed; the first: %s", t.failed,
                  t.n, t.first);
}
END_TEST

Suite *make_backends_suite(void)
{
    Suite *s = suite_create("backends");
    TCase *tc = ht_tcase_create("sweep");
    tcase_set_timeout(tc, 600);
    nsweep = sw_select(SW_BACKENDS, sweep, (int)(sizeof sweep / sizeof *sweep));
    tcase_add_loop_test(tc, backends_match_reference, 0, 4 * nsweep);
    tcase_add_test(tc, backends_sweep_covers_features);
    tcase_add_test(tc, statistics_honest_sweep);
    suite_add_tcase(s, tc);
    return s;
}
