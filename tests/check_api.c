/*
 * The API contract: every bad input returns its own status, names the offending argument in
 * fa_last_error(), and leaves every output byte untouched; contexts, environment overrides,
 * status strings.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "backends/table.h"
#include "harness.h"
#include "simd/kernels.h"

typedef struct {
    ht_tensor q, k, v, o, l, dout, dq, dk, dv;
    fa_tensor tq, tk, tv, to, tl, tdout, tdq, tdk, tdv; /* what the calls see (mutable) */
    fa_params p;
    float slopes[4];
    float sinks[4];
} setup;

static void setup_make(setup *s)
{
    ht_alloc(&s->q, FA_F32, 2, 9, 4, 8, SW_BSHD);
    ht_alloc(&s->k, FA_F32, 2, 11, 2, 8, SW_BSHD);
    ht_alloc(&s->v, FA_F32, 2, 11, 2, 6, SW_BSHD);
    ht_alloc(&s->dout, FA_F32, 2, 9, 4, 6, SW_BSHD);
    ht_alloc(&s->o, FA_F32, 2, 9, 4, 6, SW_BSHD);
    ht_alloc(&s->dq, FA_F32, 2, 9, 4, 8, SW_BSHD);
    ht_alloc(&s->dk, FA_F32, 2, 11, 2, 8, SW_BSHD);
    ht_alloc(&s->dv, FA_F32, 2, 11, 2, 6, SW_BSHD);
    ht_alloc_lse(&s->l, FA_F32, 2, 9, 4);
    ht_fill(&s->q, 1, 1, -1), ht_fill(&s->k, 2, 1, -1), ht_fill(&s->v, 3, 1, -1);
    ht_fill(&s->dout, 4, 1, -1);
    ht_fill(&s->l, 5, 0, 1); /* a plausible LSE for the backward's input */
    ht_fill(&s->o, 6, 1, -1);
    s->tq = s->q.t, s->tk = s->k.t, s->tv = s->v.t, s->to = s->o.t, s->tl = s->l.t;
    s->tdout = s->dout.t, s->tdq = s->dq.t, s->tdk = s->dk.t, s->tdv = s->dv.t;
    fa_params_init(&s->p);
    for (int h = 0; h < 4; h++)
        s->slopes[h] = 0.5f, s->sinks[h] = 1.0f;
}

static void setup_free(setup *s)
{
    ht_free(&s->q), ht_free(&s->k), ht_free(&s->v), ht_free(&s->o), ht_free(&s->l);
    ht_free(&s->dout), ht_free(&s->dq), ht_free(&s->dk), ht_free(&s->dv);
}

typedef struct {
    const char *name;
    void (*mutate)(setup *s);
    fa_status want;
    const char *detail; /* must appear in fa_last_error() */
    int only; /* 0: forward and backward, 1: backward only, 2: forward only */
} bad_case;

#define MUT(fn, body) static void fn(setup *s) { body; }
MUT(m_q_null_data, s->tq.data = NULL)
MUT(m_k_null_data, s->tk.data = NULL)
MUT(m_q_bad_dtype, s->tq.dtype = (fa_dtype)99)
MUT(m_k_dtype_mismatch, s->tk.dtype = FA_F64)
MUT(m_out_dtype_mismatch, s->to.dtype = FA_BF16)
MUT(m_lse_f16, s->tl.dtype = FA_F16)
MUT(m_q_neg_seqlen, s->tq.seqlen = -1)
MUT(m_k_headdim, s->tk.headdim = 7)
MUT(m_v_seqlen, s->tv.seqlen = 10)
MUT(m_out_headdim, s->to.headdim = 5)
MUT(m_out_seqlen, s->to.seqlen = 8)
MUT(m_gqa_indivisible, s->tq.heads = 3)
MUT(m_k_zero_heads, s->tk.heads = 0; s->tv.heads = 0)
MUT(m_q_zero_headdim, s->tq.headdim = 0; s->tk.headdim = 0)
MUT(m_k_batch, s->tk.batch = 1)
MUT(m_lse_seqlen, s->tl.seqlen = 5)
MUT(m_lse_headdim, s->tl.headdim = 2)
MUT(m_q_headdim_stride, s->tq.headdim_stride = 2)
MUT(m_k_neg_stride, s->tk.seq_stride = -8)
MUT(m_out_overlap, s->to.seq_stride = 0)
MUT(m_out_overlap_heads, s->to.head_stride = 3)
MUT(m_scale_nan, s->p.scale = NAN)
MUT(m_scale_neg, s->p.scale = -0.5)
MUT(m_scale_inf, s->p.scale = INFINITY)
MUT(m_p_one, s->p.dropout_p = 1.0)
MUT(m_p_neg, s->p.dropout_p = -0.1)
MUT(m_p_nan, s->p.dropout_p = NAN)
MUT(m_wl, s->p.window_left = -2)
MUT(m_wr, s->p.window_right = -5)
MUT(m_causal_wr, s->p.causal = 1; s->p.window_right = 3)
MUT(m_softcap_neg, s->p.softcap = -1)
MUT(m_softcap_nan, s->p.softcap = NAN)
MUT(m_softcap_inf, s->p.softcap = INFINITY)
MUT(m_align, s->p.align = (fa_align)7)
MUT(m_order, s->p.score_order = (fa_score_order)2)
MUT(m_slope_nan, s->slopes[1] = NAN; s->p.alibi_slopes = s->slopes)
MUT(m_sink_nan, s->sinks[1] = NAN; s->p.sink_logits = s->sinks)
MUT(m_sink_inf, s->sinks[2] = INFINITY; s->p.sink_logits = s->sinks)
MUT(m_sink_tokens, s->p.window_left = 3; s->p.sink_tokens = -1)
MUT(m_sink_grad_alone, s->p.sink_grad = s->sinks)
MUT(m_sink_grad_in_dq, s->p.sink_logits = s->sinks; s->p.sink_grad = (float *)s->tdq.data + 2)
MUT(m_sink_grad_on_sinks, s->p.sink_logits = s->sinks; s->p.sink_grad = s->sinks + 1)
MUT(m_out_on_sinks, s->p.sink_logits = (const float *)s->to.data + 3)
MUT(m_seqlen_huge, s->tq.seqlen = (int64_t)1 << 41)
MUT(m_stride_huge, s->tk.batch_stride = (int64_t)1 << 62)
MUT(m_extent_overflow, s->tv.seq_stride = INT64_MAX / 4)
MUT(m_dq_shape, s->tdq.headdim = 6)
MUT(m_dk_dtype, s->tdk.dtype = FA_F16)
MUT(m_dv_overlap, s->tdv.seq_stride = 1)
MUT(m_dout_shape, s->tdout.seqlen = 3)
/* aliasing: an output sharing bytes with an input or another output (shapes kept valid). The
 * smaller tensor is moved inside the larger one, so that it meets no third buffer whatever
 * the heap's layout (the message names the pair the checks meet first). */
