/*
 * The ops: fa_forward and fa_backward (and their variable-length forms) check every argument
 * (arguments.c), choose the backend, answer what docs/DESIGN.md §1 defines without computing
 * (empty problems), and hand the backend a validated problem (a backend without the op answers FA_ERR_UNSUPPORTED through
 * fai_backend_op, backends/registry.c).
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "api/api.h"
#include "core/gradient.h"

/* The backend of a call: the context's, but AUTO runs a call on CUDA when its q is device
 * memory (never in a build without CUDA). */
static const fai_backend *backend_for(const fa_context *ctx, const fa_tensor *q)
{
    if (ctx->backend_auto && fai_cuda_is_device_pointer(q->data))
        return &fai_backend_cuda;
    return fai_backend_of(ctx->backend);
}

/* ------------------------------------------------------------------ attention sinks */

/*
 * params->sink_grad[h] = sum over the rows of every batch and sequence of core's
 * fai_dsink_term (core/gradient.h), formed in float64 from the out, lse and dout the caller
 * passed (those the tiled backward reads; the oracle's exact ones where the caller gives the
 * reference's own), rows in order: one answer for every backend and thread count. Host
 * tensors only (a device backend's call with sink_grad is refused before it runs).
 */
static void sink_gradient(const fa_context *ctx, const fai_problem *pr, float *grad)
{
    enum { PIECE = 64 };
#pragma omp parallel for num_threads(ctx->num_threads) schedule(dynamic, 1)
    for (int64_t h = 0; h < pr->hq; h++) { /* each head's sum on one thread, in order */
        double o[PIECE], g[PIECE];
        const double s = fai_sink(pr, h);
        double sum = 0;
        for (int64_t grp = 0; grp < fai_groups(pr) && s != -INFINITY; grp++) {
            const fai_problem sp = fai_group(pr, grp);
            for (int64_t b = 0; b < sp.b; b++)
                for (int64_t i = 0; i < sp.sq; i++) {
                    double di = 0;
                    const size_t es = fai_dtype_size(sp.dtype);
                    const char *orow = fai_q_row(&sp, FAI_OUT, b, h, i);
                    const char *grow = fai_q_row(&sp, FAI_DOUT, b, h, i);
                    for (int64_t d0 = 0; d0 < sp.dv; d0 += PIECE) {
                        const int64_t m = sp.dv - d0 < PIECE ? sp.dv - d0 : PIECE;
                        fai_load_f64(orow + (size_t)d0 * es, sp.dtype, m, o);
                        fai_load_f64(grow + (size_t)d0 * es, sp.dtype, m, g);
                        for (int64_t d = 0; d < m; d++)
                            di += o[d] * g[d];
                    }
                    sum += fai_dsink_term_f64(s, fai_lse_read(&sp, b, h, i), di);
                }
        }
        grad[h] = (float)sum;
    }
}

/* ------------------------------------------------------------------ the ops */

/* The backend of the call, which must take a call of sequences if it is one. */
static fa_status call_backend(const fa_context *ctx, const fai_problem *pr, const fa_tensor *q,
                              const fai_backend **be)
{
    *be = backend_for(ctx, q);
    if (pr->nseq > 0 && !(*be)->sequences)
        return fai_fail(FA_ERR_UNSUPPORTED, "backend %s: calls of sequences (variable-length "
                                            "batches, paged K/V) are not implemented (the CPU "
                                            "backends take them)", (*be)->name);
    return FA_OK;
}

/* What a call's shape is beyond dense tensors: a variable-length batch's offsets, or a paged
 * K/V's table (a forward's; at most one of them). */
typedef struct {
    int varlen;
    const fa_indices *cu_q, *cu_k;
    const fa_paged_kv *pages;
} call_shape;

/* The index arrays of a call as tensors, for the aliasing check: cu_q, cu_k, the block table
 * and the used lengths (empty where the call has none). */
