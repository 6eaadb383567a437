/*
 * Convention profiles: what the kernel families' interfaces mean where they disagree, so that
 * an oracle compares like with like (README.md, "Convention profiles", gives each fact's
 * source), and fa_profile_apply, what they make of the options a caller leaves to them. The
 * `flashattn` command and the Python package read and apply them from here.
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "api/api.h"

static const fa_profile profiles[] = {
    /* name     align       base2 empty LSE         count order            lse  bias enters
     *                                                      by slope, empty O, descale layout */
    {"flashattn", FA_ALIGN_BOTTOM_RIGHT, 0, FA_EMPTY_LSE_NEG_INF, 0, FA_SOFTCAP_THEN_ALIBI, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ZERO, FA_DESCALE_PER_TENSOR},
    {"fa2", FA_ALIGN_BOTTOM_RIGHT, 0, FA_EMPTY_LSE_POS_INF, 0, FA_SOFTCAP_THEN_ALIBI, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ZERO, FA_DESCALE_PER_TENSOR},
    {"fa3", FA_ALIGN_BOTTOM_RIGHT, 0, FA_EMPTY_LSE_NEG_INF, 0, FA_SOFTCAP_THEN_ALIBI, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ZERO, FA_DESCALE_PER_KV_HEAD},
    {"pytorch", FA_ALIGN_TOP_LEFT, 0, FA_EMPTY_LSE_ANY, 0, FA_SOFTCAP_THEN_ALIBI, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ANY, FA_DESCALE_PER_TENSOR},
    {"flashinfer", FA_ALIGN_BOTTOM_RIGHT, 1, FA_EMPTY_LSE_ANY, 0, FA_ALIBI_THEN_SOFTCAP, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ZERO, FA_DESCALE_PER_TENSOR},
    {"xformers", FA_ALIGN_TOP_LEFT, 0, FA_EMPTY_LSE_ANY, 1, FA_SOFTCAP_THEN_ALIBI, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ANY, FA_DESCALE_PER_TENSOR},
    {"ggml", FA_ALIGN_BOTTOM_RIGHT, 0, FA_EMPTY_LSE_ANY, 1, FA_SOFTCAP_THEN_ALIBI, 0,
     FA_BIAS_AFTER_SOFTCAP, 1, FA_EMPTY_OUT_ANY, FA_DESCALE_PER_TENSOR},
    /* FlexAttention: masks are mask_mods (q_idx >= kv_idx: top-left), score_mod sees the scaled
     * score, a row its BlockMask masks whole gives O = 0 and LSE -inf */
    {"flex", FA_ALIGN_TOP_LEFT, 0, FA_EMPTY_LSE_NEG_INF, 0, FA_SOFTCAP_THEN_ALIBI, 1,
     FA_BIAS_AFTER_SCALE, 0, FA_EMPTY_OUT_ZERO, FA_DESCALE_PER_TENSOR},
};
#define NPROFILES ((int)(sizeof profiles / sizeof *profiles))

const fa_profile *fa_profile_at(int i)
{
    return i >= 0 && i < NPROFILES ? &profiles[i] : NULL;
}

const fa_profile *fa_profile_find(const char *name)
{
    for (int i = 0; name && i < NPROFILES; i++)
        if (!strcmp(profiles[i].name, name))
            return &profiles[i];
    return NULL;
}

fa_status fa_profile_apply(const fa_profile *pf, fa_params *p, const int64_t *window,
                           unsigned given)
{
    if (!pf)
        return fai_fail(FA_ERR_NULL_POINTER, "profile is NULL");
    if (!p)
        return fai_fail(FA_ERR_NULL_POINTER, "params is NULL");
    if (window && pf->window_is_count && *window < 1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "window = %lld: profile %s counts keys, the query's own included: "
                        "expected W >= 1",
                        (long long)*window, pf->name);
    if (!(given & FA_GIVEN_ALIGN))
        p->align = pf->align;
    if (!(given & FA_GIVEN_SCORE_ORDER))
        p->score_order = pf->score_order;
    if (!(given & FA_GIVEN_BIAS_PLACE))
        p->bias_place = pf->bias_place;
    if (!(given & FA_GIVEN_BIAS_BY_SLOPE)) /* ggml's slopes scale its mask: where both are */
        p->bias_by_slope = pf->bias_by_slope && p->alibi_slopes && p->bias;
    if (window) {
        p->window_left = pf->window_is_count ? *window - 1 : *window;
        p->window_right = pf->window_is_count ? 0 : -1;
    }
    return FA_OK;
}

#define LOG2E 1.4426950408889634 /* log2 sum 2^(s log2 e) = ln sum e^s / ln 2 */

/* One LSE value from the library's convention to the profile's (to = 1) or back. */
static double lse_map(const fa_profile *pf, double v, int to)
{
    if (to && v == -INFINITY)
        return pf->empty_lse == FA_EMPTY_LSE_POS_INF ? INFINITY : -INFINITY;
    if (!to && v == INFINITY && pf->empty_lse == FA_EMPTY_LSE_POS_INF)
        return -INFINITY;
    return pf->lse_base2 ? (to ? v * LOG2E : v / LOG2E) : v;
}

static fa_status lse_convert(const fa_profile *pf, fa_tensor *lse, int to)
{
    if (!pf)
        return fai_fail(FA_ERR_NULL_POINTER, "profile is NULL");
    FAI_TRY(fai_check_tensor(lse, "lse", FAI_OUTPUT, 1));
    for (int64_t b = 0; b < lse->batch; b++)
        for (int64_t h = 0; h < lse->heads; h++)
            for (int64_t i = 0; i < lse->seqlen; i++)
                fai_lse_store(lse, b, h, i, lse_map(pf, fai_lse_load(lse, b, h, i), to));
    return FA_OK;
}

fa_status fa_lse_to_profile(const fa_profile *pf, fa_tensor *lse) { return lse_convert(pf, lse, 1); }

fa_status fa_lse_from_profile(const fa_profile *pf, fa_tensor *lse)
{
    return lse_convert(pf, lse, 0);
}

fa_status fa_lse_rule(const fa_profile *pf, fa_dtype storage, fa_dtype lse_dtype, int fp8_inputs,
                      fa_dtype *yardstick, fa_tolerance *tol)
{
    if (!yardstick || !tol)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_lse_rule: %s is NULL",
                        !yardstick ? "yardstick" : "tol");
    if ((unsigned)storage > FA_BF16 || (unsigned)lse_dtype > FA_BF16)
        return fai_fail(FA_ERR_DTYPE, "fa_lse_rule: %s is not a fa_dtype",
                        (unsigned)storage > FA_BF16 ? "storage" : "lse_dtype");
    const int half = storage == FA_F16 || storage == FA_BF16;
    const int wide = lse_dtype == FA_F32 || lse_dtype == FA_F64;
    const int own = half && wide && !fp8_inputs; /* judged in f32 */
    *yardstick = own ? FA_F32 : storage;
    tol->allowance = own ? FA_LSE16_ALLOWANCE * (pf && pf->lse_base2 ? LOG2E : 1) : 0;
    tol->allowance_rel = own ? FA_LSE16_ALLOWANCE_REL : 0;
    return FA_OK;
}
