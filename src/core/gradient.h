/*
 * The backward's per-element formula (docs/DESIGN.md §1, "Backward"), written once for every
 * backend: the float64 reference, the tiled loop nest (f32 and f64), the portable kernels and
 * the CUDA kernels call it; the vector kernels' dsoftmax (simd/kernels.h) is its z = 1,
 * capless case in vectors. The conventional path is the exception on purpose: it computes
 * D_i = sum_j dP~_ij P_ij and rounds every step to the storage dtype, as a framework's
 * unfused softmax backward does (backends/conventional.c).
 *
 * For an allowed pair (i, j) of a row with LSE_i, P = exp(s_ij - LSE_i), the dropout factor
 * z = keep_ij / (1 - dropout_p) (0 for a dropped pair) and D_i = dO_i . O_i:
 *
 *     P~   = P z                            multiplies dO into dV:   dV_j += P~ dO_i
 *     dP~  = dO_i . v_j                     (the gradient of P~)
 *     dS   = P (dP~ z - D_i) (1 - t^2)      multiplies scale q_i into dK_j and scale k_j
 *                                           into dQ_i
 *
 * Why: O_i = sum_j P~_ij v_j, so dP_ij = z dP~_ij; softmax's Jacobian gives
 * dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik), and sum_k P_ik dP_ik = sum_k P~_ik (dO_i . v_k)
 * = dO_i . O_i = D_i. With a softcap c, s = c tanh(x / c) and ds/dx = 1 - t^2 with
 * t = tanh(x / c) (core/score.h hands t out); ALiBi's bias and the scale are affine and pass
 * dS through unchanged but for the scale of the final products.
 *
 * Edge cases: a masked or dropped pair has P~ = 0; a masked one also dS = 0 (it is never
 * formed: callers skip it by selection or by the mask). A row with one allowed key and no
 * dropout has P = 1 and O_i = v_j, so dP~ - D_i is 0 exactly where dP~ and D_i are summed in
 * the same order (the tiled backward's coldot, simd/kernels.h): dS = 0, as it must be.
 */
#ifndef FAI_CORE_GRADIENT_H
#define FAI_CORE_GRADIENT_H

#include "fmath.h"

/* dS of one allowed pair: p = P, dp = dO_i . v_j, z = keep / (1 - dropout_p) (1 without
 * dropout), di = D_i, t = tanh(x / c) when `capped` (the softcap is on), else ignored. */
FA_HOST_DEVICE static inline float fai_dscore_f32(float p, float dp, float z, float di, float t,
                                                  int capped)
{
    float g = p * (dp * z - di);
    if (capped)
        g *= 1 - t * t;
    return g;
}

FA_HOST_DEVICE static inline double fai_dscore_f64(double p, double dp, double z, double di,
                                                   double t, int capped)
{
    double g = p * (dp * z - di);
    if (capped)
        g *= 1 - t * t;
    return g;
}

/*
 * A bias tensor's gradient (docs/DESIGN.md §1, step 2a): its entry B_ij adds to x, the cap's
 * argument (before the cap), or to s (after it), so d loss / d B_ij is the dS above taken at
 * that point: with the chain factor 1 - t^2 before the cap, without it after; times the
 * slope where the slopes scale the bias (`factor`: the slope, else 1). A masked pair (B = -inf,
 * or masked by the window) has 0, as SDPA's gradient of a -inf entry of attn_mask does.
 */
FA_HOST_DEVICE static inline double fai_dbias_f64(double p, double dp, double z, double di,
                                                  double t, int capped, int after_cap,
                                                  double factor)
{
    return factor * fai_dscore_f64(p, dp, z, di, t, capped && !after_cap);
}

FA_HOST_DEVICE static inline float fai_dbias_f32(float p, float dp, float z, float di, float t,
                                                 int capped, int after_cap, float factor)
{
    return factor * fai_dscore_f32(p, dp, z, di, t, capped && !after_cap);
}

/*
 * An attention sink s_h (fa_params.sink_logits) is one more column of row i's softmax with
 * P_sink = exp(s_h - LSE_i) and no value: its dP is 0, so the Jacobian above gives
 * dS_sink = P_sink (0 - D_i), and
 *
 *     d loss / d s_h = sum over the head's rows (every batch) of -exp(s_h - LSE_i) D_i.
 *
 * The other terms keep their formula: D_i = sum_k P_ik dP_ik over all columns, the sink's
 * adding 0, is still dO_i . O_i. This is row i's term (0 where s_h = -inf: no sink).
 */
FA_HOST_DEVICE static inline double fai_dsink_term_f64(double s, double lse, double di)
{
    return s == -INFINITY ? 0.0 : -fai_exp(s - lse) * di;
}

#endif
