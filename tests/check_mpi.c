/*
 * Context parallelism over MPI (flashattn_mpi.h), run by tests/mpi.sh under mpirun with 1..4
 * ranks. Every rank draws the same global problem, computes its float64 reference and the
 * conventional path's baseline in one process (the FlashAttention rule's yardstick), runs its
 * shard through fa_cp_forward / fa_cp_backward and judges its rows. The verdicts are combined
 * over the ranks before each assertion, so every rank passes or fails together (Check runs
 * without fork here: a forked child must not call MPI).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn_mpi.h"
#include "base/base.h" /* fai_fault_arm: the library's allocation-failure hook */

static int W, R; /* ranks, this rank */

/* ------------------------------------------------------------------ tensors */

typedef struct {
    fa_tensor t;
    size_t bytes;
} tens;

static size_t dsize(fa_dtype d) { return d == FA_F64 ? 8 : d == FA_F32 ? 4 : 2; }

static tens make(fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D)
{
    tens x;
    x.bytes = (size_t)(B * S * H * D) * dsize(dt);
    void *mem = malloc(x.bytes ? x.bytes : 1);
    ck_assert(mem != NULL);
    memset(mem, 0x7f, x.bytes); /* a pattern no call writes: NaN-like bytes */
    fa_tensor_init(&x.t, mem, dt, B, S, H, D, 0);
    return x;
}

static void drop(tens *x) { free(x->t.data); }

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform values in [-1, 1) rounded to the tensor's dtype, and their exact f64 twin. */
static void draw(tens *x, tens *twin, uint64_t seed)
{
    const size_t n = x->bytes / dsize(x->t.dtype);
    double *v = malloc(n * sizeof *v + 1);
    for (size_t i = 0; i < n; i++)
        v[i] = (double)(mix(seed * 0x100000001b3ull + i) >> 11) * 0x1p-52 - 1.0;
    ck_assert_int_eq(fa_convert(v, FA_F64, x->t.data, x->t.dtype, n), FA_OK);
    ck_assert_int_eq(fa_convert(x->t.data, x->t.dtype, twin->t.data, FA_F64, n), FA_OK);
    free(v);
}

/* The rows of shard s of a global tensor, into a local one (or back: to_global). */
static void shard_copy(const fa_tensor *g, const fa_cp_shard *s, const fa_tensor *l, int to_global)
{
    const size_t es = dsize(g->dtype), row = (size_t)(g->heads * g->headdim) * es;
    int64_t at = 0;
    for (int x = 0; x < s->parts; x++) {
        for (int64_t b = 0; b < g->batch; b++) {
            char *gp = (char *)g->data +
                       (size_t)(b * g->batch_stride + s->first[x] * g->seq_stride) * es;
            char *lp = (char *)l->data + (size_t)(b * l->batch_stride + at * l->seq_stride) * es;
            memcpy(to_global ? gp : lp, to_global ? lp : gp, (size_t)s->count[x] * row);
        }
        at += s->count[x];
    }
}

static tens local_of(const tens *g, const fa_cp_shard *s)
{
    tens l = make(g->t.dtype, g->t.batch, s->local, g->t.heads, g->t.headdim);
    shard_copy(&g->t, s, &l.t, 0);
    return l;
}

/* Whether every rank's flag is set. */
static int all_ranks(int ok)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return all;
}

static fa_context *context(const char *schedule, int threads)
{
    if (schedule)
        setenv("FA_CP_SCHEDULE", schedule, 1);
    else
        unsetenv("FA_CP_SCHEDULE");
    fa_options o;
    fa_options_init(&o);
    o.backend = FA_BACKEND_TILED;
    o.num_threads = threads;
    fa_context *ctx = NULL;
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_OK);
    return ctx;
}

/* ------------------------------------------------------------------ one case */

typedef struct {
    const char *name;
    fa_cp_layout layout;
    const char *schedule;
    fa_dtype dt;
    int64_t B, Sq, Sk, Hq, Hk, D;
    int causal, top_left, alibi, sinks, dropout;
    int64_t window_left, sink_tokens;
    double softcap;
} cp_case;

/* The global problem of a case, its reference (f64, reference backend) and baseline
 * (conventional path in the case's dtype), forward and backward. */
typedef struct {
    tens q, k, v, dout, q64, k64, v64, dout64;
    tens ref_o, ref_dq, ref_dk, ref_dv, base_o, base_dq, base_dk, base_dv;
    tens ref_lse, base_lse;
    float slopes[8], sink[8], ref_sink_grad[8];
    fa_params p;
} problem;

