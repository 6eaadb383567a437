/*
 * The conventional path, kept to be measured against: S = scale Q K^T and P = softmax(S) are
 * materialized for every (batch, head) at once, through OpenBLAS GEMMs, and every intermediate
 * is rounded to the storage dtype T after each step, as a framework's unfused path does
 * (GEMMs accumulate in f32, or f64 for f64 storage; softmax reduces in the same type).
 *
 * Its memory grows as B H Sq Sk; its error is the yardstick of the tolerance rule
 * (docs/DESIGN.md §4). One deliberate difference from the fused paths, inherited from the GEMM
 * formulation: masked and dropped probabilities are exact zeros that are *multiplied* with V
 * (and K, Q in the backward), so a NaN or inf in a masked-out row of K or V can reach the
 * output here. Its softmax backward is a framework's too (D_i summed over the row's dP z P,
 * every step rounded to T), not core/gradient.h's formula; but its P is recomputed from the
 * LSE given, as every backward that takes one does (softmax(), LSE_READ), where a framework
 * keeps the forward's P: a hybrid, so that the yardstick rounds P as the kernels it judges do.
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

#define CONV_ROWS 64 /* query rows per GEMM block: bounds the f32 staging of f16/bf16 tiles */

typedef struct {
    const fai_problem *pr;
    fa_dtype t;   /* storage dtype of S, P, dP */
    fa_dtype pt;  /* what P is rounded to before P V: t, or V's format for FP8 inputs */
    int wide;     /* compute in double (f64 storage) rather than float */
    size_t cs;    /* compute element size */
    size_t ts;    /* storage element size */
    int nt;
} conv;

static double round_as(fa_dtype t, double x)
{
    switch (t) {
    case FA_F64: return x;
    case FA_F32: return (float)x;
    case FA_F16: return fai_f16_to_f64(fai_f64_to_f16(x));
    case FA_BF16: return fai_bf16_to_f64(fai_f64_to_bf16(x));
    case FA_E4M3: return fai_e4m3_to_f64(fai_f64_to_e4m3(x));
    case FA_E5M2: return fai_e5m2_to_f64(fai_f64_to_e5m2(x));
    case FA_BOOL:
    case FA_Q8_0:
    case FA_Q4_0: break; /* no storage of S, P or dP (a block format is a cache's only) */
    }
    return x;
}

static double round_t(const conv *cv, double x) { return round_as(cv->t, x); }

