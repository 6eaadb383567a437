/*
 * Inference shapes: variable-length batches (fa_forward_varlen, fa_backward_varlen) and a paged
 * K/V (fa_forward_paged).
 *
 * A variable-length batch is defined as its sequences attended one by one (docs/DESIGN.md
 * §1), so the test is that definition, to the bit: each sequence's rows against a dense call on
 * views of that sequence's rows alone, on every backend that takes the batches, in every dtype,
 * with masks aligned per sequence, sinks, ALiBi, softcap, GQA, empty sequences on either side,
 * and sequences that take the decode path beside ones that take the tiles. With dropout, equal
 * lengths are a dense batch (sequence b draws batch b's stream). A paged K/V is the same keys
 * stored contiguously, to the bit, for page sizes 1, 3, 16 and 256, pages in shuffled order,
 * shared between sequences, NHD and HND. Bad offsets and tables are refused with their own
 * message and nothing written.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { HQ = 4, HK = 2, D = 32, NSEQ = 6 };

/* Sequence lengths: an empty query side, an empty key side, one row, more rows than keys
 * (bottom-right causal leaves rows without a key), a decode-shaped sequence over two chunks. */
static const int64_t len_q[NSEQ] = {5, 0, 33, 70, 1, 3};
static const int64_t len_k[NSEQ] = {9, 12, 0, 40, 700, 600};

typedef struct {
    int64_t cq[NSEQ + 1], ck[NSEQ + 1];
    int32_t cq32[NSEQ + 1], ck32[NSEQ + 1];
    fa_indices iq, ik;
    ht_tensor q, k, v, dout, out, lse, dq, dk, dv;     /* the packed batch, and its results  */
    ht_tensor out1, lse1, dq1, dk1, dv1;               /* the results of per-sequence calls */
} packed;

static void packed_make(packed *x, fa_dtype dt, int wide)
{
    x->cq[0] = x->ck[0] = 0;
    for (int s = 0; s < NSEQ; s++) {
        x->cq[s + 1] = x->cq[s] + len_q[s];
        x->ck[s + 1] = x->ck[s] + len_k[s];
    }
    for (int s = 0; s <= NSEQ; s++)
        x->cq32[s] = (int32_t)x->cq[s], x->ck32[s] = (int32_t)x->ck[s];
    x->iq = (fa_indices){wide ? (const void *)x->cq : x->cq32,
                         wide ? FA_INDEX_INT64 : FA_INDEX_INT32, NSEQ + 1};
    x->ik = (fa_indices){wide ? (const void *)x->ck : x->ck32,
                         wide ? FA_INDEX_INT64 : FA_INDEX_INT32, NSEQ + 1};
    const int64_t tq = x->cq[NSEQ], tk = x->ck[NSEQ];
    const fa_dtype lt = dt == FA_F64 ? FA_F64 : FA_F32;
    ht_alloc(&x->q, dt, 1, tq, HQ, D, SW_BSHD);
    ht_alloc(&x->k, dt, 1, tk, HK, D, SW_BSHD);
    ht_alloc(&x->v, dt, 1, tk, HK, D, SW_BSHD);
    ht_alloc(&x->dout, dt, 1, tq, HQ, D, SW_BSHD);
    ht_fill(&x->q, 1, 1, 0), ht_fill(&x->k, 2, 1, 0), ht_fill(&x->v, 3, 1, 0);
    ht_fill(&x->dout, 4, 1, 0);
    ht_tensor *qs[4] = {&x->out, &x->dq, &x->out1, &x->dq1};
    for (int i = 0; i < 4; i++)
        ht_alloc(qs[i], dt, 1, tq, HQ, D, SW_BSHD);
    ht_tensor *ks[4] = {&x->dk, &x->dv, &x->dk1, &x->dv1};
    for (int i = 0; i < 4; i++)
        ht_alloc(ks[i], dt, 1, tk, HK, D, SW_BSHD);
    ht_alloc_lse(&x->lse, lt, 1, tq, HQ);
    ht_alloc_lse(&x->lse1, lt, 1, tq, HQ);
}

static void packed_free(packed *x)
{
    ht_tensor *all[14] = {&x->q,   &x->k,    &x->v,   &x->dout, &x->out, &x->lse, &x->dq,
                          &x->dk,  &x->dv,   &x->out1, &x->lse1, &x->dq1, &x->dk1, &x->dv1};
    for (int i = 0; i < 14; i++)
        ht_free(all[i]);
}

/* Rows [r0, r0 + n) of a packed tensor as a tensor of their own (batch 1). */
static fa_tensor rows_of(const ht_tensor *x, int64_t r0, int64_t n)
{
    fa_tensor t = x->t;
    const size_t es = x->t.dtype == FA_F64 ? 8 : x->t.dtype == FA_F32 ? 4 : 2;
    t.data = (char *)t.data + (size_t)(r0 * t.seq_stride) * es;
    t.seqlen = n;
    return t;
}

/* The bytes of two tensors of one shape and layout are the same. */
static int same_bytes(const ht_tensor *a, const ht_tensor *b)
{
    return a->nbytes == b->nbytes && memcmp(a->t.data, b->t.data, a->nbytes) == 0;
}

static const float test_sinks[HQ] = {0.75f, -INFINITY, -1.5f, 2.0f};
static const float test_slopes[HQ] = {0.5f, 0.25f, 0.125f, 0.0625f};

/*
 * _i: backend (reference, conventional, tiled) x dtype (f32, bf16, f64) x mask (bottom-right causal with
 * sinks, int64 offsets; top-left causal with a window, softcap, ALiBi and sinks, int32).
 */
