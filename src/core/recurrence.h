/*
 * The online-softmax recurrence (the article's §4.2), written once for every backend.
 *
 * State of one query row after absorbing some key blocks B_1 .. B_t (allowed keys only):
 *
 *     m   = max_{j seen} s_j                     (-inf while nothing has been seen)
 *     l   = sum_{j seen} exp(s_j - m)
 *     acc = sum_{j seen} keep_j exp(s_j - m) v_j  (keep_j in {0, 1}: the dropout decision)
 *
 * Invariant (I): l and acc are the exact row sums *relative to the reference m*.
 *
 * Absorbing a block B whose allowed scores have maximum b:
 *
 *     m'  = max(m, b)
 *     a   = exp(m - m')                    -- 0 <= a <= 1: 0 on a row's first block (m = -inf),
 *                                              1 iff m' == m
 *     l'  = a l   + sum_{j in B} exp(s_j - m')
 *     acc'= a acc + sum_{j in B} keep_j exp(s_j - m') v_j
 *
 * (I) holds again, since exp(s_j - m) * exp(m - m') = exp(s_j - m') for every old j: the rescale
 * changes the reference, not the function. Every term exp(s - m') is <= 1 because m' bounds all
 * seen scores, so nothing overflows however large the logits are. Finally
 *
 *     LSE = m + ln l,      O = acc / (l (1 - p))
 *
 * which is ln sum exp(s_j) and sum_j keep_j P_j v_j / (1 - p): docs/DESIGN.md §1's steps 5-7.
 *
 * Edge cases, each stated so no backend has to rediscover it:
 *  - A block with no allowed key, or whose allowed scores are all -inf, has b = -inf. If m is
 *    also -inf, m' - m would be -inf - (-inf) = NaN: the block is skipped instead
 *    (fai_online_move returns 0 and leaves the state alone). Skipping is exact: such a block
 *    contributes exp(-inf) = 0 to every sum.
 *  - A row that never absorbs a finite score ends with l = 0: it is an empty row, O = 0,
 *    LSE = -inf (fai_online_finalize).
 *  - NaN scores are not filtered: the caller's block max b is NaN if any allowed score is, a
 *    NaN b becomes m' here, and l, acc, LSE and O of the row are NaN (docs/DESIGN.md §1).
 *  - +inf scores give m' = +inf and exp(inf - inf) = NaN: the row is NaN, as in the reference.
 */
#ifndef FAI_CORE_RECURRENCE_H
#define FAI_CORE_RECURRENCE_H

#include <math.h>
#include "fmath.h"
#include "log2e.h" /* FAI_LOG2E, FAI_LOG2E_F, FAI_LN2: the base-2 form below */

/*
 * Moves the reference of a row from *m to max(*m, b). Returns 0 if the block is to be skipped
 * (no finite score in it nor before it); otherwise returns 1 and sets *x to the exponent of
 * the rescale: the old l and acc are to be multiplied by a = exp(*x), which is 0 when the row
 * had seen nothing yet (x = -inf). Split from the exp so that a tile's rows can take their
 * factors from one vector exp.
 */
FA_HOST_DEVICE static inline int fai_online_move_f32(float *m, float b, float *x)
{
    float m_new = fai_nanmax_f32(*m, b);
    if (m_new == -INFINITY)
        return 0;
    *x = *m - m_new;
    *m = m_new;
    return 1;
}

FA_HOST_DEVICE static inline int fai_online_move_f64(double *m, double b, double *x)
{
    double m_new = fai_nanmax_f64(*m, b);
    if (m_new == -INFINITY)
        return 0;
    *x = *m - m_new;
    *m = m_new;
    return 1;
}

/* Both steps for one row: *a = exp(x) of fai_online_move. */
FA_HOST_DEVICE static inline int fai_online_rescale_f32(float *m, float b, float *a)
{
    float x;
    if (!fai_online_move_f32(m, b, &x))
        return 0;
    *a = fai_expf(x);
    return 1;
}

FA_HOST_DEVICE static inline int fai_online_rescale_f64(double *m, double b, double *a)
{
    double x;
    if (!fai_online_move_f64(m, b, &x))
        return 0;
    *a = fai_exp(x);
    return 1;
}

/*
 * l' = a l + s: a row's sum rescaled to its new reference and the block's sum s of
 * exp(s_j - m') added. The two types round it differently, and keep doing so: f32 lets the
 * compiler fuse the product into the sum (one rounding where the base instruction set has FMA,
 * as AArch64's does), f64 rounds the product apart (two roundings, forced by the volatile).
 * That is what the tiled loop nest did for each type before it was written once for both, and
 * a restructuring must change no bit (docs/DESIGN.md §4); either rounding is well inside the
 * error analysis above.
 */
FA_HOST_DEVICE static inline float fai_online_sum_f32(float l, float a, float s)
{
    return l * a + s;
}