static void gemm(const conv *cv, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                 int64_t ldc)
{
    fai_blas_gemm(cv->wide, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* Where the rows of a role's tensor are: fai_q_row (query side) or fai_kv_row (key side). */
typedef void *(*rows_at)(const fai_problem *, fai_role, int64_t, int64_t, int64_t);

/* Packs rows [0, n) of head h of batch b of role r (dim columns) into dst, compute type. */
static void pack(const conv *cv, rows_at at, fai_role r, int64_t b, int64_t h, int64_t n,
                 int64_t dim, void *dst)
{
    for (int64_t s = 0; s < n; s++) {
        void *row = (char *)dst + (size_t)(s * dim) * cv->cs;
        if (cv->wide)
            fai_load_f64(at(cv->pr, r, b, h, s), fai_role_dtype(cv->pr, r), dim, row);
        else
            fai_load_f32(at(cv->pr, r, b, h, s), fai_role_dtype(cv->pr, r), dim, row);
    }
}

/* Stores n compute-type rows (dim columns) from src as rows [r0, r0 + n) of head h of role r. */
static void unpack(const conv *cv, rows_at at, fai_role r, int64_t b, int64_t h, int64_t r0,
                   int64_t n, int64_t dim, const void *src)
{
    for (int64_t s = 0; s < n; s++) {
        const void *row = (const char *)src + (size_t)(s * dim) * cv->cs;
        if (cv->wide)
            fai_store_f64(at(cv->pr, r, b, h, r0 + s), fai_role_dtype(cv->pr, r), dim, row);
        else
            fai_store_f32(at(cv->pr, r, b, h, r0 + s), fai_role_dtype(cv->pr, r), dim, row);
    }
}

/* Rows [r0, r0 + n) of a T matrix with `cols` columns as a compute-type matrix: the storage
 * itself when T is the compute type, else converted into `stage`. */
static const void *as_compute(const conv *cv, const void *mat, int64_t r0, int64_t n,
                              int64_t cols, void *stage)
{
    const char *src = (const char *)mat + (size_t)(r0 * cols) * cv->ts;
    if (cv->ts == cv->cs)
        return src;
    fai_load_f32(src, cv->t, n * cols, stage);
    return stage;
}

/* Where a GEMM writes rows [r0, r0 + n) of a T matrix: in place, or `stage` then commit(). */
static void *gemm_target(const conv *cv, void *mat, int64_t r0, int64_t cols, void *stage)
{
    return cv->ts == cv->cs ? (char *)mat + (size_t)(r0 * cols) * cv->ts : stage;
}

static void commit(const conv *cv, void *mat, int64_t r0, int64_t n, int64_t cols,
                   const void *stage)
{
    if (cv->ts != cv->cs)
        fai_store_f32((char *)mat + (size_t)(r0 * cols) * cv->ts, cv->t, n * cols, stage);
}

typedef struct {
    void *qp, *kp, *vp, *dop; /* packed Q, K, V, and dO (backward only)                  */
    void *stage, *stage2;     /* CONV_ROWS x max(Sk, D) and CONV_ROWS x D staging blocks */
    void *dk, *dv;            /* backward: a kv head's dK, dV accumulators               */
    double *row[3];           /* one row of S, P, dP (or tanh) widened to double         */
    unsigned char *keep;      /* one row of dropout decisions                            */
} conv_pack;

/* Row i of a T matrix with Sk columns, widened to double, and its store (values already
 * rounded to T by round_t, so the store is exact). */
static void row_load(const conv *cv, const void *mat, int64_t i, double *dst)
{
    fai_load_f64((const char *)mat + (size_t)(i * cv->pr->sk) * cv->ts, cv->t, cv->pr->sk, dst);
}

static void row_store(const conv *cv, void *mat, int64_t i, const double *src)
{
    fai_store_f64((char *)mat + (size_t)(i * cv->pr->sk) * cv->ts, cv->t, cv->pr->sk, src);
}

/*
 * S for head (b, h) = scale Q K^T into `s` (Sq x Sk, T), then the elementwise steps 2-4 of
 * docs/DESIGN.md §1 (core/score.h), each rounded to T: the bias before the cap, softcap (its
 * tanh saved in `tc` when not NULL, for the backward) and ALiBi in the problem's order, the
 * bias after the cap, and the mask (the window's, and the bias's -inf) written as -inf.
 */
static void scores(const conv *cv, const conv_pack *w, int64_t b, int64_t h, void *s, void *tc)
{
    const fai_problem *pr = cv->pr;
    for (int64_t r0 = 0; r0 < pr->sq; r0 += CONV_ROWS) {
        int64_t n = pr->sq - r0 < CONV_ROWS ? pr->sq - r0 : CONV_ROWS;
        void *c = gemm_target(cv, s, r0, pr->sk, w->stage);
        gemm(cv, 0, 1, n, pr->sk, pr->dqk, pr->score.scale * fai_descale_qk(pr, b, h / pr->group),
             (const char *)w->qp + (size_t)(r0 * pr->dqk) * cv->cs, pr->dqk, w->kp, pr->dqk, 0.0,
             c, pr->sk);
        commit(cv, s, r0, n, pr->sk, c);
    }
    const double cap = pr->score.softcap, slope = fai_slope(pr, h);
    const double factor = pr->bias ? fai_bias_factor(pr, h) : 0.0;
    const int distance = slope != 0 && !pr->score.bias_by_slope;
    const fai_bias_place place = pr->score.bias;
    double *x = w->row[0], *t = w->row[1], *bias = w->row[2];
    for (int64_t i = 0; i < pr->sq; i++) {
        row_load(cv, s, i, x);
        if (pr->bias)
            fai_load_f64(fai_bias_row(pr, b, h, i), pr->bias->dtype, pr->sk, bias);
        for (int64_t j = 0; j < pr->sk; j++) {
            t[j] = 0;
            if (!fai_mask_allows(&pr->mask, i, j) || !fai_block_listed(pr, b, h, i, j) ||
                (pr->bias && fai_bias_masks(bias[j]))) {
                x[j] = -INFINITY;
                continue;
            }
            if (place == FAI_BIAS_BEFORE_CAP)
                x[j] = round_t(cv, x[j] + factor * bias[j]);
            if (distance && pr->score.alibi_first)
                x[j] = round_t(cv, x[j] - slope * fai_alibi_distance(&pr->score, i, j));
            if (cap > 0) {
                t[j] = round_t(cv, tanh(x[j] / cap));
                x[j] = round_t(cv, cap * t[j]);
            }
            if (distance && !pr->score.alibi_first)
                x[j] = round_t(cv, x[j] - slope * fai_alibi_distance(&pr->score, i, j));
            if (place == FAI_BIAS_AFTER_CAP)
                x[j] = round_t(cv, x[j] + factor * bias[j]);
        }
        row_store(cv, s, i, x);
        if (tc)
            row_store(cv, tc, i, t);
    }
}

/* What softmax() does with the LSE: nothing, write it (the forward), or read it (the backward). */
enum { LSE_NONE, LSE_WRITE, LSE_READ };

/*
 * P = softmax(S) row by row (reductions in the compute type) and, with LSE_WRITE, the LSE.
 * With LSE_READ (the backward) P = exp(S - LSE) from the LSE given, its argument rounded to
 * the compute type, as every kernel that recomputes P from a stored LSE evaluates it (§1's
 * P_ij = exp(s_ij - LSE_i)): a relative error in P of about u |s - LSE|, which renormalizing
 * in double avoided, leaving the f32 yardstick's gradients 2-4x more accurate than any such
 * kernel's (docs/DESIGN.md §4).
 * Writes P to `p` and, when dropout is on, P~ = keep P / (1 - p) to `pd`, which may be `p`
 * itself (then P~ replaces P). s and p may be the same buffer.
 */
static void softmax(const conv *cv, const conv_pack *w, int64_t b, int64_t h, const void *s,
                    void *p, void *pd, int lse_use)
{
    const fai_problem *pr = cv->pr;
    const double keep_scale = pr->keep_scale;
    const fai_dropout drop = fai_dropout_for(pr, b, h);
    double *x = w->row[0], *xd = w->row[1];
    for (int64_t i = 0; i < pr->sq; i++) {
        double mx = -INFINITY, sum = 0;
        float sumf = 0;
        row_load(cv, s, i, x);
        if (lse_use == LSE_READ) { /* P as it is: the division below by 1 is exact */
            const double lse = fai_lse_read(pr, b, h, i);
            for (int64_t j = 0; j < pr->sk; j++) {
                const double arg = x[j] - lse;
                x[j] = lse == -INFINITY ? 0 : exp(cv->wide ? arg : (float)arg);
            }
            sum = 1;
        } else {
            for (int64_t j = 0; j < pr->sk; j++)
                mx = fai_nanmax_f64(mx, x[j]);
            /* the sink: one more column of the softmax, whose value is 0 (-inf: none) */
            const double sink = fai_sink(pr, h);
            mx = fai_nanmax_f64(mx, sink);
            if (mx != -INFINITY) {
                if (cv->wide)
                    sum = exp(sink - mx);
                else
                    sumf = (float)exp(sink - mx);
            }
            for (int64_t j = 0; j < pr->sk; j++) {
                x[j] = mx == -INFINITY ? 0 : exp(x[j] - mx);
                if (cv->wide)
                    sum += x[j];
                else
                    sumf += (float)x[j];
            }
            if (!cv->wide)
                sum = sumf;
        }
        if (lse_use == LSE_WRITE)
            fai_lse_write(pr, b, h, i, sum == 0 ? -INFINITY : mx + log(sum));
        if (drop.threshold)
            fai_dropout_keep_row(&drop, i, 0, pr->sk, w->keep);
        for (int64_t j = 0; j < pr->sk; j++) {
            x[j] = sum == 0 ? 0 : round_as(cv->pt, x[j] / sum);
            if (drop.threshold)
                xd[j] = w->keep[j] ? round_t(cv, x[j] * keep_scale) : 0;
        }
        row_store(cv, p, i, x);
        if (drop.threshold)
            row_store(cv, pd, i, xd);
    }
}

/* The sizes of a thread's packed operands and staging blocks, compute type, then its rows
 * (double) and keep flags. */
enum { NPACK = 11 };
static void pack_sizes(const conv *cv, int backward, size_t bytes_of[NPACK])
{
    const fai_problem *pr = cv->pr;
    const int64_t d = pr->dqk > pr->dv ? pr->dqk : pr->dv, wide = pr->sk > d ? pr->sk : d;
    const size_t cs = cv->cs, sk = (size_t)pr->sk;
    const size_t b[NPACK] = {
        (size_t)(pr->sq * pr->dqk) * cs, (size_t)(pr->sk * pr->dqk) * cs,
        (size_t)(pr->sk * pr->dv) * cs, backward ? (size_t)(pr->sq * pr->dv) * cs : 0,
        (size_t)(CONV_ROWS * wide) * cs, (size_t)(CONV_ROWS * d) * cs,
        backward ? (size_t)(pr->sk * pr->dqk) * cs : 0, backward ? (size_t)(pr->sk * pr->dv) * cs : 0,
        sk * sizeof(double), sk * sizeof(double) * 2, sk};
    memcpy(bytes_of, b, sizeof b);
}

static size_t pack_bytes(const conv *cv, int backward)
{
    size_t bytes_of[NPACK], per = 0;
    pack_sizes(cv, backward, bytes_of);
    for (int i = 0; i < NPACK; i++)
        per += (bytes_of[i] + 63) & ~(size_t)63;
    return per;
}

/* Thread t's packed operands and staging blocks, carved from its bytes at `at`. */
static conv_pack pack_carve(const conv *cv, int backward, char *at)
{
    size_t bytes_of[NPACK];
    pack_sizes(cv, backward, bytes_of);
    conv_pack w;
    void *rows0, *rows12, *keep;
    void **dst[NPACK] = {&w.qp, &w.kp, &w.vp, &w.dop, &w.stage,
                         &w.stage2, &w.dk, &w.dv, &rows0, &rows12, &keep};
    for (int i = 0; i < NPACK; i++) {
        *dst[i] = at;
        at += (bytes_of[i] + 63) & ~(size_t)63;
    }
    w.row[0] = rows0;
    w.row[1] = rows12;
    w.row[2] = w.row[1] + (size_t)cv->pr->sk;
    w.keep = keep;
    return w;
}

/* Bytes of `count` B x Hq x Sq x Sk matrices in T; FA_ERR_OVERFLOW if that does not fit. */
static fa_status quadratic_bytes(const conv *cv, int count, size_t *bytes)
{
    const fai_problem *pr = cv->pr;
    size_t n;
    if (!fai_mul_size((size_t)(pr->b * pr->hq), (size_t)pr->sq, &n) ||
        !fai_mul_size(n, (size_t)pr->sk, &n) || !fai_mul_size(n, cv->ts * (size_t)count, bytes))
        return fai_fail(FA_ERR_OVERFLOW,
                        "conventional: %d x B x Hq x Sq x Sk intermediates overflow size_t",
                        count);
    return FA_OK;
}

/* CBLAS takes int dimensions and leading dimensions. */
static fa_status blas_sizes(const conv *cv)
{
    if (fai_blas_dims_fit(cv->pr))
        return FA_OK;
    return fai_fail(FA_ERR_UNSUPPORTED,
                    "conventional: a dimension exceeds the BLAS int range (Sq %lld, Sk %lld)",
                    (long long)cv->pr->sq, (long long)cv->pr->sk);
}

static conv conv_make(const fa_context *ctx, const fai_problem *pr)
{
    conv cv;
    cv.pr = pr;
    /* FP8 inputs as FlashAttention-3 computes them: S and the softmax in f32 (f64 for an f64
     * out), P rounded to V's FP8 format for the second product, O accumulated in f32 and
     * stored in out's dtype */
    const fa_dtype wide_enough = pr->dtype == FA_F64 ? FA_F64 : FA_F32;
    cv.t = fai_dtype_is_fp8(pr->q_dtype) ? wide_enough : pr->dtype;
    cv.pt = fai_dtype_is_fp8(pr->q_dtype) ? pr->v_dtype : cv.t;
    cv.wide = pr->dtype == FA_F64;
    cv.cs = cv.wide ? sizeof(double) : sizeof(float);
    cv.ts = fai_dtype_size(cv.t);
    cv.nt = ctx->num_threads;
    return cv;
}

/* What a run allocates (fai_run_groups): each thread's packs; `count` B x Hq x Sq x Sk
 * matrices in T, shared. */
static fa_status conv_need(const fa_context *ctx, const fai_problem *pr, int backward, int count,
                           fai_need *need)
{
    conv cv = conv_make(ctx, pr);
    FAI_TRY(blas_sizes(&cv));
    FAI_TRY(quadratic_bytes(&cv, count, &need->shared));
    need->per = pack_bytes(&cv, backward);
    return FA_OK;
}

static fa_status conv_forward_need(const fa_context *ctx, const fai_problem *pr, fai_need *need)
{
    return conv_need(ctx, pr, 0, 2, need);
}

static void conv_forward(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc)
{
    conv cv = conv_make(ctx, pr);
    size_t qbytes;
    quadratic_bytes(&cv, 2, &qbytes); /* as conv_forward_need */
    const size_t head = (size_t)(pr->sq * pr->sk) * cv.ts;
    char *S = sc->shared, *P = S + qbytes / 2; /* S and P, for every (b, h) */
#pragma omp parallel for num_threads(cv.nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < pr->b * pr->hq; bh++) {
        const int64_t b = bh / pr->hq, h = bh % pr->hq, hk = h / pr->group;
        const conv_pack pw = pack_carve(&cv, 0, sc->base + (size_t)omp_get_thread_num() * sc->per);
        const conv_pack *w = &pw;
        const size_t at = (size_t)bh * head;
        pack(&cv, fai_q_row, FAI_Q, b, h, pr->sq, pr->dqk, w->qp);
        pack(&cv, fai_kv_row, FAI_K, b, hk, pr->sk, pr->dqk, w->kp);
        pack(&cv, fai_kv_row, FAI_V, b, hk, pr->sk, pr->dv, w->vp);
        scores(&cv, w, b, h, S + at, NULL);
        softmax(&cv, w, b, h, S + at, P + at, P + at, fai_io(pr, FAI_LSE) ? LSE_WRITE : LSE_NONE);
        for (int64_t r0 = 0; r0 < pr->sq; r0 += CONV_ROWS) { /* O = P~ V, rounded to T */
            const int64_t n = pr->sq - r0 < CONV_ROWS ? pr->sq - r0 : CONV_ROWS;
            const void *pb = as_compute(&cv, P + at, r0, n, pr->sk, w->stage);
            gemm(&cv, 0, 0, n, pr->dv, pr->sk, fai_descale_v(pr, b, hk), pb, pr->sk, w->vp, pr->dv,
                 0.0, w->stage2,
                 pr->dv);
            unpack(&cv, fai_q_row, FAI_OUT, b, h, r0, n, pr->dv, w->stage2);
        }
    }
}

/*
 * dS = P (g - D) row by row, with g = dP keep / (1 - p) (dropout's backward) and
 * D_i = sum_j g_ij P_ij (softmax's backward, as frameworks compute it), then the softcap chain
 * (1 - tanh^2); each step rounded to T. dp holds dP on entry and dS on return. With keep_uncapped
 * (a bias gradient taken after the cap), tc's row, once read, receives dS before the chain.
 */
static void softmax_backward(const conv *cv, const conv_pack *w, int64_t b, int64_t h,
                             const void *p, void *dp, void *tc, int keep_uncapped)
{
    const fai_problem *pr = cv->pr;
    const double keep_scale = pr->keep_scale;
    const fai_dropout drop = fai_dropout_for(pr, b, h);
    double *g = w->row[0], *pp = w->row[1], *t = w->row[2];
    for (int64_t i = 0; i < pr->sq; i++) {
        row_load(cv, dp, i, g);
        row_load(cv, p, i, pp);
        if (drop.threshold) {
            fai_dropout_keep_row(&drop, i, 0, pr->sk, w->keep);
            for (int64_t j = 0; j < pr->sk; j++)
                g[j] = w->keep[j] ? round_t(cv, g[j] * keep_scale) : 0;
        }
        double D = 0;
        float Df = 0;
        for (int64_t j = 0; j < pr->sk; j++) {
            if (cv->wide)
                D += g[j] * pp[j];
            else
                Df += (float)(g[j] * pp[j]);
        }
        if (!cv->wide)
            D = Df;
        if (tc)
            row_load(cv, tc, i, t);
        for (int64_t j = 0; j < pr->sk; j++)
            g[j] = round_t(cv, pp[j] * (g[j] - D));
        if (tc && keep_uncapped)
            row_store(cv, tc, i, g);
        for (int64_t j = 0; j < pr->sk && tc; j++)
            g[j] = round_t(cv, g[j] * (1 - t[j] * t[j]));
        row_store(cv, dp, i, g);
    }
}

/*
 * d loss / d bias from every head's dS (T, B x Hq x Sq x Sk at ds), as autograd reduces an
 * expanded bias's gradient: each row of the gradient the sum, in the compute type and in the
 * order (batch, head, row), of the factor-scaled dS rows that read that row of the bias.
 */
static void bias_grad(const conv *cv, const fai_scratch *sc, const char *ds)
{
    const fai_problem *pr = cv->pr;
    const fa_tensor *g = pr->bias_grad, *bias = pr->bias;
    const size_t head = (size_t)(pr->sq * pr->sk) * cv->ts;
    const int64_t tasks = g->batch * g->heads * g->seqlen;
#pragma omp parallel for num_threads(cv->nt) schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; task++) {
        const conv_pack w = pack_carve(cv, 1, sc->base + (size_t)omp_get_thread_num() * sc->per);
        const int64_t gi = task % g->seqlen, gh = (task / g->seqlen) % g->heads,
                      gb = task / (g->seqlen * g->heads);
        double *acc = w.row[1], *x = w.row[0];
        memset(acc, 0, (size_t)pr->sk * sizeof(double));
        for (int64_t b = bias->batch == 1 ? 0 : gb; b < (bias->batch == 1 ? pr->b : gb + 1); b++)
            for (int64_t h = bias->heads == 1 ? 0 : gh; h < (bias->heads == 1 ? pr->hq : gh + 1);
                 h++) {
                const double factor = fai_bias_factor(pr, h);
                for (int64_t i = bias->seqlen == 1 ? 0 : gi;
                     i < (bias->seqlen == 1 ? pr->sq : gi + 1); i++) {
                    row_load(cv, ds + (size_t)(b * pr->hq + h) * head, i, x);
                    for (int64_t j = 0; j < pr->sk; j++)
                        acc[j] = cv->wide ? acc[j] + round_t(cv, factor * x[j])
                                          : (double)((float)acc[j] +
                                                     (float)round_t(cv, factor * x[j]));
                }
            }
        fai_store_f64(fai_bias_row_of(g, gb, gh, gi), g->dtype, pr->sk, acc);
    }
}