START_TEST(varlen_is_each_sequence_alone)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    static const fa_dtype dts[3] = {FA_F32, FA_BF16, FA_F64};
    const fa_backend be = bes[_i % 3];
    const fa_dtype dt = dts[_i / 3 % 3];
    const int mask = _i / 9;
    packed x;
    packed_make(&x, dt, mask == 0);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.sink_logits = test_sinks;
    if (mask == 1) {
        p.align = FA_ALIGN_TOP_LEFT;
        p.window_left = 7;
        p.softcap = 3;
        p.alibi_slopes = test_slopes;
    }
    ht_tensor *outs[10] = {&x.out, &x.lse, &x.dq, &x.dk, &x.dv,
                           &x.out1, &x.lse1, &x.dq1, &x.dk1, &x.dv1};
    for (int i = 0; i < 10; i++)
        ht_poison(outs[i]);
    fa_context *ctx = ht_context(be, 2);
    ck_assert_msg(fa_forward_varlen(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.iq, &x.ik, &x.out.t,
                                    &x.lse.t) == FA_OK, "%s", fa_last_error());
    ck_assert_msg(fa_backward_varlen(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.iq, &x.ik, &x.out.t,
                                     &x.lse.t, &x.dout.t, &x.dq.t, &x.dk.t, &x.dv.t) == FA_OK,
                  "%s", fa_last_error());
    for (int s = 0; s < NSEQ; s++) {
        const int64_t q0 = x.cq[s], nq = len_q[s], k0 = x.ck[s], nk = len_k[s];
        const fa_tensor q = rows_of(&x.q, q0, nq), k = rows_of(&x.k, k0, nk),
                        v = rows_of(&x.v, k0, nk), g = rows_of(&x.dout, q0, nq);
        fa_tensor o = rows_of(&x.out1, q0, nq), l = rows_of(&x.lse1, q0, nq);
        fa_tensor dq = rows_of(&x.dq1, q0, nq), dk = rows_of(&x.dk1, k0, nk),
                  dv = rows_of(&x.dv1, k0, nk);
        ck_assert_msg(fa_forward(ctx, &p, &q, &k, &v, &o, &l) == FA_OK, "%s", fa_last_error());
        /* the backward of the varlen forward's own results, as the varlen backward had */
        const fa_tensor vo = rows_of(&x.out, q0, nq), vl = rows_of(&x.lse, q0, nq);
        ck_assert_msg(fa_backward(ctx, &p, &q, &k, &v, &vo, &vl, &g, &dq, &dk, &dv) == FA_OK,
                      "%s", fa_last_error());
    }
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++)
        ck_assert_msg(same_bytes(outs[i], outs[5 + i]), "%s %s mask %d: %s differs from the "
                      "per-sequence calls'", fa_backend_name(be), fa_dtype_name(dt), mask,
                      names[i]);
    /* what the definition gives where there is nothing to attend: sequence 2 has no key */
    for (int64_t i = x.cq[2]; i < x.cq[3]; i++)
        for (int h = 0; h < HQ; h++) {
            ck_assert(ht_get(&x.out, 0, i, h, 5) == 0 && ht_get(&x.dq, 0, i, h, 3) == 0);
            ck_assert(ht_get(&x.lse, 0, i, h, 0) == (double)test_sinks[h]);
        }
    for (int64_t j = x.ck[1]; j < x.ck[2]; j++) /* sequence 1 has no query: dK = dV = 0 */
        ck_assert(ht_get(&x.dk, 0, j, 1, 7) == 0 && ht_get(&x.dv, 0, j, 0, 2) == 0);
    fa_context_destroy(ctx);
    packed_free(&x);
}
END_TEST

/*
 * More sequences than the decode path's wave holds (4096 items, backends/tiled/decode.c), all
 * decode-shaped, of lengths 0 to 29 keys: each sequence's rows to the bit as a dense call on
 * its rows alone, at 1 and 3 threads (the tasks of a wave share the threads out over
 * sequences).
 */
START_TEST(varlen_of_many_sequences_is_each_alone)
{
    enum { N = 4400, SQ = 1, HQm = 4, HKm = 1, Dm = 8 }; /* 4253 with a key */
    const int threads = _i == 0 ? 1 : 3;
    int64_t *cq = malloc(sizeof(int64_t) * (N + 1)), *ck = malloc(sizeof(int64_t) * (N + 1));
    ck_assert(cq && ck);
    cq[0] = ck[0] = 0;
    for (int s = 0; s < N; s++) {
        cq[s + 1] = cq[s] + SQ;
        ck[s + 1] = ck[s] + (s * 7) % 30;
    }
    const fa_indices iq = {cq, FA_INDEX_INT64, N + 1}, ik = {ck, FA_INDEX_INT64, N + 1};
    ht_tensor q, k, v, out, lse, out1, lse1;
    ht_alloc(&q, FA_F32, 1, cq[N], HQm, Dm, SW_BSHD);
    ht_alloc(&k, FA_F32, 1, ck[N], HKm, Dm, SW_BSHD);
    ht_alloc(&v, FA_F32, 1, ck[N], HKm, Dm, SW_BSHD);
    ht_fill(&q, 11, 1, 0), ht_fill(&k, 12, 1, 0), ht_fill(&v, 13, 1, 0);
    ht_alloc(&out, FA_F32, 1, cq[N], HQm, Dm, SW_BSHD);
    ht_alloc(&out1, FA_F32, 1, cq[N], HQm, Dm, SW_BSHD);
    ht_alloc_lse(&lse, FA_F32, 1, cq[N], HQm);
    ht_alloc_lse(&lse1, FA_F32, 1, cq[N], HQm);
    ht_poison(&out), ht_poison(&out1), ht_poison(&lse), ht_poison(&lse1);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.sink_logits = test_sinks;
    fa_context *ctx = ht_context(FA_BACKEND_TILED, threads);
    ck_assert_msg(fa_forward_varlen(ctx, &p, &q.t, &k.t, &v.t, &iq, &ik, &out.t, &lse.t) ==
                      FA_OK, "%s", fa_last_error());
    for (int s = 0; s < N; s++) {
        const fa_tensor qs = rows_of(&q, cq[s], SQ), ks = rows_of(&k, ck[s], ck[s + 1] - ck[s]),
                        vs = rows_of(&v, ck[s], ck[s + 1] - ck[s]);
        fa_tensor os = rows_of(&out1, cq[s], SQ), ls = rows_of(&lse1, cq[s], SQ);
        ck_assert_msg(fa_forward(ctx, &p, &qs, &ks, &vs, &os, &ls) == FA_OK, "%s",
                      fa_last_error());
    }
    ck_assert_msg(same_bytes(&out, &out1) && same_bytes(&lse, &lse1),
                  "%d threads: a sequence differs from its call alone", threads);
    fa_context_destroy(ctx);
    ht_tensor *all[7] = {&q, &k, &v, &out, &lse, &out1, &lse1};
    for (int i = 0; i < 7; i++)
        ht_free(all[i]);
    free(cq);
    free(ck);
}
END_TEST

/* A dense decode batch of more batches than the decode path's wave holds (a wave ends inside
 * one group): each batch to the bit as a call on it alone, at 1 and 3 threads. */
