/*
 * Context parallelism over MPI (flashattn_mpi.h). A call runs in three phases:
 *   1. agreement: every rank describes its arguments, the descriptions are gathered, and every
 *      rank reaches the same verdict (the first failing rank's status, or a disagreement);
 *      then each rank checks its tensors by a dry run of the placed call (api/ops.c) and the
 *      verdicts are gathered again. Nothing has moved but these descriptions, and every rank
 *      takes part in each exchange whatever its own state, so no rank waits on one that left.
 *   2. the schedule (ring or allgather) on working copies of the shards in f32 (f64 for f64
 *      tensors): each block is a placed call (fai_forward_placed / fai_backward_placed) of
 *      some of the rank's query rows against one rank's keys at their global positions, and
 *      partial states merge in a fixed order (fa_merge_states, core/recurrence.h). A rank whose
 *      compute fails keeps sending and receiving, so its neighbours finish their steps.
 *   3. the verdicts of phase 2 are gathered; only when every rank succeeded does each write its
 *      outputs (rounded once from the working copies).
 */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn_mpi.h"
#include "api/api.h"
#include "core/gradient.h"
#include "core/score.h"

/* Messages are counted in units of CHUNK bytes (buffers are padded to it), so a count stays an
 * int for any tensor the API accepts. */
enum { CHUNK = 1 << 16, MSG = 240, TAG_KV = 1, TAG_DKV = 2 };

typedef enum { OP_FORWARD, OP_BACKWARD } cp_op;

/* ---------------------------------------------------------------- the call */

typedef struct {
    fa_context *ctx;
    MPI_Comm comm; /* the caller's, duplicated */
    int W, rank;
    fa_cp_shard *qs, *ks; /* every rank's query and key shards */
    double waited;        /* seconds blocked on K/V messages after the blocks' compute */
    double synced;        /* seconds blocked on other ranks' dK/dV terms (their compute, then
                             the message) */
    int64_t sq, sk;       /* the global lengths */
    fa_dtype wd;          /* the working dtype: f32, or f64 for f64 tensors */
    size_t es;
    int64_t b, hq, hk, dqk, dv;
    const fa_params *p;
    fa_params pb; /* the blocks' params: the caller's without sink logits (merged once, at the
                     end: a sink is one term of the row's global sum, not of each block's) */
    fai_cp_schedule sched;
} cp_call;

/* A contiguous BSHD tensor of the working dtype. */
static fa_tensor work_tensor(const cp_call *c, void *data, int64_t s, int64_t h, int64_t d)
{
    fa_tensor t;
    fa_tensor_init(&t, data, c->wd, c->b, s, h, d, 0);
    return t;
}

/* Rows [s0, s0 + n) of t (every batch and head). */
static fa_tensor rows_of(const fa_tensor *t, int64_t s0, int64_t n)
{
    fa_tensor v = *t;
    if (n > 0)
        v.data = fai_row(t, 0, s0, 0);
    v.seqlen = n;
    return v;
}

/* dst = src, any dtypes and strides, row by row through float64 (exact for the dtypes here). */
static void copy_rows(const fa_tensor *src, const fa_tensor *dst, double *row)
{
    for (int64_t b = 0; b < src->batch; b++)
        for (int64_t s = 0; s < src->seqlen; s++)
            for (int64_t h = 0; h < src->heads; h++) {
                fai_load_f64(fai_row(src, b, s, h), src->dtype, src->headdim, row);
                fai_store_f64(fai_row(dst, b, s, h), dst->dtype, dst->headdim, row);
            }
}

/* acc += x row by row, both of the working dtype and one shape (any strides). */
static void add_rows(const fa_tensor *acc, const fa_tensor *x)
{
    for (int64_t b = 0; b < acc->batch; b++)
        for (int64_t s = 0; s < acc->seqlen; s++)
            for (int64_t h = 0; h < acc->heads; h++) {
                void *a = fai_row(acc, b, s, h);
                const void *y = fai_row(x, b, s, h);
                for (int64_t d = 0; d < acc->headdim; d++)
                    if (acc->dtype == FA_F64)
                        ((double *)a)[d] += ((const double *)y)[d];
                    else
                        ((float *)a)[d] += ((const float *)y)[d];
            }
}

/* Whether any (row, key) of query part a of shard qs against key part x of shard ks is
 * allowed: the placed mask (api/params.c: fai_problem_place) classified whole, part by part. */
static int block_live(const cp_call *c, const fa_cp_shard *qs, int a, const fa_cp_shard *ks,
                      int x)
{
    const fa_params *p = c->p;
    const int64_t m = qs->count[a], n = ks->count[x];
    if (m == 0 || n == 0)
        return 0;
    const int64_t off = (p->align == FA_ALIGN_TOP_LEFT ? 0 : c->sk - c->sq) + qs->first[a] -
                        ks->first[x];
    const fai_mask mask = fai_mask_at(m, n, off, p->causal != 0, p->window_left,
                                      p->window_right, p->sink_tokens - ks->first[x]);
    fai_mask part[2];
    const int np = fai_mask_parts(&mask, part);
    for (int i = 0; i < np; i++)
        if (part[i].sk > 0 &&
            fai_mask_classify(&part[i], 0, m, 0, part[i].sk < n ? part[i].sk : n) !=
                FAI_TILE_EMPTY)
            return 1;
    return 0;
}

/* Row offset of part a in a shard's tensors. */
static int64_t part_row(const fa_cp_shard *s, int a) { return a == 0 ? 0 : s->count[0]; }

/* ---------------------------------------------------------------- memory */

static size_t padded(size_t bytes) { return (bytes + CHUNK - 1) / CHUNK * CHUNK; }

typedef struct {
    fa_context *ctx;
    void *ptr[32];
    size_t size[32];
    int n;
} cp_mem;

/* Zeroed working memory, padded to CHUNK (NULL for 0 bytes); *st = FA_ERR_NO_MEMORY on
 * failure, the allocation is then NULL and every later one is skipped. */