MUT(m_out_is_q, s->to.data = s->tq.data)
MUT(m_out_is_k, s->tk.data = s->to.data)
MUT(m_out_in_v, s->tv.data = (float *)s->to.data + 5)
MUT(m_lse_in_out, s->tl.data = (float *)s->to.data + 8)
MUT(m_lse_is_q, s->tl.data = s->tq.data)
MUT(m_out_on_slopes, s->p.alibi_slopes = (const float *)s->to.data + 3)
MUT(m_dq_is_dk, s->tdk.data = s->tdq.data)
MUT(m_dq_is_q, s->tdq.data = s->tq.data)
MUT(m_dv_is_v, s->tdv.data = s->tv.data)
MUT(m_dk_is_dout, s->tdk.data = s->tdout.data)
MUT(m_lse_in_dv, s->tl.data = s->tdv.data) /* lse (72 floats) within dv (264) */
MUT(m_dq_on_out, s->to.data = (float *)s->tdq.data + 1)

static const bad_case bad[] = {
    {"q->data NULL", m_q_null_data, FA_ERR_NULL_POINTER, "q->data", 0},
    {"k->data NULL", m_k_null_data, FA_ERR_NULL_POINTER, "k->data", 0},
    {"q dtype 99", m_q_bad_dtype, FA_ERR_DTYPE, "q->dtype", 0},
    {"k dtype f64 vs f32", m_k_dtype_mismatch, FA_ERR_DTYPE, "k->dtype", 0},
    {"out dtype bf16 vs f32", m_out_dtype_mismatch, FA_ERR_DTYPE, "out->dtype", 0},
    {"lse dtype f16", m_lse_f16, FA_ERR_DTYPE, "lse->dtype", 0},
    {"q seqlen -1", m_q_neg_seqlen, FA_ERR_SHAPE, "q->seqlen", 0},
    {"k headdim != q headdim", m_k_headdim, FA_ERR_SHAPE, "k->headdim", 0},
    {"v seqlen != k seqlen", m_v_seqlen, FA_ERR_SHAPE, "v->seqlen", 0},
    {"out headdim != v headdim", m_out_headdim, FA_ERR_SHAPE, "out->headdim", 0},
    {"out seqlen != q seqlen", m_out_seqlen, FA_ERR_SHAPE, "out->seqlen", 0},
    {"Hq % Hk != 0", m_gqa_indivisible, FA_ERR_SHAPE, "q->heads", 0},
    {"k heads 0", m_k_zero_heads, FA_ERR_SHAPE, "k->heads", 0},
    {"headdim 0", m_q_zero_headdim, FA_ERR_SHAPE, "q->headdim", 0},
    {"k batch != q batch", m_k_batch, FA_ERR_SHAPE, "k->batch", 0},
    {"lse seqlen", m_lse_seqlen, FA_ERR_SHAPE, "lse->seqlen", 0},
    {"lse headdim 2", m_lse_headdim, FA_ERR_SHAPE, "lse->headdim", 0},
    {"headdim stride 2", m_q_headdim_stride, FA_ERR_STRIDE, "q->headdim_stride", 0},
    {"negative stride", m_k_neg_stride, FA_ERR_STRIDE, "k->seq_stride", 0},
    {"out rows overlap", m_out_overlap, FA_ERR_STRIDE, "out", 2}, /* an input of the backward */
    {"out heads overlap", m_out_overlap_heads, FA_ERR_STRIDE, "out", 2},
    {"scale NaN", m_scale_nan, FA_ERR_INVALID_ARGUMENT, "params->scale", 0},
    {"scale negative", m_scale_neg, FA_ERR_INVALID_ARGUMENT, "params->scale", 0},
    {"scale inf", m_scale_inf, FA_ERR_INVALID_ARGUMENT, "params->scale", 0},
    {"dropout 1", m_p_one, FA_ERR_INVALID_ARGUMENT, "params->dropout_p", 0},
    {"dropout -0.1", m_p_neg, FA_ERR_INVALID_ARGUMENT, "params->dropout_p", 0},
    {"dropout NaN", m_p_nan, FA_ERR_INVALID_ARGUMENT, "params->dropout_p", 0},
    {"window_left -2", m_wl, FA_ERR_INVALID_ARGUMENT, "params->window_left", 0},
    {"window_right -5", m_wr, FA_ERR_INVALID_ARGUMENT, "params->window_right", 0},
    {"causal with window_right 3", m_causal_wr, FA_ERR_INVALID_ARGUMENT, "params->window_right", 0},
    {"softcap -1", m_softcap_neg, FA_ERR_INVALID_ARGUMENT, "params->softcap", 0},
    {"softcap NaN", m_softcap_nan, FA_ERR_INVALID_ARGUMENT, "params->softcap", 0},
    {"softcap inf", m_softcap_inf, FA_ERR_INVALID_ARGUMENT, "params->softcap", 0},
    {"align 7", m_align, FA_ERR_INVALID_ARGUMENT, "params->align", 0},
    {"score order 2", m_order, FA_ERR_INVALID_ARGUMENT, "params->score_order", 0},
    {"ALiBi slope NaN", m_slope_nan, FA_ERR_INVALID_ARGUMENT, "params->alibi_slopes[1]", 0},
    {"sink NaN", m_sink_nan, FA_ERR_INVALID_ARGUMENT, "params->sink_logits[1]", 0},
    {"sink_tokens -1", m_sink_tokens, FA_ERR_INVALID_ARGUMENT, "params->sink_tokens", 0},
    {"sink +inf", m_sink_inf, FA_ERR_INVALID_ARGUMENT, "params->sink_logits[2]", 0},
    {"sink_grad without sinks", m_sink_grad_alone, FA_ERR_INVALID_ARGUMENT, "params->sink_grad", 1},
    {"sink_grad inside dq", m_sink_grad_in_dq, FA_ERR_STRIDE, "params->sink_grad overlaps dq", 1},
    {"sink_grad on the sinks", m_sink_grad_on_sinks, FA_ERR_STRIDE,
     "params->sink_grad overlaps params->sink_logits", 1},
    {"sinks inside out", m_out_on_sinks, FA_ERR_STRIDE, "params->sink_logits", 2},
    {"seqlen 2^41", m_seqlen_huge, FA_ERR_OVERFLOW, "q->seqlen", 0},
    {"batch stride 2^62", m_stride_huge, FA_ERR_OVERFLOW, "k", 0},
    {"extent overflow", m_extent_overflow, FA_ERR_OVERFLOW, "v", 0},
    {"dq headdim", m_dq_shape, FA_ERR_SHAPE, "dq->headdim", 1},
    {"dk dtype", m_dk_dtype, FA_ERR_DTYPE, "dk->dtype", 1},
    {"dv rows overlap", m_dv_overlap, FA_ERR_STRIDE, "dv", 1},
    {"dout seqlen", m_dout_shape, FA_ERR_SHAPE, "dout->seqlen", 1},
    {"out = q", m_out_is_q, FA_ERR_STRIDE, "out overlaps q", 2},
    {"k = out", m_out_is_k, FA_ERR_STRIDE, "out overlaps k", 2},
    {"v inside out", m_out_in_v, FA_ERR_STRIDE, "out overlaps v", 2},
    {"lse inside out", m_lse_in_out, FA_ERR_STRIDE, "lse overlaps out", 2},
    {"lse = q", m_lse_is_q, FA_ERR_STRIDE, "lse overlaps q", 2},
    {"ALiBi slopes inside out", m_out_on_slopes, FA_ERR_STRIDE, "params->alibi_slopes", 2},
    {"dk = dq", m_dq_is_dk, FA_ERR_STRIDE, "dk overlaps dq", 1},
    {"dq = q", m_dq_is_q, FA_ERR_STRIDE, "dq overlaps q", 1},
    {"dv = v", m_dv_is_v, FA_ERR_STRIDE, "dv overlaps v", 1},
    {"dk = dout", m_dk_is_dout, FA_ERR_STRIDE, "dk overlaps dout", 1},
    {"lse inside dv", m_lse_in_dv, FA_ERR_STRIDE, "dv overlaps lse", 1},
    {"out inside dq", m_dq_on_out, FA_ERR_STRIDE, "dq overlaps out", 1},
};
#define NBAD ((int)(sizeof bad / sizeof *bad))

