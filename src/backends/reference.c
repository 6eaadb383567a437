/*
 * The float64 oracle: docs/DESIGN.md §1 computed in double throughout, in two passes over each
 * query row's keys (the maximum, then the exponentials), never tiled over keys and never
 * rescaled online. Two ways to evaluate the same formulas:
 *
 *  - blocked (the usual path): a block of query rows at a time, with the dot products and the
 *    P V / gradient products done by float64 GEMMs (one per block, on the calling thread; see
 *    blas.c) and the score pipeline, mask, softmax and dropout applied elementwise in between.
 *    GEMMs multiply masked and dropped entries by an exact 0, which is exact only when the
 *    other operand is finite, so this path is taken only for heads whose inputs are finite.
 *  - row by row: each row's dot products and sums written out, masked and dropped terms
 *    skipped by selection. It serves heads with a NaN or inf anywhere in their inputs, where
 *    the rule "masked NaN never reaches the output" (docs/DESIGN.md §1) must hold to the bit,
 *    and dimensions beyond BLAS's int range.
 *
 * Each output element is computed by one thread in an order fixed by the problem alone, so the
 * result does not depend on the thread count; the row block size changes only the GEMMs'
 * float64 rounding.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "backends/blas.h"
#include "backends/blocks.h"
#include "backends/context.h"
#include "backends/groups.h"
#include "backends/rows.h"
#include "backends/table.h"
#include "core/gradient.h"

#define REF_ROWS 64 /* query rows per block: the S block is 64 x Sk doubles (4 MiB at 8192) */

