/*
 * sweep_digest: a hash of every backend's outputs over the test sweep, to prove that a change
 * meant to keep behaviour (a restructuring, a refactor) keeps every bit.
 *
 * It runs the shapes and features of tests/check_backends.c (sizes resolved to fixed numbers,
 * so that the run does not depend on the tile plan it is checking), a few cases that cross the
 * forward's large query tiles, non-finite inputs in masked and allowed rows, forced tiles and
 * backward passes, and fa_merge_states; forward (out, LSE) and backward (dq, dk, dv, from the
 * same backend's out and LSE) on the reference, the conventional path and the tiled backend
 * with every ISA this machine runs, in every storage dtype, on 1 and 2 threads. Each line is
 * one run: its label and the FNV-1a hash of its outputs' elements in index order (strides and
 * padding do not enter). The last line hashes all lines.
 *
 * Only the public API is used, so the same source builds against any version of the library:
 *     make tests/sweep_digest && ./tests/sweep_digest > after.txt
 * then the same against the old tree, and `diff before.txt after.txt`.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

/* ------------------------------------------------------------------ hashing */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

#define FNV0 0xcbf29ce484222325ull

static uint64_t all_lines = FNV0;

static void report(const char *label, uint64_t h)
{
    char line[400];
    snprintf(line, sizeof line, "%s %016llx\n", label, (unsigned long long)h);
    fputs(line, stdout);
    all_lines = fnv(all_lines, line, strlen(line));
}

/* ------------------------------------------------------------------ tensors */

typedef enum { L_BSHD, L_BHSD, L_PADDED } layout;

static size_t dsize(fa_dtype d) { return d == FA_F64 ? 8 : d == FA_F32 ? 4 : 2; }

typedef struct {
    fa_tensor t;
    void *buf;
    size_t bytes;
} tensor;

static void talloc(tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D, layout l)
{
    const int64_t pad = l == L_PADDED ? 3 : 0, Dp = D + pad;
    fa_tensor *t = &x->t;
    t->dtype = dt;
    t->batch = B, t->seqlen = S, t->heads = H, t->headdim = D, t->headdim_stride = 1;
    if (l == L_BHSD) {
        t->seq_stride = Dp, t->head_stride = S * Dp, t->batch_stride = H * S * Dp;
    } else {
        t->head_stride = Dp, t->seq_stride = H * Dp + pad, t->batch_stride = S * (H * Dp + pad);
    }
    x->bytes = (size_t)(B * t->batch_stride + 64) * dsize(dt);
    x->buf = calloc(1, x->bytes);
    t->data = x->buf;
}

static void tlse(tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H)
{
    fa_tensor *t = &x->t;
    t->dtype = dt;
    t->batch = B, t->seqlen = S, t->heads = H, t->headdim = 1, t->headdim_stride = 1;
    t->seq_stride = 1, t->head_stride = S, t->batch_stride = H * S;
    x->bytes = (size_t)(B * H * S + 8) * dsize(dt);
    x->buf = calloc(1, x->bytes);
    t->data = x->buf;
}

static void tfree(tensor *x) { free(x->buf); }

static void *elem(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (char *)t->data +
           (b * t->batch_stride + s * t->seq_stride + h * t->head_stride) * (int64_t)dsize(t->dtype);
}

static uint64_t thash(uint64_t h, const fa_tensor *t)
{
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t hh = 0; hh < t->heads; hh++)
                h = fnv(h, elem(t, b, s, hh), (size_t)t->headdim * dsize(t->dtype));
    return h;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi), or N(0, 1) when lo > hi; rounded to the dtype by fa_convert. */
static void tfill(tensor *x, uint64_t seed, double lo, double hi)
{
    uint64_t st = seed * 0x2545f4914f6cdd1dull + 1;
    const fa_tensor *t = &x->t;
    double *row = malloc((size_t)t->headdim * sizeof(double));
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++) {
                for (int64_t d = 0; d < t->headdim; d++) {
                    double u = ((double)(splitmix(&st) >> 11) + 0.5) * 0x1p-53;
                    if (lo > hi) {
                        double u2 = ((double)(splitmix(&st) >> 11) + 0.5) * 0x1p-53;
                        row[d] = sqrt(-2 * log(u)) * cos(6.283185307179586 * u2);
                    } else {
                        row[d] = lo + (hi - lo) * u;
                    }
                }
                fa_convert(row, FA_F64, elem(t, b, s, h), t->dtype, (size_t)t->headdim);
            }
    free(row);
}