/* Every byte the setup owns -- the nine buffers with their guard zones, the slopes and the
 * sinks -- as it is before a call: a refused call must leave all of it as it was (an aliasing
 * case moves an output's pointer into an input's buffer, so checking the outputs' own buffers
 * is not enough). */
typedef struct {
    unsigned char *copy[9];
    float slopes[4], sinks[4];
} snapshot;

static ht_tensor *setup_buffer(setup *s, int i)
{
    ht_tensor *b[9] = {&s->q, &s->k, &s->v, &s->o, &s->l, &s->dout, &s->dq, &s->dk, &s->dv};
    return b[i];
}

static void snapshot_take(setup *s, snapshot *z)
{
    for (int i = 0; i < 9; i++) {
        const ht_tensor *b = setup_buffer(s, i);
        z->copy[i] = malloc(b->nbytes);
        ck_assert_ptr_nonnull(z->copy[i]);
        memcpy(z->copy[i], b->buf, b->nbytes);
    }
    memcpy(z->slopes, s->slopes, sizeof z->slopes);
    memcpy(z->sinks, s->sinks, sizeof z->sinks);
}

/* The name of the first buffer that changed, or NULL; frees the copies. */
static const char *snapshot_changed(setup *s, snapshot *z)
{
    static const char *const names[9] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    const char *changed = NULL;
    for (int i = 8; i >= 0; i--) {
        const ht_tensor *b = setup_buffer(s, i);
        if (memcmp(z->copy[i], b->buf, b->nbytes) != 0 || !ht_guards_intact(b))
            changed = names[i];
        free(z->copy[i]);
    }
    if (memcmp(z->sinks, s->sinks, sizeof z->sinks))
        return "sinks";
    return memcmp(z->slopes, s->slopes, sizeof z->slopes) ? "slopes" : changed;
}

/* One refused call on a prepared setup: the op's outputs poisoned, every byte the setup owns
 * snapshot, the op run on backend be; returns its status, and the name of the first buffer
 * it changed (NULL: none) in *changed. */
static fa_status call_on_setup(setup *s, fa_backend be, int backward, const char **changed)
{
    if (backward)
        ht_poison(&s->dq), ht_poison(&s->dk), ht_poison(&s->dv);
    else
        ht_poison(&s->o), ht_poison(&s->l);
    snapshot z;
    snapshot_take(s, &z);
    fa_context *ctx = ht_context(be, 2);
    fa_status got;
    if (backward)
        got = fa_backward(ctx, &s->p, &s->tq, &s->tk, &s->tv, &s->to, &s->tl, &s->tdout, &s->tdq,
                          &s->tdk, &s->tdv);
    else
        got = fa_forward(ctx, &s->p, &s->tq, &s->tk, &s->tv, &s->to, &s->tl);
    *changed = snapshot_changed(s, &z);
    fa_context_destroy(ctx);
    return got;
}

/* Each bad input, on each backend, forward and backward: its code, its argument named, no
 * byte of any buffer changed. */
START_TEST(bad_inputs_rejected_untouched)
{
    const bad_case *c = &bad[_i % NBAD];
    const fa_backend be = (fa_backend)(FA_BACKEND_REFERENCE + _i / NBAD);
    for (int backward = c->only == 1; backward < (c->only == 2 ? 1 : 2); backward++) {
        setup s;
        setup_make(&s);
        c->mutate(&s);
        const char *changed;
        const fa_status got = call_on_setup(&s, be, backward, &changed);
        ck_assert_msg(!changed, "%s (%s): %s was written", c->name,
                      backward ? "backward" : "forward", changed);
        ck_assert_msg(got == c->want, "%s (%s, %s): status %d (%s), want %d; detail: %s",
                      c->name, fa_backend_name(be), backward ? "backward" : "forward", got,
                      fa_status_string(got), c->want, fa_last_error());
        ck_assert_msg(strstr(fa_last_error(), c->detail), "%s: detail '%s' does not name '%s'",
                      c->name, fa_last_error(), c->detail);
        setup_free(&s);
    }
}
END_TEST

/*
 * The same for every tensor argument, one field broken at a time: 11 faults x 9 tensors (less
 * the self-overlap of the four that are never outputs), each with its status and the argument named "<tensor>-><field>".
 */
typedef struct {
    const char *what;
    const char *named; /* printf format of what fa_last_error() starts with; %s: the tensor */
    fa_status want;
    int outputs_only;  /* a fault only an output has (self-overlap) */
} tensor_fault;

static const tensor_fault tensor_faults[] = {
    {"data NULL", "%s->data", FA_ERR_NULL_POINTER, 0},
    {"dtype 77", "%s->dtype", FA_ERR_DTYPE, 0},
    {"batch -1", "%s->batch", FA_ERR_SHAPE, 0},
    {"seqlen -2", "%s->seqlen", FA_ERR_SHAPE, 0},
    {"heads 0", "%s->heads", FA_ERR_SHAPE, 0},
    {"headdim 0", "%s->headdim", FA_ERR_SHAPE, 0},
    {"batch 2^40 + 1", "%s->batch", FA_ERR_OVERFLOW, 0},
    {"headdim_stride 2", "%s->headdim_stride", FA_ERR_STRIDE, 0},
    {"seq_stride -1", "%s->seq_stride", FA_ERR_STRIDE, 0},
    {"batch_stride INT64_MAX", "%s: the extent overflows int64", FA_ERR_OVERFLOW, 0},
    {"head_stride 1 (rows overlap)", "%s: its strides map two elements", FA_ERR_STRIDE, 1},
};
#define NFAULT ((int)(sizeof tensor_faults / sizeof *tensor_faults))