static void *grab(cp_mem *m, size_t bytes, fa_status *st)
{
    if (*st != FA_OK || bytes == 0)
        return NULL;
    const size_t n = padded(bytes);
    void *p = m->n < 32 ? fai_alloc(&m->ctx->mem, n) : NULL;
    if (!p) {
        *st = fai_fail(FA_ERR_NO_MEMORY, "context parallelism: %zu bytes of working memory", n);
        return NULL;
    }
    memset(p, 0, n);
    m->ptr[m->n] = p;
    m->size[m->n++] = n;
    return p;
}

static void release(cp_mem *m)
{
    for (int i = 0; i < m->n; i++)
        fai_free(&m->ctx->mem, m->ptr[i], m->size[i]);
    m->n = 0;
}

/* Bytes of a tensor of the working dtype, or 0 with FA_ERR_OVERFLOW. */
static size_t work_bytes(const cp_call *c, int64_t s, int64_t h, int64_t d, fa_status *st)
{
    size_t n = c->es;
    const int64_t dims[4] = {c->b, s, h, d};
    for (int i = 0; i < 4; i++)
        if (!fai_mul_size(n, (size_t)dims[i], &n) || n > (size_t)INT_MAX * CHUNK) {
            if (*st == FA_OK)
                *st = fai_fail(FA_ERR_OVERFLOW, "context parallelism: a working tensor's size "
                                                "overflows");
            return 0;
        }
    return n;
}

/* ---------------------------------------------------------------- messages */

/* Every rank's verdict from each rank's own: the failure with the lowest (status, rank), its
 * message broadcast from that rank, or FA_OK; FA_ERR_COMMUNICATION where the exchange itself
 * fails. It allocates nothing, so a rank out of memory takes part as any other. */
static fa_status agree(MPI_Comm comm, int rank, fa_status mine, const char *fn)
{
    char msg[MSG] = "";
    if (mine != FA_OK)
        snprintf(msg, sizeof msg, "%s", fa_last_error());
    const int64_t code = mine == FA_OK ? INT64_MAX : ((int64_t)mine << 32) | rank;
    int64_t first;
    if (MPI_Allreduce(&code, &first, 1, MPI_INT64_T, MPI_MIN, comm) != MPI_SUCCESS)
        return fai_fail(FA_ERR_COMMUNICATION, "%s: MPI_Allreduce failed", fn);
    if (first == INT64_MAX)
        return FA_OK;
    const int root = (int)(first & 0xffffffff);
    if (MPI_Bcast(msg, MSG, MPI_CHAR, root, comm) != MPI_SUCCESS)
        return fai_fail(FA_ERR_COMMUNICATION, "%s: MPI_Bcast failed", fn);
    msg[MSG - 1] = 0;
    return fai_fail((fa_status)(first >> 32), "%s: rank %d: %s", fn, root, msg);
}

/* Lets the messages in flight move while a rank computes. */
static void progress(MPI_Request *req, int n)
{
    int done;
    if (n > 0)
        MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
}

/* Waits for n requests, adding the time blocked to *waited. */
static fa_status wait_all(MPI_Request *req, int n, fa_status st, double *waited)
{
    const double t0 = MPI_Wtime();
    if (n > 0 && MPI_Waitall(n, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS && st == FA_OK)
        st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: MPI_Waitall failed");
    *waited += MPI_Wtime() - t0;
    return st;
}

/* ---------------------------------------------------------------- phase 1: agreement */

/* What every rank must agree on, by field. */
enum { D_OP, D_LAYOUT, D_SCHED, D_B, D_HQ, D_HK, D_DQK, D_DV, D_DTYPE, D_PARAMS, D_SQ, D_SK,
       D_N };
static const char *const field_name[D_SQ] = {
    "the operation", "layout", "FA_CP_SCHEDULE", "q->batch", "q->heads", "k->heads",
    "q->headdim", "v->headdim", "q->dtype", "params"};

/* FNV-1a over the bytes of x. */
static uint64_t hash_bytes(uint64_t h, const void *x, size_t n)
{
    const unsigned char *b = x;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Every params field the global problem depends on, its arrays' values included. */
static int64_t params_hash(const fa_params *p, int64_t hq, int backward)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const int64_t ints[9] = {p->causal, p->window_left, p->window_right, p->align, p->score_order,
                             p->sink_tokens, p->alibi_slopes != NULL, p->sink_logits != NULL,
                             backward && p->sink_grad != NULL};
    const double reals[3] = {p->scale, p->softcap, p->dropout_p};
    const uint64_t drop[2] = {p->dropout_seed, p->dropout_offset};
    h = hash_bytes(h, ints, sizeof ints);
    h = hash_bytes(h, reals, sizeof reals);
    h = hash_bytes(h, drop, sizeof drop);
    if (p->alibi_slopes)
        h = hash_bytes(h, p->alibi_slopes, (size_t)hq * sizeof(float));
    if (p->sink_logits)
        h = hash_bytes(h, p->sink_logits, (size_t)hq * sizeof(float));
    return (int64_t)(h >> 1);
}

/* This rank's description, and what it can tell of its arguments without the others. */
static fa_status describe(const cp_call *c, cp_op op, fa_cp_layout layout, const fa_params *p,
                          const fa_tensor *const *t, int nt, const char *const *names,
                          int64_t *v)
{
    if (!p)
        return fai_fail(FA_ERR_NULL_POINTER, "params is NULL");
    for (int i = 0; i < nt; i++)
        if (!t[i])
            return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", names[i]);
    const fa_tensor *q = t[0], *k = t[1], *vt = t[2];
    if (q->dtype != FA_F32 && q->dtype != FA_F16 && q->dtype != FA_BF16 && q->dtype != FA_F64)
        return fai_fail(FA_ERR_DTYPE, "q->dtype = %s; context parallelism takes f32, f16, bf16 "
                                      "or f64", fa_dtype_name(q->dtype));
    if (p->bias || p->bias_grad || p->block_mask)
        return fai_fail(FA_ERR_UNSUPPORTED, "params->%s is set; context parallelism takes no "
                                            "bias tensor or block mask (they are indexed by local "
                                            "rows)", p->block_mask ? "block_mask" : "bias");
    if (q->heads < 1 || q->heads > FAI_DIM_MAX)
        return fai_fail(FA_ERR_SHAPE, "q->heads = %lld", (long long)q->heads);
    v[D_OP] = op;
    v[D_LAYOUT] = layout;
    v[D_SCHED] = c->ctx ? c->ctx->cp_schedule : 0;
    v[D_B] = q->batch;
    v[D_HQ] = q->heads;
    v[D_HK] = k->heads;
    v[D_DQK] = q->headdim;
    v[D_DV] = vt->headdim;
    v[D_DTYPE] = q->dtype;
    v[D_PARAMS] = params_hash(p, q->heads, op == OP_BACKWARD);
    v[D_SQ] = q->seqlen;
    v[D_SK] = k->seqlen;
    if (layout != FA_CP_CONTIGUOUS && layout != FA_CP_ZIGZAG)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "layout = %d is not a fa_cp_layout",
                        (int)layout);
    if (q->seqlen < 0 || k->seqlen < 0 || q->seqlen > FAI_DIM_MAX || k->seqlen > FAI_DIM_MAX)
        return fai_fail(FA_ERR_SHAPE, "q->seqlen = %lld, k->seqlen = %lld", (long long)q->seqlen,
                        (long long)k->seqlen);
    return c->ctx ? FA_OK : fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
}

