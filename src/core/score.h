/*
 * The score pipeline and the mask of docs/DESIGN.md §1, and the classification of a
 * (query tile x key tile) against the mask. Every backend — the float64 reference, the
 * conventional GEMM path, the tiled kernels and CUDA — takes its mask and score transforms
 * from here; none re-derives them.
 *
 * Mask. Key j is allowed for query row i iff
 *     j >= i + off - L   (when L >= 0, unless j < n)   and   j <= i + off + R   (when R >= 0),
 * off = Sk - Sq (bottom-right) or 0 (top-left), n the sink tokens (StreamingLLM: the first n
 * keys are exempt from the window's left bound). A placed call (a shard of a longer
 * sequence's rows against a shard of its keys, api/params.c: fai_problem_place) has the same
 * mask with another offset and n; nothing below depends on which offset. A *plain* mask (n = 0,
 * or L unbounded, where the sinks change nothing) allows one interval per row, and the
 * interval's ends move right by exactly one per row. Two consequences are used throughout:
 *   (a) a row's allowed keys are [lo_i, hi_i), computed in O(1) (fai_mask_row);
 *   (b) the union of the intervals of rows [i0, i1) is the single interval
 *       [lo_{i0}, hi_{i1-1}) when every row's interval is non-empty in the unclipped sense
 *       (L, R >= 0 or unbounded: the band has width L + R + 1 >= 1), so a tile is empty iff it
 *       misses that union, and full iff it lies inside every row's interval, i.e. inside
 *       [lo_{i1-1}, hi_{i0}).
 * A mask with sink tokens is the disjoint union of two plain masks (fai_mask_parts), so every
 * function below but fai_mask_allows and fai_mask_parts takes a plain mask, and the code that
 * loops over keys loops over the parts.
 */
#ifndef FAI_CORE_SCORE_H
#define FAI_CORE_SCORE_H

#include <stdint.h>
#include "fmath.h"

typedef struct {
    int64_t off;         /* Sk - Sq or 0 (a placed call's: any)              */
    int64_t left, right; /* window bounds, -1 unbounded, clamped (fai_mask_at) */
    int64_t sk;          /* number of keys                                   */
    int64_t sink_keys;   /* n clamped to Sk; 0 when L is unbounded (plain)   */
} fai_mask;

typedef enum { FAI_TILE_EMPTY, FAI_TILE_PARTIAL, FAI_TILE_FULL } fai_tile_class;

/* The mask of sq rows and sk keys at offset off. causal forces right = 0. Bounds beyond
 * Sq + Sk + |off| cannot bind (a left bound L >= that gives i + off - L < 0 for every row, a
 * right bound R >= it gives i + off + R >= Sk) and are clamped to it, so that the arithmetic
 * below stays far from int64 overflow (the API limits Sq, Sk and positions to < 2^40). */
FA_HOST_DEVICE static inline fai_mask fai_mask_at(int64_t sq, int64_t sk, int64_t off,
                                                  int causal, int64_t left, int64_t right,
                                                  int64_t sink_tokens)
{
    fai_mask m;
    int64_t reach = sq + sk + (off < 0 ? -off : off);
    m.off = off;
    m.left = left > reach ? reach : left;
    m.right = causal ? 0 : (right > reach ? reach : right);
    m.sk = sk;
    m.sink_keys = m.left < 0 || sink_tokens < 0 ? 0 : (sink_tokens > sk ? sk : sink_tokens);
    return m;
}

/* The mask of a call: off = Sk - Sq (bottom-right) or 0 (top-left). */
FA_HOST_DEVICE static inline fai_mask fai_mask_make(int64_t sq, int64_t sk, int causal,
                                                    int64_t left, int64_t right, int top_left,
                                                    int64_t sink_tokens)
{
    return fai_mask_at(sq, sk, top_left ? 0 : sk - sq, causal, left, right, sink_tokens);
}

/* The definition above, key by key, for any mask: what the reference tests. */
FA_HOST_DEVICE static inline int fai_mask_allows(const fai_mask *m, int64_t i, int64_t j)
{
    if (j < 0 || j >= m->sk)
        return 0;
    if (m->right >= 0 && j > i + m->off + m->right)
        return 0;
    return m->left < 0 || j >= i + m->off - m->left || j < m->sink_keys;
}

