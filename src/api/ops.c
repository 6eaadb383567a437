/*
 * The ops: fa_forward and fa_backward, their variable-length forms, the paged and cache
 * forwards and fa_append_kv check every argument (api.h's checks), choose the backend, and
 * hand it a validated problem (a backend without the op answers FA_ERR_UNSUPPORTED through
 * fai_backend_op, backends/registry.c), but for a call with no row to write, which
 * backends/empty.h answers without one.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "api/api.h"
#include "backends/empty.h"
#include "backends/groups.h"
#include "backends/rows.h"
#include "backends/table.h"
#include "core/gradient.h"

/* The backend of a call: the context's, but AUTO runs a call whose q is a device backend's
 * memory on that backend (the table's holds: never in a build without CUDA). */
static const fai_backend *backend_for(const fa_context *ctx, const fa_tensor *q)
{
    const fai_backend *device = ctx->backend_auto ? fai_backend_holding(q->data) : NULL;
    return device ? device : fai_backend_of(ctx->backend);
}

/* ------------------------------------------------------------------ attention sinks */

double fai_sink_row_term(const void *orow, const void *grow, fa_dtype dtype, int64_t dv,
                         double sink, double lse)
{
    enum { PIECE = 64 };
    double o[PIECE], g[PIECE], di = 0;
    const size_t es = fai_dtype_size(dtype);
    for (int64_t d0 = 0; d0 < dv; d0 += PIECE) {
        const int64_t m = dv - d0 < PIECE ? dv - d0 : PIECE;
        fai_load_f64((const char *)orow + (size_t)d0 * es, dtype, m, o);
        fai_load_f64((const char *)grow + (size_t)d0 * es, dtype, m, g);
        for (int64_t d = 0; d < m; d++)
            di += o[d] * g[d];
    }
    return fai_dsink_term_f64(sink, lse, di);
}

/*
 * params->sink_grad[h] = sum over the rows of every batch and sequence of core's
 * fai_dsink_term (core/gradient.h), formed in float64 from the out, lse and dout the caller
 * passed (those the tiled backward reads; the oracle's exact ones where the caller gives the
 * reference's own), rows in order: one answer for every host backend and thread count. A
 * device backend forms it itself (the CUDA one: the same terms, in double, on the device).
 */
static void sink_gradient(const fa_context *ctx, const fai_problem *pr, float *grad)
{
#pragma omp parallel for num_threads(ctx->num_threads) schedule(dynamic, 1)
    for (int64_t h = 0; h < pr->hq; h++) { /* each head's sum on one thread, in order */
        const double s = fai_sink(pr, h);
        double sum = 0;
        for (int64_t grp = 0; grp < fai_groups(pr) && s != -INFINITY; grp++) {
            const fai_problem sp = fai_group(pr, grp);
            for (int64_t b = 0; b < sp.b; b++)
                for (int64_t i = 0; i < sp.sq; i++)
                    sum += fai_sink_row_term(fai_q_row(&sp, FAI_OUT, b, h, i),
                                             fai_q_row(&sp, FAI_DOUT, b, h, i), sp.dtype, sp.dv,
                                             s, fai_lse_read(&sp, b, h, i));
        }
        grad[h] = (float)sum;
    }
}

/* ------------------------------------------------------------------ the ops */

/* The backend of the call, which must take a call of sequences if it is one. */
static fa_status call_backend(const fa_context *ctx, const fai_problem *pr, const fa_tensor *q,
                              const fai_place *place, const fai_backend **be)
{
    *be = backend_for(ctx, q);
    if (pr->nseq > 0 && !(*be)->sequences)
        return fai_fail(FA_ERR_UNSUPPORTED, "backend %s: calls of sequences (variable-length "
                                            "batches, paged K/V) are not implemented (the CPU "
                                            "backends take them)", (*be)->name);
    if (place && (*be)->device_memory) /* its kernels draw dropout words at the call's keys */
        return fai_fail(FA_ERR_UNSUPPORTED, "backend %s: context parallelism runs on the host "
                                            "backends", (*be)->name);
    return FA_OK;
}