static void break_tensor(fa_tensor *t, int fault)
{
    switch (fault) {
    case 0: t->data = NULL; break;
    case 1: t->dtype = (fa_dtype)77; break;
    case 2: t->batch = -1; break;
    case 3: t->seqlen = -2; break;
    case 4: t->heads = 0; break;
    case 5: t->headdim = 0; break;
    case 6: t->batch = ((int64_t)1 << 40) + 1; break;
    case 7: t->headdim_stride = 2; break;
    case 8: t->seq_stride = -1; break;
    case 9: t->batch_stride = INT64_MAX; break;
    default: t->head_stride = 1; break;
    }
}

/* _i: tensor (q k v out lse dout dq dk dv) x fault, on each backend */
START_TEST(tensor_faults_rejected_untouched)
{
    static const char *const names[9] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    const int tensor = _i / NFAULT % 9, fault = _i % NFAULT;
    const fa_backend be = (fa_backend)(FA_BACKEND_REFERENCE + _i / (9 * NFAULT));
    const tensor_fault *f = &tensor_faults[fault];
    /* out and lse are outputs of the forward and inputs of the backward; dout and the
     * gradients belong to the backward alone */
    for (int backward = tensor >= 5; backward < 2; backward++) {
        const int output = backward ? tensor >= 6 : tensor == 3 || tensor == 4;
        if (f->outputs_only && !output)
            continue;
        setup s;
        setup_make(&s);
        fa_tensor *ts[9] = {&s.tq, &s.tk, &s.tv, &s.to, &s.tl, &s.tdout, &s.tdq, &s.tdk, &s.tdv};
        break_tensor(ts[tensor], fault);
        const char *changed; /* a backward's out and lse stay setup_make's plausible inputs */
        const fa_status got = call_on_setup(&s, be, backward, &changed);
        ck_assert_msg(!changed, "%s %s (%s): %s was written", names[tensor], f->what,
                      backward ? "backward" : "forward", changed);
        char detail[64];
        snprintf(detail, sizeof detail, f->named, names[tensor]);
        ck_assert_msg(got == f->want, "%s %s (%s, %s): status %s, want %s; detail: %s",
                      names[tensor], f->what, fa_backend_name(be),
                      backward ? "backward" : "forward", fa_status_string(got),
                      fa_status_string(f->want), fa_last_error());
        ck_assert_msg(strncmp(fa_last_error(), detail, strlen(detail)) == 0,
                      "%s %s: detail '%s' does not start with '%s'", names[tensor], f->what,
                      fa_last_error(), detail);
        setup_free(&s);
    }
}
END_TEST

/* Views that interleave without sharing a byte are not aliasing: Q, K, V of one packed QKV
 * buffer (B, S, 3, H, D), and dQ, dK, dV of one packed dQKV, give the bits of separate
 * tensors; the same layout with K shifted by one element into Q's run is refused. */
START_TEST(packed_views_accepted)
{
    const int64_t B = 2, S = 33, H = 2, D = 16, row = 3 * H * D, n = B * S * row;
    float *qkv = malloc(sizeof(float) * n), *dqkv = malloc(sizeof(float) * n);
    float *sep = malloc(sizeof(float) * n), *dsep = malloc(sizeof(float) * n);
    float *o = malloc(sizeof(float) * B * S * H * D), *o2 = malloc(sizeof(float) * B * S * H * D);
    float *g = malloc(sizeof(float) * B * S * H * D), *l = malloc(sizeof(float) * B * H * S);
    float *l2 = malloc(sizeof(float) * B * H * S);
    uint64_t seed = 7;
    for (int64_t x = 0; x < n; x++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        qkv[x] = (float)((double)(seed >> 40) / (double)(1ull << 24)) - 0.5f;
    }
    for (int64_t x = 0; x < B * S * H * D; x++)
        g[x] = (float)((x * 37) % 101) / 101.0f - 0.5f;
    fa_tensor pk[3], pd[3], tk[3], td[3], to, to2, tg, tl, tl2;
    for (int t = 0; t < 3; t++) {
        fa_tensor_init(&pk[t], qkv + t * H * D, FA_F32, B, S, H, D, 0);
        pk[t].seq_stride = row, pk[t].batch_stride = S * row;
        pd[t] = pk[t], pd[t].data = dqkv + t * H * D;
        fa_tensor_init(&tk[t], sep + t * B * S * H * D, FA_F32, B, S, H, D, 0);
        fa_tensor_init(&td[t], dsep + t * B * S * H * D, FA_F32, B, S, H, D, 0);
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                memcpy((float *)tk[t].data + (b * S + s) * H * D,
                       (float *)pk[t].data + b * S * row + s * row, sizeof(float) * H * D);
    }
    fa_tensor_init(&to, o, FA_F32, B, S, H, D, 0), fa_tensor_init(&to2, o2, FA_F32, B, S, H, D, 0);
    fa_tensor_init(&tg, g, FA_F32, B, S, H, D, 0);
    fa_tensor_init(&tl, l, FA_F32, B, S, H, 1, 1), fa_tensor_init(&tl2, l2, FA_F32, B, S, H, 1, 1);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    ck_assert_int_eq(fa_forward(ctx, &p, &pk[0], &pk[1], &pk[2], &to, &tl), FA_OK);
    ck_assert_int_eq(fa_forward(ctx, &p, &tk[0], &tk[1], &tk[2], &to2, &tl2), FA_OK);
    ck_assert(memcmp(o, o2, sizeof(float) * B * S * H * D) == 0);
    ck_assert_int_eq(fa_backward(ctx, &p, &pk[0], &pk[1], &pk[2], &to, &tl, &tg, &pd[0], &pd[1],
                                 &pd[2]), FA_OK);
    ck_assert_int_eq(fa_backward(ctx, &p, &tk[0], &tk[1], &tk[2], &to2, &tl2, &tg, &td[0],
                                 &td[1], &td[2]), FA_OK);
    for (int t = 0; t < 3; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                ck_assert(memcmp((float *)td[t].data + (b * S + s) * H * D,
                                 (float *)pd[t].data + b * S * row + s * row,
                                 sizeof(float) * H * D) == 0);
    pd[1].data = dqkv + H * D - 1; /* dK one element into dQ's run: refused */
    ck_assert_int_eq(fa_backward(ctx, &p, &pk[0], &pk[1], &pk[2], &to, &tl, &tg, &pd[0], &pd[1],
                                 &pd[2]), FA_ERR_STRIDE);
    ck_assert_msg(strstr(fa_last_error(), "dk overlaps dq"), "%s", fa_last_error());
    fa_context_destroy(ctx);
    free(qkv), free(dqkv), free(sep), free(dsep), free(o), free(o2), free(g), free(l), free(l2);
}
END_TEST

START_TEST(null_pointers_rejected)
{
    setup s;
    setup_make(&s);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 1);
    ht_poison(&s.o);
    ck_assert_int_eq(fa_forward(NULL, &s.p, &s.tq, &s.tk, &s.tv, &s.to, NULL), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "ctx"));
    ck_assert_int_eq(fa_forward(ctx, NULL, &s.tq, &s.tk, &s.tv, &s.to, NULL), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "params"));
    ck_assert_int_eq(fa_forward(ctx, &s.p, NULL, &s.tk, &s.tv, &s.to, NULL), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "q is NULL"));
    ck_assert_int_eq(fa_forward(ctx, &s.p, &s.tq, &s.tk, &s.tv, NULL, NULL), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "out is NULL"));
    ck_assert(ht_is_poisoned(&s.o));
    ck_assert_int_eq(fa_backward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, NULL, &s.tdout, &s.tdq,
                                 &s.tdk, &s.tdv), FA_ERR_NULL_POINTER);
    ck_assert(strstr(fa_last_error(), "lse is NULL"));
    ck_assert_int_eq(fa_context_create(NULL, NULL), FA_ERR_NULL_POINTER);
    ck_assert_int_eq(fa_memory_stats(NULL, NULL, NULL), FA_ERR_NULL_POINTER);
    ck_assert_int_eq(fa_merge_states(0, NULL, NULL, &s.to, &s.tl), FA_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fa_merge_states(1, NULL, &s.tl, &s.to, &s.tl), FA_ERR_NULL_POINTER);
    fa_tensor bad_lse = s.tl;
    bad_lse.seqlen = 4;
    ck_assert_int_eq(fa_merge_states(1, &s.to, &bad_lse, &s.to, &s.tl), FA_ERR_SHAPE);
    ck_assert(strstr(fa_last_error(), "lses[0]->seqlen"));
    fa_context_destroy(ctx);
    fa_context_destroy(NULL); /* harmless, like free(NULL) */
    setup_free(&s);
}
END_TEST

