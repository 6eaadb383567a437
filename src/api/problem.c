/*
 * The validated problem a backend receives (backends/problem.h), made from q, k, v and
 * fa_params: the tensors' checks in order, then the problem's dims, dtypes and tensors, then
 * what fa_params makes of it (api/params.c). The ops add the rest (api/ops.c: outputs, calls
 * of sequences, the block mask).
 */
#include "config.h"

#include <string.h>

#include "api/api.h"

/* k and v share a dtype: q's, or an f16 / bf16 / FP8 cache under f32 or bf16 q (a forward's;
 * the ops that cannot take it say so); FP8 q takes k and v of its own format. A block-format
 * cache (q8_0, q4_0) goes under f32, f16 or bf16 q, k and v each of either format. */
static fa_status check_kv_dtypes(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v)
{
    if (fai_dtype_is_block(q->dtype))
        return fai_fail(FA_ERR_DTYPE, "q->dtype = %s; a block format is a K/V cache's only",
                        fa_dtype_name(q->dtype));
    if (fai_dtype_is_block(k->dtype) || fai_dtype_is_block(v->dtype)) {
        if (!fai_dtype_is_block(k->dtype) || !fai_dtype_is_block(v->dtype))
            return fai_fail(FA_ERR_DTYPE, "k->dtype = %s but v->dtype = %s; a block-format "
                                          "cache has both k and v in block formats",
                            fa_dtype_name(k->dtype), fa_dtype_name(v->dtype));
        if (q->dtype != FA_F32 && q->dtype != FA_F16 && q->dtype != FA_BF16)
            return fai_fail(FA_ERR_DTYPE, "k->dtype = %s under q->dtype = %s; a block-format "
                                          "cache goes under f32, f16 or bf16 q",
                            fa_dtype_name(k->dtype), fa_dtype_name(q->dtype));
        return FA_OK;
    }
    if (v->dtype != k->dtype)
        return fai_fail(FA_ERR_DTYPE, "v->dtype = %s but k->dtype = %s; k and v share one "
                                      "storage dtype", fa_dtype_name(v->dtype),
                        fa_dtype_name(k->dtype));
    if (k->dtype == q->dtype)
        return FA_OK;
    const int cache = k->dtype == FA_F16 || k->dtype == FA_BF16 || fai_dtype_is_fp8(k->dtype);
    if (cache && (q->dtype == FA_F32 || q->dtype == FA_BF16))
        return FA_OK;
    return fai_fail(FA_ERR_DTYPE, "k->dtype = %s but q->dtype = %s; k and v take q's dtype, or "
                                  "f16 / bf16 / e4m3 / e5m2 under f32 or bf16 q",
                    fa_dtype_name(k->dtype), fa_dtype_name(q->dtype));
}

fa_status fai_problem_make(fai_problem *pr, const fa_params *p, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, int paged)
{
    FAI_TRY(fai_check_tensor(q, "q", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(k, "k", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(v, "v", FAI_INPUT, 0));
    FAI_TRY(check_kv_dtypes(q, k, v));
    if (!paged) /* pages: k's batch is the number of pages */
        FAI_TRY(fai_expect_dim("k", "batch", k->batch, "q->batch", q->batch));
    FAI_TRY(fai_expect_dim("k", "headdim", k->headdim, "q->headdim", q->headdim));
    FAI_TRY(fai_check_shape(v, "v", k->batch, k->seqlen, k->heads, -1, "k"));
    if (q->heads % k->heads != 0)
        return fai_fail(FA_ERR_SHAPE,
                        "q->heads = %lld is not a multiple of k->heads = %lld (GQA groups must "
                        "be whole)", (long long)q->heads, (long long)k->heads);

    memset(pr, 0, sizeof *pr);
    pr->b = q->batch;
    pr->hq = q->heads;
    pr->hk = k->heads;
    pr->group = q->heads / k->heads;
    pr->sq = q->seqlen;
    pr->sk = k->seqlen;
    pr->dqk = q->headdim;
    pr->dv = v->headdim;
    pr->dtype = q->dtype; /* FP8 q: the op sets out's */
    pr->q_dtype = q->dtype;
    pr->k_dtype = k->dtype;
    pr->v_dtype = v->dtype;
    pr->io[FAI_Q] = q;
    pr->io[FAI_K] = k;
    pr->io[FAI_V] = v;
    return fai_problem_params(pr, p);
}