/*
 * The plain masks whose disjoint union is m, in key order; returns their number (1 or 2).
 * Without sink tokens, m itself. With n = sink_keys > 0 (so L >= 0):
 *   part[0], the sinks left of the window: keys j < n with j < lo_i = i + off - L, that is
 *           j <= i + (off - L - 1) + 0: the plain mask of n keys with offset off - L - 1, no
 *           left bound and right bound 0;
 *   part[1], the window: m without sinks, keys [lo_i, hi_i).
 * Proof. A key j >= lo_i is allowed iff j < hi_i: part 1. A key j < lo_i fails the left bound,
 * so it is allowed iff j < n and j <= i + off + R; the latter holds, since L, R >= 0 give
 * j < i + off - L <= i + off + R (and R unbounded bounds nothing): part 0. The parts are
 * disjoint (j < lo_i against j >= lo_i), and every key of part 0 precedes every key of part 1
 * in each row, so a recurrence that visits part 0's keys and then part 1's visits each row's
 * keys in ascending order. Part 0 is plain: its interval [0, min(n, lo_i)) has a left end
 * fixed at 0 and a right end moving by one per row until it stops at n, which is (b)'s band of
 * unbounded width clipped to n keys.
 */
FA_HOST_DEVICE static inline int fai_mask_parts(const fai_mask *m, fai_mask part[2])
{
    fai_mask window = *m;
    window.sink_keys = 0;
    if (m->sink_keys == 0) {
        part[0] = window;
        return 1;
    }
    part[0].off = m->off - m->left - 1;
    part[0].left = -1;
    part[0].right = 0;
    part[0].sk = m->sink_keys;
    part[0].sink_keys = 0;
    part[1] = window;
    return 2;
}

/* Allowed keys of row i of a plain mask: [*lo, *hi), clipped to [0, Sk); empty when *lo >= *hi. */
FA_HOST_DEVICE static inline void fai_mask_row(const fai_mask *m, int64_t i, int64_t *lo,
                                               int64_t *hi)
{
    int64_t a = m->left >= 0 ? i + m->off - m->left : 0;
    int64_t b = m->right >= 0 ? i + m->off + m->right + 1 : m->sk;
    *lo = a < 0 ? 0 : a;
    *hi = b > m->sk ? m->sk : b;
}

/* Keys that any row of [i0, i1) may see (consequence (b)); empty when *lo >= *hi. */
FA_HOST_DEVICE static inline void fai_mask_key_span(const fai_mask *m, int64_t i0, int64_t i1,
                                                    int64_t *lo, int64_t *hi)
{
    int64_t unused;
    fai_mask_row(m, i0, lo, &unused);
    fai_mask_row(m, i1 - 1, &unused, hi);
}

/* Query rows of [0, sq) that may see any key of [j0, j1): the mirror image of the above.
 * Keys past Sk are no row's (a mask part's Sk may stop short of the problem's keys). */
FA_HOST_DEVICE static inline void fai_mask_query_span(const fai_mask *m, int64_t sq, int64_t j0,
                                                      int64_t j1, int64_t *lo, int64_t *hi)
{
    if (j1 > m->sk)
        j1 = m->sk;
    if (j0 >= j1) {
        *lo = *hi = 0;
        return;
    }
    /* j <= i + off + R  <=>  i >= j - off - R ;   j >= i + off - L  <=>  i <= j + L - off */
    int64_t a = m->right >= 0 ? j0 - m->off - m->right : 0;
    int64_t b = m->left >= 0 ? (j1 - 1) + m->left - m->off + 1 : sq;
    *lo = a < 0 ? 0 : a;
    *hi = b > sq ? sq : b;
}

FA_HOST_DEVICE static inline fai_tile_class fai_mask_classify(const fai_mask *m, int64_t i0,
                                                              int64_t i1, int64_t j0, int64_t j1)
{
    int64_t ulo, uhi, flo, fhi, unused;
    fai_mask_key_span(m, i0, i1, &ulo, &uhi);
    if (j1 <= ulo || j0 >= uhi)
        return FAI_TILE_EMPTY;
    fai_mask_row(m, i1 - 1, &flo, &unused); /* the latest left edge  */
    fai_mask_row(m, i0, &unused, &fhi);     /* the earliest right edge */
    return (j0 >= flo && j1 <= fhi) ? FAI_TILE_FULL : FAI_TILE_PARTIAL;
}

/*
 * Score pipeline, steps 1-3 of docs/DESIGN.md §1, for a pair (i, j) with its entry `bias` of
 * the bias tensor (0 without one; a keep-mask is loaded as 0 where it keeps and -inf where it
 * masks, base/dtype.c):
 *
 *     x = scale * dot  [+ B]              B before the cap (SDPA, xformers: after the scale)
 *     x = x - slope |i + off - j|         with alibi_first (FlashInfer), else after the cap
 *     s = c tanh(x / c)                   softcap c > 0, else s = x
 *     s = s - slope |i + off - j|         ALiBi after the cap (FlashAttention, the default)
 *     s = s  [+ B]                        B after the cap (ggml)
 *
 * with B = bias, or slope * bias where the slopes scale the bias instead of a distance
 * (bias_by_slope: ggml's ALiBi, whose mask holds the positions; no distance term then). A bias
 * of -inf masks the key whatever else: s = -inf (a cap would otherwise turn -inf into -c, and
 * a zero slope -inf into NaN), and callers that skip masked keys by selection skip it too
 * (fai_bias_masks). That holds without a bias tensor too (bias NONE: the entry is only ever
 * 0 or a block mask's -inf, backends/problem.h's fai_row_biased). NaN propagates. `t` (may be NULL) receives tanh(x / c), for the backward's
 * chain rule d(c tanh(x/c))/dx = 1 - tanh^2(x/c) (the bias and ALiBi are additive, so the rule
 * is the same in every order); it is 0 when softcap is off.
 *
 * The scale alone (no cap, no distance term) gives s = scale * dot + B with one rounding for
 * the product and one for the sum in either placement: the tiled strips form the product in
 * their GEMM's store and add B in a vector loop (fai_bias_add), the same two operations.
 */