/* Runs op on the call through its backend; but a call with no row to write (fai_empty_of:
 * FAI_EMPTY_NO_ROW) asks no backend, and gets on the host what it writes (fai_write_empty:
 * a backward's bias gradient 0; a device backend's memory is left alone). A call without a
 * (query, key) pair does go to its backend, which writes its results: through fai_run_groups
 * or fai_run_call (fai_write_empty) on the host, by its own kernels on a device. */
static fa_status run_op(fa_context *ctx, const fai_backend *be, fai_op op, const char *what,
                        const fai_problem *pr, fai_empty empty)
{
    if (empty == FAI_EMPTY_NO_ROW) {
        if (!be->device_memory)
            fai_write_empty(pr, op == FAI_OP_BACKWARD);
        return FA_OK;
    }
    fai_op_fn run;
    FAI_TRY(fai_backend_op(be, op, what, &run));
    return run(ctx, pr);
}

/* What a call's shape is beyond dense tensors: a variable-length batch's offsets, a paged
 * K/V's table, or a cache's used lengths and new keys (a forward's; one kind at most). */
typedef struct {
    int varlen;
    const fa_indices *cu_q, *cu_k;
    const fa_paged_kv *pages;
    int cache; /* fa_forward_kvcache: pages, or a contiguous cache with cache_seqlens */
    const fa_indices *cache_seqlens;
    const fa_tensor *k_new, *v_new;
    const fai_place *place; /* a placed call's (dense), or NULL */
    int check_only;         /* a dry run: the checks alone */
} call_shape;

enum { NINDEX = 5 };
/* The index arrays of a call as tensors, for the aliasing check, put after the n inputs of ins
 * and names: cu_q, cu_k, the block table, the used lengths, the cache's lengths (empty where
 * the call has none); v holds them. Returns the inputs' new count. */
static int add_index_views(const call_shape *sh, fa_tensor v[NINDEX], const fa_tensor **ins,
                           const char **names, int n)
{
    const fa_indices none = {NULL, FA_INDEX_INT32, 0};
    const fa_indices *x[NINDEX] = {sh->varlen ? sh->cu_q : &none, sh->varlen ? sh->cu_k : &none,
                                   sh->pages ? &sh->pages->block_table : &none,
                                   sh->pages ? &sh->pages->seqused_k : &none,
                                   sh->cache_seqlens ? sh->cache_seqlens : &none};
    static const char *const nm[NINDEX] = {"cu_seqlens_q", "cu_seqlens_k", "pages->block_table",
                                          "pages->seqused_k", "cache_seqlens"};
    for (int i = 0; i < NINDEX; i++) {
        v[i] = fai_indices_view(x[i]);
        ins[n + i] = &v[i];
        names[n + i] = nm[i];
    }
    return n + NINDEX;
}

/* The K/V side of a call beyond dense tensors: a cache's new keys, then its pages (with the
 * pages the new keys go to) or its used lengths. */
static fa_status kv_layout(fa_context *ctx, fai_problem *pr, const call_shape *sh,
                           const fa_tensor *k, const fa_tensor *v)
{
    if (sh->cache)
        FAI_TRY(fai_problem_new_keys(pr, sh->k_new, sh->v_new, k, v));
    if (sh->pages) {
        FAI_TRY(fai_problem_pages(pr, sh->pages, k, pr->s_new));
        return fai_check_written_pages(ctx, pr);
    }
    return sh->cache ? fai_problem_cache(pr, sh->cache_seqlens, k, pr->s_new) : FA_OK;
}

/* fa_forward, fa_forward_varlen (offsets checked by fai_problem_sequences), fa_forward_paged
 * (pages by fai_problem_pages) and fa_forward_kvcache (a cache: its new keys by
 * fai_problem_new_keys, then its pages or used lengths). */