/* The verdict on the gathered descriptions (all[r * D_N + f]), the same on every rank: a field
 * that differs from rank 0's, or a shard that is not the layout's; then the global lengths and
 * shards. */
static fa_status judge(cp_call *c, const int64_t *all, fa_cp_layout layout, const char *fn)
{
    for (int r = 1; r < c->W; r++)
        for (int f = 0; f < D_SQ; f++)
            if (all[r * D_N + f] != all[f])
                return fai_fail(f == D_DTYPE                ? FA_ERR_DTYPE
                                : f >= D_B && f <= D_DV ? FA_ERR_SHAPE
                                                        : FA_ERR_INVALID_ARGUMENT,
                                "%s: rank %d's %s differs from rank 0's%s", fn, r,
                                field_name[f],
                                f >= D_B && f <= D_DV ? "" : " (every rank passes the same)");
    c->sq = c->sk = 0;
    for (int r = 0; r < c->W; r++) {
        c->sq += all[r * D_N + D_SQ];
        c->sk += all[r * D_N + D_SK];
    }
    for (int r = 0; r < c->W; r++) {
        FAI_TRY(fa_cp_local_size(layout, c->sq, c->W, r, &c->qs[r]));
        FAI_TRY(fa_cp_local_size(layout, c->sk, c->W, r, &c->ks[r]));
        for (int x = 0; x < 2; x++) {
            const int64_t have = all[r * D_N + (x ? D_SK : D_SQ)],
                          want = (x ? c->ks : c->qs)[r].local;
            if (have != want)
                return fai_fail(FA_ERR_SHAPE, "%s: rank %d holds %lld %s; the layout gives it "
                                              "%lld of the %lld in all", fn, r, (long long)have,
                                x ? "keys" : "query rows", (long long)want,
                                (long long)(x ? c->sk : c->sq));
        }
    }
    return FA_OK;
}

/* Phase 1 on every rank: each rank's own verdict, then (all well) the descriptions gathered
 * and judged alike everywhere. */
static fa_status phase_one(cp_call *c, cp_op op, fa_cp_layout layout, const fa_params *p,
                           const fa_tensor *const *t, int nt, const char *const *names,
                           const char *fn)
{
    int64_t mine[D_N] = {0};
    fa_status st = describe(c, op, layout, p, t, nt, names, mine);
    int64_t *all = calloc((size_t)c->W * D_N, sizeof *all);
    c->qs = calloc(2 * (size_t)c->W, sizeof *c->qs);
    c->ks = c->qs ? c->qs + c->W : NULL;
    if (st == FA_OK && (!all || !c->qs))
        st = fai_fail(FA_ERR_NO_MEMORY, "%s: the ranks' descriptions", fn);
    st = agree(c->comm, c->rank, st, fn);
    if (st == FA_OK) {
        if (MPI_Allgather(mine, D_N, MPI_INT64_T, all, D_N, MPI_INT64_T, c->comm) != MPI_SUCCESS)
            st = fai_fail(FA_ERR_COMMUNICATION, "%s: MPI_Allgather failed", fn);
        else
            st = judge(c, all, layout, fn);
    }
    free(all);
    return st;
}

/* ---------------------------------------------------------------- the schedules' pieces */

/* A shard's K then V (or dK then dV), packed: contiguous BSHD tensors of the working dtype,
 * one after the other. */
typedef struct {
    fa_tensor k, v;
} cp_pair;

static size_t pair_bytes(const cp_call *c, int64_t rows)
{
    return (size_t)(c->b * rows * c->hk) * (size_t)(c->dqk + c->dv) * c->es;
}

static cp_pair pair_at(const cp_call *c, void *data, int64_t rows)
{
    cp_pair x;
    x.k = work_tensor(c, data, rows, c->hk, c->dqk);
    x.v = work_tensor(c, (char *)data + (size_t)(c->b * rows * c->hk * c->dqk) * c->es, rows,
                      c->hk, c->dv);
    return x;
}

/* The message of a shard's pair: whole CHUNKs. */
static int units(const cp_call *c, int64_t rows) { return (int)(padded(pair_bytes(c, rows)) / CHUNK); }

/* The largest shard's keys (every message buffer holds any rank's pair). */
static int64_t max_keys(const cp_call *c)
{
    int64_t m = 0;
    for (int r = 0; r < c->W; r++)
        m = c->ks[r].local > m ? c->ks[r].local : m;
    return m;
}