FA_HOST_DEVICE static inline double fai_online_sum_f64(double l, double a, double s)
{
    volatile double la = l * a;
    return la + s;
}

/*
 * Split-KV: two unfinished states of a row over disjoint key sets, (m, l, acc) and
 * (m2, l2, acc2), as one over their union. Relative to m' = max(m, m2), with a = exp(m - m')
 * and a2 = exp(m2 - m'),
 *
 *     l' = a l + a2 l2,      acc' = a acc + a2 acc2,
 *
 * and (I) holds again: each old term exp(s_j - m) or exp(s_j - m2) is moved to m' exactly as
 * fai_online_move moves a row's own. A dead side (m = -inf: nothing finite seen) gets a = 0.
 * If both are dead (m' = -inf) this returns 0 and leaves *m alone: the caller then adds acc2
 * to acc with a = a2 = 1, as the one-state recurrence keeps a dead row's allowed terms 0 v in
 * acc (zero, or NaN where v has inf or NaN; the row ends empty, O = 0, either way). Folding a
 * row's chunks 0, 1, 2, ... into the state of chunk 0 in that order fixes the result, whoever
 * computed each chunk.
 */
FA_HOST_DEVICE static inline int fai_online_merge_f32(float *m, float m2, float *a, float *a2)
{
    const float m_new = fai_nanmax_f32(*m, m2);
    if (m_new == -INFINITY) {
        *a = *a2 = 1;
        return 0;
    }
    *a = fai_expf(*m - m_new);
    *a2 = fai_expf(m2 - m_new);
    *m = m_new;
    return 1;
}

/* l' = a l + a2 l2 and acc' = a acc + a2 acc2 of fai_online_merge, per element (a product may
 * fuse into the sum, as in fai_online_sum_f32: one way or the other for a build, never per
 * call). */
FA_HOST_DEVICE static inline float fai_online_merge_sum_f32(float l, float a, float l2, float a2)
{
    return l * a + l2 * a2;
}

/*
 * An attention sink (fa_params.sink_logits): one more logit s with no value, in every row's
 * denominator. Absorbed into a finished row's state as a block of one key whose exp(s - m')
 * enters l and nothing enters acc:
 *
 *     m' = max(m, s),  a = exp(m - m'),  l' = a l + exp(s - m'),  acc' = a acc
 *
 * which keeps (I), so the finalization's LSE = m' + ln l' = ln(sum_j exp(s_j) + exp(s)) and
 * O = acc' / l'. Returns a, the factor of acc (1 where s = -inf: no sink, nothing changes).
 * A row that saw nothing (m = -inf, l = 0) ends with l' = 1, LSE = s and O = 0 (a = 0; an acc
 * of 0 v terms that are NaN stays NaN, as such terms do in any row). A NaN m stays NaN.
 */
FA_HOST_DEVICE static inline float fai_online_sink_f32(float *m, float *l, float s)
{
    if (s == -INFINITY)
        return 1;
    const float m_new = fai_nanmax_f32(*m, s);
    const float a = fai_expf(*m - m_new);
    *l = fai_online_sum_f32(*l, a, fai_expf(s - m_new));
    *m = m_new;
    return a;
}

FA_HOST_DEVICE static inline double fai_online_sink_f64(double *m, double *l, double s)
{
    if (s == -INFINITY)
        return 1;
    const double m_new = fai_nanmax_f64(*m, s);
    const double a = fai_exp(*m - m_new);
    *l = fai_online_sum_f64(*l, a, fai_exp(s - m_new));
    *m = m_new;
    return a;
}

/*
 * End of the row: returns the factor that turns acc into O (0 for an empty row, so O = 0
 * exactly) and sets *lse. keep_scale is 1 / (1 - p), or 1 without dropout.
 *
 * LSE is formed in double even on the f32 path: m is often large (logits ~ 100) where one f32
 * ulp is 8e-6, and the backward's P = exp(s - LSE) inherits any rounding of LSE as a relative
 * error of the whole row. In double, storing to an f32 LSE rounds once; an f64 LSE keeps it.
 */
FA_HOST_DEVICE static inline float fai_online_finalize_f32(float m, float l, float keep_scale,
                                                           double *lse)
{
    if (!(l != 0)) { /* l == 0: nothing absorbed. (NaN l is != 0 and falls through.) */
        *lse = -INFINITY;
        return 0;
    }
    *lse = (double)m + fai_log((double)l);
    return keep_scale / l;
}

FA_HOST_DEVICE static inline double fai_online_finalize_f64(double m, double l, double keep_scale,
                                                            double *lse)
{
    if (!(l != 0)) {
        *lse = -INFINITY;
        return 0;
    }
    *lse = m + fai_log(l);
    return keep_scale / l;
}

/* O = acc f from a row's end (f of fai_online_end, for a row that is not empty); + 0 turns a -0
 * into +0, so the sign of a zero does not depend on which terms the skips left out. */
FA_HOST_DEVICE static inline float fai_online_out_f32(float acc, float f) { return acc * f + 0; }