static void tset(tensor *x, int64_t b, int64_t s, int64_t h, int64_t d, double v)
{
    fa_convert(&v, FA_F64, (char *)elem(&x->t, b, s, h) + d * (int64_t)dsize(x->t.dtype),
               x->t.dtype, 1);
}

/* ------------------------------------------------------------------ cases */

typedef struct {
    int64_t b, sq, sk, hq, hk, dqk, dv;
    int causal;
    int64_t wl, wr;
    int top_left;
    double softcap;
    int alibi;
    double dropout;
    layout lay;
    fa_score_order order;
    int nonfinite; /* inf/NaN planted in K/V rows (masked and allowed) and in Q */
    double lo, hi; /* input range (lo > hi: N(0, 1)) */
} dcase;

/* check_backends.c's sweep with BQ(x) = 128 + x and BK(x) = 256 + x, its large-logit cases,
 * and cases past the forward's 4096-row query tile, with GQA, on the selection paths. */
#define N01 1, -1
static const dcase cases[] = {
    {.b = 1, .sq = 1, .sk = 1, .hq = 1, .hk = 1, .dqk = 16, .dv = 16, .wl = -1, .wr = -1, .lo = 1, .hi = -1},
    {.b = 2, .sq = 2, .sk = 3, .hq = 2, .hk = 1, .dqk = 8, .dv = 8, .causal = 1, .wl = -1, .wr = -1, .lay = L_BHSD, .lo = 1, .hi = -1},
    {.b = 1, .sq = 3, .sk = 2, .hq = 1, .hk = 1, .dqk = 5, .dv = 7, .causal = 1, .wl = -1, .wr = -1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 255, .sk = 255, .hq = 1, .hk = 1, .dqk = 64, .dv = 64, .causal = 1, .wl = -1, .wr = -1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 256, .sk = 256, .hq = 2, .hk = 2, .dqk = 64, .dv = 64, .causal = 1, .wl = -1, .wr = -1, .dropout = 0.2, .lo = 1, .hi = -1},
    {.b = 1, .sq = 257, .sk = 257, .hq = 1, .hk = 1, .dqk = 64, .dv = 64, .wl = 5, .wr = 3, .lay = L_PADDED, .lo = 1, .hi = -1},
    {.b = 1, .sq = 127, .sk = 97, .hq = 1, .hk = 1, .dqk = 32, .dv = 32, .wl = -1, .wr = -1, .lay = L_PADDED, .lo = 1, .hi = -1},
    {.b = 1, .sq = 128, .sk = 113, .hq = 2, .hk = 1, .dqk = 32, .dv = 32, .causal = 1, .wl = -1, .wr = -1, .top_left = 1, .alibi = 1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 129, .sk = 127, .hq = 1, .hk = 1, .dqk = 32, .dv = 48, .causal = 1, .wl = -1, .wr = -1, .softcap = 5, .lay = L_BHSD, .lo = 1, .hi = -1},
    {.b = 1, .sq = 97, .sk = 113, .hq = 4, .hk = 2, .dqk = 59, .dv = 111, .wl = 16, .wr = 8, .softcap = 10, .alibi = 1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 127, .sk = 1025, .hq = 2, .hk = 1, .dqk = 16, .dv = 16, .causal = 1, .wl = -1, .wr = -1, .top_left = 1, .dropout = 0.3, .lo = 1, .hi = -1},
    {.b = 1, .sq = 1025, .sk = 127, .hq = 1, .hk = 1, .dqk = 16, .dv = 16, .causal = 1, .wl = -1, .wr = -1, .alibi = 1, .lay = L_BHSD, .lo = 1, .hi = -1},
    {.b = 2, .sq = 113, .sk = 97, .hq = 4, .hk = 1, .dqk = 59, .dv = 59, .wl = 0, .wr = 0, .dropout = 0.5, .lo = 1, .hi = -1},
    {.b = 1, .sq = 129, .sk = 129, .hq = 2, .hk = 2, .dqk = 111, .dv = 59, .wl = -1, .wr = 0, .lay = L_PADDED, .lo = 1, .hi = -1},
    {.b = 1, .sq = 65, .sk = 200, .hq = 1, .hk = 1, .dqk = 128, .dv = 128, .wl = 20, .wr = -1, .softcap = 3, .alibi = 1, .dropout = 0.1, .lay = L_BHSD, .lo = 1, .hi = -1},
    {.b = 1, .sq = 200, .sk = 65, .hq = 2, .hk = 1, .dqk = 24, .dv = 40, .causal = 1, .wl = -1, .wr = -1, .top_left = 1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 5, .sk = 1, .hq = 1, .hk = 1, .dqk = 4, .dv = 4, .causal = 1, .wl = -1, .wr = -1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 257, .sk = 257, .hq = 2, .hk = 2, .dqk = 64, .dv = 64, .wl = -1, .wr = -1, .lay = L_PADDED, .lo = 1, .hi = -1},
    {.b = 3, .sq = 61, .sk = 67, .hq = 6, .hk = 3, .dqk = 19, .dv = 23, .causal = 1, .wl = 7, .wr = -1, .softcap = 2, .alibi = 1, .dropout = 0.15, .lay = L_BHSD, .lo = 1, .hi = -1},
    {.b = 1, .sq = 90, .sk = 90, .hq = 2, .hk = 1, .dqk = 32, .dv = 32, .causal = 1, .wl = -1, .wr = -1, .softcap = 2, .alibi = 1, .dropout = 0.1, .order = FA_ALIBI_THEN_SOFTCAP, .lo = 1, .hi = -1},
    /* logits in [90, 100] */
    {.b = 1, .sq = 70, .sk = 90, .hq = 2, .hk = 1, .dqk = 64, .dv = 64, .wl = -1, .wr = -1, .lo = 3.3541019662496847, .hi = 3.5355339059327378},
    {.b = 1, .sq = 90, .sk = 70, .hq = 1, .hk = 1, .dqk = 64, .dv = 32, .causal = 1, .wl = -1, .wr = -1, .dropout = 0.2, .lay = L_BHSD, .lo = 3.3541019662496847, .hi = 3.5355339059327378},
    /* past the forward's 4096-row query tile; GQA; D = 128 with AMX's multiples */
    {.b = 1, .sq = 4097, .sk = 300, .hq = 2, .hk = 1, .dqk = 128, .dv = 128, .causal = 1, .wl = -1, .wr = -1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 600, .sk = 4100, .hq = 4, .hk = 2, .dqk = 64, .dv = 64, .wl = 700, .wr = 33, .lo = 1, .hi = -1},
    /* non-finite values: the selection paths */
    {.b = 1, .sq = 300, .sk = 300, .hq = 2, .hk = 1, .dqk = 32, .dv = 32, .causal = 1, .wl = -1, .wr = -1, .nonfinite = 1, .lo = 1, .hi = -1},
    {.b = 1, .sq = 70, .sk = 290, .hq = 1, .hk = 1, .dqk = 64, .dv = 64, .wl = 40, .wr = 2, .dropout = 0.25, .nonfinite = 1, .lo = 1, .hi = -1},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

typedef struct {
    tensor q, k, v, dout, out, lse, dq, dk, dv;
} bundle;

static void balloc(bundle *x, const dcase *c, fa_dtype dt)
{
    talloc(&x->q, dt, c->b, c->sq, c->hq, c->dqk, c->lay);
    talloc(&x->k, dt, c->b, c->sk, c->hk, c->dqk, c->lay);
    talloc(&x->v, dt, c->b, c->sk, c->hk, c->dv, c->lay);
    talloc(&x->dout, dt, c->b, c->sq, c->hq, c->dv, c->lay);
    talloc(&x->out, dt, c->b, c->sq, c->hq, c->dv, c->lay);
    talloc(&x->dq, dt, c->b, c->sq, c->hq, c->dqk, c->lay);
    talloc(&x->dk, dt, c->b, c->sk, c->hk, c->dqk, c->lay);
    talloc(&x->dv, dt, c->b, c->sk, c->hk, c->dv, c->lay);
    tlse(&x->lse, dt == FA_F64 ? FA_F64 : FA_F32, c->b, c->sq, c->hq);
}

static void bfree(bundle *x)
{
    tfree(&x->q), tfree(&x->k), tfree(&x->v), tfree(&x->dout), tfree(&x->out);
    tfree(&x->lse), tfree(&x->dq), tfree(&x->dk), tfree(&x->dv);
}

static void plant_nonfinite(bundle *x, const dcase *c)
{
    /* K and V rows near the start (masked for early causal rows, allowed for later ones), one
     * V row late in the sequence, a NaN in a Q row */
    tset(&x->k, 0, c->sk / 3, 0, 1, INFINITY);
    tset(&x->v, 0, c->sk / 2, 0, 2, NAN);
    tset(&x->v, 0, c->sk - 2, c->hk - 1, 0, -INFINITY);
    tset(&x->q, 0, c->sq / 4, 0, 3, NAN);
}

/* ------------------------------------------------------------------ runs */

typedef struct {
    fa_backend be;
    fa_isa isa;
    int threads;
    const char *tiles, *passes; /* FA_TILES, FA_BACKWARD_PASSES (NULL: unset) */
} config;

static fa_context *make_ctx(const config *cf)
{
    if (cf->tiles)
        setenv("FA_TILES", cf->tiles, 1);
    else
        unsetenv("FA_TILES");
    if (cf->passes)
        setenv("FA_BACKWARD_PASSES", cf->passes, 1);
    else
        unsetenv("FA_BACKWARD_PASSES");
    fa_options o;
    fa_options_init(&o);
    o.backend = cf->be;
    o.isa = cf->isa;
    o.num_threads = cf->threads;
    fa_context *ctx = NULL;
    if (fa_context_create(&o, &ctx) != FA_OK)
        return NULL;
    return ctx;
}

static void run_case(int ci, fa_dtype dt, const config *cf, const char *cfname)
{
    const dcase *c = &cases[ci];
    bundle x;
    balloc(&x, c, dt);
    tfill(&x.q, 1000 + ci, c->lo, c->hi);
    tfill(&x.k, 2000 + ci, c->lo, c->hi);
    tfill(&x.v, 3000 + ci, -1, 1);
    tfill(&x.dout, 4000 + ci, -1, 1);
    if (c->nonfinite)
        plant_nonfinite(&x, c);
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
    p.dropout_seed = 0xfeedface12345678ull + (uint64_t)ci;
    p.dropout_offset = 3;
    p.score_order = c->order;

    char label[300];
    fa_context *ctx = make_ctx(cf);
    fa_status s = ctx ? fa_forward(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.out.t, &x.lse.t)
                      : FA_ERR_BACKEND_UNAVAILABLE;
    snprintf(label, sizeof label, "case%02d %-4s %-28.39s fwd", ci, fa_dtype_name(dt), cfname);
    report(label, s == FA_OK ? thash(thash(FNV0, &x.out.t), &x.lse.t) : (uint64_t)s);
    if (s == FA_OK) {
        s = fa_backward(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.out.t, &x.lse.t, &x.dout.t, &x.dq.t,
                        &x.dk.t, &x.dv.t);
        snprintf(label, sizeof label, "case%02d %-4s %-28.39s bwd", ci, fa_dtype_name(dt), cfname);
        report(label, s == FA_OK ? thash(thash(thash(FNV0, &x.dq.t), &x.dk.t), &x.dv.t)
                                 : (uint64_t)s);
    }
    fa_context_destroy(ctx);
    bfree(&x);
}

/* fa_merge_states over three partial states, one of them empty. */
static void run_merge(fa_dtype dt)
{
    const dcase c = {.b = 2, .sq = 37, .hq = 3, .dv = 40, .lay = L_BHSD};
    tensor o[3], l[3], out, lse;
    for (int k = 0; k < 3; k++) {
        talloc(&o[k], dt, c.b, c.sq, c.hq, c.dv, c.lay);
        tlse(&l[k], dt == FA_F64 ? FA_F64 : FA_F32, c.b, c.sq, c.hq);
        tfill(&o[k], 50 + k, -1, 1);
        tfill(&l[k], 60 + k, -3, 5);
    }
    for (int64_t i = 0; i < c.sq; i += 3)
        tset(&l[1], 1, i, 2, 0, -INFINITY);
    talloc(&out, dt, c.b, c.sq, c.hq, c.dv, L_BSHD);
    tlse(&lse, FA_F64, c.b, c.sq, c.hq);
    fa_tensor os[3] = {o[0].t, o[1].t, o[2].t}, ls[3] = {l[0].t, l[1].t, l[2].t};
    fa_status s = fa_merge_states(3, os, ls, &out.t, &lse.t);
    char label[100];
    snprintf(label, sizeof label, "merge  %-4s", fa_dtype_name(dt));
    report(label, s == FA_OK ? thash(thash(FNV0, &out.t), &lse.t) : (uint64_t)s);
    for (int k = 0; k < 3; k++)
        tfree(&o[k]), tfree(&l[k]);
    tfree(&out), tfree(&lse);
}

static int isa_runs(fa_isa isa)
{
    config cf = {FA_BACKEND_TILED, isa, 1, NULL, NULL};
    fa_context *ctx = make_ctx(&cf);
    fa_context_destroy(ctx);
    return ctx != NULL;
}

int main(int argc, char **argv)
{
    /* --quick: the cases up to 1025 rows only (for emulators) */
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    static const fa_dtype dtypes[4] = {FA_F64, FA_F32, FA_F16, FA_BF16};
    /* every fa_isa value a context takes here, found by trying them rather than by the
     * registry's list (src/simd/isas.def), so that this file builds against trees older than
     * the registry, and runs the kernel sets of newer ones (an unknown value makes no context) */
    fa_isa isas[16];
    size_t nisas = 0;
    for (int v = FA_ISA_SCALAR; v < 16; v++)
        if (isa_runs((fa_isa)v))
            isas[nisas++] = (fa_isa)v;
    config cfs[2 + 4 * 16];
    char names[2 + 4 * 16][40];
    int n = 0;
    cfs[n] = (config){FA_BACKEND_REFERENCE, FA_ISA_AUTO, 2, NULL, NULL};
    snprintf(names[n++], 40, "reference");
    cfs[n] = (config){FA_BACKEND_CONVENTIONAL, FA_ISA_AUTO, 2, NULL, NULL};
    snprintf(names[n++], 40, "conventional");
    for (size_t i = 0; i < nisas; i++) {
        cfs[n] = (config){FA_BACKEND_TILED, isas[i], 2, NULL, NULL};
        snprintf(names[n++], 40, "tiled/%s", fa_isa_name(isas[i]));
        cfs[n] = (config){FA_BACKEND_TILED, isas[i], 1, NULL, NULL};
        snprintf(names[n++], 40, "tiled/%s/1thread", fa_isa_name(isas[i]));
        cfs[n] = (config){FA_BACKEND_TILED, isas[i], 2, "64x32", "2"};
        snprintf(names[n++], 40, "tiled/%s/64x32/2pass", fa_isa_name(isas[i]));
        cfs[n] = (config){FA_BACKEND_TILED, isas[i], 2, "48x64x24", "1"};
        snprintf(names[n++], 40, "tiled/%s/48x64x24/1pass", fa_isa_name(isas[i]));
    }
    for (int ci = 0; ci < NCASES; ci++) {
        if (quick && (cases[ci].sq > 1025 || cases[ci].sk > 1025))
            continue;
        for (int d = 0; d < 4; d++)
            for (int k = 0; k < n; k++)
                run_case(ci, dtypes[d], &cfs[k], names[k]);
        fflush(stdout);
    }
    for (int d = 0; d < 4; d++)
        run_merge(dtypes[d]);
    printf("all %016llx\n", (unsigned long long)all_lines);
    return 0;
}