static double dot64(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* Whether `rows` rows of dim elements, row s at p(pr, role, b, h, s), hold no NaN or inf. */
static int all_finite(const fai_problem *pr, void *(*p)(const fai_problem *, fai_role, int64_t,
                                                        int64_t, int64_t),
                      fai_role role, int64_t b, int64_t h, int64_t rows, int64_t dim,
                      double *row)
{
    for (int64_t s = 0; s < rows; s++) {
        fai_load_f64(p(pr, role, b, h, s), fai_role_dtype(pr, role), dim, row);
        for (int64_t d = 0; d < dim; d++)
            if (!isfinite(row[d]))
                return 0;
    }
    return 1;
}

/* ================================================================== row by row */

/* Per-thread scratch of the row path: a row of scores and their tanh (softcap), the row's
 * bias and a row of bias gradient (with a bias tensor), and rows of q, dq, o, dO and one of k
 * or v. */
typedef struct {
    double *s, *t, *bias, *dbias, *q, *kv, *o, *dout, *dq;
} row_ws;

static void row_carve(const fai_problem *pr, fai_arena *a, row_ws *w)
{
    const size_t d = sizeof(double);
    w->s = fai_carve(a, (size_t)pr->sk * d);
    w->t = fai_carve(a, (size_t)pr->sk * d);
    w->bias = pr->bias ? fai_carve(a, (size_t)pr->sk * d) : NULL;
    w->dbias = pr->bias_grad ? fai_carve(a, (size_t)pr->sk * d) : NULL;
    w->q = fai_carve(a, (size_t)pr->dqk * d);
    w->dq = fai_carve(a, (size_t)pr->dqk * d);
    w->o = fai_carve(a, (size_t)pr->dv * d);
    w->dout = fai_carve(a, (size_t)pr->dv * d);
    w->kv = fai_carve(a, (size_t)(pr->dqk > pr->dv ? pr->dqk : pr->dv) * d);
}

/*
 * Keys [*lo, *hi) hold every key that rows [i0, i1) may see: the window's span (core/score.h,
 * (b)), from key 0 where sink tokens may stand left of it. Which keys of it row i sees,
 * fai_mask_allows says, key by key: the definition itself, so the oracle needs no other
 * account of a mask with sink tokens.
 */
static void key_hull(const fai_problem *pr, int64_t i0, int64_t i1, int64_t *lo, int64_t *hi)
{
    fai_mask window = pr->mask;
    window.sink_keys = 0;
    fai_mask_key_span(&window, i0, i1, lo, hi);
    if (pr->mask.sink_keys > 0 && *hi > 0)
        *lo = 0;
}

/* Whether row i of (b, h) sees key j: the window's mask, the block mask, and the bias row
 * `bias` (row i's, by key) where there is one. */
static int row_allows(const fai_problem *pr, const double *bias, int64_t b, int64_t h,
                      int64_t i, int64_t j)
{
    return fai_mask_allows(&pr->mask, i, j) && fai_block_listed(pr, b, h, i, j) &&
           !(bias && fai_bias_masks(bias[j]));
}

/* The bias entry of key j in a row loaded into bias (0 without a bias tensor). */
static double bias_at(const double *bias, int64_t j) { return bias ? bias[j] : 0.0; }

/*
 * Steps 1-5 of docs/DESIGN.md §1 for row i of (b, h): fills w->s[j] (and w->t[j]) for allowed j
 * in [*lo, *hi) (key_hull) and returns LSE_i; -inf for an empty row (no allowed key, or all
 * allowed scores -inf), NaN if an allowed score is NaN. Fills keep[lo, hi) when dropout is on.
 */
static double row_scores(const fai_problem *pr, int64_t b, int64_t h, int64_t i, row_ws *w,
                         unsigned char *keep, int64_t *lo, int64_t *hi)
{
    const int64_t hk = h / pr->group;
    const double slope = fai_slope(pr, h);
    fai_score sc = pr->score; /* FP8: the descales of q and k scale the scores */
    sc.scale *= fai_descale_qk(pr, b, hk);
    key_hull(pr, i, i + 1, lo, hi);
    fai_load_f64(fai_q_row(pr, FAI_Q, b, h, i), pr->q_dtype, pr->dqk, w->q);
    if (w->bias)
        fai_load_f64(fai_bias_row(pr, b, h, i), pr->bias->dtype, pr->sk, w->bias);
    double mx = -INFINITY;
    for (int64_t j = *lo; j < *hi; j++) {
        if (!row_allows(pr, w->bias, b, h, i, j))
            continue;
        fai_load_f64(fai_kv_row(pr, FAI_K, b, hk, j), pr->k_dtype, pr->dqk, w->kv);
        w->s[j] = fai_score_biased_f64(&sc, dot64(w->q, w->kv, pr->dqk), slope,
                                       bias_at(w->bias, j), i, j, &w->t[j]);
        mx = fai_nanmax_f64(mx, w->s[j]);
    }
    if (pr->drop.threshold && *lo < *hi) {
        fai_dropout d = fai_dropout_for(pr, b, h);
        fai_dropout_keep_row(&d, i, *lo, *hi - *lo, keep + *lo);
    }
    const double sink = fai_sink(pr, h); /* one more logit, with no value (-inf: none) */
    mx = fai_nanmax_f64(mx, sink);
    if (isnan(mx) || mx == -INFINITY)
        return mx;
    double sum = exp(sink - mx);
    for (int64_t j = *lo; j < *hi; j++)
        if (row_allows(pr, w->bias, b, h, i, j))
            sum += exp(w->s[j] - mx);
    return mx + log(sum);
}

/* O_i = sum_{allowed, kept j} exp(s_j - LSE) / (1 - p) v_j, into w->o (0 for an empty row),
 * v_j times its FP8 descale. */
static void row_output(const fai_problem *pr, int64_t b, int64_t h, int64_t i, double lse,
                       int64_t lo, int64_t hi, const unsigned char *keep, row_ws *w)
{
    const int64_t hk = h / pr->group;
    memset(w->o, 0, (size_t)pr->dv * sizeof(double));
    if (lse == -INFINITY)
        return;
    const double descale_v = fai_descale_v(pr, b, hk);
    for (int64_t j = lo; j < hi; j++) {
        if (!row_allows(pr, w->bias, b, h, i, j) || (pr->drop.threshold && !keep[j]))
            continue; /* masked and dropped keys by selection */
        double pt = exp(w->s[j] - lse) * pr->keep_scale * descale_v;
        fai_load_f64(fai_kv_row(pr, FAI_V, b, hk, j), pr->v_dtype, pr->dv, w->kv);
        for (int64_t d = 0; d < pr->dv; d++)
            w->o[d] += pt * w->kv[d];
    }
}

/* Forward of row i of (b, h), row by row. */
static void row_forward(const fai_problem *pr, int64_t b, int64_t h, int64_t i, row_ws *w,
                        unsigned char *keep)
{
    int64_t lo, hi;
    double lse = row_scores(pr, b, h, i, w, keep, &lo, &hi);
    row_output(pr, b, h, i, lse, lo, hi, keep, w);
    fai_store_f64(fai_q_row(pr, FAI_OUT, b, h, i), pr->dtype, pr->dv, w->o);
    if (fai_io(pr, FAI_LSE))
        fai_lse_write(pr, b, h, i, lse);
}

/* Backward of the group of kv head (b, hk), row by row, dK and dV summed in dk, dv (Sk x D). */
static void row_backward_group(const fai_problem *pr, int64_t b, int64_t hk, row_ws *w,
                               unsigned char *keep, double *dk, double *dv)
{
    const double scale = pr->score.scale;
    for (int64_t h = hk * pr->group; h < (hk + 1) * pr->group; h++)
        for (int64_t i = 0; i < pr->sq; i++) {
            int64_t lo, hi;
            double lse = row_scores(pr, b, h, i, w, keep, &lo, &hi);
            memset(w->dq, 0, (size_t)pr->dqk * sizeof(double));
            if (lse != -INFINITY) {
                row_output(pr, b, h, i, lse, lo, hi, keep, w);
                fai_load_f64(fai_q_row(pr, FAI_DOUT, b, h, i), pr->dtype, pr->dv, w->dout);
                const double Di = dot64(w->dout, w->o, pr->dv);
                for (int64_t j = lo; j < hi; j++) {
                    if (!row_allows(pr, w->bias, b, h, i, j))
                        continue;
                    const double P = exp(w->s[j] - lse);
                    const double z = !pr->drop.threshold || keep[j] ? pr->keep_scale : 0.0;
                    fai_load_f64(fai_kv_row(pr, FAI_V, b, hk, j), pr->v_dtype, pr->dv, w->kv);
                    /* dP z is rounded on its own here (before dV's loop, apart from the
                     * difference): the formula then takes it with z = 1 */
                    const double dPz = dot64(w->dout, w->kv, pr->dv) * z;
                    if (z != 0)
                        for (int64_t d = 0; d < pr->dv; d++)
                            dv[j * pr->dv + d] += P * z * w->dout[d];
                    const double dS =
                        fai_dscore_f64(P, dPz, 1, Di, w->t[j], pr->score.softcap > 0);
                    fai_load_f64(fai_kv_row(pr, FAI_K, b, hk, j), pr->k_dtype, pr->dqk, w->kv);
                    for (int64_t d = 0; d < pr->dqk; d++) {
                        w->dq[d] += scale * dS * w->kv[d];
                        dk[j * pr->dqk + d] += scale * dS * w->q[d];
                    }
                }
            }
            fai_store_f64(fai_q_row(pr, FAI_DQ, b, h, i), pr->dtype, pr->dqk, w->dq);
        }
}

/* Row i of (b, h)'s terms of d loss / d bias (docs/DESIGN.md §1, core/gradient.h), added to
 * w->dbias[j] for its allowed keys j. */
static void row_dbias(const fai_problem *pr, int64_t b, int64_t h, int64_t i, row_ws *w,
                      unsigned char *keep)
{
    const int64_t hk = h / pr->group;
    const double factor = fai_bias_factor(pr, h);
    const int capped = pr->score.softcap > 0, after = pr->score.bias == FAI_BIAS_AFTER_CAP;
    int64_t lo, hi;
    const double lse = row_scores(pr, b, h, i, w, keep, &lo, &hi);
    if (lse == -INFINITY) /* an empty row: no gradient flows through it */
        return;
    row_output(pr, b, h, i, lse, lo, hi, keep, w);
    fai_load_f64(fai_q_row(pr, FAI_DOUT, b, h, i), pr->dtype, pr->dv, w->dout);
    const double Di = dot64(w->dout, w->o, pr->dv);
    for (int64_t j = lo; j < hi; j++) {
        if (!row_allows(pr, w->bias, b, h, i, j))
            continue;
        const double z = !pr->drop.threshold || keep[j] ? pr->keep_scale : 0.0;
        fai_load_f64(fai_kv_row(pr, FAI_V, b, hk, j), pr->v_dtype, pr->dv, w->kv);
        const double dPz = dot64(w->dout, w->kv, pr->dv) * z;
        w->dbias[j] += fai_dbias_f64(exp(w->s[j] - lse), dPz, 1, Di, w->t[j], capped, after,
                                     factor);
    }
}

/* ================================================================== blocked */

/* Per-thread scratch of the blocked path; k and v hold the kv head (b * Hk + hk) == packed. */
typedef struct {
    double *q, *dout, *o, *dq;  /* REF_ROWS rows of the query side                   */
    double *s, *pd, *dp, *t;    /* REF_ROWS x Sk: scores -> P, P~, dP -> dS, tanh     */
    double *k, *v;              /* the kv head, Sk x Dqk and Sk x Dv                  */
    unsigned char *keep;        /* Sk dropout decisions of one row                     */
    unsigned char *allow;       /* Sk: which keys of the block one row sees            */
    double *bias;               /* Sk: one row's bias (with a bias tensor)              */
    int64_t packed;
} blk_ws;

static void blk_carve(const fai_problem *pr, fai_arena *a, int backward, blk_ws *w)
{
    const size_t d = sizeof(double), R = REF_ROWS, sk = (size_t)pr->sk;
    w->q = fai_carve(a, R * (size_t)pr->dqk * d);
    w->o = fai_carve(a, R * (size_t)pr->dv * d);
    w->s = fai_carve(a, R * sk * d);
    w->k = fai_carve(a, sk * (size_t)pr->dqk * d);
    w->v = fai_carve(a, sk * (size_t)pr->dv * d);
    w->keep = fai_carve(a, sk);
    w->allow = fai_carve(a, sk);
    w->bias = pr->bias ? fai_carve(a, sk * d) : NULL;
    w->dout = backward ? fai_carve(a, R * (size_t)pr->dv * d) : NULL;
    w->dq = backward ? fai_carve(a, R * (size_t)pr->dqk * d) : NULL;
    w->pd = backward ? fai_carve(a, R * sk * d) : NULL;
    w->dp = backward ? fai_carve(a, R * sk * d) : NULL;
    w->t = backward && pr->score.softcap > 0 ? fai_carve(a, R * sk * d) : NULL;
    w->packed = -1;
}

/* Rows [r0, r0 + n) of (b, head h) of role r's tensor, rows at p (fai_q_row or fai_kv_row),
 * widened into dst (n x dim). */
static void pack_rows(const fai_problem *pr,
                      void *(*p)(const fai_problem *, fai_role, int64_t, int64_t, int64_t),
                      fai_role r, int64_t b, int64_t h, int64_t r0, int64_t n, int64_t dim,
                      double *dst)
{
    for (int64_t s = 0; s < n; s++)
        fai_load_f64(p(pr, r, b, h, r0 + s), fai_role_dtype(pr, r), dim, dst + s * dim);
}

static void pack_kv(const fai_problem *pr, int64_t b, int64_t hk, blk_ws *w)
{
    if (w->packed == b * pr->hk + hk)
        return;
    pack_rows(pr, fai_kv_row, FAI_K, b, hk, 0, pr->sk, pr->dqk, w->k);
    pack_rows(pr, fai_kv_row, FAI_V, b, hk, 0, pr->sk, pr->dv, w->v);
    w->packed = b * pr->hk + hk;
}

/*
 * Rows [i0, i0 + n) of (b, h) against keys [jlo, jlo + nk), the block's key span: S by GEMM,
 * then per row the pipeline over its allowed keys, the two passes, and P = exp(s - max) / sum
 * (w->s, row stride nk, exact 0 outside the row's allowed keys). If pd is not NULL it receives
 * P~ = P keep / (1 - p) and t (if not NULL) tanh(s / c). lse[r] gets each row's LSE (-inf for
 * an empty row, NaN for a row with a NaN score).
 */
static void blk_probs(const fai_problem *pr, int64_t b, int64_t h, int64_t i0, int64_t n,
                      int64_t jlo, int64_t nk, blk_ws *w, double *pd, double *t, double *lse)
{
    const double slope = fai_slope(pr, h), sink = fai_sink(pr, h);
    const fai_dropout drop = fai_dropout_for(pr, b, h);
    fai_score sc = pr->score; /* FP8: the descales of q and k scale the scores */
    sc.scale *= fai_descale_qk(pr, b, h / pr->group);
    fai_blas_gemm(1, 0, 1, n, nk, pr->dqk, 1.0, w->q, pr->dqk, w->k + jlo * pr->dqk, pr->dqk, 0.0,
                  w->s, nk);
    for (int64_t r = 0; r < n; r++) {
        const int64_t i = i0 + r;
        double *s = w->s + r * nk, *tr = t ? t + r * nk : NULL, mx = -INFINITY, sum = 0;
        int64_t lo, hi;
        key_hull(pr, i, i + 1, &lo, &hi);
        lo = (lo > jlo ? lo : jlo) - jlo; /* the row's keys as block columns */
        hi = (hi < jlo + nk ? hi : jlo + nk) - jlo;
        unsigned char *allow = w->allow;
        const double *bias = w->bias; /* the row's bias, by key */
        if (bias)
            fai_load_f64(fai_bias_row(pr, b, h, i), pr->bias->dtype, pr->sk, w->bias);
        for (int64_t c = 0; c < nk; c++)
            allow[c] = c >= lo && c < hi && row_allows(pr, bias, b, h, i, jlo + c);
        for (int64_t c = lo; c < hi; c++) {
            if (!allow[c])
                continue;
            s[c] = fai_score_biased_f64(&sc, s[c], slope, bias_at(bias, jlo + c), i, jlo + c,
                                        tr ? &tr[c] : NULL);
            mx = fai_nanmax_f64(mx, s[c]);
        }
        mx = fai_nanmax_f64(mx, sink); /* the sink: one more logit, with no value */
        if (mx != -INFINITY && !isnan(mx)) {
            sum = exp(sink - mx);
            for (int64_t c = lo; c < hi; c++)
                if (allow[c])
                    sum += s[c] = exp(s[c] - mx);
            for (int64_t c = lo; c < hi; c++)
                s[c] /= sum;
            lse[r] = mx + log(sum);
        } else {
            for (int64_t c = lo; c < hi; c++) /* empty: P = 0; NaN: P = NaN */
                s[c] = isnan(mx) ? NAN : 0;
            lse[r] = mx;
        }
        for (int64_t c = 0; c < nk; c++) /* masked entries are exact zeros */
            if (!allow[c]) {
                s[c] = 0;
                if (tr)
                    tr[c] = 0;
            }
        if (!pd && !drop.threshold)
            continue;
        double *dst = pd ? pd + r * nk : s; /* without pd, P~ replaces P */
        if (drop.threshold && lo < hi)
            fai_dropout_keep_row(&drop, i, jlo + lo, hi - lo, w->keep + lo);
        for (int64_t c = 0; c < nk; c++)
            dst[c] = !allow[c] || (drop.threshold && !w->keep[c]) ? 0 : s[c] * pr->keep_scale;
    }
}

static void blk_forward(const fai_problem *pr, int64_t b, int64_t h, int64_t i0, int64_t n,
                        blk_ws *w)
{
    double lse[REF_ROWS];
    int64_t jlo, jhi;
    key_hull(pr, i0, i0 + n, &jlo, &jhi);
    const int64_t nk = jhi > jlo ? jhi - jlo : 0;
    pack_kv(pr, b, h / pr->group, w);
    pack_rows(pr, fai_q_row, FAI_Q, b, h, i0, n, pr->dqk, w->q);
    memset(w->o, 0, (size_t)(n * pr->dv) * sizeof(double));
    if (nk > 0) {
        blk_probs(pr, b, h, i0, n, jlo, nk, w, NULL, NULL, lse); /* P~ in place in w->s */
        fai_blas_gemm(1, 0, 0, n, pr->dv, nk, fai_descale_v(pr, b, h / pr->group), w->s, nk,
                      w->v + jlo * pr->dv, pr->dv, 0.0, w->o, pr->dv);
    } else { /* no row of the block sees a key: LSE is the sink's (-inf without one) */
        for (int64_t r = 0; r < n; r++)
            lse[r] = fai_sink(pr, h);
    }
    for (int64_t r = 0; r < n; r++) {
        fai_store_f64(fai_q_row(pr, FAI_OUT, b, h, i0 + r), pr->dtype, pr->dv, w->o + r * pr->dv);
        if (fai_io(pr, FAI_LSE))
            fai_lse_write(pr, b, h, i0 + r, lse[r]);
    }
}

/* Backward of the group of kv head (b, hk), blocked; dK and dV summed in dk, dv (Sk x D). */
static void blk_backward_group(const fai_problem *pr, int64_t b, int64_t hk, blk_ws *w,
                               double *dk, double *dv)
{
    const double scale = pr->score.scale;
    const int64_t dqk = pr->dqk, dvd = pr->dv;
    pack_kv(pr, b, hk, w);
    for (int64_t h = hk * pr->group; h < (hk + 1) * pr->group; h++)
        for (int64_t i0 = 0; i0 < pr->sq; i0 += REF_ROWS) {
            const int64_t n = pr->sq - i0 < REF_ROWS ? pr->sq - i0 : REF_ROWS;
            double lse[REF_ROWS];
            int64_t jlo, jhi;
            key_hull(pr, i0, i0 + n, &jlo, &jhi);
            const int64_t nk = jhi > jlo ? jhi - jlo : 0;
            memset(w->dq, 0, (size_t)(n * dqk) * sizeof(double));
            if (nk > 0) {
                pack_rows(pr, fai_q_row, FAI_Q, b, h, i0, n, dqk, w->q);
                pack_rows(pr, fai_q_row, FAI_DOUT, b, h, i0, n, dvd, w->dout);
                blk_probs(pr, b, h, i0, n, jlo, nk, w, w->pd, w->t, lse);
                const double *vb = w->v + jlo * dvd, *kb = w->k + jlo * dqk;
                /* O = P~ V (recomputed in float64), D_i = dO_i . O_i */
                fai_blas_gemm(1, 0, 0, n, dvd, nk, 1.0, w->pd, nk, vb, dvd, 0.0, w->o, dvd);
                /* dP = dO V^T */
                fai_blas_gemm(1, 0, 1, n, nk, dvd, 1.0, w->dout, dvd, vb, dvd, 0.0, w->dp, nk);
                /* dS = P (dP keep / (1 - p) - D_i), chained through softcap; 0 where P is */
                const fai_dropout drop = fai_dropout_for(pr, b, h);
                for (int64_t r = 0; r < n; r++) {
                    const double Di = dot64(w->dout + r * dvd, w->o + r * dvd, dvd);
                    const double *P = w->s + r * nk;
                    double *g = w->dp + r * nk;
                    if (drop.threshold)
                        fai_dropout_keep_row(&drop, i0 + r, jlo, nk, w->keep);
                    for (int64_t c = 0; c < nk; c++) {
                        const double z = drop.threshold && !w->keep[c] ? 0.0 : pr->keep_scale;
                        g[c] = fai_dscore_f64(P[c], g[c], z, Di, w->t ? w->t[r * nk + c] : 0,
                                              w->t != NULL);
                    }
                }
                /* dV += P~^T dO ; dQ = scale dS K ; dK += scale dS^T Q */
                fai_blas_gemm(1, 1, 0, nk, dvd, n, 1.0, w->pd, nk, w->dout, dvd, 1.0,
                              dv + jlo * dvd, dvd);
                fai_blas_gemm(1, 0, 0, n, dqk, nk, scale, w->dp, nk, kb, dqk, 0.0, w->dq, dqk);
                fai_blas_gemm(1, 1, 0, nk, dqk, n, scale, w->dp, nk, w->q, dqk, 1.0,
                              dk + jlo * dqk, dqk);
            }
            for (int64_t r = 0; r < n; r++)
                fai_store_f64(fai_q_row(pr, FAI_DQ, b, h, i0 + r), pr->dtype, dqk, w->dq + r * dqk);
        }
}

/* ================================================================== entry points */

/* Per-thread workspace: the row path's, the blocked path's, one row of keep flags, one row for
 * the finiteness test, and for the backward the group's dK, dV accumulators. */
typedef struct {
    row_ws row;
    blk_ws blk;
    unsigned char *keep;
    double *finite_row;
    double *dk, *dv;
} ref_ws;

static size_t ref_carve(const fai_problem *pr, int backward, char *base, ref_ws *w)
{
    fai_arena a = {base, 0};
    row_carve(pr, &a, &w->row);
    blk_carve(pr, &a, backward, &w->blk);
    w->keep = fai_carve(&a, (size_t)pr->sk);
    w->finite_row =
        fai_carve(&a, (size_t)(pr->dqk > pr->dv ? pr->dqk : pr->dv) * sizeof(double));
    w->dk = backward ? fai_carve(&a, (size_t)(pr->sk * pr->dqk) * sizeof(double)) : NULL;
    w->dv = backward ? fai_carve(&a, (size_t)(pr->sk * pr->dv) * sizeof(double)) : NULL;
    return a.used;
}

/* What a run of either direction allocates (fai_run_groups): every thread's workspace, and
 * one path flag per (batch, kv head). */
static fa_status ref_need(const fai_problem *pr, int backward, fai_need *need)
{
    ref_ws w;
    need->per = ref_carve(pr, backward, NULL, &w);
    need->shared = (size_t)(pr->b * pr->hk);
    return FA_OK;
}

static fa_status ref_forward_need(const fa_context *ctx, const fai_problem *pr, fai_need *need)
{
    (void)ctx;
    return ref_need(pr, 0, need);
}

static fa_status ref_backward_need(const fa_context *ctx, const fai_problem *pr, fai_need *need)
{
    (void)ctx;
    return ref_need(pr, 1, need);
}

/*
 * fast[b * Hk + hk] = 1 when the blocked path is exact for the group of kv head (b, hk): its
 * K and V (and, for the backward, the group's Q and dO) hold no NaN or inf, and every
 * dimension fits BLAS's int.
 */
static unsigned char *fast_heads(fa_context *ctx, const fai_problem *pr, int backward,
                                 const fai_scratch *sc)
{
    unsigned char *fast = sc->shared;
    const int64_t n = pr->b * pr->hk;
    const int fit = fai_blas_dims_fit(pr);
#pragma omp parallel num_threads(ctx->num_threads)
    {
        ref_ws mine;
        ref_carve(pr, backward, sc->base + (size_t)omp_get_thread_num() * sc->per, &mine);
        double *row = mine.finite_row;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n; t++) {
            const int64_t b = t / pr->hk, hk = t % pr->hk;
            int ok = fit && all_finite(pr, fai_kv_row, FAI_K, b, hk, pr->sk, pr->dqk, row) &&
                     all_finite(pr, fai_kv_row, FAI_V, b, hk, pr->sk, pr->dv, row);
            for (int64_t h = hk * pr->group; backward && ok && h < (hk + 1) * pr->group; h++)
                ok = all_finite(pr, fai_q_row, FAI_Q, b, h, pr->sq, pr->dqk, row) &&
                     all_finite(pr, fai_q_row, FAI_DOUT, b, h, pr->sq, pr->dv, row);
            fast[t] = (unsigned char)ok;
        }
    }
    return fast;
}