static void params_of(const cp_case *c, problem *g)
{
    fa_params_init(&g->p);
    g->p.causal = c->causal;
    g->p.align = c->top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    if (c->window_left >= 0) {
        g->p.window_left = c->window_left;
        g->p.sink_tokens = c->sink_tokens;
    }
    g->p.softcap = c->softcap;
    for (int h = 0; h < 8; h++) {
        g->slopes[h] = 0.05f * (float)(h + 1);
        g->sink[h] = h % 3 == 2 ? -INFINITY : 0.25f * (float)h - 0.5f;
    }
    if (c->alibi)
        g->p.alibi_slopes = g->slopes;
    if (c->sinks)
        g->p.sink_logits = g->sink;
    if (c->dropout) {
        g->p.dropout_p = 0.15;
        g->p.dropout_seed = 0x5eedull;
        g->p.dropout_offset = 7;
    }
}

static void problem_make(const cp_case *c, problem *g)
{
    memset(g, 0, sizeof *g);
    params_of(c, g);
    g->q = make(c->dt, c->B, c->Sq, c->Hq, c->D);
    g->k = make(c->dt, c->B, c->Sk, c->Hk, c->D);
    g->v = make(c->dt, c->B, c->Sk, c->Hk, c->D);
    g->dout = make(c->dt, c->B, c->Sq, c->Hq, c->D);
    g->q64 = make(FA_F64, c->B, c->Sq, c->Hq, c->D);
    g->k64 = make(FA_F64, c->B, c->Sk, c->Hk, c->D);
    g->v64 = make(FA_F64, c->B, c->Sk, c->Hk, c->D);
    g->dout64 = make(FA_F64, c->B, c->Sq, c->Hq, c->D);
    draw(&g->q, &g->q64, 1);
    draw(&g->k, &g->k64, 2);
    draw(&g->v, &g->v64, 3);
    draw(&g->dout, &g->dout64, 4);
    g->ref_o = make(FA_F64, c->B, c->Sq, c->Hq, c->D);
    g->ref_lse = make(FA_F64, c->B, c->Sq, c->Hq, 1);
    g->ref_dq = make(FA_F64, c->B, c->Sq, c->Hq, c->D);
    g->ref_dk = make(FA_F64, c->B, c->Sk, c->Hk, c->D);
    g->ref_dv = make(FA_F64, c->B, c->Sk, c->Hk, c->D);
    g->base_o = make(c->dt, c->B, c->Sq, c->Hq, c->D);
    g->base_lse = make(c->dt == FA_F64 ? FA_F64 : FA_F32, c->B, c->Sq, c->Hq, 1);
    g->base_dq = make(c->dt, c->B, c->Sq, c->Hq, c->D);
    g->base_dk = make(c->dt, c->B, c->Sk, c->Hk, c->D);
    g->base_dv = make(c->dt, c->B, c->Sk, c->Hk, c->D);
    fa_options o;
    fa_options_init(&o);
    o.backend = FA_BACKEND_REFERENCE;
    fa_context *ref = NULL, *conv = NULL;
    ck_assert_int_eq(fa_context_create(&o, &ref), FA_OK);
    o.backend = FA_BACKEND_CONVENTIONAL;
    ck_assert_int_eq(fa_context_create(&o, &conv), FA_OK);
    fa_params p = g->p;
    p.sink_grad = g->ref_sink_grad;
    ck_assert_int_eq(fa_forward(ref, &g->p, &g->q64.t, &g->k64.t, &g->v64.t, &g->ref_o.t,
                                &g->ref_lse.t), FA_OK);
    ck_assert_int_eq(fa_backward(ref, c->sinks ? &p : &g->p, &g->q64.t, &g->k64.t, &g->v64.t,
                                 &g->ref_o.t, &g->ref_lse.t, &g->dout64.t, &g->ref_dq.t,
                                 &g->ref_dk.t, &g->ref_dv.t), FA_OK);
    ck_assert_int_eq(fa_forward(conv, &g->p, &g->q.t, &g->k.t, &g->v.t, &g->base_o.t,
                                &g->base_lse.t), FA_OK);
    ck_assert_int_eq(fa_backward(conv, &g->p, &g->q.t, &g->k.t, &g->v.t, &g->base_o.t,
                                 &g->base_lse.t, &g->dout.t, &g->base_dq.t, &g->base_dk.t,
                                 &g->base_dv.t), FA_OK);
    fa_context_destroy(ref);
    fa_context_destroy(conv);
}