START_TEST(decode_batch_past_a_wave_is_each_batch_alone)
{
    enum { B = 4200, SK = 37, HQm = 4, HKm = 2, Dm = 8 };
    const int threads = _i == 0 ? 1 : 3;
    ht_tensor q, k, v, out, lse, out1, lse1;
    ht_alloc(&q, FA_F32, B, 1, HQm, Dm, SW_BSHD);
    ht_alloc(&k, FA_F32, B, SK, HKm, Dm, SW_BSHD);
    ht_alloc(&v, FA_F32, B, SK, HKm, Dm, SW_BSHD);
    ht_fill(&q, 21, 1, 0), ht_fill(&k, 22, 1, 0), ht_fill(&v, 23, 1, 0);
    ht_alloc(&out, FA_F32, B, 1, HQm, Dm, SW_BSHD);
    ht_alloc(&out1, FA_F32, B, 1, HQm, Dm, SW_BSHD);
    ht_alloc_lse(&lse, FA_F32, B, 1, HQm);
    ht_alloc_lse(&lse1, FA_F32, B, 1, HQm);
    ht_poison(&out), ht_poison(&out1), ht_poison(&lse), ht_poison(&lse1);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    ck_assert(ht_decode_keys(threads, &p, &q.t, &k.t, &v.t) > 0);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, threads);
    ck_assert_msg(fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t) == FA_OK, "%s",
                  fa_last_error());
    for (int b = 0; b < B; b++) {
        fa_tensor qs = q.t, ks = k.t, vs = v.t, os = out1.t, ls = lse1.t;
        qs.batch = ks.batch = vs.batch = os.batch = ls.batch = 1;
        qs.data = (char *)q.t.data + (size_t)(b * q.t.batch_stride) * 4;
        ks.data = (char *)k.t.data + (size_t)(b * k.t.batch_stride) * 4;
        vs.data = (char *)v.t.data + (size_t)(b * v.t.batch_stride) * 4;
        os.data = (char *)out1.t.data + (size_t)(b * out1.t.batch_stride) * 4;
        ls.data = (char *)lse1.t.data + (size_t)(b * lse1.t.batch_stride) * 4;
        ck_assert_msg(fa_forward(ctx, &p, &qs, &ks, &vs, &os, &ls) == FA_OK, "%s",
                      fa_last_error());
    }
    ck_assert_msg(same_bytes(&out, &out1) && same_bytes(&lse, &lse1),
                  "%d threads: a batch differs from its call alone", threads);
    fa_context_destroy(ctx);
    ht_tensor *all[7] = {&q, &k, &v, &out, &lse, &out1, &lse1};
    for (int i = 0; i < 7; i++)
        ht_free(all[i]);
}
END_TEST

/* Equal lengths with dropout: the varlen batch is the dense batch of B sequences, forward and
 * backward, bit for bit (sequence b draws batch b's dropout stream). */
START_TEST(varlen_of_equal_lengths_is_a_dense_batch)
{
    enum { B = 3, SQ = 20, SK = 30 };
    const fa_dtype dt = _i ? FA_F64 : FA_F32;
    ht_tensor q, k, v, g, o, l, dq, dk, dv, o1, l1, dq1, dk1, dv1;
    ht_alloc(&q, dt, 1, B * SQ, HQ, D, SW_BSHD), ht_fill(&q, 5, 1, 0);
    ht_alloc(&k, dt, 1, B * SK, HK, D, SW_BSHD), ht_fill(&k, 6, 1, 0);
    ht_alloc(&v, dt, 1, B * SK, HK, D, SW_BSHD), ht_fill(&v, 7, 1, 0);
    ht_alloc(&g, dt, 1, B * SQ, HQ, D, SW_BSHD), ht_fill(&g, 8, 1, 0);
    ht_tensor *qs[4] = {&o, &dq, &o1, &dq1}, *ks[4] = {&dk, &dv, &dk1, &dv1};
    for (int i = 0; i < 4; i++) {
        ht_alloc(qs[i], dt, 1, B * SQ, HQ, D, SW_BSHD);
        ht_alloc(ks[i], dt, 1, B * SK, HK, D, SW_BSHD);
    }
    ht_alloc_lse(&l, dt == FA_F64 ? FA_F64 : FA_F32, 1, B * SQ, HQ);
    ht_alloc_lse(&l1, dt == FA_F64 ? FA_F64 : FA_F32, 1, B * SQ, HQ);
    const int32_t cq[B + 1] = {0, SQ, 2 * SQ, 3 * SQ}, ck[B + 1] = {0, SK, 2 * SK, 3 * SK};
    const fa_indices iq = {cq, FA_INDEX_INT32, B + 1}, ik = {ck, FA_INDEX_INT32, B + 1};
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.dropout_p = 0.25;
    p.dropout_seed = 42;
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    ck_assert_msg(fa_forward_varlen(ctx, &p, &q.t, &k.t, &v.t, &iq, &ik, &o.t, &l.t) == FA_OK,
                  "%s", fa_last_error());
    ck_assert_msg(fa_backward_varlen(ctx, &p, &q.t, &k.t, &v.t, &iq, &ik, &o.t, &l.t, &g.t,
                                     &dq.t, &dk.t, &dv.t) == FA_OK, "%s", fa_last_error());
    /* the same buffers as dense (B, S, H, D) views; the LSE (B, H, S) as its packed rows */
    fa_tensor t[10] = {q.t, k.t, v.t, g.t, o1.t, dq1.t, dk1.t, dv1.t, l1.t, o.t};
    for (int i = 0; i < 10; i++) {
        const int64_t s = t[i].seqlen / B;
        t[i].batch = B;
        t[i].batch_stride = s * t[i].seq_stride;
        t[i].seqlen = s;
    }
    fa_tensor lv = l.t; /* the varlen forward's LSE, read by the dense backward */
    lv.batch = B, lv.batch_stride = SQ * lv.seq_stride, lv.seqlen = SQ;
    ck_assert_msg(fa_forward(ctx, &p, &t[0], &t[1], &t[2], &t[4], &t[8]) == FA_OK, "%s",
                  fa_last_error());
    ck_assert_msg(fa_backward(ctx, &p, &t[0], &t[1], &t[2], &t[9], &lv, &t[3], &t[5], &t[6],
                              &t[7]) == FA_OK, "%s", fa_last_error());
    ck_assert(same_bytes(&o, &o1) && same_bytes(&l, &l1));
    ck_assert(same_bytes(&dq, &dq1) && same_bytes(&dk, &dk1) && same_bytes(&dv, &dv1));
    fa_context_destroy(ctx);
    ht_tensor *all[14] = {&q, &k, &v, &g, &o, &l, &dq, &dk, &dv, &o1, &l1, &dq1, &dk1, &dv1};
    for (int i = 0; i < 14; i++)
        ht_free(all[i]);
}
END_TEST

/* The sink's gradient sums over every sequence: the varlen call's equals the sum of the
 * per-sequence calls' (in float64, to rounding of the float result). */
START_TEST(varlen_sink_gradient_sums_the_sequences)
{
    packed x;
    packed_make(&x, FA_F64, 1);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.sink_logits = test_sinks;
    float grad[HQ], want[HQ] = {0, 0, 0, 0}, one[HQ];
    fa_context *ctx = ht_context(FA_BACKEND_REFERENCE, 2);
    ck_assert(fa_forward_varlen(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.iq, &x.ik, &x.out.t,
                                &x.lse.t) == FA_OK);
    p.sink_grad = grad;
    ck_assert_msg(fa_backward_varlen(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.iq, &x.ik, &x.out.t,
                                     &x.lse.t, &x.dout.t, &x.dq.t, &x.dk.t, &x.dv.t) == FA_OK,
                  "%s", fa_last_error());
    p.sink_grad = one;
    for (int s = 0; s < NSEQ; s++) {
        const int64_t q0 = x.cq[s], nq = len_q[s], k0 = x.ck[s], nk = len_k[s];
        const fa_tensor q = rows_of(&x.q, q0, nq), k = rows_of(&x.k, k0, nk),
                        v = rows_of(&x.v, k0, nk), g = rows_of(&x.dout, q0, nq),
                        o = rows_of(&x.out, q0, nq), l = rows_of(&x.lse, q0, nq);
        fa_tensor dq = rows_of(&x.dq1, q0, nq), dk = rows_of(&x.dk1, k0, nk),
                  dv = rows_of(&x.dv1, k0, nk);
        ck_assert(fa_backward(ctx, &p, &q, &k, &v, &o, &l, &g, &dq, &dk, &dv) == FA_OK);
        for (int h = 0; h < HQ; h++)
            want[h] += one[h];
    }
    ck_assert(grad[1] == 0);
    for (int h = 0; h < HQ; h++)
        ck_assert_msg(fabsf(grad[h] - want[h]) <= 1e-6f * (1 + fabsf(want[h])),
                      "head %d: %.9g, want %.9g", h, (double)grad[h], (double)want[h]);
    fa_context_destroy(ctx);
    packed_free(&x);
}
END_TEST

