/*
 * sweep_digest: a hash of every backend's outputs over the test sweep, to prove that a change
 * meant to keep behaviour (a restructuring, a refactor) keeps every bit.
 *
 * It runs cases of the sweep's table (tests/sweep_cases.c): shapes and features of
 * tests/check_backends.c (sizes relative to tiles resolved against fixed ones, so that the run
 * does not depend on the tile plan it is checking), a few cases that cross the forward's large
 * query tiles, non-finite inputs in masked and allowed rows; forced tiles and backward passes,
 * and fa_merge_states; forward (out, LSE) and backward (dq, dk, dv, from the
 * same backend's out and LSE) on the reference, the conventional path and the tiled backend
 * with every ISA this machine runs, in every storage dtype, on 1 and 2 threads. Each line is
 * one run: its label and the FNV-1a hash of its outputs' elements in index order (strides and
 * padding do not enter). The last line hashes all lines.
 *
 * Only the public API is used, so the same source builds against any version of the library:
 *     make tests/sweep_digest && ./tests/sweep_digest > after.txt
 * then the same against the old tree, and `diff before.txt after.txt`. The table's source is
 * included below rather than linked, so that this one file is all such a build names.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "sweep_cases.c"

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

static size_t dsize(fa_dtype d) { return d == FA_F64 ? 8 : d == FA_F32 ? 4 : 2; }

typedef struct {
    fa_tensor t;
    void *buf;
    size_t bytes;
} tensor;

static void talloc(tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D,
                   sw_layout l)
{
    const int64_t pad = l == SW_PADDED ? 3 : 0, Dp = D + pad;
    fa_tensor *t = &x->t;
    t->dtype = dt;
    t->batch = B, t->seqlen = S, t->heads = H, t->headdim = D, t->headdim_stride = 1;
    if (l == SW_BHSD) {
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

/* The cases, by name, in the order of their runs' numbers. A run's number is its label and
 * replaces the case's seed (its inputs' and its dropout stream's): the numbers of every digest
 * since the first, so that digests of old and new trees compare line by line. Sizes relative
 * to tiles are resolved against 128 query rows and 256 keys. */
static const struct {
    int number;
    const char *name;
} runs[] = {
    {0, "one_key"},
    {1, "tiny_gqa_causal"},
    {2, "causal_first_row_empty"},
    {3, "causal_key_tile_minus_1"},
    {4, "causal_key_tile_dropout"},
    {5, "window_key_tile_plus_1"},
    {6, "query_tile_minus_1"},
    {7, "query_tile_top_left_alibi"},
    {8, "query_tile_plus_1_softcap"},
    {9, "odd_dims_window_softcap_alibi"},
    {10, "long_keys_top_left_dropout"},
    {11, "long_queries_empty_rows_alibi"},
    {12, "mqa_one_key_per_row_dropout"},
    {13, "left_unbounded_window"},
    {14, "everything_d128"},
    {15, "causal_top_left_more_queries"},
    {16, "causal_last_row_only"},
    {17, "plain_257"},
    {18, "gqa_window_softcap_alibi_dropout"},
    {19, "alibi_then_softcap"},
    {20, "large_logits"},
    {21, "large_logits_causal_dropout"},
    {22, "past_query_tile"},
    {23, "past_query_tile_keys_window"},
    {24, "nonfinite_causal"},
    {25, "nonfinite_window_dropout"},
    /* the forward's decode path past one group of keys and one 512-key chunk (its row drivers,
     * dot_rows and pv_rows, at full widths: D 128, GQA), windows and sink tokens across
     * chunks; MQA's gradients summed over 8 heads */
    {26, "decode_gqa_d128"},
    {27, "decode_mqa_window"},
    {28, "decode_softcap_alibi"},
    {29, "sink_tokens_decode"},
    {30, "sink_tokens_past_chunk"},
    {31, "mqa_8_heads"},
};
#define NRUNS ((int)(sizeof runs / sizeof *runs))

typedef struct {
    tensor q, k, v, dout, out, lse, dq, dk, dv;
} bundle;

static void balloc(bundle *x, const sw_dims *d, sw_layout l, fa_dtype dt)
{
    tensor *const t[SW_NTENSORS] = {[SW_Q] = &x->q,     [SW_K] = &x->k,   [SW_V] = &x->v,
                                    [SW_DOUT] = &x->dout, [SW_OUT] = &x->out, [SW_DQ] = &x->dq,
                                    [SW_DK] = &x->dk,   [SW_DV] = &x->dv, [SW_LSE] = &x->lse};
    for (int i = 0; i < SW_NTENSORS; i++) {
        int64_t s[4];
        sw_shape(d, (sw_tensor)i, s);
        if (i == SW_LSE)
            tlse(t[i], dt == FA_F64 ? FA_F64 : FA_F32, s[0], s[1], s[2]);
        else
            talloc(t[i], dt, s[0], s[1], s[2], s[3], l);
    }
}