static void ref_forward_group(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc)
{
    const unsigned char *fast = fast_heads(ctx, pr, 0, sc);
    const int64_t nblk = (pr->sq + REF_ROWS - 1) / REF_ROWS, tasks = pr->b * pr->hq * nblk;
#pragma omp parallel num_threads(ctx->num_threads)
    {
        ref_ws mine;
        ref_carve(pr, 0, sc->base + (size_t)omp_get_thread_num() * sc->per, &mine);
        /* static: consecutive blocks of one head stay on one thread and reuse its packed K, V */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t blk = task % nblk, h = (task / nblk) % pr->hq,
                          b = task / (nblk * pr->hq);
            const int64_t i0 = blk * REF_ROWS, n = pr->sq - i0 < REF_ROWS ? pr->sq - i0 : REF_ROWS;
            if (fast[b * pr->hk + h / pr->group])
                blk_forward(pr, b, h, i0, n, &mine.blk);
            else
                for (int64_t i = i0; i < i0 + n; i++)
                    row_forward(pr, b, h, i, &mine.row, mine.keep);
        }
    }
}

static void ref_bias_grad(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc);

/*
 * Backward, per (batch, kv head): the group's dK, dV accumulate in float64 over its query heads
 * and rows in a fixed order, so no two threads touch one gradient. out and lse are recomputed
 * here in float64 rather than read: the oracle's gradient is that of the exact function.
 */