/* Query rows per placed call: a part in up to `pieces` pieces of whole 64-row strips, so that a
 * ring's messages progress between them; the same on every run (results do not depend on it:
 * each row's sum runs over the same keys in the same order whichever call holds it). */
static int64_t piece_rows(const cp_call *c, int pieces)
{
    const fa_cp_shard *qs = &c->qs[c->rank];
    const int64_t most = qs->count[0] > qs->count[1] ? qs->count[0] : qs->count[1];
    const int64_t per = (most + pieces - 1) / pieces;
    return per < 64 ? 64 : (per + 63) / 64 * 64;
}

/* The query side of a rank's call: its rows in working copies (a backward's out, dout, lse
 * too), the accumulators of its results, and the scratch of one block's. */
typedef struct {
    fa_tensor q, out, dout, lse; /* the backward reads out, dout and lse */
    fa_tensor acc, acc_lse;      /* forward: O and LSE; backward: dQ (acc_lse unused) */
    void *blk, *blk_lse;         /* one placed call's O / LSE, or dQ */
    void *blk_kv;                /* a backward block's dK | dV */
    int64_t piece;
    double *row;                 /* a row of float64, for the copies */
} cp_rows;

/* Forward: every live block of this rank's rows against the pair of shard ks, merged into the
 * accumulators in the order parts, then keys' parts, then pieces. */
static fa_status forward_blocks(const cp_call *c, const cp_rows *w, const fa_cp_shard *ks,
                                const cp_pair *kv, MPI_Request *req, int nreq)
{
    const fa_cp_shard *qs = &c->qs[c->rank];
    for (int a = 0; a < qs->parts; a++)
        for (int x = 0; x < ks->parts; x++) {
            if (!block_live(c, qs, a, ks, x))
                continue;
            const fa_tensor k = rows_of(&kv->k, part_row(ks, x), ks->count[x]),
                            v = rows_of(&kv->v, part_row(ks, x), ks->count[x]);
            for (int64_t i0 = 0; i0 < qs->count[a]; i0 += w->piece) {
                const int64_t n = qs->count[a] - i0 < w->piece ? qs->count[a] - i0 : w->piece;
                const int64_t row = part_row(qs, a) + i0;
                const fa_tensor q = rows_of(&w->q, row, n);
                fa_tensor o[2] = {rows_of(&w->acc, row, n),
                                  work_tensor(c, w->blk, n, c->hq, c->dv)},
                          l[2] = {rows_of(&w->acc_lse, row, n),
                                  work_tensor(c, w->blk_lse, n, c->hq, 1)};
                const fai_place pl = {qs->first[a] + i0, ks->first[x], c->sq, c->sk};
                FAI_TRY(fai_forward_placed(c->ctx, &c->pb, &q, &k, &v, &pl, &o[1], &l[1], 0));
                FAI_TRY(fa_merge_states(2, o, l, &o[0], &l[0]));
                progress(req, nreq);
            }
        }
    return FA_OK;
}

/* Backward: every live block of this rank's rows against the pair of shard ks; dQ added to the
 * accumulator, dK and dV to *d (shard ks's), in the order parts, keys' parts, pieces. */
static fa_status backward_blocks(const cp_call *c, const cp_rows *w, const fa_cp_shard *ks,
                                 const cp_pair *kv, const cp_pair *d, MPI_Request *req, int nreq)
{
    const fa_cp_shard *qs = &c->qs[c->rank];
    for (int a = 0; a < qs->parts; a++)
        for (int x = 0; x < ks->parts; x++) {
            if (!block_live(c, qs, a, ks, x))
                continue;
            const int64_t kr = part_row(ks, x), kn = ks->count[x];
            const fa_tensor k = rows_of(&kv->k, kr, kn), v = rows_of(&kv->v, kr, kn),
                            dk = rows_of(&d->k, kr, kn), dv = rows_of(&d->v, kr, kn);
            cp_pair blk = pair_at(c, w->blk_kv, kn);
            for (int64_t i0 = 0; i0 < qs->count[a]; i0 += w->piece) {
                const int64_t n = qs->count[a] - i0 < w->piece ? qs->count[a] - i0 : w->piece;
                const int64_t row = part_row(qs, a) + i0;
                const fa_tensor q = rows_of(&w->q, row, n), o = rows_of(&w->out, row, n),
                                l = rows_of(&w->lse, row, n), g = rows_of(&w->dout, row, n),
                                dq = rows_of(&w->acc, row, n);
                fa_tensor dqb = work_tensor(c, w->blk, n, c->hq, c->dqk);
                const fai_place pl = {qs->first[a] + i0, ks->first[x], c->sq, c->sk};
                FAI_TRY(fai_backward_placed(c->ctx, &c->pb, &q, &k, &v, &pl, &o, &l, &g, &dqb,
                                            &blk.k, &blk.v, 0));
                add_rows(&dq, &dqb);
                add_rows(&dk, &blk.k);
                add_rows(&dv, &blk.v);
                progress(req, nreq);
            }
        }
    return FA_OK;
}

/* Packs rank r's rows of a global pair (B x S x H x D tensors in global order) into its shard's
 * pair, or the reverse (to_global). */
static void shard_rows(const cp_call *c, const fa_cp_shard *s, const cp_pair *global,
                       const cp_pair *shard, int to_global)
{
    for (int x = 0; x < s->parts; x++) {
        if (s->count[x] == 0)
            continue;
        const fa_tensor *g[2] = {&global->k, &global->v}, *h[2] = {&shard->k, &shard->v};
        for (int y = 0; y < 2; y++)
            for (int64_t b = 0; b < c->b; b++) {
                void *gp = fai_row(g[y], b, s->first[x], 0), *hp = fai_row(h[y], b, part_row(s, x), 0);
                const size_t n = (size_t)(s->count[x] * g[y]->heads * g[y]->headdim) * c->es;
                memcpy(to_global ? gp : hp, to_global ? hp : gp, n);
            }
    }
}

