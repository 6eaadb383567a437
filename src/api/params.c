/*
 * fa_params: its defaults (fa_params_init), the checks of its fields (the scalars and enums,
 * the ALiBi slopes and sink logits, the bias tensor and its gradient, the FP8 descale
 * factors, what only a dense call takes) and what they make of the problem: its mask, score
 * pipeline, dropout stream, sinks, descales and bias (fai_problem_params). Every check names
 * the field; nothing here writes an output.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "api/api.h"

void fa_params_init(fa_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->scale = 0;
    p->window_left = -1;
    p->window_right = -1;
    p->align = FA_ALIGN_BOTTOM_RIGHT;
}

static fa_status check_params(const fa_params *p, int64_t hq)
{
    if (!p)
        return fai_fail(FA_ERR_NULL_POINTER, "params is NULL");
    if (!(p->scale >= 0) || isinf(p->scale))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->scale = %g; it must be finite and >= 0 (0: 1/sqrt(Dqk))",
                        p->scale);
    if (p->window_left < -1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->window_left = %lld; it must be >= -1 (-1: unbounded)",
                        (long long)p->window_left);
    if (p->window_right < -1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->window_right = %lld; it must be >= -1 (-1: unbounded)",
                        (long long)p->window_right);
    if (p->sink_tokens < 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->sink_tokens = %lld; it must be >= 0 (0: none)",
                        (long long)p->sink_tokens);
    if (p->causal && p->window_right > 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->window_right = %lld with causal set; causal means "
                        "window_right = 0",
                        (long long)p->window_right);
    if (p->align != FA_ALIGN_BOTTOM_RIGHT && p->align != FA_ALIGN_TOP_LEFT)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->align = %d is not a fa_align",
                        (int)p->align);
    if (p->score_order != FA_SOFTCAP_THEN_ALIBI && p->score_order != FA_ALIBI_THEN_SOFTCAP)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->score_order = %d is not a fa_score_order",
                        (int)p->score_order);
    if (!(p->softcap >= 0) || isinf(p->softcap))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->softcap = %g; it must be finite and >= 0 (0: off)", p->softcap);
    if (!(p->dropout_p >= 0 && p->dropout_p < 1))
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->dropout_p = %g is outside [0, 1)",
                        p->dropout_p);
    if (p->alibi_slopes)
        for (int64_t h = 0; h < hq; h++)
            if (!isfinite(p->alibi_slopes[h]))
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->alibi_slopes[%lld] = %g is not finite", (long long)h,
                                (double)p->alibi_slopes[h]);
    if (p->sink_logits)
        for (int64_t h = 0; h < hq; h++)
            if (isnan(p->sink_logits[h]) || p->sink_logits[h] == INFINITY)
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->sink_logits[%lld] = %g; a sink is finite or -inf "
                                "(no sink)", (long long)h, (double)p->sink_logits[h]);
    return FA_OK;
}

/*
 * The bias tensor and its gradient (fa_params.bias, bias_grad) against the problem's dims:
 * batch B or 1, seqlen Sq or 1, heads Hq or 1, headdim Sk; the gradient in the bias's shape,
 * f32 or f64, and only for an additive bias.
 */