static void index_views(const call_shape *sh, fa_tensor v[4])
{
    const fa_indices none = {NULL, FA_INDEX_INT32, 0};
    const fa_indices *x[4] = {sh->varlen ? sh->cu_q : &none, sh->varlen ? sh->cu_k : &none,
                              sh->pages ? &sh->pages->block_table : &none,
                              sh->pages ? &sh->pages->seqused_k : &none};
    for (int i = 0; i < 4; i++)
        v[i] = fai_indices_view(x[i]);
}

/* fa_forward, fa_forward_varlen (offsets checked by fai_problem_sequences) and
 * fa_forward_paged (pages by fai_problem_pages). */
static fa_status forward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                         const fa_tensor *k, const fa_tensor *v, const call_shape *sh,
                         fa_tensor *out, fa_tensor *lse)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(fai_problem_make(&pr, p, q, k, v, sh->pages != NULL));
    if (sh->varlen)
        FAI_TRY(fai_problem_sequences(&pr, sh->cu_q, sh->cu_k));
    if (sh->pages)
        FAI_TRY(fai_problem_pages(&pr, sh->pages, k));
    FAI_TRY(fai_check_operand(out, "out", FAI_OUTPUT, q->dtype, pr.b, pr.sq, pr.hq, pr.dv,
                              "q (headdim: v)"));
    if (lse) {
        FAI_TRY(fai_check_tensor(lse, "lse", FAI_OUTPUT, 1));
        FAI_TRY(fai_check_shape(lse, "lse", pr.b, pr.sq, pr.hq, 1, "q"));
    }
    {
        const fa_tensor slopes = fai_slopes_view(p, pr.hq), sinks = fai_sinks_view(p, pr.hq);
        fa_tensor ix[4];
        index_views(sh, ix);
        const fa_tensor *outs[2] = {out, lse},
                        *ins[9] = {q, k, v, &slopes, &sinks, &ix[0], &ix[1], &ix[2], &ix[3]};
        const char *on[2] = {"out", "lse"};
        const char *in[9] = {"q", "k", "v", "params->alibi_slopes", "params->sink_logits",
                             "cu_seqlens_q", "cu_seqlens_k", "pages->block_table",
                             "pages->seqused_k"};
        FAI_TRY(fai_check_outputs_disjoint(outs, on, lse ? 2 : 1, ins, in, 9));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    const fai_backend *be;
    FAI_TRY(call_backend(ctx, &pr, q, &be));
    if (pr.b == 0 || pr.sq == 0)
        return FA_OK;
    fai_op_fn run;
    FAI_TRY(fai_backend_op(be, FAI_OP_FORWARD, "forward", &run));
    if (pr.sk == 0 && !be->device_memory) { /* no row has a key */
        fai_write_empty(&pr, 0);
        return FA_OK;
    }
    return run(ctx, &pr);
}

fa_status fa_forward(fa_context *ctx, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, fa_tensor *out, fa_tensor *lse)
{
    const call_shape dense = {0, NULL, NULL, NULL};
    return forward(ctx, p, q, k, v, &dense, out, lse);
}

fa_status fa_forward_varlen(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                            const fa_tensor *k, const fa_tensor *v, const fa_indices *cu_seqlens_q,
                            const fa_indices *cu_seqlens_k, fa_tensor *out, fa_tensor *lse)
{
    const call_shape varlen = {1, cu_seqlens_q, cu_seqlens_k, NULL};
    return forward(ctx, p, q, k, v, &varlen, out, lse);
}

fa_status fa_forward_paged(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, const fa_paged_kv *pages,
                           fa_tensor *out, fa_tensor *lse)
{
    const call_shape paged = {0, NULL, NULL, pages};
    if (!pages) /* (forward() tells a paged call by its pages) */
        return fai_fail(FA_ERR_NULL_POINTER, "pages is NULL");
    return forward(ctx, p, q, k, v, &paged, out, lse);
}