/* ---------------------------------------------------------------- the schedules */

/* The ring's memory: two K/V message buffers (the shard held, the next one arriving), and for
 * the backward two stages of dK/dV terms (the one being sent, the one being formed), two
 * receive buffers of terms for this rank's shard, and its sum. */
typedef struct {
    void *kv[2], *stage[2], *recv[2];
    cp_pair own; /* this rank's dK / dV */
} cp_ring;

/* Waits for terms of this rank's shard (into recv) and adds them to its sum. */
static fa_status add_terms(cp_call *c, cp_ring *b, MPI_Request *req, void *recv, fa_status st)
{
    st = wait_all(req, 1, st, &c->synced);
    if (st == FA_OK) {
        const cp_pair t = pair_at(c, recv, c->ks[c->rank].local);
        add_rows(&b->own.k, &t.k);
        add_rows(&b->own.v, &t.v);
    }
    return st;
}

/* The ring: at step s rank r holds shard (r - s) mod W's K/V (its own at step 0), sends it on
 * to r + 1 and receives the next one from r - 1 while its blocks compute. In the backward,
 * step s's dK/dV terms for shard t = (r - s) mod W go straight to their owner t, which takes
 * them from rank (t + s) mod W at the same step s: no step waits for another rank's step (the
 * terms are waited for a step later), and the owner adds them in step order 0, 1, ..., W - 1
 * (its own terms first), a fixed order. */
static fa_status ring(cp_call *c, const cp_rows *w, MPI_Datatype unit, cp_ring *b, int backward)
{
    const int W = c->W, r = c->rank, next = (r + 1) % W, prev = (r + W - 1) % W;
    const int own = units(c, c->ks[r].local);
    MPI_Request dq[5] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                         MPI_REQUEST_NULL}; /* K/V send, receive; terms: receive by step parity,
                                               the last send */
    MPI_Request sent[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}; /* terms, by step parity */
    fa_status st = FA_OK;
    for (int s = 0; s < W; s++) {
        const int src = (r + W - s) % W, nsrc = (src + W - 1) % W, x = s & 1;
        const fa_cp_shard *ks = &c->ks[src];
        int rc = MPI_SUCCESS;
        if (s < W - 1) {
            rc |= MPI_Isend(b->kv[x], units(c, ks->local), unit, next, TAG_KV, c->comm, &dq[0]);
            rc |= MPI_Irecv(b->kv[!x], units(c, c->ks[nsrc].local), unit, prev, TAG_KV, c->comm,
                            &dq[1]);
        }
        if (backward && s > 0) /* the terms rank r + s forms for this shard at its step s */
            rc |= MPI_Irecv(b->recv[x], own, unit, (r + s) % W, TAG_DKV, c->comm, &dq[2 + x]);
        if (rc != MPI_SUCCESS && st == FA_OK)
            st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: a ring message failed");
        const cp_pair kv = pair_at(c, b->kv[x], ks->local);
        if (!backward) {
            if (st == FA_OK)
                st = forward_blocks(c, w, ks, &kv, dq, 5);
        } else {
            /* this step's terms: into this rank's sum at step 0, else into a stage whose send
             * of two steps ago has left */
            st = wait_all(&sent[x], 1, st, &c->synced);
            const cp_pair terms = s == 0 ? b->own : pair_at(c, b->stage[x], ks->local);
            if (s > 0)
                memset(b->stage[x], 0, pair_bytes(c, ks->local));
            dq[4] = sent[!x];
            if (st == FA_OK)
                st = backward_blocks(c, w, ks, &kv, &terms, dq, 5);
            sent[!x] = dq[4];
            if (s > 0 && MPI_Isend(b->stage[x], units(c, ks->local), unit, src, TAG_DKV, c->comm,
                                   &sent[x]) != MPI_SUCCESS && st == FA_OK)
                st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: a ring message failed");
            if (s > 1) /* the last step's terms for this shard, added in step order */
                st = add_terms(c, b, &dq[2 + !x], b->recv[!x], st);
        }
        st = wait_all(dq, 2, st, &c->waited);
    }
    if (backward && W > 1)
        st = add_terms(c, b, &dq[2 + ((W - 1) & 1)], b->recv[(W - 1) & 1], st);
    return wait_all(sent, 2, st, &c->synced);
}

/* The allgather: every rank's pair gathered (buf: W pairs), laid out in global order (g), and
 * each of this rank's parts attended to the whole sequence by one placed call; the backward's
 * dK/dV over the whole sequence (gd) go back to their owners, who sum them in rank order. */