static fa_status forward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                         const fa_tensor *k, const fa_tensor *v, const call_shape *sh,
                         fa_tensor *out, fa_tensor *lse)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(fai_problem_make(&pr, p, q, k, v, sh->pages != NULL));
    if (sh->place)
        FAI_TRY(fai_problem_place(&pr, sh->place));
    if (sh->varlen || sh->pages || sh->cache)
        FAI_TRY(fai_refuse_dense_only(&pr, p, sh->varlen  ? "fa_forward_varlen"
                                                  : sh->cache ? "fa_forward_kvcache"
                                                              : "fa_forward_paged"));
    if (sh->varlen)
        FAI_TRY(fai_problem_sequences(&pr, sh->cu_q, sh->cu_k));
    FAI_TRY(kv_layout(ctx, &pr, sh, k, v));
    if (fai_dtype_is_fp8(q->dtype)) { /* out in a wider dtype, its own */
        FAI_TRY(fai_check_tensor(out, "out", FAI_OUTPUT, FAI_TENSOR_VALUES));
        if (fai_dtype_is_fp8(out->dtype) || fai_dtype_is_block(out->dtype))
            return fai_fail(FA_ERR_DTYPE, "out->dtype = %s with q->dtype = %s; the output of "
                                          "FP8 inputs is f32, f16, bf16 or f64",
                            fa_dtype_name(out->dtype), fa_dtype_name(q->dtype));
        pr.dtype = out->dtype;
    }
    FAI_TRY(fai_check_operand(out, "out", FAI_OUTPUT, pr.dtype, pr.b, pr.sq, pr.hq, pr.dv,
                              "q (headdim: v)"));
    if (lse) {
        FAI_TRY(fai_check_tensor(lse, "lse", FAI_OUTPUT, FAI_TENSOR_LSE));
        FAI_TRY(fai_check_shape(lse, "lse", pr.b, pr.sq, pr.hq, 1, "q"));
    }
    {
        /* outputs: out, lse, and a cache that is appended to; every other tensor an input */
        const fa_tensor slopes = fai_slopes_view(p, pr.hq), sinks = fai_sinks_view(p, pr.hq);
        fa_tensor ix[NINDEX];
        const char *in[8 + NINDEX] = {"q", "params->alibi_slopes", "params->sink_logits",
                                      "params->bias"},
                   *on[4] = {"out"};
        const fa_tensor *ins[8 + NINDEX] = {q, &slopes, &sinks, p->bias}, *outs[4] = {out};
        int ni = p->bias ? 4 : 3, no = 1;
        if (lse)
            outs[no] = lse, on[no++] = "lse";
        const fa_tensor *const kv[4] = {k, v, pr.k_new, pr.v_new};
        const char *const kvn[4] = {"k", "v", "k_new", "v_new"};
        for (int x = 0; x < 4; x++) {
            if (x < 2 && pr.k_new)
                outs[no] = kv[x], on[no++] = kvn[x];
            else if (kv[x])
                ins[ni] = kv[x], in[ni++] = kvn[x];
        }
        ni = add_index_views(sh, ix, ins, in, ni);
        FAI_TRY(fai_check_outputs_disjoint(outs, on, no, ins, in, ni));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    const fai_backend *be;
    FAI_TRY(call_backend(ctx, &pr, q, sh->place, &be));
    fai_block_map blocks; /* checked before anything is written, even where nothing is */
    size_t map_bytes;
    FAI_TRY(fai_problem_blocks(ctx, &pr, p->block_mask, &blocks, &map_bytes));
    const fa_status st =
        sh->check_only ? FA_OK
                       : run_op(ctx, be, FAI_OP_FORWARD, "forward", &pr, fai_empty_of(&pr, 0));
    fai_free(&ctx->mem, (void *)blocks.listed, map_bytes);
    return st;
}

fa_status fa_forward(fa_context *ctx, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, fa_tensor *out, fa_tensor *lse)
{
    const call_shape dense = {0};
    return forward(ctx, p, q, k, v, &dense, out, lse);
}