FA_HOST_DEVICE static inline double fai_online_out_f64(double acc, double f)
{
    return acc * f + 0;
}

/*
 * A row's end on the CPU paths: its sink absorbed (s = -inf: none), then finalized. *f is the
 * factor that turns acc into O, a keep_scale / l' (exactly the finalization's factor where
 * there is no sink, a = 1); returns 0 for an empty row (nothing seen and no sink), whose O is
 * 0 whatever acc holds. A row with only its sink is not empty: O = 0 acc, which is 0 but for
 * the NaN of an allowed 0 v term, as in the reference.
 */
FA_HOST_DEVICE static inline int fai_online_end_f32(float m, float l, float s, float keep_scale,
                                                    double *lse, float *f)
{
    const float a = fai_online_sink_f32(&m, &l, s);
    const float g = fai_online_finalize_f32(m, l, keep_scale, lse);
    *f = a * g;
    return g != 0;
}

FA_HOST_DEVICE static inline int fai_online_end_f64(double m, double l, double s,
                                                    double keep_scale, double *lse, double *f)
{
    const double a = fai_online_sink_f64(&m, &l, s);
    const double g = fai_online_finalize_f64(m, l, keep_scale, lse);
    *f = a * g;
    return g != 0;
}

/*
 * The same recurrence in base 2 (the CUDA tensor-core kernels, whose exponential is exp2).
 * Measure scores in base-2 units, x_j = s_j log2(e), and keep m in those units: then
 * exp(s_j - m ln 2) = 2^(x_j - m), so with every exp replaced by exp2 the state, the move
 * (fai_online_move: a = 2^x) and its invariant (I) are the ones above, term for term; only
 * the end changes, LSE = ln sum_j exp(s_j) = ln(2^m l) = m ln 2 + ln l. The scale and log2(e)
 * fold into one factor of the raw dot products (scale2 = scale log2(e)), and the backward's
 * P = exp(s - LSE) becomes 2^(x - LSE log2(e)).
 */

FA_HOST_DEVICE static inline float fai_online_finalize_base2_f32(float m, float l,
                                                                 float keep_scale, double *lse)
{
    if (!(l != 0)) {
        *lse = -INFINITY;
        return 0;
    }
    *lse = (double)m * FAI_LN2 + fai_log((double)l);
    return keep_scale / l;
}

/* A row's end in base 2 (the tensor-core kernels): fai_online_end with m and the sink s2 in
 * base-2 units (s2 = sink log2(e); -inf: none), so every exp is an exp2. */
FA_HOST_DEVICE static inline int fai_online_end_base2_f32(float m, float l, float s2,
                                                         float keep_scale, double *lse, float *f)
{
    float a = 1;
    if (s2 != -INFINITY) {
        const float m_new = fai_nanmax_f32(m, s2);
        a = fai_exp2f(m - m_new);
        l = fai_online_sum_f32(l, a, fai_exp2f(s2 - m_new));
        m = m_new;
    }
    const float g = fai_online_finalize_base2_f32(m, l, keep_scale, lse);
    *f = a * g;
    return g != 0;
}

/* The backward's LSE in base-2 units, LSE log2(e), so that P = 2^(x - it); +inf for an empty row
 * (LSE -inf), so that P is 0 there instead of 2^(+inf). */
FA_HOST_DEVICE static inline float fai_lse_base2_f32(double lse)
{
    return lse == -INFINITY ? INFINITY : (float)(lse * FAI_LOG2E);
}

/*
 * Merge of finished states over disjoint key sets, in LSE form (split-KV, ring attention).
 * With M = max_k LSE_k: LSE = M + ln sum_k exp(LSE_k - M), and state k's weight is
 * exp(LSE_k - LSE). The same argument as above: every exponent is <= 0. The empty state
 * (LSE = -inf) gets weight exp(-inf) = 0 and is neutral; if every state is empty, M = -inf and
 * the merge is empty too (weights 0, LSE -inf), never -inf - (-inf).
 *
 * Usage: lse_out = fai_merge_lse_f64(lse, n); then state k enters with weight
 * fai_merge_weight_f64(lse[k], lse_out). A NaN LSE makes the merge NaN.
 */
FA_HOST_DEVICE static inline double fai_merge_lse_f64(const double *lse, int n)
{
    double M = -INFINITY;
    for (int k = 0; k < n; k++)
        M = fai_nanmax_f64(M, lse[k]);
    if (M == -INFINITY)
        return -INFINITY;
    double sum = 0;
    for (int k = 0; k < n; k++)
        sum += fai_exp(lse[k] - M);
    return M + fai_log(sum);
}

/* Weight of a state with log-sum-exp lse_k in the merge whose log-sum-exp is lse. */
FA_HOST_DEVICE static inline double fai_merge_weight_f64(double lse_k, double lse)
{
    return lse == -INFINITY ? 0.0 : fai_exp(lse_k - lse);
}

#endif