static fa_status allgather(cp_call *c, const cp_rows *w, MPI_Datatype unit, void *mine,
                           void *buf, size_t slot, const cp_pair *g, const cp_pair *gd,
                           void *sendbuf, cp_pair *mine_d)
{
    const fa_cp_shard *qs = &c->qs[c->rank];
    const int n = units(c, max_keys(c));
    fa_status st = FA_OK;
    double t0 = MPI_Wtime();
    if (MPI_Allgather(mine, n, unit, buf, n, unit, c->comm) != MPI_SUCCESS)
        st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: MPI_Allgather failed");
    c->waited += MPI_Wtime() - t0;
    for (int r = 0; r < c->W && st == FA_OK; r++) {
        const cp_pair x = pair_at(c, (char *)buf + (size_t)r * slot, c->ks[r].local);
        shard_rows(c, &c->ks[r], g, &x, 1);
    }
    for (int a = 0; a < qs->parts && st == FA_OK; a++) {
        const int64_t row = part_row(qs, a), m = qs->count[a];
        if (m == 0)
            continue;
        const fai_place pl = {qs->first[a], 0, c->sq, c->sk};
        const fa_tensor q = rows_of(&w->q, row, m);
        fa_tensor acc = rows_of(&w->acc, row, m);
        if (!mine_d) {
            fa_tensor l = rows_of(&w->acc_lse, row, m);
            st = fai_forward_placed(c->ctx, &c->pb, &q, &g->k, &g->v, &pl, &acc, &l, 0);
        } else {
            const fa_tensor o = rows_of(&w->out, row, m), l = rows_of(&w->lse, row, m),
                            dout = rows_of(&w->dout, row, m);
            cp_pair blk = pair_at(c, w->blk_kv, c->sk);
            st = fai_backward_placed(c->ctx, &c->pb, &q, &g->k, &g->v, &pl, &o, &l, &dout, &acc,
                                     &blk.k, &blk.v, 0);
            if (st == FA_OK) {
                add_rows(&gd->k, &blk.k);
                add_rows(&gd->v, &blk.v);
            }
        }
    }
    if (!mine_d)
        return st;
    for (int r = 0; r < c->W && st == FA_OK; r++) {
        const cp_pair x = pair_at(c, (char *)sendbuf + (size_t)r * slot, c->ks[r].local);
        shard_rows(c, &c->ks[r], gd, &x, 0);
    }
    /* every rank reaches the exchange, whatever its state: the others wait in it */
    t0 = MPI_Wtime();
    if (MPI_Alltoall(sendbuf, n, unit, buf, n, unit, c->comm) != MPI_SUCCESS && st == FA_OK)
        st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: MPI_Alltoall failed");
    c->waited += MPI_Wtime() - t0;
    *mine_d = pair_at(c, buf, c->ks[c->rank].local); /* rank 0's terms, then the others' */
    for (int r = 1; r < c->W && st == FA_OK; r++) {
        const cp_pair x = pair_at(c, (char *)buf + (size_t)r * slot, c->ks[c->rank].local);
        add_rows(&mine_d->k, &x.k);
        add_rows(&mine_d->v, &x.v);
    }
    return st;
}

/* ---------------------------------------------------------------- the plan */

/* The schedule of a call, and why (a static string: fa_context_describe prints the last one).
 * The rule is the measured one of docs/notes/context-parallel.md. */
static const char *choose(cp_call *c)
{
    if (c->ctx->cp_schedule == FAI_CP_RING) {
        c->sched = FAI_CP_RING;
        return "ring (FA_CP_SCHEDULE)";
    }
    if (c->ctx->cp_schedule == FAI_CP_ALLGATHER) {
        c->sched = FAI_CP_ALLGATHER;
        return "allgather (FA_CP_SCHEDULE)";
    }
    if (c->W == 1) {
        c->sched = FAI_CP_ALLGATHER;
        return "allgather (auto: one rank, no message)";
    }
    c->sched = FAI_CP_RING;
    return "ring (auto: K/V messages overlap the blocks' compute)";
}

/* ---------------------------------------------------------------- the calls */

/* The call's communicator (the caller's, duplicated: collective), its size and rank. */
static fa_status begin(cp_call *c, fa_context *ctx, MPI_Comm comm, const char *fn)
{
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->comm = MPI_COMM_NULL;
    int up = 0, down = 0;
    if (comm == MPI_COMM_NULL)
        return fai_fail(FA_ERR_NULL_POINTER, "%s: comm is MPI_COMM_NULL", fn);
    if (MPI_Initialized(&up) != MPI_SUCCESS || !up || MPI_Finalized(&down) != MPI_SUCCESS ||
        down)
        return fai_fail(FA_ERR_COMMUNICATION, "%s: MPI is not initialized (or finalized)", fn);
    if (MPI_Comm_dup(comm, &c->comm) != MPI_SUCCESS) {
        c->comm = MPI_COMM_NULL;
        return fai_fail(FA_ERR_COMMUNICATION, "%s: MPI_Comm_dup failed", fn);
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(c->comm, &c->W);
    MPI_Comm_rank(c->comm, &c->rank);
    return FA_OK;
}

static void end(cp_call *c)
{
    if (c->comm != MPI_COMM_NULL)
        MPI_Comm_free(&c->comm);
    free(c->qs);
}

/* The dims of the agreed call, its working dtype and its blocks' params. */
static void settle(cp_call *c, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                   const fa_tensor *v)
{
    c->p = p;
    c->pb = *p;
    c->pb.sink_logits = NULL;
    c->pb.sink_grad = NULL;
    c->wd = q->dtype == FA_F64 ? FA_F64 : FA_F32;
    c->es = fai_dtype_size(c->wd);
    c->b = q->batch;
    c->hq = q->heads;
    c->hk = k->heads;
    c->dqk = q->headdim;
    c->dv = v->headdim;
}

/* The query side's working memory: copies of q (and a backward's out, dout, lse), the
 * accumulators, one block's scratch, a row of doubles. */
static void rows_memory(const cp_call *c, cp_mem *m, cp_rows *w, int backward, int pieces,
                        fa_status *st)
{
    const int64_t sq = c->qs[c->rank].local;
    const int64_t d = c->dqk > c->dv ? c->dqk : c->dv;
    w->piece = piece_rows(c, pieces);
    const int64_t n = w->piece < sq ? w->piece : sq;
    w->q = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, c->dqk, st), st), sq, c->hq, c->dqk);
    w->acc = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, backward ? c->dqk : c->dv, st), st),
                         sq, c->hq, backward ? c->dqk : c->dv);
    w->blk = grab(m, work_bytes(c, n, c->hq, backward ? c->dqk : c->dv, st), st);
    w->row = grab(m, (size_t)d * sizeof(double), st);
    if (!backward) {
        w->acc_lse = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, 1, st), st), sq, c->hq, 1);
        w->blk_lse = grab(m, work_bytes(c, n, c->hq, 1, st), st);
        if (*st == FA_OK) /* an empty state: O = 0, LSE = -inf */
            for (int64_t i = 0; i < c->b * sq * c->hq; i++)
                fai_lse_store(&w->acc_lse, i / (sq * c->hq), i % c->hq, i / c->hq % sq,
                              -INFINITY);
        return;
    }
    w->out = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, c->dv, st), st), sq, c->hq, c->dv);
    w->dout = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, c->dv, st), st), sq, c->hq, c->dv);
    w->lse = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, 1, st), st), sq, c->hq, 1);
}

