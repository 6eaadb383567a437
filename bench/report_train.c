/*
 * A training step of a small transformer, for the report's "a kernel speedup is not a step
 * speedup" section (the article's §7.1): `layers` pre-norm blocks of
 *
 *     h = LN(x);  qkv = h Wqkv;  o = attention(q, k, v) causal;  x1 = x + o Wo;
 *     h2 = LN(x1);  u = h2 W1;  x' = x1 + relu(u) W2,
 *
 * (LN without gain and bias), an L2 loss against a fixed random target, the backward by hand,
 * and an Adam step. The GEMMs are OpenBLAS's cblas_sgemm (f32), the attention is this library's
 * fa_forward / fa_backward on the backend asked for (conventional or tiled), reading q, k, v
 * in place from the qkv rows through strides and writing dq, dk, dv the same way. The time
 * spent inside the attention calls is measured separately, so the section can report
 * attention's share of the step next to the step's speedup.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "report_train.h"

typedef struct {
    float *wqkv, *wo, *w1, *w2; /* d x 3d, d x d, d x dff, dff x d (row-major) */
} layer_w;

typedef struct { /* what the forward keeps for the backward, per layer */
    float *x, *h, *rstd, *qkv, *o, *lse, *x1, *h2, *rstd2, *u;
} layer_act;

typedef struct {
    train_shape s;
    int64_t T; /* tokens: batch x seqlen */
    size_t nparam;
    float *param, *grad, *adam_m, *adam_v; /* every layer's weights, one block each */
    layer_w *w, *dw;
    layer_act *act;
    float *x_out, *target;
    float *dx, *dx1, *dqkv, *du, *dh, *dov; /* the backward's scratch, shared by the layers */
    fa_context *ctx;
    double attn_s;
    size_t bytes;
} model;

static uint64_t rng = 0x243F6A8885A308D3ull;

static double normal(void) { return normal_draw(&rng); }

static float *alloc(model *m, size_t n)
{
    m->bytes += n * sizeof(float);
    return calloc(n, sizeof(float));
}

/* C (m x n) = op(A) op(B) (+ C when acc), row-major. */
static void gemm(int ta, int tb, int64_t mm, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *b, int64_t ldb, int acc, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)mm, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, acc ? 1.0f : 0.0f, c,
                (int)ldc);
}

/* y = (x - mean) * rstd over each row of d values. */
static void layer_norm(const float *x, float *y, float *rstd, int64_t T, int d)
{
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * d;
        double mean = 0, var = 0;
        for (int i = 0; i < d; i++)
            mean += xr[i];
        mean /= d;
        for (int i = 0; i < d; i++)
            var += (xr[i] - mean) * (xr[i] - mean);
        const double r = 1.0 / sqrt(var / d + 1e-5);
        rstd[t] = (float)r;
        for (int i = 0; i < d; i++)
            y[t * d + i] = (float)((xr[i] - mean) * r);
    }
}

/* dx += rstd (dy - mean(dy) - y mean(dy y)): the gradient of y = (x - mean) rstd. */
static void layer_norm_back(const float *y, const float *rstd, const float *dy, float *dx,
                            int64_t T, int d)
{
    for (int64_t t = 0; t < T; t++) {
        const float *yr = y + t * d, *g = dy + t * d;
        double sg = 0, sgy = 0;
        for (int i = 0; i < d; i++)
            sg += g[i], sgy += (double)g[i] * yr[i];
        sg /= d, sgy /= d;
        for (int i = 0; i < d; i++)
            dx[t * d + i] += (float)(rstd[t] * (g[i] - sg - yr[i] * sgy));
    }
}

/* The (batch, seqlen, heads, D) view of columns [col, col + dmodel) of rows of width ld. */
static fa_tensor view(const model *m, float *base, int col, int ld)
{
    const train_shape *s = &m->s;
    fa_tensor t;
    fa_tensor_init(&t, base + col, FA_F32, s->batch, s->seqlen, s->heads, s->dmodel / s->heads,
                   0);
    t.seq_stride = ld;
    t.batch_stride = (int64_t)ld * s->seqlen;
    return t;
}

static fa_tensor lse_view(const model *m, float *lse)
{
    fa_tensor t;
    fa_tensor_init(&t, lse, FA_F32, m->s.batch, m->s.seqlen, m->s.heads, 1, 0);
    return t;
}

/* One layer's attention call: causal, q, k, v read through strides from the qkv rows. */
typedef struct {
    fa_params p;
    fa_tensor q, k, v, o, lse;
} attention_call;

