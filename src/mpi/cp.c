/*
 * Context parallelism's public calls (flashattn_mpi.h; cp.h says how a call runs): their
 * working memory, the plan, the sink logits, and the phases in order.
 */
#include "config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/cp.h"
#include "backends/table.h"

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

/* ---------------------------------------------------------------- memory */

/* A call's working buffers: 16 at most (a ring backward with sink logits). */
enum { MAX_BUFFERS = 32 };

typedef struct {
    fa_context *ctx;
    void *ptr[MAX_BUFFERS];
    size_t size[MAX_BUFFERS];
    int n;
} cp_mem;

/* Zeroed working memory, padded to CHUNK (NULL for 0 bytes); *st = FA_ERR_NO_MEMORY on
 * failure, the allocation is then NULL and every later one is skipped. */
static void *grab(cp_mem *m, size_t bytes, fa_status *st)
{
    if (*st != FA_OK || bytes == 0)
        return NULL;
    const size_t n = padded(bytes);
    void *p = m->n < MAX_BUFFERS ? fai_alloc(&m->ctx->mem, n) : NULL;
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

/* Query rows per placed call: a part in up to `pieces` pieces of whole 64-row strips, so that a
 * ring's messages progress between them. Fixed by the shapes, so the same on every run and
 * thread count; a row's O need not have the bits of one call over its whole part (a short last
 * piece may take the decode path), and the dK/dV terms are summed piece by piece. */
static int64_t piece_rows(const cp_call *c, int pieces)
{
    const fa_cp_shard *qs = &c->qs[c->rank];
    const int64_t most = qs->count[0] > qs->count[1] ? qs->count[0] : qs->count[1];
    const int64_t per = (most + pieces - 1) / pieces;
    return per < 64 ? 64 : (per + 63) / 64 * 64;
}

/* ---------------------------------------------------------------- the plan */

/* The schedule of a call, and why (a static string: fa_context_describe prints the last one).
 * docs/notes/context-parallel.md says what the rule rests on (provisional: the allgather was
 * never ahead there). */
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
    if (c->op == OP_BACKWARD && !fai_backend_of(c->ctx->backend)->backward_reads_lse) {
        c->sched = FAI_CP_ALLGATHER;
        return "allgather (auto: the backend's backward recomputes the softmax, so each call "
               "takes all the keys)";
    }
    c->sched = FAI_CP_RING;
    return "ring (auto: K/V messages overlap the blocks' compute)";
}

/* ---------------------------------------------------------------- the calls */

/* The dims of the agreed call, its working dtype and its blocks' params. */
static void settle(cp_call *c, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                   const fa_tensor *v)
{
    c->p = p;
    c->pa = *p;
    c->pa.sink_grad = NULL;
    c->pb = c->pa;
    c->pb.sink_logits = NULL;
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
static void rows_memory(const cp_call *c, cp_mem *m, cp_rows *w, int backward, fa_status *st)
{
    const int ring = c->sched == FAI_CP_RING; /* blocks of pieces, their results merged */
    const int64_t sq = c->qs[c->rank].local;
    const int64_t d = c->dqk > c->dv ? c->dqk : c->dv;
    w->piece = piece_rows(c, ring ? 4 : 1);
    const int64_t n = w->piece < sq ? w->piece : sq;
    w->q = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, c->dqk, st), st), sq, c->hq, c->dqk);
    w->acc = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, backward ? c->dqk : c->dv, st), st),
                         sq, c->hq, backward ? c->dqk : c->dv);
    if (ring)
        w->blk = grab(m, work_bytes(c, n, c->hq, backward ? c->dqk : c->dv, st), st);
    w->row = grab(m, (size_t)d * sizeof(double), st);
    if (!backward) {
        w->acc_lse = work_tensor(c, grab(m, work_bytes(c, sq, c->hq, 1, st), st), sq, c->hq, 1);
        if (ring)
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
    (void)work_bytes(c, c->sk, c->hk, c->dqk + c->dv, st); /* the largest pair's size fits */
    if (*st != FA_OK)
        return;
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
                          const fa_tensor *dout, double *sums, fa_status *st)
{
    double *mine = sums + (size_t)c->W * c->hq;
    for (int64_t h = 0; h < c->hq; h++) {
        const double s = c->p->sink_logits[h];
        double sum = 0;
        for (int64_t b = 0; b < c->b && s != -INFINITY && *st == FA_OK; b++)
            for (int64_t i = 0; i < out->seqlen; i++)
                sum += fai_sink_row_term(fai_row(out, b, i, h), fai_row(dout, b, i, h),
                                         out->dtype, c->dv, s, fai_lse_load(lse, b, h, i));
        mine[h] = sum;
    }
    if (MPI_Allgather(mine, (int)c->hq, MPI_DOUBLE, sums, (int)c->hq, MPI_DOUBLE, c->comm) !=
            MPI_SUCCESS &&
        *st == FA_OK)
        *st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: MPI_Allgather failed");
}