static fa_status check_bias(const fa_params *p, const fai_problem *pr)
{
    if (p->bias_place != FA_BIAS_AFTER_SCALE && p->bias_place != FA_BIAS_AFTER_SOFTCAP)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->bias_place = %d is not a fa_bias_place",
                        (int)p->bias_place);
    const fa_tensor *t = p->bias;
    if (!t) {
        if (p->bias_by_slope)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->bias_by_slope is set but params->bias is NULL (the slopes "
                            "would scale no bias)");
        if (p->bias_grad)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->bias_grad is set but params->bias is NULL (no bias has a "
                            "gradient)");
        return FA_OK;
    }
    FAI_TRY(fai_check_tensor(t, "params->bias", FAI_INPUT, FAI_TENSOR_BIAS));
    if (fai_dtype_is_fp8(t->dtype))
        return fai_fail(FA_ERR_DTYPE, "params->bias->dtype = %s; a bias is f32, f16, bf16 or f64, "
                                      "a keep-mask bool", fa_dtype_name(t->dtype));
    const struct {
        const char *dim, *ref;
        int64_t got, want;
    } d[4] = {{"batch", "q->batch", t->batch, pr->b},
              {"seqlen", "q->seqlen", t->seqlen, pr->sq},
              {"heads", "q->heads", t->heads, pr->hq},
              {"headdim", "k->seqlen (the keys)", t->headdim, pr->sk}};
    for (int i = 0; i < 4; i++)
        if (d[i].got != d[i].want && (i == 3 || d[i].got != 1))
            return fai_fail(FA_ERR_SHAPE,
                            "params->bias->%s = %lld; it must be %s = %lld%s", d[i].dim,
                            (long long)d[i].got, d[i].ref, (long long)d[i].want,
                            i == 3 ? "" : " or 1 (broadcast)");
    if (p->bias_by_slope && !p->alibi_slopes)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->bias_by_slope is set but params->alibi_slopes is NULL (no slope "
                        "to scale the bias)");
    fa_tensor *g = p->bias_grad;
    if (!g)
        return FA_OK;
    if (t->dtype == FA_BOOL)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->bias_grad is set but params->bias is a keep-mask (bool): a mask "
                        "has no gradient");
    FAI_TRY(fai_check_tensor(g, "params->bias_grad", FAI_OUTPUT, FAI_TENSOR_BIAS));
    FAI_TRY(fai_check_shape(g, "params->bias_grad", t->batch, t->seqlen, t->heads, t->headdim,
                            "params->bias"));
    if (g->dtype != FA_F32 && g->dtype != FA_F64)
        return fai_fail(FA_ERR_DTYPE, "params->bias_grad->dtype = %s; a bias gradient is f32 or "
                                      "f64", fa_dtype_name(g->dtype));
    return FA_OK;
}

fa_status fai_refuse_dense_only(const fai_problem *pr, const fa_params *p, const char *op)
{
    if (p->block_mask)
        return fai_fail(FA_ERR_UNSUPPORTED,
                        "params->block_mask with %s: a block mask is one of a dense call; calls "
                        "of sequences do not take one", op);
    if (pr->bias)
        return fai_fail(FA_ERR_UNSUPPORTED,
                        "params->bias with %s: a bias tensor is (B, Sq, H, Sk) of a dense call; "
                        "calls of sequences do not take one", op);
    if (pr->descale_per_head)
        return fai_fail(FA_ERR_UNSUPPORTED,
                        "params->descale_layout = FA_DESCALE_PER_KV_HEAD with %s: descale "
                        "factors per (batch, kv head) are a dense call's; a call of sequences "
                        "takes them per tensor", op);
    return FA_OK;
}

/* The FP8 descale factors: each for an FP8 tensor only, one float or B x Hk (the layout), every
 * one finite and > 0. */
static fa_status check_descales(const fa_params *p, const fai_problem *pr)
{
    if (p->descale_layout != FA_DESCALE_PER_TENSOR && p->descale_layout != FA_DESCALE_PER_KV_HEAD)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->descale_layout = %d is not a fa_descale_layout",
                        (int)p->descale_layout);
    const float *const d[3] = {p->descale_q, p->descale_k, p->descale_v};
    const char *const name[3] = {"descale_q", "descale_k", "descale_v"};
    const fa_dtype dt[3] = {pr->q_dtype, pr->k_dtype, pr->v_dtype};
    const int64_t n = p->descale_layout == FA_DESCALE_PER_KV_HEAD ? pr->b * pr->hk : 1;
    for (int x = 0; x < 3; x++) {
        if (!d[x])
            continue;
        if (!fai_dtype_is_fp8(dt[x]))
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->%s is set but %c->dtype = %s; descale factors are for FP8 "
                            "tensors", name[x], "qkv"[x], fa_dtype_name(dt[x]));
        for (int64_t i = 0; i < n; i++)
            if (!(d[x][i] > 0) || isinf(d[x][i]))
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->%s[%lld] = %g; a descale factor is finite and > 0",
                                name[x], (long long)i, (double)d[x][i]);
    }
    return FA_OK;
}

