/*
 * What the files of context parallelism share (flashattn_mpi.h; docs/notes/context-parallel.md):
 * the agreed call, the working tensors and messages, and the two schedules. A call runs in
 * three phases:
 *   1. agreement (agree.c): every rank describes its arguments and reaches the same verdict
 *      (the failure of lowest (status, rank), or a disagreement); then each rank checks its tensors
 *      by a dry run of the placed call (api/ops.c) and the verdicts are agreed again. Nothing
 *      has moved but these descriptions, and every rank takes part in each exchange whatever
 *      its own state, so no rank waits on one that left.
 *   2. the schedule (schedule.c: ring or allgather) on working copies of the shards in f32 (f64
 *      for f64 tensors): each block is a placed call (fai_forward_placed / fai_backward_placed)
 *      of some of the rank's query rows against one rank's keys at their global positions, and
 *      partial states merge in a fixed order (fa_merge_states, core/recurrence.h). A rank whose
 *      compute fails keeps sending and receiving, so the others finish their steps.
 *   3. the verdicts of phase 2 are agreed; only when every rank succeeded does each write its
 *      outputs, rounded once from the working copies (cp.c, which holds the memory, the plan and
 *      the public calls).
 */
#ifndef FAI_MPI_CP_H
#define FAI_MPI_CP_H

#include <mpi.h>
#include <stdint.h>

#include "flashattn_mpi.h"
#include "api/api.h"

/* Messages are counted in units of CHUNK bytes (buffers are padded to it), so a count stays an
 * int for any tensor the API accepts. */
enum { CHUNK = 1 << 16, MSG = 240, TAG_KV = 1, TAG_DKV = 2 };

typedef enum { OP_FORWARD, OP_BACKWARD } cp_op;

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
    cp_op op;
    fa_params pa; /* the allgather's calls' params: the caller's without sink_grad (each call
                     holds whole rows; the sink gradient is the call's, formed once) */
    fa_params pb; /* the ring's blocks' params: pa without sink logits (merged once, at the
                     end: a sink is one term of the row's global sum, not of each block's) */
    fai_cp_schedule sched;
} cp_call;

/* A contiguous BSHD tensor of the working dtype. */
static inline fa_tensor work_tensor(const cp_call *c, void *data, int64_t s, int64_t h, int64_t d)
{
    fa_tensor t;
    fa_tensor_init(&t, data, c->wd, c->b, s, h, d, 0);
    return t;
}

/* Rows [s0, s0 + n) of t (every batch and head). */
static inline fa_tensor rows_of(const fa_tensor *t, int64_t s0, int64_t n)
{
    fa_tensor v = *t;
    if (n > 0)
        v.data = fai_row(t, 0, s0, 0);
    v.seqlen = n;
    return v;
}

/* Row offset of part a in a shard's tensors. */
static inline int64_t part_row(const fa_cp_shard *s, int a) { return a == 0 ? 0 : s->count[0]; }

static inline size_t padded(size_t bytes) { return (bytes + CHUNK - 1) / CHUNK * CHUNK; }

/* A shard's K then V (or dK then dV), packed: contiguous BSHD tensors of the working dtype,
 * one after the other. */
typedef struct {
    fa_tensor k, v;
} cp_pair;

static inline size_t pair_bytes(const cp_call *c, int64_t rows)
{
    return (size_t)(c->b * rows * c->hk) * (size_t)(c->dqk + c->dv) * c->es;
}

static inline cp_pair pair_at(const cp_call *c, void *data, int64_t rows)
{
    cp_pair x;
    x.k = work_tensor(c, data, rows, c->hk, c->dqk);
    x.v = work_tensor(c, (char *)data + (size_t)(c->b * rows * c->hk * c->dqk) * c->es, rows,
                      c->hk, c->dv);
    return x;
}

/* The message of a shard's pair: whole CHUNKs. */
static inline int units(const cp_call *c, int64_t rows)
{
    return (int)(padded(pair_bytes(c, rows)) / CHUNK);
}

/* The largest shard's keys (every message buffer holds any rank's pair). */
static inline int64_t max_keys(const cp_call *c)
{
    int64_t m = 0;
    for (int r = 0; r < c->W; r++)
        m = c->ks[r].local > m ? c->ks[r].local : m;
    return m;
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

/* The ring's memory: two K/V message buffers (the shard held, the next one arriving), and for
 * the backward two stages of dK/dV terms (the one being sent, the one being formed), two
 * receive buffers of terms for this rank's shard, and its sum. */
typedef struct {
    void *kv[2], *stage[2], *recv[2];
    cp_pair own; /* this rank's dK / dV */
} cp_ring;

/* Lets the messages in flight move while a rank computes. */
static inline void progress(MPI_Request *req, int n)
{
    int done;
    if (n > 0)
        MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
}

/* Waits for n requests, adding the time blocked to *waited. */
static inline fa_status wait_all(MPI_Request *req, int n, fa_status st, double *waited)
{
    const double t0 = MPI_Wtime();
    if (n > 0 && MPI_Waitall(n, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS && st == FA_OK)
        st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: MPI_Waitall failed");
    *waited += MPI_Wtime() - t0;
    return st;
}

/* agree.c: the call's communicator (the caller's, duplicated: collective), its size and rank,
 * and its release; every rank's same verdict from each rank's own; phase 1's first half (the
 * descriptions, gathered and judged: the agreed dims and shards in *c). */
fa_status fai_cp_begin(cp_call *c, fa_context *ctx, MPI_Comm comm, const char *fn);
void fai_cp_end(cp_call *c);
fa_status fai_cp_agree(MPI_Comm comm, int rank, fa_status mine, const char *fn);
fa_status fai_cp_phase_one(cp_call *c, cp_op op, fa_cp_layout layout, const fa_params *p,
                           const fa_tensor *const *t, int nt, const char *const *names,
                           const char *fn);

/* schedule.c: the schedules over the rows' working memory w. The ring's backward leaves this
 * rank's dK/dV in b->own; the allgather's in *mine_d (its backward: gd and sendbuf given). */
fa_status fai_cp_ring(cp_call *c, const cp_rows *w, MPI_Datatype unit, cp_ring *b, int backward);
fa_status fai_cp_allgather(cp_call *c, const cp_rows *w, MPI_Datatype unit, void *mine,
                           void *buf, size_t slot, const cp_pair *g, const cp_pair *gd,
                           void *sendbuf, cp_pair *mine_d);

#endif
