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
    case FA_E5M2:
    case FA_Q8_0:
    case FA_Q4_0: break; /* refused before: no output has them */
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

/*
 * One pass over x against ref (same shape), elements where both are finite: the max error and
 * where it is, NaN/inf mismatches, and the sums the statistics need (docs/DESIGN.md §4), with
 * e = x - ref: sum e, sum |ref|, sum ref, sum ref^2, sum e^2, sum e ref, and over rows (b, s, h)
 * the products of the row's sums (a row's errors may be correlated: it shares its softmax
 * denominator), for the statistics' standard errors with rows as clusters: with E = sum e,
 * A = sum |ref|, F = sum e ref, G = sum ref^2 over a row, the sums over rows of E^2, E A,
 * A^2, F^2, F G and G^2.
 */
typedef struct {
    double max_abs, max_rel, ref_max; /* ref_max: where both are finite */
    double ref_top;                   /* max |ref| over ref's finite elements */
    int64_t worst[4];
    double worst_x, worst_ref;
    int64_t nonfinite, first_bad[4];
    double bad_x, bad_ref;
    int explicit_ok;
    double n, sum_e, sum_absr, sum_r, sum_rr, sum_ee, sum_er;
    double rows, ee, ea, aa, ff, fg, gg; /* over rows (with finite elements) */
} scan;

static void scan_tensor(const fa_tensor *x, const fa_tensor *ref, const fa_tolerance *explicit_tol,
                        scan *r)
{
    memset(r, 0, sizeof *r);
    r->explicit_ok = 1;
    double xs[CHUNK], rs[CHUNK];
    for (int64_t b = 0; b < ref->batch; b++)
        for (int64_t s = 0; s < ref->seqlen; s++)
            for (int64_t h = 0; h < ref->heads; h++) {
                double re = 0, ra = 0, rf = 0, rg = 0, rn = 0; /* the row's E, A, F, G, count */
                for (int64_t d = 0; d < ref->headdim; d++) {
                    const int64_t i = d % CHUNK;
                    if (i == 0) {
                        chunk(x, b, s, h, d, ref->headdim - d, xs);
                        chunk(ref, b, s, h, d, ref->headdim - d, rs);
                    }
                    const double c = xs[i], v = rs[i];
                    const int64_t at[4] = {b, s, h, d};
                    if (isfinite(v) && fabs(v) > r->ref_top)
                        r->ref_top = fabs(v);
                    if (!isfinite(c) || !isfinite(v)) {
                        if (!same_nonfinite(c, v) && r->nonfinite++ == 0) {
                            memcpy(r->first_bad, at, sizeof at);
                            r->bad_x = c, r->bad_ref = v;
                        }
                        continue;
                    }
                    const double e = c - v, ae = fabs(e);
                    r->ref_max = fabs(v) > r->ref_max ? fabs(v) : r->ref_max;
                    if (v != 0 && ae / fabs(v) > r->max_rel)
                        r->max_rel = ae / fabs(v);
                    if (explicit_tol && ae > explicit_tol->atol + explicit_tol->rtol * fabs(v))
                        r->explicit_ok = 0;
                    if (ae > r->max_abs) {
                        r->max_abs = ae;
                        memcpy(r->worst, at, sizeof at);
                        r->worst_x = c, r->worst_ref = v;
                    }
                    r->n += 1;
                    r->sum_e += e, r->sum_absr += fabs(v), r->sum_r += v, r->sum_rr += v * v;
                    r->sum_ee += e * e, r->sum_er += e * v;
                    re += e, ra += fabs(v), rf += e * v, rg += v * v, rn++;
                }
                r->rows += rn > 0;
                r->ee += re * re, r->ea += re * ra, r->aa += ra * ra;
                r->ff += rf * rf, r->fg += rf * rg, r->gg += rg * rg;
            }
}

/* The statistics of a scan: bias sum e / sum |ref|; the least-squares scale's deviation
 * sum e ref / sum ref^2 (scale - 1); the RMS error; the decorrelation 1 - corr(x, ref). */
static double bias_of(const scan *r) { return r->sum_absr > 0 ? r->sum_e / r->sum_absr : 0; }
static double scale_dev_of(const scan *r) { return r->sum_rr > 0 ? r->sum_er / r->sum_rr : 0; }

/*
 * The standard errors of bias and scale - 1, rows as clusters: a ratio b = sum_r N_r / sum_r
 * M_r over R rows has residuals N_r - b M_r, and se(b) = sqrt(R / (R - 1) sum_r (N_r -
 * b M_r)^2) / sum_r M_r (what is left of the errors once the statistic's own systematic part
 * is taken out, so a large systematic error does not widen its own bound; R / (R - 1) for
 * the degree of freedom b takes). One row leaves no residual to measure: 0, and the bound is
 * the dtype's margin and the yardstick's term alone.
 */