/* Bad offsets and shapes: each its own status and a message naming the argument; the outputs
 * untouched. */
START_TEST(varlen_bad_input_is_refused)
{
    static const struct {
        int what;
        fa_status want;
        const char *says;
    } bad[] = {
        {0, FA_ERR_INVALID_ARGUMENT, "cu_seqlens_q[0] = 1; the offsets start at 0"},
        {1, FA_ERR_INVALID_ARGUMENT, "cu_seqlens_k[3] = 20 is below cu_seqlens_k[2]"},
        {2, FA_ERR_INVALID_ARGUMENT, "cu_seqlens_q[6] = 111 but q->seqlen = 112"},
        {3, FA_ERR_SHAPE, "cu_seqlens_k->count = 6 does not match cu_seqlens_q->count = 7"},
        {4, FA_ERR_SHAPE, "cu_seqlens_q->count = 0"},
        {5, FA_ERR_NULL_POINTER, "cu_seqlens_k is NULL"},
        {6, FA_ERR_NULL_POINTER, "cu_seqlens_q->data is NULL"},
        {7, FA_ERR_INVALID_ARGUMENT, "cu_seqlens_k->type = 7 is not a fa_index_type"},
        {8, FA_ERR_SHAPE, "q->batch = 2; a variable-length batch is packed along seqlen"},
        {9, FA_ERR_INVALID_ARGUMENT, "cu_seqlens_q[0] = 0 but q->seqlen = 112"},
        {10, FA_ERR_STRIDE, "cu_seqlens_q"},
        {11, FA_ERR_STRIDE, "cu_seqlens_k"},
    };
    const int c = _i;
    packed x;
    packed_make(&x, FA_F32, 1);
    fa_indices iq = x.iq, ik = x.ik, *piq = &iq, *pik = &ik;
    fa_tensor q = x.q.t, k = x.k.t, v = x.v.t, out = x.out.t, lse = x.lse.t;
    int64_t cq[NSEQ + 1];
    memcpy(cq, x.cq, sizeof cq);
    iq.data = cq;
    switch (bad[c].what) {
    case 0: cq[0] = 1; break;
    case 1: x.ck[3] = 20; break;
    case 2: cq[NSEQ] = 111; break;
    case 3: ik.count = NSEQ; break;
    case 4: iq.count = 0; break;
    case 5: pik = NULL; break;
    case 6: iq.data = NULL; break;
    case 7: ik.type = (fa_index_type)7; break;
    case 8: /* two batches of half the rows each */
        q.batch = k.batch = v.batch = out.batch = lse.batch = 2;
        q.seqlen = out.seqlen = lse.seqlen = x.q.t.seqlen / 2;
        k.seqlen = v.seqlen = x.k.t.seqlen / 2;
        break;
    case 9: iq.count = ik.count = 1; break; /* no sequence, but rows */
    case 10: /* the offsets inside the output */
        memcpy(out.data, cq, sizeof cq);
        iq.data = out.data;
        break;
    case 11: /* the key offsets inside dk: the backward's output (the forward's input) */
        memcpy(x.dk.t.data, x.ck, sizeof x.ck);
        ik.data = x.dk.t.data;
        break;
    }
    const int fwd = bad[c].what != 11, bwd = bad[c].what != 10;
    if (bad[c].what != 10)
        ht_poison(&x.out);
    ht_poison(&x.lse), ht_poison(&x.dq), ht_poison(&x.dv);
    if (bad[c].what != 11)
        ht_poison(&x.dk);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    fa_params p;
    fa_params_init(&p);
    fa_status s;
    if (fwd) { /* (case 11's forward is valid: dk is no output of it) */
        s = fa_forward_varlen(ctx, &p, &q, &k, &v, piq, pik, &out, &lse);
        ck_assert_msg(s == bad[c].want && strstr(fa_last_error(), bad[c].says),
                      "case %d: forward %s: %s", c, fa_status_string(s), fa_last_error());
    }
    if (bwd) { /* the backward reads out: case 10's out holds the offsets */
        s = fa_backward_varlen(ctx, &p, &q, &k, &v, piq, pik, &out, &lse, &x.dout.t, &x.dq.t,
                               &x.dk.t, &x.dv.t);
        ck_assert_msg(s == bad[c].want && strstr(fa_last_error(), bad[c].says),
                      "case %d: backward %s: %s", c, fa_status_string(s), fa_last_error());
        ck_assert(ht_is_poisoned(&x.out));
    }
    ck_assert(ht_is_poisoned(&x.lse) && ht_is_poisoned(&x.dq) && ht_is_poisoned(&x.dv));
    ck_assert(bad[c].what == 11 ? !memcmp(x.dk.t.data, x.ck, sizeof x.ck)
                                : ht_is_poisoned(&x.dk));
    fa_context_destroy(ctx);
    packed_free(&x);
}
END_TEST

/* ------------------------------------------------------------------ paged K/V */

enum { PB = 4, PSMAX = 700 };
/* Used lengths: none, one key, a few pages, a decode over two chunks. Sequence 3 shares its
 * first pages with sequence 2 (a common prefix: the same keys, the same page ids). */
static const int64_t used_k[PB] = {0, 1, 37, 700};

static size_t dsize(fa_dtype dt) { return dt == FA_F64 ? 8 : dt == FA_F32 ? 4 : 2; }

static char *row_at(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (char *)t->data +
           (size_t)(b * t->batch_stride + s * t->seq_stride + h * t->head_stride) * dsize(t->dtype);
}

typedef struct {
    ht_tensor q, k, v, out, lse, out1, lse1; /* dense K, V: (PB, PSMAX, HK, D) */
    void *kp, *vp;                           /* the page pools */
    fa_tensor tk, tv;                        /* their views: (num_pages, page, HK, D) */
    int64_t *table, max_pages, num_pages;
    int64_t used[PB];
    fa_paged_kv pages;
} paged;

/* Pages of `page` keys, shuffled, HND or NHD; sequence 3's first full pages are sequence 2's.
 * V's head dim dv. */
