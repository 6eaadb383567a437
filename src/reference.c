/*
 * The float64 oracle: DESIGN.md §1 computed literally, one query row at a time, in two passes
 * over the keys (max, then exponentials), everything in double. Never tiled, never reordered
 * for speed: what it computes should be obviously the definition. Rows are independent, so the
 * result does not depend on the number of threads.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "internal.h"

static double dot64(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* Per-thread scratch: a row of scores and their tanh (softcap), keep flags, and rows of q, k,
 * v, o and their gradients. */
typedef struct {
    double *s, *t, *q, *kv, *o, *dout, *dq;
    unsigned char *keep;
} ref_scratch;

static size_t scratch_doubles(const fai_problem *pr)
{
    return (size_t)(2 * pr->sk + 2 * pr->dqk + 2 * pr->dv + (pr->dqk > pr->dv ? pr->dqk : pr->dv));
}

static void scratch_carve(const fai_problem *pr, double *base, unsigned char *keep,
                          ref_scratch *w)
{
    w->s = base;
    w->t = w->s + pr->sk;
    w->q = w->t + pr->sk;
    w->dq = w->q + pr->dqk;
    w->o = w->dq + pr->dqk;
    w->dout = w->o + pr->dv;
    w->kv = w->dout + pr->dv; /* one row of k or v, whichever is longer */
    w->keep = keep;
}

/*
 * Steps 1-5 of §1 for row i of (b, h): fills w->s[j] (and w->t[j]) for allowed j in [*lo, *hi)
 * and returns LSE_i; -inf for an empty row (no allowed key, or all allowed scores -inf).
 * Also fills w->keep for the allowed keys when dropout is on.
 */
static double score_row(const fai_problem *pr, int64_t b, int64_t h, int64_t i, ref_scratch *w,
                        int64_t *lo, int64_t *hi)
{
    const int64_t hk = h / pr->group;
    const double slope = fai_slope(pr, h);
    fai_mask_row(&pr->mask, i, lo, hi);
    fai_load_f64(fai_row(pr->io.q, b, i, h), pr->dtype, pr->dqk, w->q);
    double mx = -INFINITY;
    int has_nan = 0;
    for (int64_t j = *lo; j < *hi; j++) {
        fai_load_f64(fai_row(pr->io.k, b, j, hk), pr->dtype, pr->dqk, w->kv);
        w->s[j] = fai_score_f64(&pr->score, dot64(w->q, w->kv, pr->dqk), slope, i, j, &w->t[j]);
        if (w->s[j] > mx)
            mx = w->s[j];
        has_nan |= isnan(w->s[j]);
    }
    if (pr->drop_threshold && *lo < *hi) {
        fai_dropout d = fai_dropout_for(pr, b, h);
        fai_dropout_keep_row(&d, i, *lo, *hi - *lo, w->keep + *lo);
    }
    if (has_nan)
        return NAN;
    if (mx == -INFINITY)
        return -INFINITY;
    double sum = 0;
    for (int64_t j = *lo; j < *hi; j++)
        sum += exp(w->s[j] - mx);
    return mx + log(sum);
}

static int kept(const fai_problem *pr, const ref_scratch *w, int64_t j)
{
    return !pr->drop_threshold || w->keep[j];
}

/* O_i = sum_{allowed, kept j} exp(s_j - LSE) / (1 - p) v_j, into w->o (0 for an empty row). */
static void output_row(const fai_problem *pr, int64_t b, int64_t h, int64_t i, double lse,
                       int64_t lo, int64_t hi, ref_scratch *w)
{
    const int64_t hk = h / pr->group;
    const double inv_keep = 1.0 / (1.0 - pr->dropout_p);
    memset(w->o, 0, (size_t)pr->dv * sizeof(double));
    if (lse == -INFINITY)
        return;
    for (int64_t j = lo; j < hi; j++) {
        if (!kept(pr, w, j)) /* dropped by selection, like masked keys */
            continue;
        double pt = exp(w->s[j] - lse) * inv_keep;
        fai_load_f64(fai_row(pr->io.v, b, j, hk), pr->dtype, pr->dv, w->kv);
        for (int64_t d = 0; d < pr->dv; d++)
            w->o[d] += pt * w->kv[d];
    }
}

static fa_status alloc_scratch(fa_context *ctx, const fai_problem *pr, size_t extra_doubles,
                               int nt, double **base, unsigned char **keep, size_t *bytes,
                               size_t *per_thread)
{
    size_t per = scratch_doubles(pr) + extra_doubles, total, kb;
    if (!fai_mul_size(per, sizeof(double), &per) || !fai_mul_size(per, (size_t)nt, &total) ||
        !fai_mul_size((size_t)pr->sk, (size_t)nt, &kb) || total + kb < total)
        return fai_fail(FA_ERR_OVERFLOW, "reference: scratch size overflows");
    *base = fai_alloc(ctx, total + kb);
    if (!*base)
        return fai_fail(FA_ERR_NO_MEMORY, "reference: %zu bytes of scratch", total + kb);
    *keep = (unsigned char *)*base + total;
    *bytes = total + kb;
    *per_thread = per / sizeof(double);
    return FA_OK;
}