typedef enum { FAI_BIAS_NONE, FAI_BIAS_BEFORE_CAP, FAI_BIAS_AFTER_CAP } fai_bias_place;

typedef struct {
    double scale, softcap; /* softcap 0: off */
    int64_t off;           /* the mask's alignment offset, shared with ALiBi */
    int alibi_first;       /* FA_ALIBI_THEN_SOFTCAP */
    fai_bias_place bias;   /* where a bias tensor's entries enter (NONE: no tensor) */
    int bias_by_slope;     /* the ALiBi slope multiplies the bias; no distance term */
} fai_score;

/* Whether a bias entry masks its key. */
FA_HOST_DEVICE static inline int fai_bias_masks(double bias) { return bias == -INFINITY; }

FA_HOST_DEVICE static inline double fai_alibi_distance(const fai_score *sc, int64_t i, int64_t j)
{
    int64_t d = i + sc->off - j;
    return (double)(d < 0 ? -d : d);
}

FA_HOST_DEVICE static inline double fai_score_biased_f64(const fai_score *sc, double dot,
                                                         double slope, double bias, int64_t i,
                                                         int64_t j, double *t)
{
    double s = sc->scale * dot, th = 0.0;
    const int distance = slope != 0 && !sc->bias_by_slope;
    if (fai_bias_masks(bias)) {
        if (t)
            *t = 0.0;
        return -INFINITY;
    }
    const double b = sc->bias_by_slope ? slope * bias : bias;
    if (sc->bias == FAI_BIAS_BEFORE_CAP)
        s += b;
    if (distance && sc->alibi_first)
        s -= slope * fai_alibi_distance(sc, i, j);
    if (sc->softcap > 0) {
        th = fai_tanh(s / sc->softcap);
        s = sc->softcap * th;
    }
    if (distance && !sc->alibi_first)
        s -= slope * fai_alibi_distance(sc, i, j);
    if (sc->bias == FAI_BIAS_AFTER_CAP)
        s += b;
    if (t)
        *t = th;
    return s;
}

/* The same in float: what the f32-accumulating paths compute. */
FA_HOST_DEVICE static inline float fai_score_biased_f32(const fai_score *sc, float dot,
                                                        float slope, float bias, int64_t i,
                                                        int64_t j, float *t)
{
    float s = (float)sc->scale * dot, th = 0.0f;
    const int distance = slope != 0 && !sc->bias_by_slope;
    if (fai_bias_masks(bias)) {
        if (t)
            *t = 0.0f;
        return -INFINITY;
    }
    const float b = sc->bias_by_slope ? slope * bias : bias;
    if (sc->bias == FAI_BIAS_BEFORE_CAP)
        s += b;
    if (distance && sc->alibi_first)
        s -= slope * (float)fai_alibi_distance(sc, i, j);
    if (sc->softcap > 0) {
        float cap = (float)sc->softcap;
        th = fai_tanhf(s / cap);
        s = cap * th;
    }
    if (distance && !sc->alibi_first)
        s -= slope * (float)fai_alibi_distance(sc, i, j);
    if (sc->bias == FAI_BIAS_AFTER_CAP)
        s += b;
    if (t)
        *t = th;
    return s;
}

/* Without a bias tensor (sc->bias NONE). */
FA_HOST_DEVICE static inline double fai_score_f64(const fai_score *sc, double dot, double slope,
                                                  int64_t i, int64_t j, double *t)
{
    return fai_score_biased_f64(sc, dot, slope, 0.0, i, j, t);
}

FA_HOST_DEVICE static inline float fai_score_f32(const fai_score *sc, float dot, float slope,
                                                 int64_t i, int64_t j, float *t)
{
    return fai_score_biased_f32(sc, dot, slope, 0.0f, i, j, t);
}

/* Whether the pipeline is the scale, then the bias added, and nothing else: no cap, no
 * distance term (the slope 0, or scaling the bias). */
FA_HOST_DEVICE static inline int fai_score_is_affine(const fai_score *sc, double slope)
{
    return sc->softcap == 0 && (slope == 0 || sc->bias_by_slope);
}

#endif