static void ref_backward_group(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc)
{
    const unsigned char *fast = fast_heads(ctx, pr, 1, sc);
    const int64_t tasks = pr->b * pr->hk;
#pragma omp parallel num_threads(ctx->num_threads)
    {
        ref_ws mine;
        ref_carve(pr, 1, sc->base + (size_t)omp_get_thread_num() * sc->per, &mine);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t b = task / pr->hk, hk = task % pr->hk;
            memset(mine.dk, 0, (size_t)(pr->sk * pr->dqk) * sizeof(double));
            memset(mine.dv, 0, (size_t)(pr->sk * pr->dv) * sizeof(double));
            if (fast[task])
                blk_backward_group(pr, b, hk, &mine.blk, mine.dk, mine.dv);
            else
                row_backward_group(pr, b, hk, &mine.row, mine.keep, mine.dk, mine.dv);
            for (int64_t j = 0; j < pr->sk; j++) {
                fai_store_f64(fai_kv_row(pr, FAI_DK, b, hk, j), pr->dtype, pr->dqk,
                              mine.dk + j * pr->dqk);
                fai_store_f64(fai_kv_row(pr, FAI_DV, b, hk, j), pr->dtype, pr->dv,
                              mine.dv + j * pr->dv);
            }
        }
    }
    if (pr->bias_grad)
        ref_bias_grad(ctx, pr, sc);
}