static void paged_make(paged *x, fa_dtype qt, fa_dtype kt, int64_t sq, int64_t page, int hnd,
                       int64_t dv)
{
    ht_alloc(&x->q, qt, PB, sq, HQ, D, SW_BSHD), ht_fill(&x->q, 11, -1, 1);
    ht_alloc(&x->k, kt, PB, PSMAX, HK, D, SW_BSHD), ht_fill(&x->k, 12, -1, 1);
    ht_alloc(&x->v, kt, PB, PSMAX, HK, dv, SW_BSHD), ht_fill(&x->v, 13, -1, 1);
    const fa_dtype lt = qt == FA_F64 ? FA_F64 : FA_F32;
    ht_alloc(&x->out, qt, PB, sq, HQ, dv, SW_BSHD), ht_alloc(&x->out1, qt, PB, sq, HQ, dv, SW_BSHD);
    ht_alloc_lse(&x->lse, lt, PB, sq, HQ), ht_alloc_lse(&x->lse1, lt, PB, sq, HQ);
    memcpy(x->used, used_k, sizeof x->used);
    const int64_t shared = used_k[2] / page; /* full pages of sequence 2 */
    for (int64_t j = 0; j < shared * page; j++) /* the common prefix */
        for (int h = 0; h < HK; h++) {
            memcpy(row_at(&x->k.t, 3, j, h), row_at(&x->k.t, 2, j, h), (size_t)D * dsize(kt));
            memcpy(row_at(&x->v.t, 3, j, h), row_at(&x->v.t, 2, j, h), (size_t)dv * dsize(kt));
        }
    x->max_pages = (PSMAX + page - 1) / page + 1;
    x->table = malloc(sizeof(int64_t) * (size_t)(PB * x->max_pages));
    for (int64_t i = 0; i < PB * x->max_pages; i++)
        x->table[i] = -1; /* unused entries: never read */
    x->num_pages = 0;
    for (int b = 0; b < PB; b++)
        x->num_pages += (x->used[b] + page - 1) / page;
    x->num_pages += 2; /* two pages nobody uses */
    /* page ids in a shuffled order: id n goes to slot (n * 7919) mod num_pages' permutation */
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)x->num_pages), next = 0;
    for (int64_t n = 0; n < x->num_pages; n++)
        perm[n] = n;
    for (int64_t n = x->num_pages - 1; n > 0; n--) {
        const int64_t m = (n * 7919 + 13) % (n + 1), t = perm[n];
        perm[n] = perm[m], perm[m] = t;
    }
    const size_t es = dsize(kt), bytes = (size_t)(x->num_pages * page * HK * D) * es,
                 vbytes = (size_t)(x->num_pages * page * HK * dv) * es;
    x->kp = malloc(bytes), x->vp = malloc(vbytes);
    memset(x->kp, 0x7f, bytes), memset(x->vp, 0x7f, vbytes); /* NaN-ish where nothing is */
    fa_tensor_init(&x->tk, x->kp, kt, x->num_pages, page, HK, D, hnd); /* HND: (num_pages, HK,
                                                                           page, D) in memory */
    fa_tensor_init(&x->tv, x->vp, kt, x->num_pages, page, HK, dv, hnd);
    for (int b = 0; b < PB; b++)
        for (int64_t i = 0; i < (x->used[b] + page - 1) / page; i++) {
            int64_t id;
            if (b == 3 && i < shared)
                id = x->table[2 * x->max_pages + i];
            else
                id = perm[next++];
            x->table[b * x->max_pages + i] = id;
            for (int64_t r = 0; r < page && i * page + r < x->used[b]; r++)
                for (int h = 0; h < HK; h++) {
                    memcpy(row_at(&x->tk, id, r, h), row_at(&x->k.t, b, i * page + r, h),
                           (size_t)D * es);
                    memcpy(row_at(&x->tv, id, r, h), row_at(&x->v.t, b, i * page + r, h),
                           (size_t)dv * es);
                }
        }
    free(perm);
    x->pages = (fa_paged_kv){{x->table, FA_INDEX_INT64, PB * x->max_pages}, x->max_pages,
                             {x->used, FA_INDEX_INT64, PB}};
}

static void paged_free(paged *x)
{
    ht_tensor *all[7] = {&x->q, &x->k, &x->v, &x->out, &x->lse, &x->out1, &x->lse1};
    for (int i = 0; i < 7; i++)
        ht_free(all[i]);
    free(x->kp), free(x->vp), free(x->table);
}

/*
 * _i: backend (reference, conventional, tiled) x page size (1, 3, 16, 256) x Sq (1: decode;
 * 20: the tiles) x storage (f32; bf16; f32 q over an f16 cache), causal with sinks; then 12
 * runs (backend x pages of 3, 16 x Sq, f32) of top-left causal with a window, softcap and
 * ALiBi, and Dv 48 apart from Dqk. NHD or HND by page size.
 */
START_TEST(paged_is_contiguous)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    static const int64_t psz[4] = {1, 3, 16, 256};
    static const fa_dtype qts[3] = {FA_F32, FA_BF16, FA_F32}, kts[3] = {FA_F32, FA_BF16, FA_F16};
    const int scores = _i >= 72, x72 = _i % 72; /* the second score set: 12 runs, f32 */
    const fa_backend be = bes[x72 % 3];
    const int64_t page = scores ? psz[1 + x72 / 3 % 2] : psz[x72 / 3 % 4];
    const int64_t sq = (scores ? x72 / 6 : x72 / 12) % 2 ? 20 : 1;
    const int st = scores ? 0 : x72 / 24;
    paged x;
    paged_make(&x, qts[st], kts[st], sq, page, page % 2 == 1, scores ? 48 : D);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.sink_logits = test_sinks;
    if (scores) {
        p.align = FA_ALIGN_TOP_LEFT;
        p.window_left = 40;
        p.softcap = 5;
        p.alibi_slopes = test_slopes;
    }
    ht_poison(&x.out), ht_poison(&x.lse), ht_poison(&x.out1), ht_poison(&x.lse1);
    fa_context *ctx = ht_context(be, 2);
    ck_assert_msg(fa_forward_paged(ctx, &p, &x.q.t, &x.tk, &x.tv, &x.pages, &x.out.t,
                                   &x.lse.t) == FA_OK, "%s", fa_last_error());
    for (int b = 0; b < PB; b++) { /* each sequence against its contiguous keys */
        fa_tensor q = x.q.t, k = x.k.t, v = x.v.t, o = x.out1.t, l = x.lse1.t;
        q.batch = k.batch = v.batch = o.batch = l.batch = 1;
        q.data = row_at(&x.q.t, b, 0, 0), o.data = row_at(&x.out1.t, b, 0, 0);
        k.data = row_at(&x.k.t, b, 0, 0), v.data = row_at(&x.v.t, b, 0, 0);
        l.data = row_at(&x.lse1.t, b, 0, 0);
        k.seqlen = v.seqlen = x.used[b];
        ck_assert_msg(fa_forward(ctx, &p, &q, &k, &v, &o, &l) == FA_OK, "%s", fa_last_error());
    }
    ck_assert_msg(same_bytes(&x.out, &x.out1) && same_bytes(&x.lse, &x.lse1),
                  "%s page %lld Sq %lld storage %d: paged differs from contiguous",
                  fa_backend_name(be), (long long)page, (long long)sq, st);
    fa_context_destroy(ctx);
    paged_free(&x);
}
END_TEST