static void problem_free(problem *g)
{
    tens *all[] = {&g->q, &g->k, &g->v, &g->dout, &g->q64, &g->k64, &g->v64, &g->dout64,
                   &g->ref_o, &g->ref_dq, &g->ref_dk, &g->ref_dv, &g->base_o, &g->base_dq,
                   &g->base_dk, &g->base_dv, &g->ref_lse, &g->base_lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
}

/* The shard's rows of a candidate against the reference's and the baseline's: the FlashAttention
 * rule (factor 2 for O, 3 for gradients). */
static int judged(const char *what, const cp_case *c, const tens *cand, const tens *ref,
                  const tens *base, const fa_cp_shard *s, double factor)
{
    tens r = local_of(ref, s), b = local_of(base, s);
    fa_tolerance tol = {.factor = factor};
    fa_comparison res;
    const fa_status st = fa_compare(&cand->t, &r.t, &b.t, &tol, &res);
    const int ok = st == FA_OK && res.pass;
    if (!ok)
        fprintf(stderr, "rank %d of %d: %s: %s: %s (max %g, bound %g, failed %d)\n", R, W,
                c->name, what, st == FA_OK ? res.rule : fa_last_error(), res.max_abs,
                res.bound, res.failed);
    drop(&r);
    drop(&b);
    return ok;
}

/* One case forward and backward on this rank; returns whether it is right here, and the bits
 * of its results (out, dq, dk, dv) in *bits (a malloc'd copy) for the repeatability check. */
static int run_case(const cp_case *c, int threads, const problem *g, unsigned char **bits,
                    size_t *nbits)
{
    fa_cp_shard qs, ks;
    ck_assert_int_eq(fa_cp_local_size(c->layout, c->Sq, W, R, &qs), FA_OK);
    ck_assert_int_eq(fa_cp_local_size(c->layout, c->Sk, W, R, &ks), FA_OK);
    tens q = local_of(&g->q, &qs), k = local_of(&g->k, &ks), v = local_of(&g->v, &ks),
         dout = local_of(&g->dout, &qs);
    tens o = make(c->dt, c->B, qs.local, c->Hq, c->D),
         lse = make(c->dt == FA_F64 ? FA_F64 : FA_F32, c->B, qs.local, c->Hq, 1),
         dq = make(c->dt, c->B, qs.local, c->Hq, c->D),
         dk = make(c->dt, c->B, ks.local, c->Hk, c->D),
         dv = make(c->dt, c->B, ks.local, c->Hk, c->D);
    float sink_grad[8] = {0};
    fa_params p = g->p;
    if (c->sinks)
        p.sink_grad = sink_grad;
    fa_context *ctx = context(c->schedule, threads);
    int ok = fa_cp_forward(ctx, MPI_COMM_WORLD, c->layout, &p, &q.t, &k.t, &v.t, &o.t, &lse.t) ==
             FA_OK;
    if (!ok)
        fprintf(stderr, "rank %d: %s: fa_cp_forward: %s\n", R, c->name, fa_last_error());
    ok = ok && fa_cp_backward(ctx, MPI_COMM_WORLD, c->layout, &p, &q.t, &k.t, &v.t, &o.t, &lse.t,
                              &dout.t, &dq.t, &dk.t, &dv.t) == FA_OK;
    if (!ok)
        fprintf(stderr, "rank %d: %s: %s\n", R, c->name, fa_last_error());
    if (ok) {
        ok &= judged("out", c, &o, &g->ref_o, &g->base_o, &qs, 2);
        ok &= judged("lse", c, &lse, &g->ref_lse, &g->base_lse, &qs, 2);
        ok &= judged("dq", c, &dq, &g->ref_dq, &g->base_dq, &qs, 3);
        ok &= judged("dk", c, &dk, &g->ref_dk, &g->base_dk, &ks, 3);
        ok &= judged("dv", c, &dv, &g->ref_dv, &g->base_dv, &ks, 3);
        for (int h = 0; c->sinks && h < c->Hq; h++) { /* every rank: the whole sum */
            const double want = g->ref_sink_grad[h], err = fabs(sink_grad[h] - want);
            if (!(err <= 1e-4 * (1 + fabs(want)))) {
                fprintf(stderr, "rank %d: %s: sink_grad[%d] = %g, reference %g\n", R, c->name,
                        h, sink_grad[h], want);
                ok = 0;
            }
        }
    }
    if (bits) {
        const tens *r[5] = {&o, &lse, &dq, &dk, &dv};
        *nbits = 0;
        for (int i = 0; i < 5; i++)
            *nbits += r[i]->bytes;
        *bits = malloc(*nbits + sizeof sink_grad);
        size_t at = 0;
        for (int i = 0; i < 5; i++) {
            memcpy(*bits + at, r[i]->t.data, r[i]->bytes);
            at += r[i]->bytes;
        }
        memcpy(*bits + at, sink_grad, sizeof sink_grad);
        *nbits += sizeof sink_grad;
    }
    fa_context_destroy(ctx);
    tens *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
    return ok;
}

static const cp_case cases[] = {
    {"f32 contiguous ring causal", FA_CP_CONTIGUOUS, "ring", FA_F32, 2, 203, 203, 2, 2, 32, 1, 0,
     0, 0, 0, -1, 0, 0},
    {"f32 zigzag ring causal GQA", FA_CP_ZIGZAG, "ring", FA_F32, 1, 256, 256, 4, 2, 64, 1, 0, 0,
     0, 0, -1, 0, 0},
    {"f32 zigzag allgather causal GQA", FA_CP_ZIGZAG, "allgather", FA_F32, 2, 256, 256, 4, 2, 64,
     1, 0, 0, 0, 0, -1, 0, 0},
    {"bf16 zigzag ring window sink tokens", FA_CP_ZIGZAG, "ring", FA_BF16, 2, 190, 190, 2, 1, 32,
     1, 0, 0, 0, 0, 37, 5, 0},
    {"f64 contiguous ring alibi softcap sinks", FA_CP_CONTIGUOUS, "ring", FA_F64, 1, 150, 150, 4,
     4, 16, 0, 0, 1, 1, 0, -1, 0, 3.0},
    {"f32 zigzag ring causal dropout sinks", FA_CP_ZIGZAG, "ring", FA_F32, 1, 180, 180, 3, 1, 32,
     1, 0, 0, 1, 1, -1, 0, 0},
    {"f16 contiguous allgather top-left Sq < Sk", FA_CP_CONTIGUOUS, "allgather", FA_F16, 1, 120,
     211, 2, 2, 32, 1, 1, 1, 0, 0, -1, 0, 0},
    {"f32 zigzag ring bottom-right Sq < Sk window alibi dropout", FA_CP_ZIGZAG, "ring", FA_F32, 1,
     97, 300, 2, 1, 32, 1, 0, 1, 0, 1, 50, 3, 0},
    {"f32 contiguous auto", FA_CP_CONTIGUOUS, NULL, FA_F32, 1, 128, 128, 2, 2, 32, 0, 0, 0, 0, 0,
     -1, 0, 0},
    /* fewer rows than ranks or chunks: empty shards and parts */
    {"f32 contiguous ring 3 rows", FA_CP_CONTIGUOUS, "ring", FA_F32, 2, 3, 3, 2, 1, 16, 1, 0, 0,
     1, 0, -1, 0, 0},
    {"f64 zigzag allgather 5 rows", FA_CP_ZIGZAG, "allgather", FA_F64, 1, 5, 5, 2, 2, 16, 1, 0,
     0, 0, 1, -1, 0, 0},
    {"f32 zigzag ring 5 rows dropout", FA_CP_ZIGZAG, "ring", FA_F32, 1, 5, 5, 2, 2, 16, 1, 0, 0,
     0, 1, -1, 0, 0},
};

START_TEST(cp_matches_the_reference)
{
    const cp_case *c = &cases[_i];
    problem g;
    problem_make(c, &g);
    const int ok = run_case(c, 1, &g, NULL, NULL);
    problem_free(&g);
    ck_assert_msg(all_ranks(ok), "%s: some rank's rows are off the reference (stderr)", c->name);
}
END_TEST

/* Two runs, at 1 and 2 threads, give the same bits on every rank. */
START_TEST(cp_bitwise_repeatable)
{
    const cp_case *c = &cases[_i];
    problem g;
    problem_make(c, &g);
    unsigned char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int ok = run_case(c, 1, &g, &a, &na);
    ok &= run_case(c, 2, &g, &b, &nb);
    ok &= na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
    problem_free(&g);
    ck_assert_msg(all_ranks(ok), "%s: results differ between runs or thread counts", c->name);
}
END_TEST

/* ------------------------------------------------------------------ bad arguments */

/* A call where one rank's argument is bad: every rank gets the same status, the message names
 * the rank, and no output is written anywhere. */
typedef enum { BAD_HEADS, BAD_NULL_OUT, BAD_SHARD, BAD_PARAMS, BAD_BIAS, BAD_ALIAS,
               BAD_LAYOUT, BAD_SCHEDULE, BAD_KV_DTYPE, BAD_COUNT } bad_kind;

START_TEST(cp_bad_argument_fails_everywhere)
{
    const bad_kind kind = (bad_kind)_i;
    const int culprit = W - 1;
    const int64_t S = 64, H = 2, D = 16;
    fa_cp_shard s;
    ck_assert_int_eq(fa_cp_local_size(FA_CP_ZIGZAG, S, W, R, &s), FA_OK);
    int64_t rows = s.local;
    if (kind == BAD_SHARD && R == culprit)
        rows = rows > 0 ? rows - 1 : 1;
    tens q = make(FA_F32, 1, rows, kind == BAD_HEADS && R == culprit ? H + 2 : H, D),
         k = make(kind == BAD_KV_DTYPE && R == culprit ? FA_F16 : FA_F32, 1, rows, H, D),
         v = make(kind == BAD_KV_DTYPE && R == culprit ? FA_F16 : FA_F32, 1, rows, H, D),
         o = make(FA_F32, 1, rows, H, D), lse = make(FA_F32, 1, rows, H, 1);
    for (size_t i = 0; i < q.bytes / 4; i++)
        ((float *)q.t.data)[i] = 0.5f;
    memcpy(k.t.data, q.t.data, k.bytes < q.bytes ? k.bytes : q.bytes);
    memcpy(v.t.data, q.t.data, v.bytes < q.bytes ? v.bytes : q.bytes);
    fa_params p;
    fa_params_init(&p);
    p.causal = !(kind == BAD_PARAMS && R == culprit);
    float bias_data[1] = {0};
    fa_tensor bias;
    fa_tensor_init(&bias, bias_data, FA_F32, 1, 1, 1, 1, 0);
    if (kind == BAD_BIAS && R == culprit)
        p.bias = &bias;
    fa_tensor *out = kind == BAD_NULL_OUT && R == culprit ? NULL : &o.t;
    fa_tensor alias = o.t;
    if (kind == BAD_ALIAS && R == culprit)
        alias.data = q.t.data, out = &alias; /* out overlaps q */
    fa_cp_layout layout = kind == BAD_LAYOUT && R == culprit ? FA_CP_CONTIGUOUS : FA_CP_ZIGZAG;
    fa_context *ctx = context(kind == BAD_SCHEDULE && R == culprit ? "allgather" : "ring", 1);
    const fa_status want[BAD_COUNT] = {FA_ERR_SHAPE, FA_ERR_NULL_POINTER, FA_ERR_SHAPE,
                                       FA_ERR_INVALID_ARGUMENT, FA_ERR_UNSUPPORTED, FA_ERR_STRIDE,
                                       FA_ERR_INVALID_ARGUMENT, FA_ERR_INVALID_ARGUMENT,
                                       FA_ERR_DTYPE};
    fa_status st = fa_cp_forward(ctx, MPI_COMM_WORLD, layout, &p, &q.t, &k.t, &v.t, out, &lse.t);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fa_last_error());
    fa_context_destroy(ctx);
    int ok = 1;
    const int single = W == 1 && (kind == BAD_SHARD || kind == BAD_PARAMS ||
                                  kind == BAD_LAYOUT || kind == BAD_SCHEDULE);
    if (single) /* one rank agrees with itself: a shorter shard is its whole sequence */
        ok = st == FA_OK || st == want[kind];
    else {
        ok = st == want[kind];
        /* the rank that erred is named (a short shard: the first rank whose shard is not the
         * layout's for the sum of the shards, which need not be the one that erred) */
        char tag[32];
        snprintf(tag, sizeof tag, "rank %d", culprit);
        if (!strstr(msg, kind == BAD_SHARD ? "the layout gives it" : tag))
            ok = 0;
        for (size_t i = 0; i < o.bytes; i++) /* nothing written */
            ok &= ((unsigned char *)o.t.data)[i] == 0x7f;
        for (size_t i = 0; i < lse.bytes; i++)
            ok &= ((unsigned char *)lse.t.data)[i] == 0x7f;
    }
    if (!ok)
        fprintf(stderr, "rank %d: bad argument %d: status %s, message: %s\n", R, (int)kind,
                fa_status_string(st), msg);
    tens *all[] = {&q, &k, &v, &o, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
    ck_assert_msg(all_ranks(ok), "bad argument %d: not every rank failed alike", (int)kind);
}
END_TEST

/* The backward: one rank's dq is NULL, or a backend other than the tiled one; every rank fails
 * alike and no dk/dv is written. */
START_TEST(cp_bad_backward_argument_fails_everywhere)
{
    const int culprit = W - 1;
    const int64_t S = 48, H = 2, D = 16;
    fa_cp_shard s;
    ck_assert_int_eq(fa_cp_local_size(FA_CP_ZIGZAG, S, W, R, &s), FA_OK);
    tens q = make(FA_F32, 1, s.local, H, D), o = make(FA_F32, 1, s.local, H, D),
         lse = make(FA_F32, 1, s.local, H, 1), dq = make(FA_F32, 1, s.local, H, D),
         dk = make(FA_F32, 1, s.local, H, D), dv = make(FA_F32, 1, s.local, H, D);
    for (size_t i = 0; i < q.bytes / 4; i++)
        ((float *)q.t.data)[i] = (float)(i % 7) * 0.1f, ((float *)o.t.data)[i] = 0.5f;
    for (size_t i = 0; i < lse.bytes / 4; i++)
        ((float *)lse.t.data)[i] = 1.0f;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    fa_context *ctx = context("ring", 1);
    const fa_status st = fa_cp_backward(ctx, MPI_COMM_WORLD, FA_CP_ZIGZAG, &p, &q.t, &q.t, &q.t,
                                        &o.t, &lse.t, &o.t, R == culprit ? NULL : &dq.t, &dk.t,
                                        &dv.t);
    fa_context_destroy(ctx);
    char tag[32];
    snprintf(tag, sizeof tag, "rank %d: dq is NULL", culprit);
    int ok = st == FA_ERR_NULL_POINTER && strstr(fa_last_error(), tag) != NULL;
    /* and the reference backend's backward, which recomputes the softmax over its call's keys:
     * refused on every rank where FA_CP_SCHEDULE forces the ring (a call holds some keys) */
    fa_options opt;
    fa_options_init(&opt);
    opt.backend = FA_BACKEND_REFERENCE;
    setenv("FA_CP_SCHEDULE", "ring", 1);
    ck_assert_int_eq(fa_context_create(&opt, &ctx), FA_OK);
    const fa_status sr = fa_cp_backward(ctx, MPI_COMM_WORLD, FA_CP_ZIGZAG, &p, &q.t, &q.t, &q.t,
                                        &o.t, &lse.t, &o.t, &dq.t, &dk.t, &dv.t);
    fa_context_destroy(ctx);
    ok &= sr == FA_ERR_UNSUPPORTED;
    for (size_t i = 0; i < dk.bytes; i++)
        ok &= ((unsigned char *)dk.t.data)[i] == 0x7f && ((unsigned char *)dv.t.data)[i] == 0x7f;
    if (!ok)
        fprintf(stderr, "rank %d: backward with a NULL dq: %s: %s\n", R, fa_status_string(st),
                fa_last_error());
    tens *all[] = {&q, &o, &lse, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
    ck_assert_msg(all_ranks(ok), "a NULL dq on one rank: not every rank failed alike");
}
END_TEST

/* One rank's n-th allocation fails (its working memory, or one inside a block's call during
 * the schedule): every rank returns the same status, FA_ERR_NO_MEMORY where it fired, and no
 * output is written anywhere; past the call's allocations it succeeds. Both schedules,
 * forward and backward. */
START_TEST(cp_failed_allocation_fails_everywhere)
{
    const int backward = _i & 1, allgather = _i >> 1;
    const cp_case c = {"fault", FA_CP_ZIGZAG, allgather ? "allgather" : "ring", FA_F32, 1, 96,
                       96, 2, 2, 16, 1, 0, 0, 1, 0, -1, 0, 0};
    problem g;
    problem_make(&c, &g);
    fa_cp_shard qs;
    ck_assert_int_eq(fa_cp_local_size(c.layout, c.Sq, W, R, &qs), FA_OK);
    tens q = local_of(&g.q, &qs), k = local_of(&g.k, &qs), v = local_of(&g.v, &qs),
         dout = local_of(&g.dout, &qs), o = make(FA_F32, 1, qs.local, 2, 16),
         lse = make(FA_F32, 1, qs.local, 2, 1);
    fa_context *ctx = context(c.schedule, 1);
    if (backward) /* the backward's out and lse, from a forward that runs */
        ck_assert(all_ranks(fa_cp_forward(ctx, MPI_COMM_WORLD, c.layout, &g.p, &q.t, &k.t, &v.t,
                                          &o.t, &lse.t) == FA_OK));
    int ok = 1, fired_any = 0;
    for (long n = 1; n <= 40; n++) {
        tens dq = make(FA_F32, 1, qs.local, 2, 16), dk = make(FA_F32, 1, qs.local, 2, 16),
             dv = make(FA_F32, 1, qs.local, 2, 16), o2 = make(FA_F32, 1, qs.local, 2, 16);
        if (R == W - 1)
            fai_fault_arm(n);
        const fa_status st =
            backward ? fa_cp_backward(ctx, MPI_COMM_WORLD, c.layout, &g.p, &q.t, &k.t, &v.t,
                                      &o.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t)
                     : fa_cp_forward(ctx, MPI_COMM_WORLD, c.layout, &g.p, &q.t, &k.t, &v.t,
                                     &o2.t, NULL);
        int fired = R == W - 1 && fai_fault_fired();
        fai_fault_arm(0);
        MPI_Allreduce(MPI_IN_PLACE, &fired, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
        fired_any |= fired;
        const tens *outs[4] = {&o2, &dq, &dk, &dv};
        if (!fired)
            ok &= st == FA_OK;
        else {
            ok &= st == FA_ERR_NO_MEMORY;
            for (int t = 0; t < 4; t++)
                for (size_t i = 0; i < outs[t]->bytes; i++)
                    ok &= ((unsigned char *)outs[t]->t.data)[i] == 0x7f;
        }
        if (!ok)
            fprintf(stderr, "rank %d: allocation %ld (%s): %s: %s\n", R, n,
                    fired ? "fired" : "not fired", fa_status_string(st), fa_last_error());
        drop(&dq), drop(&dk), drop(&dv), drop(&o2);
        if (!all_ranks(ok) || !fired)
            break;
    }
    fa_context_destroy(ctx);
    tens *all[] = {&q, &k, &v, &dout, &o, &lse};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
    problem_free(&g);
    ck_assert_msg(all_ranks(ok && fired_any), "%s %s: a failed allocation on rank %d",
                  c.schedule, backward ? "backward" : "forward", W - 1);
}
END_TEST

/* The float64 oracle distributed the same way: fa_cp_forward / fa_cp_backward on a reference
 * context (the forward's blocks by the auto rule or the allgather, the backward by the
 * allgather, whose calls hold all the keys) give the single process's reference rows, O, LSE,
 * dQ, dK, dV and the sink gradient, to float64 rounding. */
START_TEST(cp_distributes_the_float64_reference)
{
    const cp_case c = {"reference", FA_CP_ZIGZAG, _i ? "allgather" : NULL, FA_F64, 2, 77, 77, 4,
                       2, 16, 1, 0, 1, 1, 1, 20, 2, 2.5};
    problem g;
    problem_make(&c, &g);
    fa_cp_shard qs;
    ck_assert_int_eq(fa_cp_local_size(c.layout, c.Sq, W, R, &qs), FA_OK);
    tens q = local_of(&g.q64, &qs), k = local_of(&g.k64, &qs), v = local_of(&g.v64, &qs),
         dout = local_of(&g.dout64, &qs), o = make(FA_F64, c.B, qs.local, c.Hq, c.D),
         lse = make(FA_F64, c.B, qs.local, c.Hq, 1), dq = make(FA_F64, c.B, qs.local, c.Hq, c.D),
         dk = make(FA_F64, c.B, qs.local, c.Hk, c.D), dv = make(FA_F64, c.B, qs.local, c.Hk, c.D);
    float sink_grad[8] = {0};
    fa_params p = g.p;
    p.sink_grad = sink_grad;
    if (c.schedule)
        setenv("FA_CP_SCHEDULE", c.schedule, 1);
    else
        unsetenv("FA_CP_SCHEDULE");
    fa_options opt;
    fa_options_init(&opt);
    opt.backend = FA_BACKEND_REFERENCE;
    fa_context *ctx;
    ck_assert_int_eq(fa_context_create(&opt, &ctx), FA_OK);
    int ok = fa_cp_forward(ctx, MPI_COMM_WORLD, c.layout, &p, &q.t, &k.t, &v.t, &o.t, &lse.t) ==
                 FA_OK &&
             fa_cp_backward(ctx, MPI_COMM_WORLD, c.layout, &p, &q.t, &k.t, &v.t, &o.t, &lse.t,
                            &dout.t, &dq.t, &dk.t, &dv.t) == FA_OK;
    if (!ok)
        fprintf(stderr, "rank %d: the distributed reference: %s\n", R, fa_last_error());
    const tens *got[5] = {&o, &lse, &dq, &dk, &dv}, *want[5] = {&g.ref_o, &g.ref_lse, &g.ref_dq,
                                                                &g.ref_dk, &g.ref_dv};
    for (int t = 0; t < 5 && ok; t++) {
        tens w = local_of(want[t], &qs);
        const double *a = got[t]->t.data, *b = w.t.data;
        double err = 0, big = 1;
        for (size_t i = 0; i < w.bytes / 8; i++) {
            big = fmax(big, fabs(b[i]));
            err = fmax(err, a[i] == b[i] ? 0 : fabs(a[i] - b[i]));
        }
        if (!(err <= 1e-12 * big)) {
            fprintf(stderr, "rank %d: reference tensor %d off by %g\n", R, t, err);
            ok = 0;
        }
        drop(&w);
    }
    for (int h = 0; h < c.Hq && ok; h++)
        ok &= fabs(sink_grad[h] - g.ref_sink_grad[h]) <= 1e-6 * (1 + fabs(g.ref_sink_grad[h]));
    fa_context_destroy(ctx);
    tens *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        drop(all[i]);
    problem_free(&g);
    ck_assert_msg(all_ranks(ok), "the distributed float64 reference differs from one process's");
}
END_TEST

START_TEST(cp_local_size_layouts)
{
    /* contiguous and zigzag shards tile [0, S) exactly, every rank's in order */
    for (int ranks = 1; ranks <= 5; ranks++)
        for (int64_t S = 0; S <= 23; S++)
            for (int zig = 0; zig < 2; zig++) {
                unsigned char seen[23] = {0};
                int64_t total = 0;
                for (int r = 0; r < ranks; r++) {
                    fa_cp_shard s;
                    ck_assert_int_eq(fa_cp_local_size(zig ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS, S,
                                                      ranks, r, &s), FA_OK);
                    ck_assert_int_eq(s.parts, zig ? 2 : 1);
                    for (int x = 0; x < s.parts; x++)
                        for (int64_t i = s.first[x]; i < s.first[x] + s.count[x]; i++) {
                            ck_assert(i >= 0 && i < S && !seen[i]);
                            seen[i] = 1;
                        }
                    total += s.local;
                }
                ck_assert_int_eq(total, S);
            }
    fa_cp_shard s;
    ck_assert_int_eq(fa_cp_local_size(FA_CP_ZIGZAG, 16, 4, 1, &s), FA_OK);
    ck_assert(s.first[0] == 2 && s.count[0] == 2 && s.first[1] == 12 && s.count[1] == 2);
    ck_assert_int_eq(fa_cp_local_size(FA_CP_ZIGZAG, 16, 4, 4, &s), FA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fa_cp_local_size((fa_cp_layout)7, 16, 4, 0, &s), FA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fa_cp_local_size(FA_CP_CONTIGUOUS, -1, 4, 0, &s), FA_ERR_SHAPE);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    Suite *s = suite_create("mpi");
    TCase *tc = tcase_create("cp");
    const int n = (int)(sizeof cases / sizeof *cases);
    tcase_add_test(tc, cp_local_size_layouts);
    tcase_add_loop_test(tc, cp_matches_the_reference, 0, n);
    tcase_add_loop_test(tc, cp_bitwise_repeatable, 1, 3); /* ring, allgather (B = 2) */
    tcase_add_loop_test(tc, cp_bitwise_repeatable, 5, 6);
    tcase_add_loop_test(tc, cp_bad_argument_fails_everywhere, 0, BAD_COUNT);
    tcase_add_test(tc, cp_bad_backward_argument_fails_everywhere);
    tcase_add_loop_test(tc, cp_distributes_the_float64_reference, 0, 2);
    tcase_add_loop_test(tc, cp_failed_allocation_fails_everywhere, 0, 4);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, R == 0 ? CK_NORMAL : CK_SILENT);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
