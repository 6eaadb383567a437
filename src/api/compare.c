/*
 * fa_compare: the tolerance rule of docs/DESIGN.md §4, shared by `flashattn check` and the tests.
 * Everything is read through float64, in (batch, seq, head, dim) order, each row in chunks.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "base/dtype.h"

static double eps_of(fa_dtype d)
{
    switch (d) {
    case FA_F64: return 0x1p-52;
    case FA_F32: return 0x1p-23;
    case FA_F16: return 0x1p-10;
    case FA_BF16: return 0x1p-7;
    case FA_BOOL:
    case FA_E4M3:
    case FA_E5M2: break; /* refused before: no output has them */
    }
    return 1;
}

/* Elements [d0, d0 + min(left, CHUNK)) of row (b, s, h) of t, through float64: rows are read
 * in chunks, not element by element (a call per element took a quarter of the test sweep's
 * time under qemu). */
enum { CHUNK = 64 };
static void chunk(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d0, int64_t left,
                  double *out)
{
    const int64_t n = left < CHUNK ? left : CHUNK;
    fai_load_f64((const char *)fai_row(t, b, s, h) + d0 * (int64_t)fai_dtype_size(t->dtype),
                 t->dtype, n, out);
}

/* Both non-finite the same way (NaN with NaN, +inf with +inf, -inf with -inf). */
static int same_nonfinite(double a, double r)
{
    return (isnan(a) && isnan(r)) || (isinf(a) && a == r);
}

static fa_status same_shape(const fa_tensor *a, const char *an, const fa_tensor *b)
{
    if (a->batch == b->batch && a->seqlen == b->seqlen && a->heads == b->heads &&
        a->headdim == b->headdim)
        return FA_OK;
    return fai_fail(FA_ERR_SHAPE,
                    "fa_compare: %s is %lldx%lldx%lldx%lld but ref is %lldx%lldx%lldx%lld", an,
                    (long long)a->batch, (long long)a->seqlen, (long long)a->heads,
                    (long long)a->headdim, (long long)b->batch, (long long)b->seqlen,
                    (long long)b->heads, (long long)b->headdim);
}

/* max |x - ref| over elements where both are finite. */
static double max_err(const fa_tensor *x, const fa_tensor *ref)
{
    double m = 0, xs[CHUNK], rs[CHUNK];
    for (int64_t b = 0; b < ref->batch; b++)
        for (int64_t s = 0; s < ref->seqlen; s++)
            for (int64_t h = 0; h < ref->heads; h++)
                for (int64_t d = 0; d < ref->headdim; d++) {
                    const int64_t i = d % CHUNK;
                    if (i == 0) {
                        chunk(x, b, s, h, d, ref->headdim - d, xs);
                        chunk(ref, b, s, h, d, ref->headdim - d, rs);
                    }
                    const double e = fabs(xs[i] - rs[i]);
                    if (e > m && isfinite(e))
                        m = e;
                }
    return m;
}

