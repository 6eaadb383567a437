/*
 * The ops: fa_forward and fa_backward check every argument (arguments.c), choose the backend,
 * answer what docs/DESIGN.md §1 defines without computing (empty problems), and hand the
 * backend a validated problem (a backend without the op answers FA_ERR_UNSUPPORTED through
 * fai_backend_op, backends/registry.c).
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "api/api.h"

/* The backend of a call: the context's, but AUTO runs a call on CUDA when its q is device
 * memory (never in a build without CUDA). */
static const fai_backend *backend_for(const fa_context *ctx, const fa_tensor *q)
{
    if (ctx->backend_auto && fai_cuda_is_device_pointer(q->data))
        return &fai_backend_cuda;
    return fai_backend_of(ctx->backend);
}

/* ------------------------------------------------------------------ the ops */

/* Zeroes the rows of t (used where docs/DESIGN.md §1 defines the result without computing
 * anything). */
static void zero_tensor(const fa_tensor *t)
{
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
        const fa_tensor slopes = fai_slopes_view(p, pr.hq);
        const fa_tensor *outs[2] = {out, lse}, *ins[4] = {q, k, v, &slopes};
        const char *on[2] = {"out", "lse"}, *in[4] = {"q", "k", "v", "params->alibi_slopes"};
        FAI_TRY(fai_check_outputs_disjoint(outs, on, lse ? 2 : 1, ins, in, 4));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    if (pr.b == 0 || pr.sq == 0)
        return FA_OK;
    const fai_backend *be = backend_for(ctx, q);
    fai_op_fn run;
    FAI_TRY(fai_backend_op(be, FAI_OP_FORWARD, "forward", &run));
    if (pr.sk == 0 && !be->device_memory) { /* every row is empty: O = 0, LSE = -inf */
        zero_tensor(out);
        if (lse)
            for (int64_t b = 0; b < pr.b; b++)
                for (int64_t h = 0; h < pr.hq; h++)
                    for (int64_t i = 0; i < pr.sq; i++)
                        fai_lse_store(lse, b, h, i, -INFINITY);
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
    {
        const fa_tensor slopes = fai_slopes_view(p, pr.hq);
        const fa_tensor *outs[3] = {dq, dk, dv}, *ins[7] = {q, k, v, out, lse, dout, &slopes};
        const char *on[3] = {"dq", "dk", "dv"};
        const char *in[7] = {"q", "k", "v", "out", "lse", "dout", "params->alibi_slopes"};
        FAI_TRY(fai_check_outputs_disjoint(outs, on, 3, ins, in, 7));
    }
    pr.io[FAI_OUT] = out;
    pr.io[FAI_LSE] = lse;
    pr.io[FAI_DOUT] = dout;
    pr.io[FAI_DQ] = dq;
    pr.io[FAI_DK] = dk;
    pr.io[FAI_DV] = dv;
    if (pr.b == 0)
        return FA_OK;
    const fai_backend *be = backend_for(ctx, q);
    fai_op_fn run;
    FAI_TRY(fai_backend_op(be, FAI_OP_BACKWARD, "backward", &run));
    if ((pr.sq == 0 || pr.sk == 0) && !be->device_memory) { /* no (query, key) pair: every
                                                               gradient is 0 */
        zero_tensor(dq);
        zero_tensor(dk);
        zero_tensor(dv);
        return FA_OK;
    }
    return run(ctx, &pr);
}