/* The key side's: the ring's buffers (cp_ring), or the allgather's (every rank's K/V, this
 * rank's own to send, the global pairs; the backward's dK/dV over the sequence and the buffer
 * it leaves from); this rank's K/V copied into the one sent first. */
typedef struct {
    cp_ring ring;
    void *all, *mine, *sendbuf;
    size_t slot; /* one rank's K/V in the gathered buffer: the largest shard's, padded */
    cp_pair g, gd;
} cp_keys;

static void keys_memory(const cp_call *c, cp_mem *m, cp_keys *k, cp_rows *w, const fa_tensor *kk,
                        const fa_tensor *vv, int backward, fa_status *st)
{
    const int64_t most = max_keys(c), mine = c->ks[c->rank].local;
    (void)work_bytes(c, most, c->hk, c->dqk + c->dv, st); /* (overflow check) */
    const size_t pair = pair_bytes(c, most);
    k->slot = padded(pair);
    if (c->sched == FAI_CP_RING) {
        for (int i = 0; i < 2; i++)
            k->ring.kv[i] = grab(m, k->slot, st);
        if (backward) {
            for (int i = 0; i < 2; i++) {
                k->ring.stage[i] = grab(m, pair, st);
                k->ring.recv[i] = grab(m, pair_bytes(c, mine), st);
            }
            k->ring.own = pair_at(c, grab(m, pair_bytes(c, mine), st), mine);
            w->blk_kv = grab(m, pair, st);
        }
        k->mine = k->ring.kv[0];
    } else {
        size_t all = 0;
        if (!fai_mul_size(k->slot, (size_t)c->W, &all) && *st == FA_OK)
            *st = fai_fail(FA_ERR_OVERFLOW, "context parallelism: the gathered K/V's size");
        k->all = grab(m, all, st);
        k->mine = grab(m, k->slot, st);
        const size_t gbytes = pair_bytes(c, c->sk);
        k->g = pair_at(c, grab(m, gbytes, st), c->sk);
        if (backward) {
            k->gd = pair_at(c, grab(m, gbytes, st), c->sk);
            w->blk_kv = grab(m, gbytes, st);
            k->sendbuf = grab(m, all, st);
        }
    }
    if (*st != FA_OK)
        return;
    const cp_pair own = pair_at(c, k->mine, mine);
    copy_rows(kk, &own.k, w->row);
    copy_rows(vv, &own.v, w->row);
}

/* The sink logits as one more state of every row, O = 0 and LSE = sink_h (zero strides over
 * memory of Dv + Hq working values). */
static void sink_state(const cp_call *c, cp_mem *m, fa_tensor *o, fa_tensor *l, fa_status *st)
{
    const int64_t sq = c->qs[c->rank].local;
    char *x = grab(m, c->es * (size_t)(c->dv + c->hq), st);
    *o = (fa_tensor){x, c->wd, c->b, sq, c->hq, c->dv, 0, 0, 0, 1};
    *l = (fa_tensor){x ? x + c->es * (size_t)c->dv : NULL, c->wd, c->b, sq, c->hq, 1, 0, 0, 1, 1};
    for (int64_t h = 0; x && h < c->hq; h++)
        fai_lse_store(l, 0, h, 0, c->p->sink_logits[h]);
}

/* d loss / d sink_h over the whole sequence: each rank's rows in order, in float64 (as
 * api/ops.c sums one process's), the ranks' sums gathered and added in rank order. Every rank
 * takes part in the gather; *st records a failure. */
static void sink_gradient(const cp_call *c, const fa_tensor *out, const fa_tensor *lse,
                          const fa_tensor *dout, double *row2, double *sums, fa_status *st)
{
    double *mine = sums + (size_t)c->W * c->hq, *o = row2, *g = row2 + c->dv;
    for (int64_t h = 0; h < c->hq; h++) {
        const double s = c->p->sink_logits[h];
        double sum = 0;
        for (int64_t b = 0; b < c->b && s != -INFINITY && *st == FA_OK; b++)
            for (int64_t i = 0; i < out->seqlen; i++) {
                fai_load_f64(fai_row(out, b, i, h), out->dtype, c->dv, o);
                fai_load_f64(fai_row(dout, b, i, h), dout->dtype, c->dv, g);
                double di = 0;
                for (int64_t d = 0; d < c->dv; d++)
                    di += o[d] * g[d];
                sum += fai_dsink_term_f64(s, fai_lse_load(lse, b, h, i), di);
            }
        mine[h] = sum;
    }
    if (MPI_Allgather(mine, (int)c->hq, MPI_DOUBLE, sums, (int)c->hq, MPI_DOUBLE, c->comm) !=
            MPI_SUCCESS &&
        *st == FA_OK)
        *st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: MPI_Allgather failed");
}

/* The schedule's times, for fa_context_describe (the bench's measure of hidden messages). */
static void record(const cp_call *c, double took)
{
    atomic_store(&c->ctx->cp_waited_ns, (int64_t)(c->waited * 1e9));
    atomic_store(&c->ctx->cp_synced_ns, (int64_t)(c->synced * 1e9));
    atomic_store(&c->ctx->cp_took_ns, (int64_t)(took * 1e9));
}

