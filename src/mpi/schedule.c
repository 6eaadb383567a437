/*
 * Context parallelism's schedules (cp.h, phase 2): the ring and the allgather, and the blocks
 * they run.
 */
#include "config.h"

#include <string.h>

#include "mpi/cp.h"
#include "core/score.h"

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
                void *gp = fai_row(g[y], b, s->first[x], 0),
                     *hp = fai_row(h[y], b, part_row(s, x), 0);
                const size_t n = (size_t)(s->count[x] * g[y]->heads * g[y]->headdim) * c->es;
                memcpy(to_global ? gp : hp, to_global ? hp : gp, n);
            }
    }
}

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
fa_status fai_cp_ring(cp_call *c, const cp_rows *w, MPI_Datatype unit, cp_ring *b, int backward)
{
    const int W = c->W, r = c->rank, next = (r + 1) % W, prev = (r + W - 1) % W;
    const int own = units(c, c->ks[r].local);
    /* K/V send and receive; the terms' receives by step parity; the last step's terms' send */
    MPI_Request req[5] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                          MPI_REQUEST_NULL};
    MPI_Request sent[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}; /* terms, by step parity */
    fa_status st = FA_OK;
    for (int s = 0; s < W; s++) {
        const int src = (r + W - s) % W, nsrc = (src + W - 1) % W, x = s & 1;
        const fa_cp_shard *ks = &c->ks[src];
        int rc = MPI_SUCCESS;
        if (s < W - 1) {
            rc |= MPI_Isend(b->kv[x], units(c, ks->local), unit, next, TAG_KV, c->comm, &req[0]);
            rc |= MPI_Irecv(b->kv[!x], units(c, c->ks[nsrc].local), unit, prev, TAG_KV, c->comm,
                            &req[1]);
        }
        if (backward && s > 0) /* the terms rank r + s forms for this shard at its step s */
            rc |= MPI_Irecv(b->recv[x], own, unit, (r + s) % W, TAG_DKV, c->comm, &req[2 + x]);
        if (rc != MPI_SUCCESS && st == FA_OK)
            st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: a ring message failed");
        const cp_pair kv = pair_at(c, b->kv[x], ks->local);
        if (!backward) {
            if (st == FA_OK)
                st = forward_blocks(c, w, ks, &kv, req, 5);
        } else {
            /* this step's terms: into this rank's sum at step 0, else into a stage whose send
             * of two steps ago has left */
            st = wait_all(&sent[x], 1, st, &c->synced);
            const cp_pair terms = s == 0 ? b->own : pair_at(c, b->stage[x], ks->local);
            if (s > 0)
                memset(b->stage[x], 0, pair_bytes(c, ks->local));
            req[4] = sent[!x];
            if (st == FA_OK)
                st = backward_blocks(c, w, ks, &kv, &terms, req, 5);
            sent[!x] = req[4];
            if (s > 0 && MPI_Isend(b->stage[x], units(c, ks->local), unit, src, TAG_DKV, c->comm,
                                   &sent[x]) != MPI_SUCCESS && st == FA_OK)
                st = fai_fail(FA_ERR_COMMUNICATION, "context parallelism: a ring message failed");
            if (s > 1) /* the last step's terms for this shard, added in step order */
                st = add_terms(c, b, &req[2 + !x], b->recv[!x], st);
        }
        st = wait_all(req, 2, st, &c->waited);
    }
    if (backward && W > 1)
        st = add_terms(c, b, &req[2 + ((W - 1) & 1)], b->recv[(W - 1) & 1], st);
    return wait_all(sent, 2, st, &c->synced);
}

/* The allgather: every rank's pair gathered (buf: W pairs), laid out in global order (g), and
 * each of this rank's parts attended to the whole sequence by one placed call; the backward's
 * dK/dV over the whole sequence (gd) go back to their owners, who sum them in rank order. */
fa_status fai_cp_allgather(cp_call *c, const cp_rows *w, MPI_Datatype unit, void *mine,
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
            st = fai_forward_placed(c->ctx, &c->pa, &q, &g->k, &g->v, &pl, &acc, &l, 0);
        } else {
            const fa_tensor o = rows_of(&w->out, row, m), l = rows_of(&w->lse, row, m),
                            dout = rows_of(&w->dout, row, m);
            cp_pair blk = pair_at(c, w->blk_kv, c->sk);
            st = fai_backward_placed(c->ctx, &c->pa, &q, &g->k, &g->v, &pl, &o, &l, &dout, &acc,
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