/* With f64 storage the backward refuses an f32 LSE: P = exp(s - LSE) would lose f64 accuracy. */
START_TEST(f64_backward_needs_f64_lse)
{
    ht_tensor q, o, l;
    ht_alloc(&q, FA_F64, 1, 4, 1, 8, SW_BSHD);
    ht_alloc(&o, FA_F64, 1, 4, 1, 8, SW_BSHD);
    ht_alloc_lse(&l, FA_F32, 1, 4, 1);
    fa_params p;
    fa_params_init(&p);
    for (int be = FA_BACKEND_REFERENCE; be <= FA_BACKEND_TILED; be++) {
        fa_context *ctx = ht_context((fa_backend)be, 1);
        ht_poison(&o);
        ck_assert_int_eq(fa_backward(ctx, &p, &q.t, &q.t, &q.t, &q.t, &l.t, &q.t, &o.t, &o.t,
                                     &o.t), FA_ERR_DTYPE);
        ck_assert(strstr(fa_last_error(), "lse->dtype"));
        ck_assert(ht_is_poisoned(&o));
        fa_context_destroy(ctx);
    }
    ht_free(&q), ht_free(&o), ht_free(&l);
}
END_TEST

/* A failure found inside a backend (here: the conventional path's BLAS int range) also leaves
 * the outputs untouched. The tensors claim 2^31 keys over a small buffer: the call must refuse
 * before reading them. */
START_TEST(backend_refusal_untouched)
{
    setup s;
    setup_make(&s);
    s.tk.seqlen = s.tv.seqlen = (int64_t)1 << 31;
    s.tk.batch_stride = s.tv.batch_stride = 0;
    s.tk.seq_stride = s.tv.seq_stride = 0; /* every key row aliases row 0: a valid input view */
    fa_context *ctx = ht_context(FA_BACKEND_CONVENTIONAL, 2);
    ht_poison(&s.o), ht_poison(&s.l);
    ck_assert_int_eq(fa_forward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl), FA_ERR_UNSUPPORTED);
    ck_assert(strstr(fa_last_error(), "BLAS int"));
    ck_assert(ht_is_poisoned(&s.o) && ht_is_poisoned(&s.l));
    fa_context_destroy(ctx);
    setup_free(&s);
}
END_TEST

/* Zero-size problems are valid: nothing to do, or (no keys) every row empty. */
START_TEST(zero_sizes)
{
    setup s;
    setup_make(&s);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    s.tq.seqlen = 0, s.to.seqlen = 0, s.tl.seqlen = 0;
    ck_assert_int_eq(fa_forward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl), FA_OK);
    s.tq = s.q.t, s.to = s.o.t, s.tl = s.l.t;
    s.tk.seqlen = 0, s.tv.seqlen = 0;
    ht_poison(&s.o);
    ck_assert_int_eq(fa_forward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl), FA_OK);
    for (int64_t i = 0; i < 9; i++) {
        ck_assert(ht_get(&s.o, 1, i, 3, 5) == 0);
        ck_assert(ht_get(&s.l, 1, i, 3, 0) == -INFINITY);
    }
    /* backward with no query rows: no (query, key) pair, so dk and dv are 0 */
    s.tk = s.k.t, s.tv = s.v.t;
    s.tq.seqlen = s.to.seqlen = s.tl.seqlen = s.tdout.seqlen = s.tdq.seqlen = 0;
    ht_poison(&s.dk), ht_poison(&s.dv);
    ck_assert_int_eq(fa_backward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl, &s.tdout, &s.tdq,
                                 &s.tdk, &s.tdv), FA_OK);
    ck_assert(ht_get(&s.dk, 1, 10, 1, 7) == 0 && ht_get(&s.dv, 0, 3, 0, 5) == 0);
    /* a batch at the 2^40 limit with no rows and no keys: nothing to touch, and nothing to
     * loop over (a loop over the batch alone would run for hours; the fuzzer found one) */
    fa_tensor *all[9] = {&s.tq, &s.tk, &s.tv, &s.to, &s.tl, &s.tdout, &s.tdq, &s.tdk, &s.tdv};
    for (int i = 0; i < 9; i++)
        all[i]->batch = (int64_t)1 << 40, all[i]->seqlen = 0, all[i]->data = NULL;
    ck_assert_int_eq(fa_forward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl), FA_OK);
    ck_assert_int_eq(fa_backward(ctx, &s.p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl, &s.tdout, &s.tdq,
                                 &s.tdk, &s.tdv), FA_OK);
    fa_context_destroy(ctx);
    setup_free(&s);
}
END_TEST

START_TEST(context_options_and_environment)
{
    fa_context *ctx;
    fa_options o;
    fa_options_init(&o);
    o.num_threads = -1;
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(fa_last_error(), "num_threads"));
    fa_options_init(&o);
    o.backend = FA_BACKEND_CUDA;