static attention_call attention_of(const model *m, layer_act *a)
{
    const int d = m->s.dmodel;
    attention_call c;
    fa_params_init(&c.p);
    c.p.causal = 1;
    c.q = view(m, a->qkv, 0, 3 * d), c.k = view(m, a->qkv, d, 3 * d);
    c.v = view(m, a->qkv, 2 * d, 3 * d), c.o = view(m, a->o, 0, d);
    c.lse = lse_view(m, a->lse);
    return c;
}

static int attention_forward(model *m, layer_act *a)
{
    attention_call c = attention_of(m, a);
    const double t0 = now();
    const fa_status st = fa_forward(m->ctx, &c.p, &c.q, &c.k, &c.v, &c.o, &c.lse);
    m->attn_s += now() - t0;
    return st != FA_OK;
}

/* dq, dk, dv into the dqkv rows, as q, k, v are read from the qkv rows. */
static int attention_backward(model *m, layer_act *a, float *dout)
{
    const int d = m->s.dmodel;
    const attention_call c = attention_of(m, a);
    fa_tensor dO = view(m, dout, 0, d), dq = view(m, m->dqkv, 0, 3 * d),
              dk = view(m, m->dqkv, d, 3 * d), dv = view(m, m->dqkv, 2 * d, 3 * d);
    const double t0 = now();
    const fa_status st =
        fa_backward(m->ctx, &c.p, &c.q, &c.k, &c.v, &c.o, &c.lse, &dO, &dq, &dk, &dv);
    m->attn_s += now() - t0;
    return st != FA_OK;
}

/* The loss 0.5 mean((x_L - target)^2) after the forward from x0 = act[0].x. */
static int forward(model *m, double *loss)
{
    const int d = m->s.dmodel, f = m->s.dff;
    const int64_t T = m->T;
    for (int l = 0; l < m->s.layers; l++) {
        layer_act *a = &m->act[l];
        const layer_w *w = &m->w[l];
        float *x_next = l + 1 < m->s.layers ? m->act[l + 1].x : m->x_out;
        layer_norm(a->x, a->h, a->rstd, T, d);
        gemm(0, 0, T, 3 * d, d, a->h, d, w->wqkv, 3 * d, 0, a->qkv, 3 * d);
        if (attention_forward(m, a))
            return 1;
        memcpy(a->x1, a->x, sizeof(float) * (size_t)(T * d));
        gemm(0, 0, T, d, d, a->o, d, w->wo, d, 1, a->x1, d);
        layer_norm(a->x1, a->h2, a->rstd2, T, d);
        gemm(0, 0, T, f, d, a->h2, d, w->w1, f, 0, a->u, f);
        for (int64_t i = 0; i < T * f; i++) /* relu in place of du's scratch: u stays */
            m->du[i] = a->u[i] > 0 ? a->u[i] : 0;
        memcpy(x_next, a->x1, sizeof(float) * (size_t)(T * d));
        gemm(0, 0, T, d, f, m->du, f, w->w2, d, 1, x_next, d);
    }
    double sum = 0;
    for (int64_t i = 0; i < T * d; i++) {
        const double e = (double)m->x_out[i] - m->target[i];
        sum += e * e;
    }
    *loss = 0.5 * sum / (double)(T * d);
    return 0;
}

/* Every weight's gradient into m->grad, after forward(). */
static int backward(model *m)
{
    const int d = m->s.dmodel, f = m->s.dff;
    const int64_t T = m->T;
    const double inv = 1.0 / (double)(T * d);
    for (int64_t i = 0; i < T * d; i++)
        m->dx[i] = (float)(((double)m->x_out[i] - m->target[i]) * inv);
    for (int l = m->s.layers - 1; l >= 0; l--) {
        layer_act *a = &m->act[l];
        const layer_w *w = &m->w[l];
        layer_w *g = &m->dw[l];
        /* x' = x1 + relu(u) W2 */
        for (int64_t i = 0; i < T * f; i++)
            m->du[i] = a->u[i] > 0 ? a->u[i] : 0;
        gemm(1, 0, f, d, T, m->du, f, m->dx, d, 0, g->w2, d);
        gemm(0, 1, T, f, d, m->dx, d, w->w2, d, 0, m->du, f);
        for (int64_t i = 0; i < T * f; i++)
            m->du[i] = a->u[i] > 0 ? m->du[i] : 0;
        /* u = h2 W1, h2 = LN(x1) */
        gemm(1, 0, d, f, T, a->h2, d, m->du, f, 0, g->w1, f);
        gemm(0, 1, T, d, f, m->du, f, w->w1, f, 0, m->dh, d);
        memcpy(m->dx1, m->dx, sizeof(float) * (size_t)(T * d));
        layer_norm_back(a->h2, a->rstd2, m->dh, m->dx1, T, d);
        /* x1 = x + o Wo */
        gemm(1, 0, d, d, T, a->o, d, m->dx1, d, 0, g->wo, d);
        gemm(0, 1, T, d, d, m->dx1, d, w->wo, d, 0, m->dov, d);
        if (attention_backward(m, a, m->dov))
            return 1;
        /* qkv = h Wqkv, h = LN(x) */
        gemm(1, 0, d, 3 * d, T, a->h, d, m->dqkv, 3 * d, 0, g->wqkv, 3 * d);
        gemm(0, 1, T, d, 3 * d, m->dqkv, 3 * d, w->wqkv, 3 * d, 0, m->dh, d);
        memcpy(m->dx, m->dx1, sizeof(float) * (size_t)(T * d));
        layer_norm_back(a->h, a->rstd, m->dh, m->dx, T, d);
    }
    return 0;
}

