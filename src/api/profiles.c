/*
 * Convention profiles: what the kernel families' interfaces mean where they disagree, so that
 * an oracle compares like with like (README.md, "Convention profiles", gives each fact's
 * source). The `flashattn` command and the Python package read them from here.
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