fa_status fa_forward_varlen(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                            const fa_tensor *k, const fa_tensor *v, const fa_indices *cu_seqlens_q,
                            const fa_indices *cu_seqlens_k, fa_tensor *out, fa_tensor *lse)
{
    const call_shape varlen = {.varlen = 1, .cu_q = cu_seqlens_q, .cu_k = cu_seqlens_k};
    return forward(ctx, p, q, k, v, &varlen, out, lse);
}

fa_status fa_forward_paged(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, const fa_paged_kv *pages,
                           fa_tensor *out, fa_tensor *lse)
{
    const call_shape paged = {.pages = pages};
    if (!pages) /* (forward() tells a paged call by its pages) */
        return fai_fail(FA_ERR_NULL_POINTER, "pages is NULL");
    return forward(ctx, p, q, k, v, &paged, out, lse);
}

/* A cache's lengths come once: cache_seqlens for a contiguous one, pages->seqused_k for pages. */
static fa_status cache_lengths_once(const fa_indices *cache_seqlens, const fa_paged_kv *pages)
{
    if (pages && cache_seqlens)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "cache_seqlens and pages are both given; a "
                                                 "paged cache's lengths are pages->seqused_k");
    if (!pages && !cache_seqlens)
        return fai_fail(FA_ERR_NULL_POINTER, "cache_seqlens is NULL (a contiguous cache needs "
                                             "its lengths)");
    return FA_OK;
}

fa_status fa_forward_kvcache(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                             fa_tensor *k_cache, fa_tensor *v_cache, const fa_tensor *k_new,
                             const fa_tensor *v_new, const fa_indices *cache_seqlens,
                             const fa_paged_kv *pages, fa_tensor *out, fa_tensor *lse)
{
    FAI_TRY(cache_lengths_once(cache_seqlens, pages));
    const call_shape cache = {.pages = pages, .cache = 1, .cache_seqlens = cache_seqlens,
                              .k_new = k_new, .v_new = v_new};
    return forward(ctx, p, q, k_cache, v_cache, &cache, out, lse);
}

fa_status fa_append_kv(fa_context *ctx, const fa_tensor *k_new, const fa_tensor *v_new,
                       fa_tensor *k_cache, fa_tensor *v_cache, const fa_indices *cache_seqlens,
                       const fa_paged_kv *pages)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    if (!k_new || !v_new)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", k_new ? "v_new" : "k_new");
    FAI_TRY(cache_lengths_once(cache_seqlens, pages));
    const call_shape sh = {.pages = pages, .cache = 1, .cache_seqlens = cache_seqlens,
                           .k_new = k_new, .v_new = v_new};
    fai_problem pr;
    FAI_TRY(fai_problem_for_cache(&pr, k_new, k_cache, v_cache, pages != NULL));
    FAI_TRY(kv_layout(ctx, &pr, &sh, k_cache, v_cache));
    fa_tensor ix[NINDEX];
    const char *in[2 + NINDEX] = {"k_new", "v_new"}, *on[2] = {"k", "v"};
    const fa_tensor *ins[2 + NINDEX] = {k_new, v_new}, *outs[2] = {k_cache, v_cache};
    const int ni = add_index_views(&sh, ix, ins, in, 2);
    FAI_TRY(fai_check_outputs_disjoint(outs, on, 2, ins, in, ni));
    const fai_backend *be = backend_for(ctx, k_new);
    if (be->device_memory) { /* the device's copy (it checks the pointers) */
        fai_op_fn run;
        FAI_TRY(fai_backend_op(be, FAI_OP_APPEND, "append", &run));
        return run(ctx, &pr);
    }
    const fa_tensor *host[4] = {k_new, v_new, k_cache, v_cache};
    const char *hn[4] = {"k_new", "v_new", "k", "v"};
    for (int x = 0; x < 4; x++) { /* copied here, on the host */
        const fai_backend *holder = fai_backend_holding(host[x]->data);
        if (holder)
            return fai_fail(FA_ERR_UNSUPPORTED, "%s->data is device memory but the context's "
                                                "backend is %s, a host one (the %s backend "
                                                "appends to its device's cache)",
                            hn[x], be->name, holder->name);
    }
    fai_append_new_keys(&pr);
    return FA_OK;
}

