/*
 * Running an op over the groups of a call (backends/groups.h): a dense problem is one group,
 * a call of sequences (variable-length, paged, a cache) one per sequence. The groups share one
 * allocation made before anything is written (fai_run_groups: sized for the largest group,
 * which are run one by one; fai_run_call: sized by the backend for the whole call, run at
 * once); then the new keys of a cache are appended, and groups without a (query, key) pair get
 * their defined results here, on the host, for every backend alike.
 */
#include "config.h"

#include <string.h>

#include "backends/context.h"
#include "backends/groups.h"
#include "backends/rows.h"

/* Zeroes `dim` elements of each of rows [0, n) of every (batch, head) of role r. */
static void zero_rows(const fai_problem *pr, fai_role r, int64_t heads, int64_t n, int64_t dim)
{
    if (n == 0) /* no row, and the batch alone may be 2^40: no loop over it */
        return;
    const int kv = r == FAI_DK || r == FAI_DV;
    const size_t bytes = (size_t)dim * fai_dtype_size(fai_role_dtype(pr, r));
    for (int64_t b = 0; b < pr->b; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < n; i++)
                memset(kv ? fai_kv_row(pr, r, b, h, i) : fai_q_row(pr, r, b, h, i), 0, bytes);
}

void fai_zero_bias_grad(const fai_problem *pr)
{
    const fa_tensor *g = pr->bias_grad;
    const size_t row = (size_t)g->headdim * fai_dtype_size(g->dtype);
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t h = 0; h < g->heads; h++)
            for (int64_t i = 0; i < g->seqlen; i++)
                memset(fai_bias_row_of(g, b, h, i), 0, row);
}

void fai_write_empty(const fai_problem *pr, int backward)
{
    if (backward) { /* no (query, key) pair: every gradient is 0 */
        zero_rows(pr, FAI_DQ, pr->hq, pr->sq, pr->dqk);
        zero_rows(pr, FAI_DK, pr->hk, pr->sk, pr->dqk);
        zero_rows(pr, FAI_DV, pr->hk, pr->sk, pr->dv);
        if (pr->bias_grad)
            fai_zero_bias_grad(pr);
        return;
    }
    zero_rows(pr, FAI_OUT, pr->hq, pr->sq, pr->dv); /* no key: O = 0, LSE = the sink's */
    if (fai_io(pr, FAI_LSE) && pr->sq > 0)
        for (int64_t b = 0; b < pr->b; b++)
            for (int64_t h = 0; h < pr->hq; h++)
                for (int64_t i = 0; i < pr->sq; i++)
                    fai_lse_write(pr, b, h, i, fai_sink(pr, h));
}

void fai_append_new_keys(const fai_problem *pr)
{
    const size_t es = fai_dtype_size(pr->kv_dtype);
    for (int64_t g = 0; g < pr->nseq; g++) {
        const fai_problem s = fai_group(pr, g);
        const int64_t at = s.sk - pr->s_new; /* the sequence's length before */
        for (int64_t n = 0; n < pr->s_new; n++)
            for (int64_t h = 0; h < pr->hk; h++) {
                memcpy(fai_kv_row(&s, FAI_K, 0, h, at + n), fai_new_key_row(pr, FAI_K, g, h, n),
                       (size_t)pr->dqk * es);
                memcpy(fai_kv_row(&s, FAI_V, 0, h, at + n), fai_new_key_row(pr, FAI_V, g, h, n),
                       (size_t)pr->dv * es);
            }
    }
}

/* What run_groups calls: each group's need and run (fai_run_groups), or the whole call's, with
 * the backend's arg (fai_run_call). */
typedef struct {
    fai_need_fn need;
    fai_run_fn run;
    fai_call_need_fn call_need;
    fai_call_run_fn call_run;
    const void *arg;
} runner;

static fa_status run_groups(fa_context *ctx, const fai_problem *pr, int backward,
                            const char *who, const runner *r)
{
    const int whole = r->call_need != NULL;
    const int64_t n = fai_groups(pr);
    fai_need most = {0, 0};
    int any = 0;
    for (int64_t g = 0; g < n; g++) {
        const fai_problem s = fai_group(pr, g);
        any |= !fai_group_empty(&s);
        if (whole || fai_group_empty(&s))
            continue;
        fai_need one = {0, 0};
        FAI_TRY(r->need(ctx, &s, &one));
        most.per = one.per > most.per ? one.per : most.per;
        most.shared = one.shared > most.shared ? one.shared : most.shared;
    }
    if (whole && any)
        FAI_TRY(r->call_need(ctx, pr, r->arg, &most));
    fai_scratch sc = {NULL, most.per, NULL};
    size_t bytes = 0;
    if (any) {
        FAI_TRY(fai_thread_scratch(&ctx->mem, who, &sc.per, ctx->num_threads, &sc.base, &bytes));
        if (most.shared && !(sc.shared = fai_alloc(&ctx->mem, most.shared))) {
            fai_free(&ctx->mem, sc.base, bytes);
            return fai_fail(FA_ERR_NO_MEMORY, "%s: %zu bytes of shared workspace", who,
                            most.shared);
        }
    }
    if (pr->k_new) /* allocated: nothing can fail from here on */
        fai_append_new_keys(pr);
    for (int64_t g = 0; g < n; g++) {
        const fai_problem s = fai_group(pr, g);
        if (fai_group_empty(&s))
            fai_write_empty(&s, backward);
        else if (!whole)
            r->run(ctx, &s, &sc);
    }
    if (whole && any)
        r->call_run(ctx, pr, r->arg, &sc);
    fai_free(&ctx->mem, sc.shared, most.shared);
    fai_free(&ctx->mem, sc.base, bytes);
    return FA_OK;
}

fa_status fai_run_groups(fa_context *ctx, const fai_problem *pr, int backward, const char *who,
                         fai_need_fn need, fai_run_fn run)
{
    const runner r = {.need = need, .run = run};
    return run_groups(ctx, pr, backward, who, &r);
}

fa_status fai_run_call(fa_context *ctx, const fai_problem *call, int backward, const char *who,
                       const void *arg, fai_call_need_fn need, fai_call_run_fn run)
{
    const runner r = {.call_need = need, .call_run = run, .arg = arg};
    return run_groups(ctx, call, backward, who, &r);
}