/* per (b, h): X (S, then dP, then dS), P, and P~ and tanh when needed: what autograd keeps */
static int backward_buffers(const fai_problem *pr)
{
    return 2 + (pr->drop.threshold != 0) + (pr->score.softcap > 0);
}

static fa_status conv_backward_need(const fa_context *ctx, const fai_problem *pr, fai_need *need)
{
    return conv_need(ctx, pr, 1, backward_buffers(pr), need);
}

static void conv_backward(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc)
{
    conv cv = conv_make(ctx, pr);
    const int nbuf = backward_buffers(pr);
    size_t qbytes;
    quadratic_bytes(&cv, nbuf, &qbytes); /* as conv_backward_need */
    char *big = sc->shared;
    const size_t head = (size_t)(pr->sq * pr->sk) * cv.ts, all = qbytes / (size_t)nbuf;
    char *X = big, *P = big + all, *rest = big + 2 * all, *Pd = P, *Tc = NULL;
    if (pr->drop.threshold) {
        Pd = rest;
        rest += all;
    }
    if (pr->score.softcap > 0)
        Tc = rest;
    /* the bias gradient is dS where the bias enters: after the cap, dS before its chain */
    const int uncapped_grad = pr->bias_grad && Tc && pr->score.bias == FAI_BIAS_AFTER_CAP;
    /* The query rows each GEMM of dV = P~^T dO and dK = scale dS^T Q sums: all of them where T
     * is the compute type (f32, f64 storage; FP8 inputs, whose T is f32), as a framework
     * computes them (summed in 64-row blocks they were about 2x more accurate than that, and
     * than a fused kernel's one accumulator over the rows: docs/DESIGN.md §4); a 16-bit T's
     * blocks are staged to f32, CONV_ROWS at a time. */
    const int64_t acc_rows = cv.ts == cv.cs ? pr->sq : CONV_ROWS;
    /* one task per (b, kv head): the group's dK, dV sum in one thread, in head order */
#pragma omp parallel for num_threads(cv.nt) schedule(dynamic, 1)
    for (int64_t bk = 0; bk < pr->b * pr->hk; bk++) {
        const int64_t b = bk / pr->hk, hk = bk % pr->hk;
        const conv_pack pw = pack_carve(&cv, 1, sc->base + (size_t)omp_get_thread_num() * sc->per);
        const conv_pack *w = &pw;
        memset(w->dk, 0, (size_t)(pr->sk * pr->dqk) * cv.cs);
        memset(w->dv, 0, (size_t)(pr->sk * pr->dv) * cv.cs);
        pack(&cv, fai_kv_row, FAI_K, b, hk, pr->sk, pr->dqk, w->kp);
        pack(&cv, fai_kv_row, FAI_V, b, hk, pr->sk, pr->dv, w->vp);
        for (int64_t h = hk * pr->group; h < (hk + 1) * pr->group; h++) {
            const size_t at = (size_t)(b * pr->hq + h) * head;
            char *x = X + at, *p = P + at, *pd = Pd + at, *tc = Tc ? Tc + at : NULL;
            pack(&cv, fai_q_row, FAI_Q, b, h, pr->sq, pr->dqk, w->qp);
            pack(&cv, fai_q_row, FAI_DOUT, b, h, pr->sq, pr->dv, w->dop);
            scores(&cv, w, b, h, x, tc);
            softmax(&cv, w, b, h, x, p, pd, LSE_READ);
            for (int64_t r0 = 0; r0 < pr->sq; r0 += acc_rows) { /* dV += P~^T dO */
                const int64_t n = pr->sq - r0 < acc_rows ? pr->sq - r0 : acc_rows;
                gemm(&cv, 1, 0, pr->sk, pr->dv, n, 1.0,
                     as_compute(&cv, pd, r0, n, pr->sk, w->stage), pr->sk,
                     (const char *)w->dop + (size_t)(r0 * pr->dv) * cv.cs, pr->dv, 1.0, w->dv,
                     pr->dv);
            }
            for (int64_t r0 = 0; r0 < pr->sq; r0 += CONV_ROWS) {
                const int64_t n = pr->sq - r0 < CONV_ROWS ? pr->sq - r0 : CONV_ROWS;
                const void *dob = (const char *)w->dop + (size_t)(r0 * pr->dv) * cv.cs;
                /* dP = dO V^T */
                void *c = gemm_target(&cv, x, r0, pr->sk, w->stage);
                gemm(&cv, 0, 1, n, pr->sk, pr->dv, 1.0, dob, pr->dv, w->vp, pr->dv, 0.0, c, pr->sk);
                commit(&cv, x, r0, n, pr->sk, c);
            }
            softmax_backward(&cv, w, b, h, p, x, tc, uncapped_grad);
            for (int64_t r0 = 0; r0 < pr->sq; r0 += CONV_ROWS) { /* dQ = scale dS K */
                const int64_t n = pr->sq - r0 < CONV_ROWS ? pr->sq - r0 : CONV_ROWS;
                gemm(&cv, 0, 0, n, pr->dqk, pr->sk, pr->score.scale,
                     as_compute(&cv, x, r0, n, pr->sk, w->stage), pr->sk, w->kp, pr->dqk, 0.0,
                     w->stage2, pr->dqk);
                unpack(&cv, fai_q_row, FAI_DQ, b, h, r0, n, pr->dqk, w->stage2);
            }
            for (int64_t r0 = 0; r0 < pr->sq; r0 += acc_rows) { /* dK += scale dS^T Q */
                const int64_t n = pr->sq - r0 < acc_rows ? pr->sq - r0 : acc_rows;
                gemm(&cv, 1, 0, pr->sk, pr->dqk, n, pr->score.scale,
                     as_compute(&cv, x, r0, n, pr->sk, w->stage), pr->sk,
                     (const char *)w->qp + (size_t)(r0 * pr->dqk) * cv.cs, pr->dqk, 1.0, w->dk,
                     pr->dqk);
            }
        }
        unpack(&cv, fai_kv_row, FAI_DK, b, hk, 0, pr->sk, pr->dqk, w->dk);
        unpack(&cv, fai_kv_row, FAI_DV, b, hk, 0, pr->sk, pr->dv, w->dv);
    }
    if (pr->bias_grad)
        bias_grad(&cv, sc, uncapped_grad ? Tc : X);
}

static fa_status conv_forward_groups(fa_context *ctx, const fai_problem *pr)
{
    return fai_run_groups(ctx, pr, 0, "conventional", conv_forward_need, conv_forward);
}

static fa_status conv_backward_groups(fa_context *ctx, const fai_problem *pr)
{
    return fai_run_groups(ctx, pr, 1, "conventional", conv_backward_need, conv_backward);
}

static fa_status conventional_forward(fa_context *ctx, const fai_problem *pr)
{
    return fai_with_serial_blas(conv_forward_groups, ctx, pr);
}

static fa_status conventional_backward(fa_context *ctx, const fai_problem *pr)
{
    return fai_with_serial_blas(conv_backward_groups, ctx, pr);
}

const fai_backend fai_backend_conventional = {
    .name = "conventional",
    .sequences = 1,
    .ops = {[FAI_OP_FORWARD] = conventional_forward, [FAI_OP_BACKWARD] = conventional_backward},
};