static fa_status ref_forward(fa_context *ctx, const fai_problem *pr)
{
    const int nt = ctx->num_threads;
    double *base;
    unsigned char *keep;
    size_t bytes, per;
    fa_status st = alloc_scratch(ctx, pr, 0, nt, &base, &keep, &bytes, &per);
    if (st != FA_OK)
        return st;
    const int64_t rows = pr->b * pr->hq * pr->sq;
#pragma omp parallel num_threads(nt)
    {
        ref_scratch w;
        int tid = omp_get_thread_num();
        scratch_carve(pr, base + (size_t)tid * per, keep + (size_t)tid * (size_t)pr->sk, &w);
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = r % pr->sq, h = (r / pr->sq) % pr->hq, b = r / (pr->sq * pr->hq);
            int64_t lo, hi;
            double lse = score_row(pr, b, h, i, &w, &lo, &hi);
            output_row(pr, b, h, i, lse, lo, hi, &w);
            fai_store_f64(fai_row(pr->io.out, b, i, h), pr->dtype, pr->dv, w.o);
            if (pr->io.lse)
                fai_lse_store(pr->io.lse, b, h, i, lse);
        }
    }
    fai_free(ctx, base, bytes);
    return FA_OK;
}

/*
 * Backward, per (batch, kv head): the group's dK, dV accumulate in float64 over its query heads
 * and rows in a fixed order, so no two threads touch one gradient. out and lse are recomputed
 * here in float64 rather than read: the oracle's gradient is that of the exact function.
 */
static fa_status ref_backward(fa_context *ctx, const fai_problem *pr)
{
    const int nt = ctx->num_threads;
    const size_t kv_acc = (size_t)(pr->sk * (pr->dqk + pr->dv));
    double *base;
    unsigned char *keep;
    size_t bytes, per;
    fa_status st = alloc_scratch(ctx, pr, kv_acc, nt, &base, &keep, &bytes, &per);
    if (st != FA_OK)
        return st;
    const double inv_keep = 1.0 / (1.0 - pr->dropout_p), scale = pr->score.scale;
    const int64_t tasks = pr->b * pr->hk;
#pragma omp parallel num_threads(nt)
    {
        ref_scratch w;
        int tid = omp_get_thread_num();
        double *mine = base + (size_t)tid * per;
        scratch_carve(pr, mine + kv_acc, keep + (size_t)tid * (size_t)pr->sk, &w);
        double *dk = mine, *dv = mine + pr->sk * pr->dqk;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t b = task / pr->hk, hk = task % pr->hk;
            memset(mine, 0, kv_acc * sizeof(double));
            for (int64_t h = hk * pr->group; h < (hk + 1) * pr->group; h++) {
                for (int64_t i = 0; i < pr->sq; i++) {
                    int64_t lo, hi;
                    double lse = score_row(pr, b, h, i, &w, &lo, &hi);
                    memset(w.dq, 0, (size_t)pr->dqk * sizeof(double));
                    if (lse != -INFINITY) {
                        output_row(pr, b, h, i, lse, lo, hi, &w);
                        fai_load_f64(fai_row(pr->io.dout, b, i, h), pr->dtype, pr->dv, w.dout);
                        const double Di = dot64(w.dout, w.o, pr->dv);
                        for (int64_t j = lo; j < hi; j++) {
                            const double P = exp(w.s[j] - lse);
                            const double z = kept(pr, &w, j) ? inv_keep : 0.0;
                            fai_load_f64(fai_row(pr->io.v, b, j, hk), pr->dtype, pr->dv, w.kv);
                            const double dP = dot64(w.dout, w.kv, pr->dv) * z;
                            if (z != 0)
                                for (int64_t d = 0; d < pr->dv; d++)
                                    dv[j * pr->dv + d] += P * z * w.dout[d];
                            double dS = P * (dP - Di);
                            if (pr->score.softcap > 0)
                                dS *= 1.0 - w.t[j] * w.t[j];
                            fai_load_f64(fai_row(pr->io.k, b, j, hk), pr->dtype, pr->dqk, w.kv);
                            for (int64_t d = 0; d < pr->dqk; d++) {
                                w.dq[d] += scale * dS * w.kv[d];
                                dk[j * pr->dqk + d] += scale * dS * w.q[d];
                            }
                        }
                    }
                    fai_store_f64(fai_row(pr->io.dq, b, i, h), pr->dtype, pr->dqk, w.dq);
                }
            }
            for (int64_t j = 0; j < pr->sk; j++) {
                fai_store_f64(fai_row(pr->io.dk, b, j, hk), pr->dtype, pr->dqk, dk + j * pr->dqk);
                fai_store_f64(fai_row(pr->io.dv, b, j, hk), pr->dtype, pr->dv, dv + j * pr->dv);
            }
        }
    }
    fai_free(ctx, base, bytes);
    return FA_OK;
}

const fai_backend fai_backend_reference = {ref_forward, ref_backward};