/* The messages' unit: CHUNK bytes (MPI_Type_free it). */
static MPI_Datatype unit_type(void)
{
    MPI_Datatype unit;
    MPI_Type_contiguous(CHUNK, MPI_BYTE, &unit);
    MPI_Type_commit(&unit);
    return unit;
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
    FAI_TRY(fai_cp_begin(c, ctx, comm, fn));
    fa_status st = fai_cp_phase_one(c, op, layout, p, t, nt, names, fn);
    if (st == FA_OK) {
        const fai_place whole = {0, 0, c->sq, c->sk};
        settle(c, p, t[0], t[1], t[2]);
        c->op = op;
        const fa_status mine =
            op == OP_FORWARD
                ? fai_forward_placed(ctx, p, t[0], t[1], t[2], &whole, (fa_tensor *)t[3],
                                     (fa_tensor *)t[4], 1)
                : fai_backward_placed(ctx, p, t[0], t[1], t[2], &whole, t[3], t[4], t[5],
                                      (fa_tensor *)t[6], (fa_tensor *)t[7], (fa_tensor *)t[8],
                                      1);
        st = fai_cp_agree(c->comm, c->rank, mine, fn); /* phase 1's second half: the dry runs */
    }
    if (st != FA_OK) {
        fai_cp_end(c);
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
    rows_memory(&c, &m, &w, 0, &mine);
    keys_memory(&c, &m, &kb, &w, k, v, 0, &mine);
    if (p->sink_logits && c.sched == FAI_CP_RING) /* (the allgather's calls hold whole rows) */
        sink_state(&c, &m, &sink_o, &sink_l, &mine);
    fa_status st = fai_cp_agree(c.comm, c.rank, mine, fn); /* every rank has its memory */
    if (st == FA_OK) {
        MPI_Datatype unit = unit_type();
        copy_rows(q, &w.q, w.row);
        const double t0 = MPI_Wtime();
        mine = c.sched == FAI_CP_RING
                   ? fai_cp_ring(&c, &w, unit, &kb.ring, 0)
                   : fai_cp_allgather(&c, &w, unit, kb.mine, kb.all, kb.slot, &kb.g, NULL,
                                      NULL, NULL);
        record(&c, MPI_Wtime() - t0);
        MPI_Type_free(&unit);
        if (mine == FA_OK && p->sink_logits && c.sched == FAI_CP_RING) {
            const fa_tensor so[2] = {w.acc, sink_o}, sl[2] = {w.acc_lse, sink_l};
            mine = fa_merge_states(2, so, sl, &w.acc, &w.acc_lse);
        }
        st = fai_cp_agree(c.comm, c.rank, mine, fn);
    }
    if (st == FA_OK) { /* phase 3: every rank succeeded; nothing below can fail */
        copy_rows(&w.acc, out, w.row);
        if (lse)
            copy_rows(&w.acc_lse, lse, w.row);
    }
    release(&m);
    fai_cp_end(&c);
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
    rows_memory(&c, &m, &w, 1, &mine);
    keys_memory(&c, &m, &kb, &w, k, v, 1, &mine);
    double *sums = p->sink_grad ? grab(&m, sizeof(double) * (size_t)((c.W + 1) * c.hq), &mine)
                                : NULL;
    fa_status st = fai_cp_agree(c.comm, c.rank, mine, fn);
    cp_pair d;
    memset(&d, 0, sizeof d);
    if (st == FA_OK) {
        MPI_Datatype unit = unit_type();
        copy_rows(q, &w.q, w.row);
        copy_rows(out, &w.out, w.row);
        copy_rows(dout, &w.dout, w.row);
        copy_rows(lse, &w.lse, w.row);
        const double t0 = MPI_Wtime();
        mine = c.sched == FAI_CP_RING
                   ? fai_cp_ring(&c, &w, unit, &kb.ring, 1)
                   : fai_cp_allgather(&c, &w, unit, kb.mine, kb.all, kb.slot, &kb.g, &kb.gd,
                                      kb.sendbuf, &d);
        if (c.sched == FAI_CP_RING)
            d = kb.ring.own;
        record(&c, MPI_Wtime() - t0);
        MPI_Type_free(&unit);
        if (p->sink_grad)
            sink_gradient(&c, out, lse, dout, sums, &mine);
        st = fai_cp_agree(c.comm, c.rank, mine, fn);
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
    fai_cp_end(&c);
    return st;
}
