/*
 * Running an op over the groups of a call (backends/groups.h): a dense problem is one group,
 * a call of sequences (variable-length, paged, a cache) one per sequence. The groups share one
 * allocation made before anything is written (fai_run_groups: sized for the largest group,
 * which are run one by one; fai_run_call: sized by the backend for the whole call, run at
 * once); then the new keys of a cache are appended, and groups without a (query, key) pair get
 * their defined results (backends/empty.h), on the host, for every host backend alike.
 */
#include "config.h"

#include <string.h>

#include "backends/context.h"
#include "backends/empty.h"
#include "backends/groups.h"
#include "backends/rows.h"

/* A new key's row of dim elements into the cache: copied, or (f32, f16 or bf16 into a block
 * format) quantized, a piece of whole blocks at a time (core/quant.h; the values were checked
 * finite with the call's arguments). */
static void append_row(void *dst, fa_dtype dd, const void *src, fa_dtype sd, int64_t dim)
{
    if (sd == dd) {
        memcpy(dst, src, (size_t)fai_dtype_bytes(dd, dim));
        return;
    }
    float piece[256];
    for (int64_t e = 0; e < dim; e += 256) {
        const int64_t n = dim - e < 256 ? dim - e : 256;
        fai_load_f32((const char *)src + fai_dtype_bytes(sd, e), sd, n, piece);
        fai_store_f32((char *)dst + fai_dtype_bytes(dd, e), dd, n, piece);
    }
}

void fai_append_new_keys(const fai_problem *pr)
{
    for (int64_t g = 0; g < pr->nseq; g++) {
        const fai_problem s = fai_group(pr, g);
        const int64_t at = s.sk - pr->s_new; /* the sequence's length before */
        for (int64_t n = 0; n < pr->s_new; n++)
            for (int64_t h = 0; h < pr->hk; h++) {
                append_row(fai_kv_row(&s, FAI_K, 0, h, at + n), pr->k_dtype,
                           fai_new_key_row(pr, FAI_K, g, h, n), pr->k_new->dtype, pr->dqk);
                append_row(fai_kv_row(&s, FAI_V, 0, h, at + n), pr->v_dtype,
                           fai_new_key_row(pr, FAI_V, g, h, n), pr->v_new->dtype, pr->dv);
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
        const int empty = fai_empty_of(&s, backward) != FAI_NOT_EMPTY;
        any |= !empty;
        if (whole || empty)
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
        if (fai_empty_of(&s, backward) != FAI_NOT_EMPTY)
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