static fa_status backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                          const fa_tensor *k, const fa_tensor *v, int varlen,
                          const fa_indices *cu_q, const fa_indices *cu_k,
                          const fai_place *place, int check_only, const fa_tensor *out,
                          const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                          fa_tensor *dk, fa_tensor *dv)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(fai_problem_make(&pr, p, q, k, v, 0));
    if (place)
        FAI_TRY(fai_problem_place(&pr, place));
    if (varlen) {
        FAI_TRY(fai_refuse_dense_only(&pr, p, "fa_backward_varlen"));
        FAI_TRY(fai_problem_sequences(&pr, cu_q, cu_k));
    }
    if (pr.k_dtype != pr.dtype || pr.v_dtype != pr.dtype)
        return fai_fail(FA_ERR_UNSUPPORTED, "%s->dtype = %s under q->dtype = %s: a cache dtype "
                                            "apart from q's is forward only",
                        pr.k_dtype != pr.dtype ? "k" : "v",
                        fa_dtype_name(pr.k_dtype != pr.dtype ? pr.k_dtype : pr.v_dtype),
                        fa_dtype_name(pr.dtype));
    if (fai_dtype_is_fp8(pr.q_dtype))
        return fai_fail(FA_ERR_UNSUPPORTED, "q->dtype = %s: FP8 inputs are forward only (as "
                                            "FlashAttention-3's FP8 path)",
                        fa_dtype_name(pr.q_dtype));
    FAI_TRY(fai_check_operand(out, "out", FAI_INPUT, q->dtype, pr.b, pr.sq, pr.hq, pr.dv,
                              "q (headdim: v)"));
    FAI_TRY(fai_check_tensor(lse, "lse", FAI_INPUT, FAI_TENSOR_LSE));
    FAI_TRY(fai_check_shape(lse, "lse", pr.b, pr.sq, pr.hq, 1, "q"));
    if (q->dtype == FA_F64 && lse->dtype != FA_F64) /* P = exp(s - LSE) is only as exact as LSE */
        return fai_fail(FA_ERR_DTYPE, "lse->dtype = %s with f64 storage; the backward needs an "
                                      "f64 LSE to keep f64 accuracy", fa_dtype_name(lse->dtype));
    FAI_TRY(fai_check_operand(dout, "dout", FAI_INPUT, q->dtype, pr.b, pr.sq, pr.hq, pr.dv,
                              "out"));
    FAI_TRY(fai_check_tensor(dq, "dq", FAI_OUTPUT, 0));
    FAI_TRY(fai_check_tensor(dk, "dk", FAI_OUTPUT, 0));
    FAI_TRY(fai_check_tensor(dv, "dv", FAI_OUTPUT, 0));
    FAI_TRY(fai_check_dtype(dq, "dq", q->dtype));
    FAI_TRY(fai_check_dtype(dk, "dk", q->dtype));
    FAI_TRY(fai_check_dtype(dv, "dv", q->dtype));
    FAI_TRY(fai_check_shape(dq, "dq", pr.b, pr.sq, pr.hq, pr.dqk, "q"));
    FAI_TRY(fai_check_shape(dk, "dk", pr.b, pr.sk, pr.hk, pr.dqk, "k"));
    FAI_TRY(fai_check_shape(dv, "dv", pr.b, pr.sk, pr.hk, pr.dv, "v"));
    if (p->sink_grad && !p->sink_logits)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->sink_grad is set but params->sink_logits is NULL (no sink has a "
                        "gradient)");
    {
        const fa_tensor slopes = fai_slopes_view(p, pr.hq), sinks = fai_sinks_view(p, pr.hq);
        const fa_tensor sgrad = fai_sink_grad_view(p, pr.hq);
        fa_tensor ix[NINDEX];
        const call_shape sh = {.varlen = varlen, .cu_q = cu_q, .cu_k = cu_k};
        const fa_tensor *outs[5] = {dq, dk, dv};
        const fa_tensor *ins[9 + NINDEX] = {q, k, v, out, lse, dout, &slopes, &sinks};
        const char *on[5] = {"dq", "dk", "dv"};
        const char *in[9 + NINDEX] = {"q",   "k",   "v",    "out", "lse", "dout",
                                      "params->alibi_slopes", "params->sink_logits"};
        int no = 3, ni = 8;
        if (p->sink_grad)
            outs[no] = &sgrad, on[no++] = "params->sink_grad";
        if (p->bias_grad)
            outs[no] = p->bias_grad, on[no++] = "params->bias_grad";
        if (p->bias)
            ins[ni] = p->bias, in[ni++] = "params->bias";
        ni = add_index_views(&sh, ix, ins, in, ni);
        FAI_TRY(fai_check_outputs_disjoint(outs, on, no, ins, in, ni));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    pr.io[FAI_DOUT] = dout;
    pr.io[FAI_DQ] = dq;
    pr.io[FAI_DK] = dk;
    pr.io[FAI_DV] = dv;
    pr.bias_grad = p->bias_grad;
    const fai_backend *be;
    FAI_TRY(call_backend(ctx, &pr, q, place, &be));
    if (place && !check_only && !be->backward_reads_lse &&
        (place->k_pos != 0 || place->sk != pr.sk))
        return fai_fail(FA_ERR_UNSUPPORTED, "backend %s: its backward recomputes the softmax "
                                            "over the call's keys, so a placed call over some of "
                                            "the keys does not get the whole row's (context "
                                            "parallelism's backward runs on the tiled backend)",
                        be->name);
    if (be->device_memory) /* it forms the sink gradient where out, lse and dout are */
        pr.sink_grad = p->sink_grad;
    fai_block_map blocks; /* checked before anything is written, even where nothing is */
    size_t map_bytes;
    FAI_TRY(fai_problem_blocks(ctx, &pr, p->block_mask, &blocks, &map_bytes));
    const fai_empty empty = fai_empty_of(&pr, 1);
    if (check_only) {
        fai_free(&ctx->mem, (void *)blocks.listed, map_bytes);
        return FA_OK;
    }
    const fa_status st = run_op(ctx, be, FAI_OP_BACKWARD, "backward", &pr, empty);
    /* the sink gradient (host memory), the device backend's own where it ran */
    if (st == FA_OK && p->sink_grad && (!be->device_memory || empty == FAI_EMPTY_NO_ROW)) {
        if (empty == FAI_NOT_EMPTY)
            sink_gradient(ctx, &pr, p->sink_grad);
        else /* a sum over no (query, key) pair: O = 0 (or no row), D_i = 0 */
            memset(p->sink_grad, 0, (size_t)pr.hq * sizeof(float));
    }
    fai_free(&ctx->mem, (void *)blocks.listed, map_bytes);
    return st;
}