/*
 * d loss / d bias, one task per row of the gradient: the sum, in the order (batch, head, row),
 * of the terms of every (b, h, i) that reads that row of the bias (one, or all of a broadcast
 * dim's). Row by row, so NaN and inf in masked places stay out as in the row path.
 */
static void ref_bias_grad(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc)
{
    const fa_tensor *g = pr->bias_grad, *bias = pr->bias;
    const int64_t tasks = g->batch * g->heads * g->seqlen;
#pragma omp parallel num_threads(ctx->num_threads)
    {
        ref_ws mine;
        ref_carve(pr, 1, sc->base + (size_t)omp_get_thread_num() * sc->per, &mine);
        row_ws *w = &mine.row;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t gi = task % g->seqlen, gh = (task / g->seqlen) % g->heads,
                          gb = task / (g->seqlen * g->heads);
            memset(w->dbias, 0, (size_t)pr->sk * sizeof(double));
            const int64_t b0 = bias->batch == 1 ? 0 : gb, b1 = bias->batch == 1 ? pr->b : gb + 1;
            const int64_t h0 = bias->heads == 1 ? 0 : gh, h1 = bias->heads == 1 ? pr->hq : gh + 1;
            const int64_t i0 = bias->seqlen == 1 ? 0 : gi,
                          i1 = bias->seqlen == 1 ? pr->sq : gi + 1;
            for (int64_t b = b0; b < b1; b++)
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t i = i0; i < i1; i++)
                        row_dbias(pr, b, h, i, w, mine.keep);
            fai_store_f64(fai_bias_row_of(g, gb, gh, gi), g->dtype, pr->sk, w->dbias);
        }
    }
}

static fa_status ref_forward_run(fa_context *ctx, const fai_problem *pr)
{
    return fai_run_groups(ctx, pr, 0, "reference", ref_forward_need, ref_forward_group);
}

static fa_status ref_backward_run(fa_context *ctx, const fai_problem *pr)
{
    return fai_run_groups(ctx, pr, 1, "reference", ref_backward_need, ref_backward_group);
}

static fa_status ref_forward(fa_context *ctx, const fai_problem *pr)
{
    return fai_with_serial_blas(ref_forward_run, ctx, pr);
}

static fa_status ref_backward(fa_context *ctx, const fai_problem *pr)
{
    return fai_with_serial_blas(ref_backward_run, ctx, pr);
}

const fai_backend fai_backend_reference = {
    .name = "reference",
    .sequences = 1,
    .ops = {[FAI_OP_FORWARD] = ref_forward, [FAI_OP_BACKWARD] = ref_backward},
};