static void bfree(bundle *x)
{
    tfree(&x->q), tfree(&x->k), tfree(&x->v), tfree(&x->dout), tfree(&x->out);
    tfree(&x->lse), tfree(&x->dq), tfree(&x->dk), tfree(&x->dv);
}

static void plant_nonfinite(bundle *x, const sw_dims *d)
{
    /* K and V rows near the start (masked for early causal rows, allowed for later ones), one
     * V row late in the sequence, a NaN in a Q row */
    tset(&x->k, 0, d->sk / 3, 0, 1, INFINITY);
    tset(&x->v, 0, d->sk / 2, 0, 2, NAN);
    tset(&x->v, 0, d->sk - 2, d->hk - 1, 0, -INFINITY);
    tset(&x->q, 0, d->sq / 4, 0, 3, NAN);
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

/* Case c of sizes d in dtype dt on one configuration; labelled by the case's seed (its run's
 * number). */
static void run_case(const sw_case *c, const sw_dims *d, fa_dtype dt, const config *cf,
                     const char *cfname)
{
    bundle x;
    balloc(&x, d, c->layout, dt);
    tensor *const in[4] = {[SW_Q] = &x.q, [SW_K] = &x.k, [SW_V] = &x.v, [SW_DOUT] = &x.dout};
    for (int i = 0; i < 4; i++) {
        uint64_t seed;
        double lo, hi;
        sw_draw(c, (sw_tensor)i, &seed, &lo, &hi);
        tfill(in[i], seed, lo, hi);
    }
    if (c->nonfinite)
        plant_nonfinite(&x, d);
    fa_params p;
    sw_params(c, &p);

    char label[300];
    fa_context *ctx = make_ctx(cf);
    fa_status s = ctx ? fa_forward(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.out.t, &x.lse.t)
                      : FA_ERR_BACKEND_UNAVAILABLE;
    snprintf(label, sizeof label, "case%02d %-4s %-28.39s fwd", c->seed, fa_dtype_name(dt),
             cfname);
    report(label, s == FA_OK ? thash(thash(FNV0, &x.out.t), &x.lse.t) : (uint64_t)s);
    if (s == FA_OK) {
        s = fa_backward(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.out.t, &x.lse.t, &x.dout.t, &x.dq.t,
                        &x.dk.t, &x.dv.t);
        snprintf(label, sizeof label, "case%02d %-4s %-28.39s bwd", c->seed, fa_dtype_name(dt),
                 cfname);
        report(label, s == FA_OK ? thash(thash(thash(FNV0, &x.dq.t), &x.dk.t), &x.dv.t)
                                 : (uint64_t)s);
    }
    fa_context_destroy(ctx);
    bfree(&x);
}

/* fa_merge_states over three partial states, one of them empty. */
static void run_merge(fa_dtype dt)
{
    const int64_t B = 2, S = 37, H = 3, D = 40;
    tensor o[3], l[3], out, lse;
    for (int k = 0; k < 3; k++) {
        talloc(&o[k], dt, B, S, H, D, SW_BHSD);
        tlse(&l[k], dt == FA_F64 ? FA_F64 : FA_F32, B, S, H);
        tfill(&o[k], 50 + k, -1, 1);
        tfill(&l[k], 60 + k, -3, 5);
    }
    for (int64_t i = 0; i < S; i += 3)
        tset(&l[1], 1, i, 2, 0, -INFINITY);
    talloc(&out, dt, B, S, H, D, SW_BSHD);
    tlse(&lse, FA_F64, B, S, H);
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
    /* --quick: the cases up to 1025 query rows and keys, and the decode shapes (at most 16
     * query rows) of any length (for emulators) */
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
    sw_case cases[NRUNS]; /* every name looked up before the first run */
    for (int r = 0; r < NRUNS; r++) {
        cases[r] = *sw_case_named(runs[r].name);
        cases[r].seed = runs[r].number;
    }
    for (int r = 0; r < NRUNS; r++) {
        const sw_dims d = sw_dims_of(&cases[r], 128, 256);
        if (quick && (d.sq > 1025 || (d.sk > 1025 && d.sq > 16)))
            continue;
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < n; k++)
                run_case(&cases[r], &d, dtypes[t], &cfs[k], names[k]);
        fflush(stdout);
    }
    for (int d = 0; d < 4; d++)
        run_merge(dtypes[d]);
    printf("all %016llx\n", (unsigned long long)all_lines);
    return 0;
}