/* Bad tables and pages: each its own status and message; the outputs untouched. */
START_TEST(paged_bad_input_is_refused)
{
    static const struct {
        fa_status want;
        const char *says;
    } bad[] = {
        {FA_ERR_INVALID_ARGUMENT, "pages->block_table[2][1] = -1 is not a page of k"},
        {FA_ERR_INVALID_ARGUMENT, "pages->block_table[3][0] = 99 is not a page of k (k->batch"},
        {FA_ERR_INVALID_ARGUMENT, "pages->seqused_k[1] = 721, but its row of the block table "
                                  "holds 45 pages of 16 keys"},
        {FA_ERR_INVALID_ARGUMENT, "pages->seqused_k[0] = -1 is negative"},
        {FA_ERR_SHAPE, "k->seqlen = 0; a page holds at least 1 key"},
        {FA_ERR_SHAPE, "pages->block_table.count = 179; B x max_pages (180) are needed"},
        {FA_ERR_SHAPE, "pages->seqused_k.count = 3; B (4) are needed"},
        {FA_ERR_NULL_POINTER, "pages is NULL"},
        {FA_ERR_DTYPE, "k->dtype = f16 but q->dtype = f64"},
        {FA_ERR_STRIDE, "pages->block_table"},
        {FA_ERR_OVERFLOW, "pages->seqused_k[3] = 2199023255553 exceeds the limit 2^40"},
    };
    paged x;
    paged_make(&x, _i == 8 ? FA_F64 : FA_F32, _i == 8 ? FA_F16 : FA_F32, 2, 16, 0, D);
    fa_paged_kv pg = x.pages;
    fa_tensor k = x.tk, v = x.tv, out = x.out.t;
    int64_t table[PB * 64];
    memcpy(table, x.table, sizeof(int64_t) * (size_t)(PB * x.max_pages));
    pg.block_table.data = table;
    const fa_paged_kv *ppg = &pg;
    switch (_i) {
    case 0: table[2 * x.max_pages + 1] = -1; break;
    case 1: table[3 * x.max_pages] = 99; break;
    case 2: x.used[1] = x.max_pages * 16 + 1; break;
    case 3: x.used[0] = -1; break;
    case 4: k.seqlen = v.seqlen = 0; break;
    case 5: pg.block_table.count--; break;
    case 6: pg.seqused_k.count = PB - 1; break;
    case 7: ppg = NULL; break;
    case 8: break;
    case 10: x.used[3] = ((int64_t)1 << 41) + 1; break;
    case 9: /* the table inside the output */
        memcpy(out.data, table, sizeof(int64_t) * (size_t)(PB * x.max_pages));
        pg.block_table.data = out.data;
        break;
    }
    if (_i != 9)
        ht_poison(&x.out);
    ht_poison(&x.lse);
    fa_params p;
    fa_params_init(&p);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    const fa_status s = fa_forward_paged(ctx, &p, &x.q.t, &k, &v, ppg, &out, &x.lse.t);
    ck_assert_msg(s == bad[_i].want && strstr(fa_last_error(), bad[_i].says), "case %d: %s: %s",
                  _i, fa_status_string(s), fa_last_error());
    ck_assert(ht_is_poisoned(&x.lse) && (_i == 9 || ht_is_poisoned(&x.out)));
    fa_context_destroy(ctx);
    paged_free(&x);
}
END_TEST

/* ------------------------------------------------------------------ a cache that grows */

enum { CB = 3, CS = 64, CNEW = 5 };

/* _i: a contiguous cache (0) or pages of 16 (1). The new keys land at each sequence's length,
 * nothing else of the cache changes, and the attention is that over the grown cache. */