/* Phase 1 and the plan: the agreed call, or every rank's same failure (then nothing else). */
static fa_status open_call(cp_call *c, fa_context *ctx, MPI_Comm comm, cp_op op,
                           fa_cp_layout layout, const fa_params *p, const fa_tensor *const *t,
                           int nt, const char *const *names, const char *fn)
{
    FAI_TRY(begin(c, ctx, comm, fn));
    fa_status st = phase_one(c, op, layout, p, t, nt, names, fn);
    if (st == FA_OK) {
        const fai_place whole = {0, 0, c->sq, c->sk};
        settle(c, p, t[0], t[1], t[2]);
        const fa_status mine =
            op == OP_FORWARD
                ? fai_forward_placed(ctx, p, t[0], t[1], t[2], &whole, (fa_tensor *)t[3],
                                     (fa_tensor *)t[4], 1)
                : fai_backward_placed(ctx, p, t[0], t[1], t[2], &whole, t[3], t[4], t[5],
                                      (fa_tensor *)t[6], (fa_tensor *)t[7], (fa_tensor *)t[8],
                                      1);
        st = agree(c->comm, c->rank, mine, fn); /* phase 1's second half: the dry runs */
    }
    if (st != FA_OK) {
        end(c);
        return st;
    }
    atomic_store(&ctx->cp_plan, choose(c));
    return FA_OK;
}

fa_status fa_cp_forward(fa_context *ctx, MPI_Comm comm, fa_cp_layout layout, const fa_params *p,
                        const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                        fa_tensor *out, fa_tensor *lse)
{
    static const char fn[] = "fa_cp_forward";
    static const char *const names[4] = {"q", "k", "v", "out"};
    const fa_tensor *const t[5] = {q, k, v, out, lse};
    cp_call c;
    FAI_TRY(open_call(&c, ctx, comm, OP_FORWARD, layout, p, t, 4, names, fn));
    cp_mem m = {.ctx = ctx};
    cp_rows w = {0};
    cp_keys kb = {0};
    fa_tensor sink_o, sink_l;
    fa_status mine = FA_OK;
    rows_memory(&c, &m, &w, 0, c.sched == FAI_CP_RING ? 4 : 1, &mine);
    keys_memory(&c, &m, &kb, &w, k, v, 0, &mine);
    if (p->sink_logits)
        sink_state(&c, &m, &sink_o, &sink_l, &mine);
    fa_status st = agree(c.comm, c.rank, mine, fn); /* every rank has its memory */
    if (st == FA_OK) {
        MPI_Datatype unit;
        MPI_Type_contiguous(CHUNK, MPI_BYTE, &unit);
        MPI_Type_commit(&unit);
        copy_rows(q, &w.q, w.row);
        const double t0 = MPI_Wtime();
        mine = c.sched == FAI_CP_RING
                   ? ring(&c, &w, unit, &kb.ring, 0)
                   : allgather(&c, &w, unit, kb.mine, kb.all, kb.slot, &kb.g, NULL, NULL, NULL);
        record(&c, MPI_Wtime() - t0);
        MPI_Type_free(&unit);
        if (mine == FA_OK && p->sink_logits) {
            const fa_tensor so[2] = {w.acc, sink_o}, sl[2] = {w.acc_lse, sink_l};
            mine = fa_merge_states(2, so, sl, &w.acc, &w.acc_lse);
        }
        st = agree(c.comm, c.rank, mine, fn);
    }
    if (st == FA_OK) { /* phase 3: every rank succeeded; nothing below can fail */
        copy_rows(&w.acc, out, w.row);
        if (lse)
            copy_rows(&w.acc_lse, lse, w.row);
    }
    release(&m);
    end(&c);
    return st;
}

fa_status fa_cp_backward(fa_context *ctx, MPI_Comm comm, fa_cp_layout layout, const fa_params *p,
                         const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                         const fa_tensor *out, const fa_tensor *lse, const fa_tensor *dout,
                         fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    static const char fn[] = "fa_cp_backward";
    static const char *const names[9] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    const fa_tensor *const t[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    cp_call c;
    FAI_TRY(open_call(&c, ctx, comm, OP_BACKWARD, layout, p, t, 9, names, fn));
    cp_mem m = {.ctx = ctx};
    cp_rows w = {0};
    cp_keys kb = {0};
    fa_status mine = FA_OK;
    rows_memory(&c, &m, &w, 1, c.sched == FAI_CP_RING ? 4 : 1, &mine);
    keys_memory(&c, &m, &kb, &w, k, v, 1, &mine);
    double *sums = p->sink_grad ? grab(&m, sizeof(double) * (size_t)((c.W + 1) * c.hq), &mine)
                                : NULL;
    double *row2 = p->sink_grad ? grab(&m, sizeof(double) * 2 * (size_t)c.dv, &mine) : NULL;
    fa_status st = agree(c.comm, c.rank, mine, fn);
    cp_pair d;
    memset(&d, 0, sizeof d);
    if (st == FA_OK) {
        MPI_Datatype unit;
        MPI_Type_contiguous(CHUNK, MPI_BYTE, &unit);
        MPI_Type_commit(&unit);
        copy_rows(q, &w.q, w.row);
        copy_rows(out, &w.out, w.row);
        copy_rows(dout, &w.dout, w.row);
        copy_rows(lse, &w.lse, w.row);
        const double t0 = MPI_Wtime();
        mine = c.sched == FAI_CP_RING
                   ? ring(&c, &w, unit, &kb.ring, 1)
                   : allgather(&c, &w, unit, kb.mine, kb.all, kb.slot, &kb.g, &kb.gd,
                               kb.sendbuf, &d);
        if (c.sched == FAI_CP_RING)
            d = kb.ring.own;
        record(&c, MPI_Wtime() - t0);
        MPI_Type_free(&unit);
        if (p->sink_grad)
            sink_gradient(&c, out, lse, dout, row2, sums, &mine);
        st = agree(c.comm, c.rank, mine, fn);
    }
    if (st == FA_OK) { /* phase 3 */
        copy_rows(&w.acc, dq, w.row);
        copy_rows(&d.k, dk, w.row);
        copy_rows(&d.v, dv, w.row);
        for (int64_t h = 0; p->sink_grad && h < c.hq; h++) {
            double total = 0;
            for (int r = 0; r < c.W; r++)
                total += sums[(size_t)r * c.hq + h];
            p->sink_grad[h] = (float)total;
        }
    }
    release(&m);
    end(&c);
    return st;
}