static double cluster_se(double b, double nn, double nm, double mm, double m, double rows)
{
    const double v = nn - 2 * b * nm + b * b * mm;
    return m > 0 && rows > 1 ? sqrt(rows / (rows - 1) * (v > 0 ? v : 0)) / m : 0;
}
static double bias_se(const scan *r)
{
    return cluster_se(bias_of(r), r->ee, r->ea, r->aa, r->sum_absr, r->rows);
}
static double scale_se(const scan *r)
{
    return cluster_se(scale_dev_of(r), r->ff, r->fg, r->gg, r->sum_rr, r->rows);
}

/* n var(ref): the centred sum of squares of ref. */
static double ref_ss(const scan *r)
{
    return r->n > 0 ? r->sum_rr - r->sum_r * r->sum_r / r->n : 0;
}
static double rms_of(const scan *r) { return r->n > 0 ? sqrt(r->sum_ee / r->n) : 0; }

/*
 * 1 - corr(x, ref) without the cancellation of 1 - (a computed corr): with x = ref + e and
 * tildes for centred vectors, a = e~.ref~ / |ref~|^2 and q = |e~|^2 / |ref~|^2,
 *     corr = (1 + a) / sqrt(1 + 2a + q),
 *     1 - corr = (q - a^2) / (t (t + 1 + a)),  t = sqrt(1 + 2a + q),
 * where q - a^2 >= 0 (Cauchy-Schwarz). 0 for a constant ref (no correlation to speak of).
 */
static double decorr_of(const scan *r)
{
    if (r->n < 2)
        return 0;
    const double mr = r->sum_r / r->n, me = r->sum_e / r->n;
    const double rr = ref_ss(r), ee = r->sum_ee - r->n * me * me, er = r->sum_er - r->n * me * mr;
    if (!(rr > 0))
        return 0;
    const double a = er / rr, q = ee / rr, num = q - a * a > 0 ? q - a * a : 0;
    const double t = sqrt(1 + 2 * a + q > 0 ? 1 + 2 * a + q : 0);
    /* t (t + 1 + a) = 0: corr = -1 exactly (t > 0: 1 - corr = 2), or x constant (t = 0) */
    return t * (t + 1 + a) > 0 ? num / (t * (t + 1 + a)) : t > 0 ? 2 : 1;
}

/*
 * The statistics' margin for a dtype's systematic error, in units of its unit roundoff
 * u = eps / 2 (docs/DESIGN.md §4): a quarter of u for the 16-bit dtypes (rounding to nearest
 * is unbiased; truncation is biased by about u), 4 u for f32 and 64 u for f64, whose honest
 * kernels' own biases (an exp polynomial's, a summation's) are not below their storage's.
 * `kNoise`: the noise allowance in standard deviations of the statistic.
 */
static double stat_tau(fa_dtype d)
{
    return d == FA_F64 ? 64 : d == FA_F32 ? 4 : 0.25;
}
enum { kNoise = 6 };