fa_status fa_backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq, fa_tensor *dk,
                      fa_tensor *dv)
{
    return backward(ctx, p, q, k, v, 0, NULL, NULL, NULL, 0, out, lse, dout, dq, dk, dv);
}

fa_status fa_backward_varlen(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v,
                             const fa_indices *cu_seqlens_q, const fa_indices *cu_seqlens_k,
                             const fa_tensor *out, const fa_tensor *lse, const fa_tensor *dout,
                             fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    return backward(ctx, p, q, k, v, 1, cu_seqlens_q, cu_seqlens_k, NULL, 0, out, lse, dout, dq,
                    dk, dv);
}

fa_status fai_forward_placed(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v, const fai_place *pl,
                             fa_tensor *out, fa_tensor *lse, int check_only)
{
    const call_shape placed = {.place = pl, .check_only = check_only};
    return forward(ctx, p, q, k, v, &placed, out, lse);
}

fa_status fai_backward_placed(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                              const fa_tensor *k, const fa_tensor *v, const fai_place *pl,
                              const fa_tensor *out, const fa_tensor *lse, const fa_tensor *dout,
                              fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, int check_only)
{
    return backward(ctx, p, q, k, v, 0, NULL, NULL, pl, check_only, out, lse, dout, dq, dk, dv);
}
