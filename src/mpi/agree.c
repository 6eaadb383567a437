/*
 * Context parallelism's agreement (cp.h, phase 1): every rank's same verdict, whatever each
 * rank passed.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/cp.h"
#include "backends/table.h"

/* Every rank's verdict from each rank's own: the failure with the lowest (status, rank), its
 * message broadcast from that rank, or FA_OK; FA_ERR_COMMUNICATION where the exchange itself
 * fails. It allocates nothing, so a rank out of memory takes part as any other. */
fa_status fai_cp_agree(MPI_Comm comm, int rank, fa_status mine, const char *fn)
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
    if (k->dtype != q->dtype || vt->dtype != q->dtype)
        return fai_fail(FA_ERR_DTYPE, "%s->dtype = %s with q->dtype = %s; context parallelism "
                                      "takes one dtype (no cache dtype apart from q's)",
                        k->dtype != q->dtype ? "k" : "v",
                        fa_dtype_name(k->dtype != q->dtype ? k->dtype : vt->dtype),
                        fa_dtype_name(q->dtype));
    if (p->bias || p->bias_grad || p->block_mask)
        return fai_fail(FA_ERR_UNSUPPORTED, "params->%s is set; context parallelism takes no "
                                            "bias tensor or block mask (they are indexed by local "
                                            "rows)", p->block_mask ? "block_mask" : "bias");
    if (p->descale_q || p->descale_k || p->descale_v)
        return fai_fail(FA_ERR_UNSUPPORTED, "params->descale_%c is set; context parallelism "
                                            "takes no FP8 tensors",
                        p->descale_q ? 'q' : p->descale_k ? 'k' : 'v');
    if (q->heads < 1 || q->heads > INT32_MAX) /* (the sink gradient's gather counts heads) */
        return fai_fail(FA_ERR_SHAPE, "q->heads = %lld", (long long)q->heads);
    if (op == OP_BACKWARD && c->ctx && c->ctx->cp_schedule == FAI_CP_RING &&
        !fai_backend_of(c->ctx->backend)->backward_reads_lse)
        return fai_fail(FA_ERR_UNSUPPORTED, "ctx's backend is %s, whose backward recomputes the "
                                            "softmax over its call's keys, and FA_CP_SCHEDULE=ring "
                                            "gives a call some of them (the allgather takes it)",
                        fa_backend_name(c->ctx->backend));
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
    for (int r = 0; r < c->W; r++) { /* each at most 2^40 (describe): no sum overflows */
        c->sq += all[r * D_N + D_SQ];
        c->sk += all[r * D_N + D_SK];
        if (c->sq > FAI_DIM_MAX || c->sk > FAI_DIM_MAX)
            return fai_fail(FA_ERR_SHAPE, "%s: the ranks' shards add up to more than 2^40 rows",
                            fn);
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
fa_status fai_cp_phase_one(cp_call *c, cp_op op, fa_cp_layout layout, const fa_params *p,
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
    st = fai_cp_agree(c->comm, c->rank, st, fn);
    if (st == FA_OK) {
        if (MPI_Allgather(mine, D_N, MPI_INT64_T, all, D_N, MPI_INT64_T, c->comm) != MPI_SUCCESS)
            st = fai_fail(FA_ERR_COMMUNICATION, "%s: MPI_Allgather failed", fn);
        else
            st = judge(c, all, layout, fn);
    }
    free(all);
    return st;
}

/* The call's communicator (the caller's, duplicated: collective), its size and rank. */
fa_status fai_cp_begin(cp_call *c, fa_context *ctx, MPI_Comm comm, const char *fn)
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

void fai_cp_end(cp_call *c)
{
    if (c->comm != MPI_COMM_NULL)
        MPI_Comm_free(&c->comm);
    free(c->qs);
}