static fa_status backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                          const fa_tensor *k, const fa_tensor *v, int varlen,
                          const fa_indices *cu_q, const fa_indices *cu_k, const fa_tensor *out,
                          const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                          fa_tensor *dk, fa_tensor *dv)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(fai_problem_make(&pr, p, q, k, v, 0));
    if (varlen)
        FAI_TRY(fai_problem_sequences(&pr, cu_q, cu_k));
    if (pr.kv_dtype != pr.dtype)
        return fai_fail(FA_ERR_UNSUPPORTED, "k->dtype = %s under q->dtype = %s: a cache dtype "
                                            "apart from q's is forward only",
                        fa_dtype_name(pr.kv_dtype), fa_dtype_name(pr.dtype));
    FAI_TRY(fai_check_operand(out, "out", FAI_INPUT, q->dtype, pr.b, pr.sq, pr.hq, pr.dv,
                              "q (headdim: v)"));
    FAI_TRY(fai_check_tensor(lse, "lse", FAI_INPUT, 1));
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
        fa_tensor ix[4];
        const call_shape sh = {varlen, cu_q, cu_k, NULL};
        index_views(&sh, ix);
        const fa_tensor cq = ix[0], ck = ix[1];
        const fa_tensor *outs[4] = {dq, dk, dv, &sgrad};
        const fa_tensor *ins[10] = {q, k, v, out, lse, dout, &slopes, &sinks, &cq, &ck};
        const char *on[4] = {"dq", "dk", "dv", "params->sink_grad"};
        const char *in[10] = {"q",   "k",    "v",    "out", "lse", "dout", "params->alibi_slopes",
                              "params->sink_logits", "cu_seqlens_q", "cu_seqlens_k"};
        FAI_TRY(fai_check_outputs_disjoint(outs, on, p->sink_grad ? 4 : 3, ins, in, 10));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    pr.io[FAI_DOUT] = dout;
    pr.io[FAI_DQ] = dq;
    pr.io[FAI_DK] = dk;
    pr.io[FAI_DV] = dv;
    const fai_backend *be;
    FAI_TRY(call_backend(ctx, &pr, q, &be));
    if (p->sink_grad && be->device_memory) /* sink_gradient reads out, lse, dout on the host */
        return fai_fail(FA_ERR_UNSUPPORTED, "backend %s: params->sink_grad is not implemented "
                                            "for device tensors yet", be->name);
    if (pr.b == 0) {
        if (p->sink_grad) /* a sum over no rows */
            memset(p->sink_grad, 0, (size_t)pr.hq * sizeof(float));
        return FA_OK;
    }
    fai_op_fn run;
    FAI_TRY(fai_backend_op(be, FAI_OP_BACKWARD, "backward", &run));
    if ((pr.sq == 0 || pr.sk == 0) && !be->device_memory) { /* no (query, key) pair: every
                                                               gradient is 0 */
        fai_write_empty(&pr, 1);
        if (p->sink_grad) /* O = 0 (or no row): D_i = 0 */
            memset(p->sink_grad, 0, (size_t)pr.hq * sizeof(float));
        return FA_OK;
    }
    FAI_TRY(run(ctx, &pr));
    if (p->sink_grad)
        sink_gradient(ctx, &pr, p->sink_grad);
    return FA_OK;
}

fa_status fa_backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq, fa_tensor *dk,
                      fa_tensor *dv)
{
    return backward(ctx, p, q, k, v, 0, NULL, NULL, out, lse, dout, dq, dk, dv);
}

fa_status fa_backward_varlen(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v,
                             const fa_indices *cu_seqlens_q, const fa_indices *cu_seqlens_k,
                             const fa_tensor *out, const fa_tensor *lse, const fa_tensor *dout,
                             fa_tensor *dq, fa_tensor *dk, fa_tensor *dv)
{
    return backward(ctx, p, q, k, v, 1, cu_seqlens_q, cu_seqlens_k, out, lse, dout, dq, dk, dv);
}