fa_status fai_problem_params(fai_problem *pr, const fa_params *p)
{
    FAI_TRY(check_params(p, pr->hq));
    pr->mask_spec = (fai_mask_spec){.causal = p->causal != 0,
                                    .top_left = p->align == FA_ALIGN_TOP_LEFT,
                                    .left = p->window_left,
                                    .right = p->window_right,
                                    .sink_tokens = p->sink_tokens};
    pr->mask = fai_mask_make(pr->sq, pr->sk, pr->mask_spec.causal, pr->mask_spec.left,
                             pr->mask_spec.right, pr->mask_spec.top_left,
                             pr->mask_spec.sink_tokens);
    pr->score.scale = p->scale > 0 ? p->scale : 1.0 / sqrt((double)pr->dqk);
    pr->score.softcap = p->softcap;
    pr->score.off = pr->mask.off;
    pr->score.alibi_first = p->score_order == FA_ALIBI_THEN_SOFTCAP;
    pr->slopes = p->alibi_slopes;
    pr->sinks = p->sink_logits;
    pr->drop.seed = p->dropout_seed;
    pr->drop.offset = p->dropout_offset;
    pr->drop.threshold = fai_dropout_threshold(p->dropout_p);
    pr->keep_scale = fai_dropout_keep_scale(p->dropout_p);
    FAI_TRY(check_bias(p, pr));
    FAI_TRY(check_descales(p, pr));
    pr->descale_q = p->descale_q;
    pr->descale_k = p->descale_k;
    pr->descale_v = p->descale_v;
    pr->descale_per_head = p->descale_layout == FA_DESCALE_PER_KV_HEAD;
    if (p->bias) {
        pr->bias = p->bias;
        pr->score.bias = p->bias_place == FA_BIAS_AFTER_SOFTCAP ? FAI_BIAS_AFTER_CAP
                                                                : FAI_BIAS_BEFORE_CAP;
        pr->score.bias_by_slope = p->bias_by_slope != 0;
    }
    return FA_OK;
}

fa_status fai_problem_place(fai_problem *pr, const fai_place *pl)
{
    if (pl->sq < 0 || pl->sq > FAI_DIM_MAX || pl->sk < 0 || pl->sk > FAI_DIM_MAX)
        return fai_fail(FA_ERR_SHAPE, "a placed call's sequence is %lld x %lld; lengths are in "
                                      "[0, 2^40]", (long long)pl->sq, (long long)pl->sk);
    if (pl->q_pos < 0 || pl->q_pos > pl->sq - pr->sq || pl->k_pos < 0 ||
        pl->k_pos > pl->sk - pr->sk)
        return fai_fail(FA_ERR_SHAPE, "a placed call's rows [%lld, %lld) and keys [%lld, %lld) "
                                      "are not inside its sequence of %lld x %lld",
                        (long long)pl->q_pos, (long long)(pl->q_pos + pr->sq),
                        (long long)pl->k_pos, (long long)(pl->k_pos + pr->sk),
                        (long long)pl->sq, (long long)pl->sk);
    if (pr->nseq > 0)
        return fai_fail(FA_ERR_UNSUPPORTED, "a placed call is a dense call");
    const fai_mask_spec *m = &pr->mask_spec;
    /* the global mask's offset, seen from this call's row 0 and key 0: a global row q_pos + i
     * and key k_pos + j are allowed iff k_pos + j <= q_pos + i + off_g + R (and the left bound
     * alike), that is j <= i + (off_g + q_pos - k_pos) + R */
    const int64_t off = (m->top_left ? 0 : pl->sk - pl->sq) + pl->q_pos - pl->k_pos;
    /* the global sinks k < n are this call's keys j < n - k_pos */
    pr->mask = fai_mask_at(pr->sq, pr->sk, off, m->causal, m->left, m->right,
                           m->sink_tokens - pl->k_pos);
    pr->score.off = off;
    pr->drop.row0 = pl->q_pos;
    pr->drop.col0 = pl->k_pos;
    return FA_OK;
}