START_TEST(kvcache_appends_then_attends)
{
    const int in_pages = _i;
    const int64_t len[CB] = {0, 16, 50}, page = 16, max_pages = CS / 16;
    ht_tensor q, kc, vc, kn, vn, o, l, o1, l1;
    ht_alloc(&q, FA_F32, CB, CNEW, HQ, D, SW_BSHD), ht_fill(&q, 21, 1, 0);
    ht_alloc(&kn, FA_F32, CB, CNEW, HK, D, SW_BSHD), ht_fill(&kn, 22, 1, 0);
    ht_alloc(&vn, FA_F32, CB, CNEW, HK, D, SW_BSHD), ht_fill(&vn, 23, 1, 0);
    /* the cache: CB x CS rows (contiguous), or CB x max_pages pages of 16 in reverse order */
    ht_alloc(&kc, FA_F32, CB, CS, HK, D, SW_BSHD), ht_fill(&kc, 24, 1, 0);
    ht_alloc(&vc, FA_F32, CB, CS, HK, D, SW_BSHD), ht_fill(&vc, 25, 1, 0);
    ht_alloc(&o, FA_F32, CB, CNEW, HQ, D, SW_BSHD), ht_alloc(&o1, FA_F32, CB, CNEW, HQ, D, SW_BSHD);
    ht_alloc_lse(&l, FA_F32, CB, CNEW, HQ), ht_alloc_lse(&l1, FA_F32, CB, CNEW, HQ);
    fa_tensor tk = kc.t, tv = vc.t;
    int64_t table[CB * 4];
    if (in_pages) { /* the same memory as CB * max_pages pages; sequence b's page i is page
                    (CB * max_pages - 1) - (b * max_pages + i) */
        tk.batch = tv.batch = CB * max_pages;
        tk.seqlen = tv.seqlen = page;
        tk.batch_stride = tv.batch_stride = page * tk.seq_stride;
        for (int64_t x = 0; x < CB * max_pages; x++)
            table[x] = CB * max_pages - 1 - x;
    }
    const fa_paged_kv pg = {{table, FA_INDEX_INT64, CB * max_pages}, max_pages,
                            {len, FA_INDEX_INT64, CB}};
    const fa_indices lens = {len, FA_INDEX_INT64, CB};
    ht_tensor before_k, before_v; /* the cache's bytes before */
    ht_alloc(&before_k, FA_F32, CB, CS, HK, D, SW_BSHD), ht_alloc(&before_v, FA_F32, CB, CS, HK, D, SW_BSHD);
    memcpy(before_k.t.data, kc.t.data, kc.nbytes), memcpy(before_v.t.data, vc.t.data, vc.nbytes);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.sink_logits = test_sinks;
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    ck_assert_msg(fa_forward_kvcache(ctx, &p, &q.t, &tk, &tv, &kn.t, &vn.t, in_pages ? NULL : &lens,
                                     in_pages ? &pg : NULL, &o.t, &l.t) == FA_OK,
                  "%s", fa_last_error());
    /* the cache: new rows at [len, len + CNEW) of each sequence, every other byte as before */
    for (int b = 0; b < CB; b++)
        for (int64_t j = 0; j < CS; j++) {
            /* where key j of sequence b lies in kc's memory */
            const int64_t at = in_pages ? table[b * max_pages + j / page] * page + j % page
                                     : b * CS + j;
            const int64_t bb = at / CS, jj = at % CS;
            for (int h = 0; h < HK; h++) {
                const int fresh = j >= len[b] && j < len[b] + CNEW;
                const void *want_k = fresh ? row_at(&kn.t, b, j - len[b], h) : row_at(&before_k.t, bb, jj, h);
                const void *want_v = fresh ? row_at(&vn.t, b, j - len[b], h) : row_at(&before_v.t, bb, jj, h);
                ck_assert_msg(!memcmp(row_at(&kc.t, bb, jj, h), want_k, D * 4) &&
                                  !memcmp(row_at(&vc.t, bb, jj, h), want_v, D * 4),
                              "in_pages %d: sequence %d key %lld head %d", in_pages, b, (long long)j, h);
            }
        }
    /* the attention: that of each grown sequence alone */
    for (int b = 0; b < CB; b++) {
        fa_tensor qq = q.t, k = kc.t, v = vc.t, oo = o1.t, ll = l1.t;
        qq.batch = k.batch = v.batch = oo.batch = ll.batch = 1;
        qq.data = row_at(&q.t, b, 0, 0), oo.data = row_at(&o1.t, b, 0, 0);
        ll.data = row_at(&l1.t, b, 0, 0);
        ht_tensor gk, gv; /* the sequence's keys, gathered */
        ht_alloc(&gk, FA_F32, 1, len[b] + CNEW, HK, D, SW_BSHD);
        ht_alloc(&gv, FA_F32, 1, len[b] + CNEW, HK, D, SW_BSHD);
        for (int64_t j = 0; j < len[b] + CNEW; j++)
            for (int h = 0; h < HK; h++) {
                const int64_t at = in_pages ? table[b * max_pages + j / page] * page + j % page
                                         : b * CS + j;
                memcpy(row_at(&gk.t, 0, j, h), row_at(&kc.t, at / CS, at % CS, h), D * 4);
                memcpy(row_at(&gv.t, 0, j, h), row_at(&vc.t, at / CS, at % CS, h), D * 4);
            }
        k = gk.t, v = gv.t;
        ck_assert(fa_forward(ctx, &p, &qq, &k, &v, &oo, &ll) == FA_OK);
        ht_free(&gk), ht_free(&gv);
    }
    ck_assert(same_bytes(&o, &o1) && same_bytes(&l, &l1));
    /* fa_append_kv alone writes the same bytes (the grown cache kept in o1's place: k in
     * after_k, v in after_v) */
    ht_tensor after_k, after_v;
    ht_alloc(&after_k, FA_F32, CB, CS, HK, D, SW_BSHD), ht_alloc(&after_v, FA_F32, CB, CS, HK, D, SW_BSHD);
    memcpy(after_k.t.data, kc.t.data, kc.nbytes), memcpy(after_v.t.data, vc.t.data, vc.nbytes);
    memcpy(kc.t.data, before_k.t.data, kc.nbytes), memcpy(vc.t.data, before_v.t.data, vc.nbytes);
    ck_assert_msg(fa_append_kv(ctx, &kn.t, &vn.t, &tk, &tv, in_pages ? NULL : &lens,
                               in_pages ? &pg : NULL) == FA_OK, "%s", fa_last_error());
    ck_assert(!memcmp(kc.t.data, after_k.t.data, kc.nbytes) &&
              !memcmp(vc.t.data, after_v.t.data, vc.nbytes));
    ht_free(&after_k), ht_free(&after_v);
    ht_tensor *all[11] = {&q, &kc, &vc, &kn, &vn, &o, &l, &o1, &l1, &before_k, &before_v};
    fa_context_destroy(ctx);
    for (int i = 0; i < 11; i++)
        ht_free(all[i]);
}
END_TEST

/* A cache call with no query row still appends its new keys (it has nothing to attend, but
 * a cache to write), on every CPU backend: rows [len, len + CNEW) of each sequence are the new
 * keys and values, every other byte of the cache as before. */
START_TEST(kvcache_without_queries_appends)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    const int64_t len[CB] = {0, 16, 50};
    ht_tensor q, o, kc, vc, kn, vn, want_k, want_v;
    ht_alloc(&q, FA_F32, CB, 0, HQ, D, SW_BSHD);
    ht_alloc(&o, FA_F32, CB, 0, HQ, D, SW_BSHD);
    ht_alloc(&kn, FA_F32, CB, CNEW, HK, D, SW_BSHD), ht_fill(&kn, 31, 1, 0);
    ht_alloc(&vn, FA_F32, CB, CNEW, HK, D, SW_BSHD), ht_fill(&vn, 32, 1, 0);
    ht_alloc(&kc, FA_F32, CB, CS, HK, D, SW_BSHD), ht_fill(&kc, 33, 1, 0);
    ht_alloc(&vc, FA_F32, CB, CS, HK, D, SW_BSHD), ht_fill(&vc, 34, 1, 0);
    ht_alloc(&want_k, FA_F32, CB, CS, HK, D, SW_BSHD);
    ht_alloc(&want_v, FA_F32, CB, CS, HK, D, SW_BSHD);
    memcpy(want_k.t.data, kc.t.data, kc.nbytes), memcpy(want_v.t.data, vc.t.data, vc.nbytes);
    for (int b = 0; b < CB; b++)
        for (int64_t i = 0; i < CNEW; i++)
            for (int h = 0; h < HK; h++) {
                memcpy(row_at(&want_k.t, b, len[b] + i, h), row_at(&kn.t, b, i, h), D * 4);
                memcpy(row_at(&want_v.t, b, len[b] + i, h), row_at(&vn.t, b, i, h), D * 4);
            }
    const fa_indices lens = {len, FA_INDEX_INT64, CB};
    fa_params p;
    fa_params_init(&p);
    fa_context *ctx = ht_context(bes[_i], 2);
    ck_assert_msg(fa_forward_kvcache(ctx, &p, &q.t, &kc.t, &vc.t, &kn.t, &vn.t, &lens, NULL,
                                     &o.t, NULL) == FA_OK,
                  "%s: %s", fa_backend_name(bes[_i]), fa_last_error());
    ck_assert_msg(!memcmp(kc.t.data, want_k.t.data, kc.nbytes) &&
                      !memcmp(vc.t.data, want_v.t.data, vc.nbytes),
                  "%s: the cache is not the old one with the new keys appended",
                  fa_backend_name(bes[_i]));
    fa_context_destroy(ctx);
    ht_tensor *all[8] = {&q, &o, &kc, &vc, &kn, &vn, &want_k, &want_v};
    for (int i = 0; i < 8; i++)
        ht_free(all[i]);
}
END_TEST