#ifdef FA_HAVE_CUDA /* a CUDA build: available exactly when a device is there */
    const fa_status cuda = fa_context_create(&o, &ctx);
    ck_assert_msg(cuda == FA_OK || cuda == FA_ERR_BACKEND_UNAVAILABLE, "%s", fa_last_error());
    if (cuda == FA_OK)
        fa_context_destroy(ctx);
#else
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
#endif
    fa_options_init(&o);
#if defined(__aarch64__)
    o.isa = FA_ISA_AVX2; /* an ISA this CPU cannot run */
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
    ck_assert(strstr(fa_last_error(), "avx2"));
#else
    o.isa = FA_ISA_NEON;
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
    ck_assert(strstr(fa_last_error(), "neon"));
#endif

    char line[512];
    setenv("FA_BACKEND", "reference", 1);
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_OK);
    fa_context_describe(ctx, line, sizeof line);
    ck_assert_msg(strstr(line, "backend=reference"), "%s", line);
    fa_context_destroy(ctx);
    fa_options_init(&o);
    o.backend = FA_BACKEND_CONVENTIONAL; /* an explicit choice wins over the variable */
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_OK);
    fa_context_describe(ctx, line, sizeof line);
    ck_assert_msg(strstr(line, "backend=conventional"), "%s", line);
    fa_context_destroy(ctx);
    setenv("FA_BACKEND", "bogus", 1);
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_ERR_INVALID_ARGUMENT);
    ck_assert(strstr(fa_last_error(), "FA_BACKEND=bogus"));
    unsetenv("FA_BACKEND");
    setenv("FA_ISA", "neon", 1); /* an ISA this (x86) CPU cannot run, or an arm64 build lacks */
#if defined(__x86_64__)
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_ERR_BACKEND_UNAVAILABLE);
#else
    if (fa_context_create(NULL, &ctx) == FA_OK)
        fa_context_destroy(ctx);
#endif
    setenv("FA_ISA", "scalar", 1);
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_OK);
    fa_context_describe(ctx, line, sizeof line);
    ck_assert_msg(strstr(line, "backend=tiled isa=scalar") && strstr(line, "L1d="), "%s", line);
    /* truncation is safe and terminated */
    ck_assert_int_eq(fa_context_describe(ctx, line, 10), FA_OK);
    ck_assert_uint_eq(strlen(line), 9);
    fa_context_destroy(ctx);
    unsetenv("FA_ISA");
    /* FA_TILES: BQxBK or BQxBKxBR, decimal, each in [1, 4096], BR <= BQ; describe shows them */
    static const char *const tiles_ok[] = {"64x32", "64x32x8", "4096x4096x4096", "1x1x1"};
    for (size_t t = 0; t < sizeof tiles_ok / sizeof *tiles_ok; t++) {
        setenv("FA_TILES", tiles_ok[t], 1);
        ck_assert_msg(fa_context_create(NULL, &ctx) == FA_OK, "%s: %s", tiles_ok[t],
                      fa_last_error());
        fa_context_describe(ctx, line, sizeof line);
        fa_context_destroy(ctx);
        if (t == 1)
            ck_assert_msg(strstr(line, "D=64 64x32x8/64x32"), "%s", line);
    }
    static const char *const tiles_bad[] = {
        "64x32x", "64x32x0", "64x32x65", "64x 32", "64x32x8x1", "0x32",  "64",
        "64x4097", "99999999999999999999x1", "x32", "64x32 ", "-64x32", "+64x32"};
    for (size_t t = 0; t < sizeof tiles_bad / sizeof *tiles_bad; t++) {
        setenv("FA_TILES", tiles_bad[t], 1);
        ck_assert_msg(fa_context_create(NULL, &ctx) == FA_ERR_INVALID_ARGUMENT, "%s accepted",
                      tiles_bad[t]);
        ck_assert(strstr(fa_last_error(), "FA_TILES="));
    }
    unsetenv("FA_TILES");
#ifdef FA_HAVE_CUDA
    /* FA_CUDA_KERNEL, read once as a context is made (any backend's: AUTO may take CUDA's
     * kernels): describe shows the choice, a context keeps it, and a value naming no choice
     * refuses the context by name */
    setenv("FA_CUDA_KERNEL", "mma", 1);
    ck_assert_msg(fa_context_create(NULL, &ctx) == FA_OK, "%s", fa_last_error());
    setenv("FA_CUDA_KERNEL", "wgmma", 1);
    fa_context_describe(ctx, line, sizeof line);
    fa_context_destroy(ctx);
    ck_assert_msg(strstr(line, " cuda_kernels=mma"), "%s", line);
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "FA_CUDA_KERNEL=wgmma"), "%s", fa_last_error());
    unsetenv("FA_CUDA_KERNEL");
#endif
    /* the tile products and the bf16 forward's tiles on them, only where the set has them */
    ht_kernels = ht_emulated_tiles();
    ctx = ht_context(FA_BACKEND_TILED, 1);
    fa_context_describe(ctx, line, sizeof line);
    fa_context_destroy(ctx);
    ck_assert_msg(strstr(line, ",qk,expsum,pv,gemm ") &&
                      strstr(line, "; bf16 fwd on tile products: D=128 "),
                  "%s", line);
    ht_kernels = NULL;
    ctx = ht_context(FA_BACKEND_TILED, 1);
    fa_context_describe(ctx, line, sizeof line);
    fa_context_destroy(ctx);
    ck_assert_msg(!strstr(line, "tile products") || fai_kernels_for(fai_isa_best(NULL))->bf16, "%s",
                  line);
    /* AUTO obeys the rule, and says why, where one decided: only where this CPU runs the
     * AVX512_BF16 set and AMX's does not go first */
    const char *why, *rule;
    const fa_isa best = fai_isa_best(&why);
    if (fai_kernels_for(FA_ISA_AVX512BF16) && best != FA_ISA_AMX) {
        const int takes = fai_cpu_auto_takes(FA_ISA_AVX512BF16, &rule);
        ck_assert_int_eq(best, takes ? FA_ISA_AVX512BF16 : FA_ISA_AVX512);
        ck_assert_msg(why && why == rule && strstr(line, why), "%s", line);
    } else {
        ck_assert_msg(!why, "%s: %s", line, why);
    }
    char isa_word[64];
    snprintf(isa_word, sizeof isa_word, " isa=%s ", fa_isa_name(best));
    ck_assert_msg(strstr(line, isa_word), "%s", line);
}
END_TEST

/* AUTO's rule for the bf16 dot products (simd/cpu.c), asked about CPUs this one need not
 * be: AMD Zen 5 (family 0x1a), where they were measured faster, takes them; Zen 4 (0x19),
 * other families and every other vendor (family 0 here) widen to f32; each answer comes with
 * its reason. */
START_TEST(bf16_dots_rule_by_family)
{
    static const int family[] = {0, 0x17, 0x19, 0x1a, 0x1b}, takes[] = {0, 0, 0, 1, 0};
    for (int i = 0; i < 5; i++) {
        const char *why = NULL;
        ck_assert_int_eq(fai_cpu_bf16_dots_rule(family[i], &why), takes[i]);
        ck_assert_msg(why && *why, "family %#x: no reason", family[i]);
    }
}
END_TEST