static void adam(model *m, int step)
{
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double c1 = 1 - pow(b1, step), c2 = 1 - pow(b2, step);
    for (size_t i = 0; i < m->nparam; i++) {
        const double g = m->grad[i];
        m->adam_m[i] = (float)(b1 * m->adam_m[i] + (1 - b1) * g);
        m->adam_v[i] = (float)(b2 * m->adam_v[i] + (1 - b2) * g * g);
        m->param[i] -= (float)(lr * (m->adam_m[i] / c1) / (sqrt(m->adam_v[i] / c2) + eps));
    }
}

static void carve(float *base, layer_w *w, int layers, int d, int f)
{
    for (int l = 0; l < layers; l++) {
        w[l].wqkv = base, base += (size_t)d * 3 * d;
        w[l].wo = base, base += (size_t)d * d;
        w[l].w1 = base, base += (size_t)d * f;
        w[l].w2 = base, base += (size_t)f * d;
    }
}

static void model_free(model *m)
{
    if (m->act)
        for (int l = 0; l < m->s.layers; l++) {
            layer_act *a = &m->act[l];
            free(a->x), free(a->h), free(a->rstd), free(a->qkv), free(a->o), free(a->lse);
            free(a->x1), free(a->h2), free(a->rstd2), free(a->u);
        }
    free(m->act), free(m->w), free(m->dw);
    free(m->param), free(m->grad), free(m->adam_m), free(m->adam_v);
    free(m->x_out), free(m->target), free(m->dx), free(m->dx1), free(m->dqkv), free(m->du);
    free(m->dh), free(m->dov);
    fa_context_destroy(m->ctx);
}

static int model_init(model *m, const train_shape *s, fa_backend be, int threads)
{
    memset(m, 0, sizeof *m);
    m->s = *s;
    const int d = s->dmodel, f = s->dff;
    const int64_t T = m->T = (int64_t)s->batch * s->seqlen;
    m->nparam = (size_t)s->layers * ((size_t)4 * d * d + (size_t)2 * d * f);
    m->param = alloc(m, m->nparam), m->grad = alloc(m, m->nparam);
    m->adam_m = alloc(m, m->nparam), m->adam_v = alloc(m, m->nparam);
    m->w = calloc((size_t)s->layers, sizeof(layer_w));
    m->dw = calloc((size_t)s->layers, sizeof(layer_w));
    m->act = calloc((size_t)s->layers, sizeof(layer_act));
    if (!m->param || !m->grad || !m->adam_m || !m->adam_v || !m->w || !m->dw || !m->act)
        return 1;
    carve(m->param, m->w, s->layers, d, f);
    carve(m->grad, m->dw, s->layers, d, f);
    rng = 0x243F6A8885A308D3ull;
    for (int l = 0; l < s->layers; l++) {
        const layer_w *w = &m->w[l];
        for (size_t i = 0; i < (size_t)d * 3 * d; i++)
            w->wqkv[i] = (float)(normal() / sqrt(d));
        for (size_t i = 0; i < (size_t)d * d; i++)
            w->wo[i] = (float)(normal() / sqrt(d));
        for (size_t i = 0; i < (size_t)d * f; i++)
            w->w1[i] = (float)(normal() / sqrt(d));
        for (size_t i = 0; i < (size_t)f * d; i++)
            w->w2[i] = (float)(normal() / sqrt(f));
        layer_act *a = &m->act[l];
        a->x = alloc(m, (size_t)(T * d)), a->h = alloc(m, (size_t)(T * d));
        a->rstd = alloc(m, (size_t)T), a->qkv = alloc(m, (size_t)(T * 3 * d));
        a->o = alloc(m, (size_t)(T * d)), a->lse = alloc(m, (size_t)(T * s->heads));
        a->x1 = alloc(m, (size_t)(T * d)), a->h2 = alloc(m, (size_t)(T * d));
        a->rstd2 = alloc(m, (size_t)T), a->u = alloc(m, (size_t)(T * f));
        if (!a->x || !a->h || !a->rstd || !a->qkv || !a->o || !a->lse || !a->x1 || !a->h2 ||
            !a->rstd2 || !a->u)
            return 1;
    }
    m->x_out = alloc(m, (size_t)(T * d)), m->target = alloc(m, (size_t)(T * d));
    m->dx = alloc(m, (size_t)(T * d)), m->dx1 = alloc(m, (size_t)(T * d));
    m->dqkv = alloc(m, (size_t)(T * 3 * d)), m->du = alloc(m, (size_t)(T * f));
    m->dh = alloc(m, (size_t)(T * d)), m->dov = alloc(m, (size_t)(T * d));
    if (!m->x_out || !m->target || !m->dx || !m->dx1 || !m->dqkv || !m->du || !m->dh || !m->dov)
        return 1;
    for (int64_t i = 0; i < T * d; i++)
        m->act[0].x[i] = (float)normal(), m->target[i] = (float)(0.5 * normal());
    fa_options o;
    fa_options_init(&o);
    o.backend = be;
    o.num_threads = threads;
    return fa_context_create(&o, &m->ctx) != FA_OK;
}