/* Without room, or with new keys that do not fit the cache, nothing is written. */
START_TEST(kvcache_without_room_writes_nothing)
{
    static const struct {
        fa_status want;
        const char *says;
    } bad[] = {
        {FA_ERR_INVALID_ARGUMENT, "cache_seqlens[1] = 60 and the new keys, but the cache holds "
                                  "k->seqlen = 64 keys"},
        {FA_ERR_INVALID_ARGUMENT, "pages->seqused_k[2] = 62 and the new keys, but its row of "
                                  "the block table holds 4 pages of 16 keys"},
        {FA_ERR_INVALID_ARGUMENT, "pages->block_table[0][1] = -1 is not a page of k"},
        {FA_ERR_SHAPE, "k_new->heads = 4 does not match k->heads = 2"},
        {FA_ERR_DTYPE, "v_new->dtype = f64 but v->dtype = f32"},
        {FA_ERR_INVALID_ARGUMENT, "cache_seqlens and pages are both given"},
        {FA_ERR_STRIDE, "out"},
        {FA_ERR_INVALID_ARGUMENT, "pages->block_table[1][0] = 0: new keys are written to that "
                                  "page"},
    };
    const int64_t max_pages = 4;
    int64_t len[CB] = {14, 60, 10}, table[CB * 4];
    for (int x = 0; x < CB * 4; x++)
        table[x] = x;
    ht_tensor q, kc, vc, kn, vn, vn64, o, kn4;
    ht_alloc(&q, FA_F32, CB, CNEW, HQ, D, SW_BSHD), ht_fill(&q, 1, 1, 0);
    ht_alloc(&kc, FA_F32, CB, CS, HK, D, SW_BSHD), ht_fill(&kc, 2, 1, 0);
    ht_alloc(&vc, FA_F32, CB, CS, HK, D, SW_BSHD), ht_fill(&vc, 3, 1, 0);
    ht_alloc(&kn, FA_F32, CB, CNEW, HK, D, SW_BSHD), ht_fill(&kn, 4, 1, 0);
    ht_alloc(&kn4, FA_F32, CB, CNEW, HQ, D, SW_BSHD), ht_fill(&kn4, 4, 1, 0);
    ht_alloc(&vn, FA_F32, CB, CNEW, HK, D, SW_BSHD), ht_fill(&vn, 5, 1, 0);
    ht_alloc(&vn64, FA_F64, CB, CNEW, HK, D, SW_BSHD), ht_fill(&vn64, 5, 1, 0);
    ht_alloc(&o, FA_F32, CB, CNEW, HQ, D, SW_BSHD);
    fa_tensor tk = kc.t, tv = vc.t, k_new = kn.t, v_new = vn.t, out = o.t;
    fa_indices lens = {len, FA_INDEX_INT64, CB};
    fa_paged_kv pg = {{table, FA_INDEX_INT64, CB * max_pages}, max_pages, {len, FA_INDEX_INT64, CB}};
    const fa_indices *pl = &lens;
    const fa_paged_kv *pp = NULL;
    if (_i == 1 || _i == 2 || _i == 7) { /* pages of 16 over the same memory */
        tk.batch = tv.batch = CB * max_pages;
        tk.seqlen = tv.seqlen = 16;
        tk.batch_stride = tv.batch_stride = 16 * tk.seq_stride;
        pl = NULL, pp = &pg;
    }
    switch (_i) {
    case 1: len[1] = 10, len[2] = 62; break;
    case 2: table[1] = -1; break; /* sequence 0's second page: its new keys go there */
    case 3: k_new = kn4.t; break;
    case 4: v_new = vn64.t; break;
    case 5: pp = &pg; break;
    case 7: len[1] = 10, table[4] = 0; break; /* sequence 1 writes to a page sequence 0 reads */
    case 6: len[1] = 10, out = kc.t, out.seqlen = CNEW, out.heads = HQ, out.batch_stride = CNEW * HQ * D,
            out.seq_stride = HQ * D; break; /* out inside the cache */
    }
    ht_tensor before, before_v;
    ht_alloc(&before, FA_F32, CB, CS, HK, D, SW_BSHD);
    ht_alloc(&before_v, FA_F32, CB, CS, HK, D, SW_BSHD);
    memcpy(before.t.data, kc.t.data, kc.nbytes);
    memcpy(before_v.t.data, vc.t.data, vc.nbytes);
    ht_poison(&o);
    fa_params p;
    fa_params_init(&p);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    fa_status s = fa_forward_kvcache(ctx, &p, &q.t, &tk, &tv, &k_new, &v_new, pl, pp, &out, NULL);
    ck_assert_msg(s == bad[_i].want && strstr(fa_last_error(), bad[_i].says), "case %d: %s: %s",
                  _i, fa_status_string(s), fa_last_error());
    if (_i != 6) {
        s = fa_append_kv(ctx, &k_new, &v_new, &tk, &tv, pl, pp);
        ck_assert_msg(s == bad[_i].want && strstr(fa_last_error(), bad[_i].says),
                      "case %d: append: %s: %s", _i, fa_status_string(s), fa_last_error());
        ck_assert(ht_is_poisoned(&o));
    }
    ck_assert_msg(!memcmp(before.t.data, kc.t.data, kc.nbytes) &&
                      !memcmp(before_v.t.data, vc.t.data, vc.nbytes),
                  "case %d: the cache changed", _i);
    ht_free(&before_v);
    fa_context_destroy(ctx);
    ht_tensor *all[9] = {&q, &kc, &vc, &kn, &kn4, &vn, &vn64, &o, &before};
    for (int i = 0; i < 9; i++)
        ht_free(all[i]);
}
END_TEST

Suite *make_inference_suite(void)
{
    Suite *s = suite_create("inference");
    TCase *tc = ht_tcase_create("varlen");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, varlen_is_each_sequence_alone, 0, 18);
    tcase_add_loop_test(tc, varlen_of_equal_lengths_is_a_dense_batch, 0, 2);
    tcase_add_loop_test(tc, varlen_of_many_sequences_is_each_alone, 0, 2);
    tcase_add_loop_test(tc, decode_batch_past_a_wave_is_each_batch_alone, 0, 2);
    tcase_add_test(tc, varlen_sink_gradient_sums_the_sequences);
    tcase_add_loop_test(tc, varlen_bad_input_is_refused, 0, 12);
    suite_add_tcase(s, tc);
    TCase *pc = ht_tcase_create("paged");
    tcase_set_timeout(pc, 300);
    tcase_add_loop_test(pc, paged_is_contiguous, 0, 84);
    tcase_add_loop_test(pc, paged_bad_input_is_refused, 0, 11);
    tcase_add_loop_test(pc, kvcache_appends_then_attends, 0, 2);
    tcase_add_loop_test(pc, kvcache_without_room_writes_nothing, 0, 8);
    tcase_add_loop_test(pc, kvcache_without_queries_appends, 0, 3);
    suite_add_tcase(s, pc);
    return s;
}