/*
 * Every ISA of the registry has a name, and that name is what FA_ISA accepts (a context is
 * made, or refused as unavailable with the ISA named, never as an unknown name) and what an
 * explicit option is refused or accepted with alike; fa_isa_name knows no value beyond the
 * registry. (FA_ISA=amx, documented, was once refused as unknown: the list was kept by hand.)
 * The command's --isa takes the names from fa_isa_name too (tests/test_cli.py, isa_names).
 */
START_TEST(isa_names_round_trip)
{
    char line[512];
    for (int i = 0; i < ht_nisas; i++) {
        const char *name = fa_isa_name(ht_isas[i]);
        ck_assert(strcmp(name, "invalid") != 0 && strcmp(name, "auto") != 0);
        setenv("FA_ISA", name, 1);
        fa_context *ctx;
        const fa_status s = fa_context_create(NULL, &ctx);
        ck_assert_msg(s == FA_OK || s == FA_ERR_BACKEND_UNAVAILABLE, "FA_ISA=%s: %s", name,
                      fa_last_error());
        if (s == FA_OK) {
            fa_context_describe(ctx, line, sizeof line);
            char want[64];
            snprintf(want, sizeof want, " isa=%s ", name);
            ck_assert_msg(strstr(line, want), "FA_ISA=%s: %s", name, line);
            fa_context_destroy(ctx);
        } else {
            ck_assert_msg(strstr(fa_last_error(), name), "FA_ISA=%s: %s", name, fa_last_error());
        }
        unsetenv("FA_ISA");
        fa_options o;
        fa_options_init(&o);
        o.isa = ht_isas[i];
        ck_assert_int_eq(fa_context_create(&o, &ctx), s);
        if (s == FA_OK)
            fa_context_destroy(ctx);
    }
    int named = 0;
    for (int v = FA_ISA_AUTO + 1; strcmp(fa_isa_name((fa_isa)v), "invalid") != 0; v++)
        named++;
    ck_assert_int_eq(named, ht_nisas);
    fa_context *ctx;
    fa_options o;
    fa_options_init(&o);
    o.isa = (fa_isa)(ht_nisas + 1);
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_ERR_INVALID_ARGUMENT);
    setenv("FA_ISA", "sse", 1); /* unknown: refused with every name listed */
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < ht_nisas; i++)
        ck_assert_msg(strstr(fa_last_error(), fa_isa_name(ht_isas[i])), "%s", fa_last_error());
    setenv("FA_ISA", "auto", 1);
    ck_assert_int_eq(fa_context_create(NULL, &ctx), FA_ERR_INVALID_ARGUMENT);
    unsetenv("FA_ISA");
}
END_TEST

/* An op a backend's table lacks (a NULL slot) is FA_ERR_UNSUPPORTED, naming the backend and
 * the op; a slot that is there is handed out. */
START_TEST(missing_op_unsupported)
{
    const fai_backend partial = {
        .name = "partial", .ops = {[FAI_OP_BACKWARD] = fai_backend_tiled.ops[FAI_OP_BACKWARD]}};
    fai_op_fn fn = NULL;
    ck_assert_int_eq(fai_backend_op(&partial, FAI_OP_FORWARD, "forward", &fn),
                     FA_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(fa_last_error(), "partial") && strstr(fa_last_error(), "forward"), "%s",
                  fa_last_error());
    ck_assert_int_eq(fai_backend_op(&partial, FAI_OP_BACKWARD, "backward", &fn), FA_OK);
    ck_assert(fn == fai_backend_tiled.ops[FAI_OP_BACKWARD]);
    for (int b = FA_BACKEND_REFERENCE; b <= FA_BACKEND_CUDA; b++) { /* every backend has both */
        const fai_backend *be = fai_backend_of((fa_backend)b);
        ck_assert(be && be->ops[FAI_OP_FORWARD] && be->ops[FAI_OP_BACKWARD]);
        ck_assert_str_eq(be->name, fa_backend_name((fa_backend)b));
        ck_assert_int_eq(fai_backend_from_name(be->name), b);
    }
}
END_TEST

START_TEST(status_strings_distinct)
{
    for (int a = FA_OK; a <= FA_ERR_COMMUNICATION; a++) {
        ck_assert(strlen(fa_status_string((fa_status)a)) > 0);
        for (int b = a + 1; b <= FA_ERR_COMMUNICATION; b++)
            ck_assert_str_ne(fa_status_string((fa_status)a), fa_status_string((fa_status)b));
    }
    ck_assert_str_eq(fa_status_string((fa_status)1000), "unknown status");
    ck_assert_str_eq(fa_dtype_name(FA_BF16), "bf16");
    ck_assert_str_eq(fa_backend_name(FA_BACKEND_TILED), "tiled");
    ck_assert_str_eq(fa_isa_name(FA_ISA_AVX512), "avx512");
}
END_TEST

/* The convention profiles: listed, found by name, and the LSE conventions of README's table
 * (FlashInfer's log2, FA2's +inf for an empty row) applied in place and undone. */
START_TEST(profiles_convert_lse)
{
    static const char *const names[] = {"flashattn", "fa2", "fa3", "pytorch", "flashinfer",
                                        "xformers", "ggml", "flex"};
    const int n = (int)(sizeof names / sizeof *names);
    for (int i = 0; i < n; i++) {
        ck_assert_ptr_nonnull(fa_profile_at(i));
        ck_assert_str_eq(fa_profile_at(i)->name, names[i]);
        ck_assert_ptr_eq(fa_profile_find(names[i]), fa_profile_at(i));
    }
    ck_assert_ptr_null(fa_profile_at(n));
    ck_assert_ptr_null(fa_profile_at(-1));
    ck_assert_ptr_null(fa_profile_find("fa4"));
    ck_assert_ptr_null(fa_profile_find(NULL));
    ck_assert_int_eq(fa_profile_find("pytorch")->align, FA_ALIGN_TOP_LEFT);
    ck_assert_int_eq(fa_profile_find("ggml")->has_lse, 0);
    ck_assert_int_eq(fa_profile_find("xformers")->window_is_count, 1);
    ck_assert_int_eq(fa_profile_find("ggml")->bias_place, FA_BIAS_AFTER_SOFTCAP);
    ck_assert_int_eq(fa_profile_find("ggml")->bias_by_slope, 1);
    ck_assert_int_eq(fa_profile_find("fa3")->descale_layout, FA_DESCALE_PER_KV_HEAD);
    ck_assert_int_eq(fa_profile_find("flex")->empty_out, FA_EMPTY_OUT_ZERO);

    double v[3] = {1.5, -INFINITY, -2.0}; /* B 1, H 1, S 3 */
    fa_tensor t = {v, FA_F64, 1, 3, 1, 1, 3, 1, 3, 1};
    ck_assert_int_eq(fa_lse_to_profile(fa_profile_find("flashinfer"), &t), FA_OK);
    ck_assert(fabs(v[0] - 1.5 / log(2.0)) < 1e-15 && v[1] == -INFINITY &&
              fabs(v[2] + 2.0 / log(2.0)) < 1e-15);
    ck_assert_int_eq(fa_lse_from_profile(fa_profile_find("flashinfer"), &t), FA_OK);
    ck_assert(fabs(v[0] - 1.5) < 1e-15 && fabs(v[2] + 2.0) < 1e-15);
    ck_assert_int_eq(fa_lse_to_profile(fa_profile_find("fa2"), &t), FA_OK);
    ck_assert(v[1] == INFINITY && fabs(v[0] - 1.5) < 1e-15);
    ck_assert_int_eq(fa_lse_from_profile(fa_profile_find("fa2"), &t), FA_OK);
    ck_assert(v[1] == -INFINITY);
    ck_assert_int_eq(fa_lse_to_profile(NULL, &t), FA_ERR_NULL_POINTER);
    t.headdim = 2; /* not an LSE: refused, nothing written */
    ck_assert_int_eq(fa_lse_to_profile(fa_profile_find("fa2"), &t), FA_ERR_SHAPE);
    ck_assert(v[1] == -INFINITY);
}
END_TEST