int train_run(const train_shape *sh, fa_backend be, int threads, int steps, train_result *r)
{
    model m;
    int err = model_init(&m, sh, be, threads);
    memset(r, 0, sizeof *r);
    r->step_s = 1e30;
    for (int step = 1; step <= steps && !err; step++) {
        double loss;
        m.attn_s = 0;
        const double t0 = now();
        err = forward(&m, &loss) || backward(&m);
        if (err)
            break;
        adam(&m, step);
        const double dt = now() - t0;
        if (dt < r->step_s)
            r->step_s = dt, r->attn_s = m.attn_s;
        if (step == 1)
            r->loss_first = loss;
        r->loss_last = loss;
    }
    size_t peak = 0;
    if (m.ctx)
        fa_memory_stats(m.ctx, NULL, &peak);
    r->peak_bytes = m.bytes + peak;
    model_free(&m);
    return err;
}

/* The loss at param + eps dir, param restored after. */
static int loss_at(model *m, const float *saved, const float *dir, double eps, double *loss)
{
    for (size_t i = 0; i < m->nparam; i++)
        m->param[i] = saved[i] + (float)(eps * dir[i]);
    const int err = forward(m, loss);
    memcpy(m->param, saved, sizeof(float) * m->nparam);
    return err;
}

double train_gradient_error(void)
{
    const train_shape s = {.layers = 2, .dmodel = 32, .dff = 64, .heads = 2, .batch = 2,
                           .seqlen = 12};
    model m;
    double worst = INFINITY, loss;
    float *dir = NULL, *saved = NULL;
    if (model_init(&m, &s, FA_BACKEND_TILED, 1) || forward(&m, &loss) || backward(&m))
        goto done;
    dir = malloc(sizeof(float) * m.nparam), saved = malloc(sizeof(float) * m.nparam);
    if (!dir || !saved)
        goto done;
    memcpy(saved, m.param, sizeof(float) * m.nparam);
    /* One direction per weight matrix: the gradient restricted to it, so that a wrong or
     * missing term of any one block's gradient is a first-order error of its own slope
     * (|g_b|^2 along g_b), not diluted by the other blocks. */
    double e_max = 0;
    const size_t per_layer = m.nparam / (size_t)s.layers;
    const size_t sizes[4] = {(size_t)s.dmodel * 3 * s.dmodel, (size_t)s.dmodel * s.dmodel,
                             (size_t)s.dmodel * s.dff, (size_t)s.dff * s.dmodel};
    for (int l = 0; l < s.layers; l++)
        for (size_t b = 0, off = 0; b < 4; off += sizes[b++]) {
            const size_t lo = (size_t)l * per_layer + off, hi = lo + sizes[b];
            double gb = 0;
            for (size_t i = 0; i < m.nparam; i++) {
                dir[i] = i >= lo && i < hi ? m.grad[i] : 0.0f;
                gb += (double)dir[i] * dir[i];
            }
            /* 0.1% of the loss each side: the third-order term then stays near 1e-5 */
            const double eps = 1e-3 * loss / gb;
            double lp, lm;
            if (gb == 0 || loss_at(&m, saved, dir, eps, &lp) || loss_at(&m, saved, dir, -eps, &lm))
                goto done;
            const double e = fabs((lp - lm) / (2 * eps) - gb) / gb;
            e_max = e > e_max ? e : e_max;
        }
    worst = e_max;
done:
    free(dir), free(saved);
    model_free(&m);
    return worst;
}
