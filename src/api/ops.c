/*
 * The ops: fa_forward and fa_backward check every argument (arguments.c), choose the backend,
 * answer what docs/DESIGN.md §1 defines without computing (empty problems), and hand the
 * backend a validated problem (a backend without the op answers FA_ERR_UNSUPPORTED through
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

/* Head h's LSE for a row without keys: its sink (-inf without one). */
static double empty_row_lse(const fai_problem *pr, int64_t h) { return fai_sink(pr, h); }

/*
 * params->sink_grad[h] = sum over b, i of core's fai_dsink_term (core/gradient.h), formed in
 * float64 from the out, lse and dout the caller passed (those the tiled backward reads; the
 * oracle's exact ones where the caller gives the reference's own), b and i in order: one
 * answer for every backend and thread count. Host tensors only (a device backend's call with
 * sink_grad is refused before it runs).
 */
static void sink_gradient(const fa_context *ctx, const fai_problem *pr, float *grad)
{
    enum { PIECE = 64 };
#pragma omp parallel for num_threads(ctx->num_threads) schedule(dynamic, 1)
    for (int64_t h = 0; h < pr->hq; h++) { /* each head's sum on one thread, in order */
        double o[PIECE], g[PIECE];
        const double s = fai_sink(pr, h);
        double sum = 0;
        for (int64_t b = 0; b < pr->b && s != -INFINITY; b++)
            for (int64_t i = 0; i < pr->sq; i++) {
                double di = 0;
                const size_t es = fai_dtype_size(pr->dtype);
                const char *orow = fai_q_row(pr, FAI_OUT, b, h, i);
                const char *grow = fai_q_row(pr, FAI_DOUT, b, h, i);
                for (int64_t d0 = 0; d0 < pr->dv; d0 += PIECE) {
                    const int64_t m = pr->dv - d0 < PIECE ? pr->dv - d0 : PIECE;
                    fai_load_f64(orow + (size_t)d0 * es, pr->dtype, m, o);
                    fai_load_f64(grow + (size_t)d0 * es, pr->dtype, m, g);
                    for (int64_t d = 0; d < m; d++)
                        di += o[d] * g[d];
                }
                sum += fai_dsink_term_f64(s, fai_lse_read(pr, b, h, i), di);
            }
        grad[h] = (float)sum;
    }
}

/* ------------------------------------------------------------------ the ops */

/* Zeroes the rows of t (used where docs/DESIGN.md §1 defines the result without computing
 * anything). */
static void zero_tensor(const fa_tensor *t)
{
    if (t->seqlen == 0) /* no element; the batch alone may be 2^40: no loop over it */
        return;
    size_t es = fai_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                memset(fai_row(t, b, s, h), 0, (size_t)t->headdim * es);
}

fa_status fa_forward(fa_context *ctx, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, fa_tensor *out, fa_tensor *lse)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(fai_problem_make(&pr, p, q, k, v));
    FAI_TRY(fai_check_operand(out, "out", FAI_OUTPUT, q->dtype, pr.b, pr.sq, pr.hq, pr.dv,
                              "q (headdim: v)"));
    if (lse) {
        FAI_TRY(fai_check_tensor(lse, "lse", FAI_OUTPUT, 1));
        FAI_TRY(fai_check_shape(lse, "lse", pr.b, pr.sq, pr.hq, 1, "q"));
    }
    {
        const fa_tensor slopes = fai_slopes_view(p, pr.hq), sinks = fai_sinks_view(p, pr.hq);
        const fa_tensor *outs[2] = {out, lse}, *ins[5] = {q, k, v, &slopes, &sinks};
        const char *on[2] = {"out", "lse"};
        const char *in[5] = {"q", "k", "v", "params->alibi_slopes", "params->sink_logits"};
        FAI_TRY(fai_check_outputs_disjoint(outs, on, lse ? 2 : 1, ins, in, 5));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    if (pr.b == 0 || pr.sq == 0)
        return FA_OK;
    const fai_backend *be = backend_for(ctx, q);
    fai_op_fn run;
    FAI_TRY(fai_backend_op(be, FAI_OP_FORWARD, "forward", &run));
    if (pr.sk == 0 && !be->device_memory) { /* no row has a key: O = 0, LSE = the sink's */
        zero_tensor(out);
        if (lse)
            for (int64_t b = 0; b < pr.b; b++)
                for (int64_t h = 0; h < pr.hq; h++)
                    for (int64_t i = 0; i < pr.sq; i++)
                        fai_lse_store(lse, b, h, i, empty_row_lse(&pr, h));
        return FA_OK;
    }
    return run(ctx, &pr);
}

fa_status fa_backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq, fa_tensor *dk,
                      fa_tensor *dv)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(fai_problem_make(&pr, p, q, k, v));
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
        const fa_tensor *outs[4] = {dq, dk, dv, &sgrad};
        const fa_tensor *ins[8] = {q, k, v, out, lse, dout, &slopes, &sinks};
        const char *on[4] = {"dq", "dk", "dv", "params->sink_grad"};
        const char *in[8] = {"q",    "k",    "v",        "out", "lse", "dout", "params->alibi_slopes",
                             "params->sink_logits"};
        FAI_TRY(fai_check_outputs_disjoint(outs, on, p->sink_grad ? 4 : 3, ins, in, 8));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    pr.io[FAI_DOUT] = dout;
    pr.io[FAI_DQ] = dq;
    pr.io[FAI_DK] = dk;
    pr.io[FAI_DV] = dv;
    const fai_backend *be = backend_for(ctx, q);
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
        zero_tensor(dq);
        zero_tensor(dk);
        zero_tensor(dv);
        if (p->sink_grad) /* O = 0 (or no row): D_i = 0 */
            memset(p->sink_grad, 0, (size_t)pr.hq * sizeof(float));
        return FA_OK;
    }
    FAI_TRY(run(ctx, &pr));
    if (p->sink_grad)
        sink_gradient(ctx, &pr, p->sink_grad);
    return FA_OK;
}