/* fa_compare's verdict once its arguments are checked. */
static void verdict(const fa_tensor *cand, const fa_tensor *ref, const fa_tensor *baseline,
                    const fa_tolerance *tol, int explicit_rule, fa_comparison *r)
{
    memset(r, 0, sizeof *r);
    scan c;
    scan_tensor(cand, ref, explicit_rule ? tol : NULL, &c);
    r->max_abs = c.max_abs, r->max_rel = c.max_rel, r->ref_max = c.ref_top;
    if (c.nonfinite) { /* worst names the first mismatch */
        r->nonfinite_mismatches = c.nonfinite;
        memcpy(r->worst, c.first_bad, sizeof r->worst);
        r->worst_cand = c.bad_x, r->worst_ref = c.bad_ref;
    } else {
        memcpy(r->worst, c.worst, sizeof r->worst);
        r->worst_cand = c.worst_x, r->worst_ref = c.worst_ref;
    }
    r->nmse = c.sum_rr > 0 ? c.sum_ee / c.sum_rr : c.sum_ee > 0 ? INFINITY : 0;
    r->bias = bias_of(&c), r->scale = 1 + scale_dev_of(&c), r->rms = rms_of(&c);
    r->decorr = decorr_of(&c);
    r->bias_bound = r->scale_bound = r->rms_bound = r->decorr_bound = INFINITY;
    if (explicit_rule) {
        r->bound = tol->atol + tol->rtol * fabs(r->worst_ref); /* at the worst element */
        r->failed = c.explicit_ok && c.nonfinite == 0 ? 0 : FA_CMP_MAX;
        r->pass = r->failed == 0;
        snprintf(r->rule, sizeof r->rule,
                 "explicit: |cand - ref| <= %g + %g |ref| for every element; NaN/inf must match",
                 tol->atol, tol->rtol);
        return;
    }
    const double factor = tol->factor > 0 ? tol->factor : 2;
    /* the floor's dtype: the coarser of the candidate file's and the yardstick's (a kernel's
     * storage dtype: an f32 kernel's output saved as f64 and judged against f32 has f32's) */
    const fa_dtype floor_dt = eps_of(baseline->dtype) > eps_of(cand->dtype) ? baseline->dtype
                                                                            : cand->dtype;
    const double floor_eps = floor_dt == FA_F64 ? 64 * eps_of(FA_F64) : eps_of(floor_dt);
    const double floor = floor_eps * (c.ref_max > 1 ? c.ref_max : 1);
    scan y;
    scan_tensor(baseline, ref, NULL, &y);
    r->baseline_err = y.max_abs;
    const double allow = tol->allowance + tol->allowance_rel * c.ref_max;
    r->bound = factor * r->baseline_err + floor + allow;
    if (r->max_abs > r->bound || c.nonfinite)
        r->failed |= FA_CMP_MAX;
    if (!tol->max_only) {
        /* docs/DESIGN.md §4: each statistic within `factor` times the baseline's, plus the
         * dtype's margin (bias, scale) or floor (RMS, decorrelation), plus kNoise standard
         * deviations of its own noise (bias, scale) */
        /* the storage dtype's margin, the yardstick's (a bf16 kernel's output saved as f32
         * is held to bf16's) */
        const double tu = stat_tau(baseline->dtype) * eps_of(baseline->dtype) / 2;
        /* eps at the largest |ref| (not at 1, as the max rule's: small outputs, the mean of
         * many values, keep their resolution), eps where ref is all 0 */
        const double rms_floor = floor_eps * (c.ref_max > 0 ? c.ref_max : 1) + allow;
        /* tol's allowance as a shift of every element by `allow`: the bias moves by allow n /
         * sum |ref|, the scale by allow sum ref / sum ref^2, at most allow sum |ref| / sum ref^2 */
        const double allow_bias = c.sum_absr > 0 ? allow * c.n / c.sum_absr : 0;
        const double allow_scale = c.sum_rr > 0 ? allow * c.sum_absr / c.sum_rr : 0;
        r->bias_bound = tu + factor * fabs(bias_of(&y)) + kNoise * bias_se(&c) + allow_bias;
        r->scale_bound = tu + factor * fabs(scale_dev_of(&y)) + kNoise * scale_se(&c) + allow_scale;
        r->rms_bound = factor * rms_of(&y) + rms_floor;
        const double rr = ref_ss(&c);
        r->decorr_bound = factor * factor * decorr_of(&y) +
                          (rr > 0 ? rms_floor * rms_floor * c.n / rr / 2 : 0);
        if (fabs(r->bias) > r->bias_bound)
            r->failed |= FA_CMP_BIAS;
        if (fabs(r->scale - 1) > r->scale_bound)
            r->failed |= FA_CMP_SCALE;
        if (r->rms > r->rms_bound)
            r->failed |= FA_CMP_RMS;
        if (r->decorr > r->decorr_bound)
            r->failed |= FA_CMP_DECORR;
    }
    r->pass = r->failed == 0;
    char extra[48] = "", rule[320];
    if (allow > 0)
        snprintf(extra, sizeof extra, " + %.3g (allowance)", allow);
    snprintf(rule, sizeof rule,
             "flash: max|cand - ref| <= %g x %.3g (conventional %s error) + %.3g (%s floor)%s = "
             "%.3g; NaN/inf must match%s",
             factor, r->baseline_err, fa_dtype_name(baseline->dtype), floor,
             fa_dtype_name(floor_dt), extra, r->bound,
             tol->max_only ? "" : "; bias, scale, RMS, decorrelation (§4)");
    /* into fa_comparison.rule, cut at its size (about 180 characters at the longest) */
    const size_t len = strnlen(rule, sizeof r->rule - 1);
    memcpy(r->rule, rule, len);
    r->rule[len] = '\0';
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
    const fa_tolerance dflt = {2, 0, 0, 0, 0, 0};
    if (!tol)
        tol = &dflt;
    const int explicit_rule = tol->atol > 0 || tol->rtol > 0;
    if (!(tol->atol >= 0) || !(tol->rtol >= 0) || !(tol->factor >= 0) || isinf(tol->factor))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "fa_compare: tolerance atol %g, rtol %g, factor %g must be finite and >= 0",
                        tol->atol, tol->rtol, tol->factor);
    if (!(tol->allowance >= 0) || isinf(tol->allowance) || !(tol->allowance_rel >= 0) ||
        isinf(tol->allowance_rel))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "fa_compare: tolerance allowance %g, allowance_rel %g must be finite and "
                        ">= 0",
                        tol->allowance, tol->allowance_rel);
    if (!explicit_rule && !baseline)
        return fai_fail(FA_ERR_NULL_POINTER,
                        "fa_compare: baseline is NULL; the default rule needs the conventional "
                        "path's output (or give atol/rtol)");

    verdict(cand, ref, baseline, tol, explicit_rule, r);
    return FA_OK;
}