fa_status fa_compare(const fa_tensor *cand, const fa_tensor *ref, const fa_tensor *baseline,
                     const fa_tolerance *tol, fa_comparison *r)
{
    if (!cand || !ref || !r)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_compare: %s is NULL",
                        !cand ? "cand" : !ref ? "ref" : "result");
    const fa_tensor *ts[3] = {cand, ref, baseline};
    const char *names[3] = {"cand", "ref", "baseline"};
    for (int i = 0; i < 3; i++) {
        if (!ts[i])
            continue;
        if ((unsigned)ts[i]->dtype > FA_BF16)
            return fai_fail(FA_ERR_DTYPE, "fa_compare: %s->dtype is not a fa_dtype", names[i]);
        if (ts[i]->batch < 0 || ts[i]->seqlen < 0 || ts[i]->heads < 0 || ts[i]->headdim < 0)
            return fai_fail(FA_ERR_SHAPE, "fa_compare: %s has a negative dimension", names[i]);
        if (!ts[i]->data && ts[i]->batch * ts[i]->seqlen * ts[i]->heads * ts[i]->headdim > 0)
            return fai_fail(FA_ERR_NULL_POINTER, "fa_compare: %s->data is NULL", names[i]);
    }
    fa_status st = same_shape(cand, "cand", ref);
    if (st == FA_OK && baseline)
        st = same_shape(baseline, "baseline", ref);
    if (st != FA_OK)
        return st;
    const fa_tolerance dflt = {2, 0, 0};
    if (!tol)
        tol = &dflt;
    const int explicit_rule = tol->atol > 0 || tol->rtol > 0;
    if (!(tol->atol >= 0) || !(tol->rtol >= 0) || !(tol->factor >= 0) || isinf(tol->factor))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "fa_compare: tolerance atol %g, rtol %g, factor %g must be finite and >= 0",
                        tol->atol, tol->rtol, tol->factor);
    if (!explicit_rule && !baseline)
        return fai_fail(FA_ERR_NULL_POINTER,
                        "fa_compare: baseline is NULL; the default rule needs the conventional "
                        "path's output (or give atol/rtol)");

    memset(r, 0, sizeof *r);
    double sum_e2 = 0, sum_r2 = 0, ref_max = 0, worst_c = 0, worst_x = 0;
    int64_t worst_at[4] = {0, 0, 0, 0};
    int explicit_ok = 1;
    double cs[CHUNK], xs[CHUNK];
    for (int64_t b = 0; b < ref->batch; b++)
        for (int64_t s = 0; s < ref->seqlen; s++)
            for (int64_t h = 0; h < ref->heads; h++)
                for (int64_t d = 0; d < ref->headdim; d++) {
                    const int64_t i = d % CHUNK;
                    if (i == 0) {
                        chunk(cand, b, s, h, d, ref->headdim - d, cs);
                        chunk(ref, b, s, h, d, ref->headdim - d, xs);
                    }
                    const double c = cs[i], x = xs[i];
                    const int64_t at[4] = {b, s, h, d};
                    if (!isfinite(c) || !isfinite(x)) {
                        if (!same_nonfinite(c, x) && r->nonfinite_mismatches++ == 0) {
                            memcpy(r->worst, at, sizeof at); /* the first mismatch */
                            r->worst_cand = c, r->worst_ref = x;
                        }
                        continue;
                    }
                    const double e = fabs(c - x);
                    ref_max = fabs(x) > ref_max ? fabs(x) : ref_max;
                    sum_e2 += e * e;
                    sum_r2 += x * x;
                    if (x != 0 && e / fabs(x) > r->max_rel)
                        r->max_rel = e / fabs(x);
                    if (explicit_rule && e > tol->atol + tol->rtol * fabs(x))
                        explicit_ok = 0;
                    if (e > r->max_abs) {
                        r->max_abs = e;
                        memcpy(worst_at, at, sizeof at);
                        worst_c = c, worst_x = x;
                    }
                }
    if (r->nonfinite_mismatches == 0) { /* else worst already names the first mismatch */
        memcpy(r->worst, worst_at, sizeof worst_at);
        r->worst_cand = worst_c, r->worst_ref = worst_x;
    }
    r->nmse = sum_r2 > 0 ? sum_e2 / sum_r2 : sum_e2 > 0 ? INFINITY : 0;
    if (explicit_rule) {
        r->bound = tol->atol + tol->rtol * fabs(r->worst_ref); /* at the worst element */
        r->pass = explicit_ok && r->nonfinite_mismatches == 0;
        snprintf(r->rule, sizeof r->rule,
                 "explicit: |cand - ref| <= %g + %g |ref| for every element; NaN/inf must match",
                 tol->atol, tol->rtol);
        return FA_OK;
    }
    const double factor = tol->factor > 0 ? tol->factor : 2;
    const double floor_eps = cand->dtype == FA_F64 ? 64 * eps_of(FA_F64) : eps_of(cand->dtype);
    const double floor = floor_eps * (ref_max > 1 ? ref_max : 1);
    r->baseline_err = max_err(baseline, ref);
    r->bound = factor * r->baseline_err + floor;
    r->pass = r->max_abs <= r->bound && r->nonfinite_mismatches == 0;
    snprintf(r->rule, sizeof r->rule,
             "flash: max|cand - ref| <= %g x %.3g (conventional %s error) + %.3g (%s floor) = "
             "%.3g; NaN/inf must match",
             factor, r->baseline_err, fa_dtype_name(baseline->dtype), floor,
             fa_dtype_name(cand->dtype), r->bound);
    return FA_OK;
}