/* fa_profile_apply: a profile's conventions for the fields not given, the given ones kept, one
 * window number as a key count or a left bound, ggml's slopes on its bias only where both are
 * set, and a count below 1 refused with the params untouched. */
START_TEST(profiles_apply_conventions)
{
    const fa_profile *ggml = fa_profile_find("ggml"), *pytorch = fa_profile_find("pytorch");
    fa_params p, before;
    fa_params_init(&p);
    const int64_t w = 5, zero = 0;
    ck_assert_int_eq(fa_profile_apply(ggml, &p, &w, 0), FA_OK);
    ck_assert(p.window_left == 4 && p.window_right == 0);
    ck_assert(p.bias_place == FA_BIAS_AFTER_SOFTCAP && p.bias_by_slope == 0); /* no slopes */
    const float slopes[1] = {0.5f};
    fa_tensor bias = {0};
    p.alibi_slopes = slopes;
    p.bias = &bias;
    ck_assert_int_eq(fa_profile_apply(ggml, &p, NULL, 0), FA_OK);
    ck_assert(p.bias_by_slope == 1 && p.window_left == 4); /* no window: left as it was */
    ck_assert_int_eq(fa_profile_apply(ggml, &p, NULL, FA_GIVEN_BIAS_BY_SLOPE), FA_OK);
    ck_assert_int_eq(p.bias_by_slope, 1);
    p.bias_by_slope = 0;
    ck_assert_int_eq(fa_profile_apply(ggml, &p, NULL, FA_GIVEN_BIAS_BY_SLOPE), FA_OK);
    ck_assert_int_eq(p.bias_by_slope, 0);

    fa_params_init(&p);
    ck_assert_int_eq(fa_profile_apply(pytorch, &p, &w, FA_GIVEN_BIAS_PLACE), FA_OK);
    ck_assert(p.align == FA_ALIGN_TOP_LEFT && p.window_left == 5 && p.window_right == -1);
    p.align = FA_ALIGN_BOTTOM_RIGHT;
    p.bias_place = FA_BIAS_AFTER_SOFTCAP;
    p.score_order = FA_ALIBI_THEN_SOFTCAP;
    ck_assert_int_eq(fa_profile_apply(pytorch, &p, NULL,
                                      FA_GIVEN_ALIGN | FA_GIVEN_SCORE_ORDER |
                                          FA_GIVEN_BIAS_PLACE),
                     FA_OK);
    ck_assert(p.align == FA_ALIGN_BOTTOM_RIGHT && p.score_order == FA_ALIBI_THEN_SOFTCAP &&
              p.bias_place == FA_BIAS_AFTER_SOFTCAP);
    ck_assert_int_eq(fa_profile_apply(fa_profile_find("flashinfer"), &p, NULL, 0), FA_OK);
    ck_assert(p.score_order == FA_ALIBI_THEN_SOFTCAP && p.bias_place == FA_BIAS_AFTER_SCALE);

    memcpy(&before, &p, sizeof p); /* the padding too */
    ck_assert_int_eq(fa_profile_apply(fa_profile_find("xformers"), &p, &zero, 0),
                     FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "window = 0"), "%s", fa_last_error());
    ck_assert(!memcmp(&p, &before, sizeof p));
    ck_assert_int_eq(fa_profile_apply(NULL, &p, NULL, 0), FA_ERR_NULL_POINTER);
    ck_assert_int_eq(fa_profile_apply(ggml, NULL, NULL, 0), FA_ERR_NULL_POINTER);
}
END_TEST

/* fa_last_error is per thread: a failure on one thread does not overwrite another's detail. */
START_TEST(last_error_thread_local)
{
    fa_context *ctx;
    fa_options o;
    fa_options_init(&o);
    o.num_threads = -3;
    ck_assert_int_eq(fa_context_create(&o, &ctx), FA_ERR_INVALID_ARGUMENT);
    int other_ok = 0;
#pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1) {
            ck_assert_int_eq(fa_merge_states(0, NULL, NULL, NULL, NULL), FA_ERR_INVALID_ARGUMENT);
            other_ok = strstr(fa_last_error(), "n = 0") != NULL;
        }
    }
    ck_assert(other_ok);
    ck_assert_msg(strstr(fa_last_error(), "num_threads: -3"), "%s", fa_last_error());
}
END_TEST

Suite *make_api_suite(void)
{
    Suite *s = suite_create("api");
    TCase *tc = ht_tcase_create("api");
    tcase_add_loop_test(tc, bad_inputs_rejected_untouched, 0, 3 * NBAD);
    tcase_add_loop_test(tc, tensor_faults_rejected_untouched, 0, 3 * 9 * NFAULT);
    tcase_add_test(tc, null_pointers_rejected);
    tcase_add_test(tc, packed_views_accepted);
    tcase_add_test(tc, zero_sizes);
    tcase_add_test(tc, f64_backward_needs_f64_lse);
    tcase_add_test(tc, backend_refusal_untouched);
    tcase_add_test(tc, context_options_and_environment);
    tcase_add_test(tc, isa_names_round_trip);
    tcase_add_test(tc, bf16_dots_rule_by_family);
    tcase_add_test(tc, missing_op_unsupported);
    tcase_add_test(tc, status_strings_distinct);
    tcase_add_test(tc, profiles_convert_lse);
    tcase_add_test(tc, profiles_apply_conventions);
    suite_add_tcase(s, tc);
    TCase *cc = ht_tcase_create("concurrency"); /* CI's ThreadSanitizer stage runs these */
    tcase_add_test(cc, last_error_thread_local);
    suite_add_tcase(s, cc);
    return s;
}
