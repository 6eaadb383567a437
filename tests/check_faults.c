/*
 * Allocation failures, SQLite's way: for n = 1, 2, ... the n-th allocation of a call fails
 * (fai_fault_arm), until the call makes fewer than n and succeeds. Every failing call must
 * return FA_ERR_NO_MEMORY, name what it could not allocate, leave every output byte (and the
 * guard zones around them) untouched, and hand back all it allocated (fa_memory_stats' current
 * bytes 0; ASan's leak checker sees the rest in the sanitizer build). Over forward and
 * backward of every CPU backend and kernel set, in one pass and two, with every feature on;
 * context creation, fa_merge_states and the command's .npy reader the same way.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "harness.h"
#include "../src/cli/npy.h"

#define MAX_N 400 /* far above any call's allocation count: a loop that never ends fails */

typedef struct {
    ht_tensor q, k, v, o, l, dout, dq, dk, dv;
    float slopes[4];
} faults_set;

static void set_make(faults_set *s, fa_dtype dt)
{
    ht_alloc(&s->q, dt, 2, 37, 4, 24, SW_BSHD);
    ht_alloc(&s->k, dt, 2, 45, 2, 24, SW_BSHD);
    ht_alloc(&s->v, dt, 2, 45, 2, 16, SW_BSHD);
    ht_alloc(&s->o, dt, 2, 37, 4, 16, SW_BSHD);
    ht_alloc(&s->dout, dt, 2, 37, 4, 16, SW_BSHD);
    ht_alloc(&s->dq, dt, 2, 37, 4, 24, SW_BSHD);
    ht_alloc(&s->dk, dt, 2, 45, 2, 24, SW_BSHD);
    ht_alloc(&s->dv, dt, 2, 45, 2, 16, SW_BSHD);
    ht_alloc_lse(&s->l, dt == FA_F64 ? FA_F64 : FA_F32, 2, 37, 4);
    ht_fill(&s->q, 1, -1, 1), ht_fill(&s->k, 2, -1, 1), ht_fill(&s->v, 3, -1, 1);
    ht_fill(&s->dout, 4, -1, 1);
    for (int h = 0; h < 4; h++)
        s->slopes[h] = 0.25f * (float)(h + 1);
}

static void set_free(faults_set *s)
{
    ht_free(&s->q), ht_free(&s->k), ht_free(&s->v), ht_free(&s->o), ht_free(&s->l);
    ht_free(&s->dout), ht_free(&s->dq), ht_free(&s->dk), ht_free(&s->dv);
}

static void params(fa_params *p, const faults_set *s, int features)
{
    fa_params_init(p);
    if (features) {
        p->causal = 1;
        p->window_left = 20;
        p->softcap = 5;
        p->alibi_slopes = s->slopes;
        p->dropout_p = 0.2;
        p->dropout_seed = 11;
    }
}

static size_t current_bytes(fa_context *ctx)
{
    size_t cur = 1, peak = 0;
    ck_assert_int_eq(fa_memory_stats(ctx, &cur, &peak), FA_OK);
    return cur;
}

/* Runs op under "fail the n-th allocation" for n = 1, 2, ... until it succeeds; returns the
 * number of allocations it needed. outs: the tensors the op writes. */
static int until_success(const char *what, fa_context *ctx, fa_status (*op)(fa_context *, void *),
                         void *arg, ht_tensor **outs, int nout)
{
    for (int n = 1; n <= MAX_N; n++) {
        for (int t = 0; t < nout; t++)
            ht_poison(outs[t]);
        fai_fault_arm(n);
        fa_status s = op(ctx, arg);
        const int fired = fai_fault_fired();
        fai_fault_arm(0);
        if (!fired) {
            ck_assert_msg(s == FA_OK, "%s: n = %d: %s (%s)", what, n, fa_status_string(s),
                          fa_last_error());
            ck_assert_uint_eq(current_bytes(ctx), 0);
            printf("faults: %s: %d allocations, each failed once\n", what, n - 1);
            return n - 1;
        }
        ck_assert_msg(s == FA_ERR_NO_MEMORY, "%s: allocation %d failed: %s, want no memory (%s)",
                      what, n, fa_status_string(s), fa_last_error());
        ck_assert_msg(strstr(fa_last_error(), "bytes") || strstr(fa_last_error(), "memory"),
                      "%s: allocation %d: the message names nothing: %s", what, n,
                      fa_last_error());
        for (int t = 0; t < nout; t++)
            ck_assert_msg(ht_is_poisoned(outs[t]), "%s: allocation %d failed, output %d written",
                          what, n, t);
        ck_assert_msg(current_bytes(ctx) == 0, "%s: allocation %d failed, %zu bytes kept", what,
                      n, current_bytes(ctx));
    }
    ck_abort_msg("%s: still failing after %d allocations", what, MAX_N);
    return -1;
}

typedef struct {
    faults_set *s;
    fa_params p;
} op_arg;

static fa_status op_forward(fa_context *ctx, void *arg)
{
    op_arg *a = arg;
    faults_set *s = a->s;
    return fa_forward(ctx, &a->p, &s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->l.t);
}

static fa_status op_backward(fa_context *ctx, void *arg)
{
    op_arg *a = arg;
    faults_set *s = a->s;
    return fa_backward(ctx, &a->p, &s->q.t, &s->k.t, &s->v.t, &s->o.t, &s->l.t, &s->dout.t,
                       &s->dq.t, &s->dk.t, &s->dv.t);
}

static const fa_dtype dtypes[3] = {FA_F32, FA_BF16, FA_F64};

/* _i: backend (reference, conventional, tiled) x dtype x features (on, off) */
START_TEST(forward_and_backward_fail_cleanly)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    const fa_backend be = bes[_i / 6];
    const fa_dtype dt = dtypes[_i / 2 % 3];
    const int features = _i % 2;
    /* the tiled backend with every distinct kernel set that runs here (ht_isa_tested), in one
     * backward pass and two */
    const int nisa = be == FA_BACKEND_TILED ? ht_nisas : 1;
    for (int x = 0; x < nisa; x++) {
        if (be == FA_BACKEND_TILED && !ht_isa_tested(x, dt))
            continue;
        ht_isa = be == FA_BACKEND_TILED ? ht_isas[x] : FA_ISA_AUTO;
        for (int passes = 1; passes <= (be == FA_BACKEND_TILED ? 2 : 1); passes++) {
            setenv("FA_BACKWARD_PASSES", passes == 1 ? "1" : "2", 1);
            faults_set s;
            set_make(&s, dt);
            op_arg a;
            a.s = &s;
            params(&a.p, &s, features);
            fa_context *ctx = ht_context(be, 2);
            char what[160];
            snprintf(what, sizeof what, "%s/%s/%s%s forward", fa_backend_name(be),
                     fa_isa_name(ht_isa), fa_dtype_name(dt), features ? " +features" : "");
            ht_tensor *fo[2] = {&s.o, &s.l};
            const int nf = until_success(what, ctx, op_forward, &a, fo, 2);
            ck_assert_int_ge(nf, 1); /* the call did allocate, so a failure was tried */
            snprintf(what, sizeof what, "%s/%s/%s%s backward, %d pass%s", fa_backend_name(be),
                     fa_isa_name(ht_isa), fa_dtype_name(dt), features ? " +features" : "",
                     passes, passes == 1 ? "" : "es");
            ht_tensor *bo[3] = {&s.dq, &s.dk, &s.dv};
            const int nb = until_success(what, ctx, op_backward, &a, bo, 3);
            ck_assert_int_ge(nb, 1);
            fa_context_destroy(ctx);
            set_free(&s);
        }
    }
}
END_TEST

/* Variable-length batches: one allocation for all sequences (backends/groups.c), so a failure
 * leaves every sequence's rows unwritten. Sequences for the tiles, for the decode path (two
 * chunks) and with no key or no query. _i: backend (reference, conventional, tiled) x dtype. */
typedef struct {
    faults_set *s;
    fa_params p;
    fa_indices cq, ck;
} varlen_arg;

static fa_status op_forward_varlen(fa_context *ctx, void *arg)
{
    varlen_arg *a = arg;
    faults_set *s = a->s;
    return fa_forward_varlen(ctx, &a->p, &s->q.t, &s->k.t, &s->v.t, &a->cq, &a->ck, &s->o.t,
                             &s->l.t);
}

static fa_status op_backward_varlen(fa_context *ctx, void *arg)
{
    varlen_arg *a = arg;
    faults_set *s = a->s;
    return fa_backward_varlen(ctx, &a->p, &s->q.t, &s->k.t, &s->v.t, &a->cq, &a->ck, &s->o.t,
                              &s->l.t, &s->dout.t, &s->dq.t, &s->dk.t, &s->dv.t);
}

START_TEST(varlen_fails_cleanly)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    const fa_backend be = bes[_i % 3];
    const fa_dtype dt = dtypes[_i / 3];
    static const int64_t cq[5] = {0, 30, 31, 31, 40}, ck[5] = {0, 25, 725, 800, 800};
    faults_set s;
    ht_alloc(&s.q, dt, 1, 40, 4, 24, SW_BSHD);
    ht_alloc(&s.k, dt, 1, 800, 2, 24, SW_BSHD);
    ht_alloc(&s.v, dt, 1, 800, 2, 16, SW_BSHD);
    ht_alloc(&s.o, dt, 1, 40, 4, 16, SW_BSHD);
    ht_alloc(&s.dout, dt, 1, 40, 4, 16, SW_BSHD);
    ht_alloc(&s.dq, dt, 1, 40, 4, 24, SW_BSHD);
    ht_alloc(&s.dk, dt, 1, 800, 2, 24, SW_BSHD);
    ht_alloc(&s.dv, dt, 1, 800, 2, 16, SW_BSHD);
    ht_alloc_lse(&s.l, dt == FA_F64 ? FA_F64 : FA_F32, 1, 40, 4);
    ht_fill(&s.q, 1, -1, 1), ht_fill(&s.k, 2, -1, 1), ht_fill(&s.v, 3, -1, 1);
    ht_fill(&s.dout, 4, -1, 1);
    varlen_arg a = {.s = &s, .cq = {cq, FA_INDEX_INT64, 5}, .ck = {ck, FA_INDEX_INT64, 5}};
    fa_params_init(&a.p);
    a.p.causal = 1;
    fa_context *ctx = ht_context(be, 2);
    char what[96];
    snprintf(what, sizeof what, "%s/%s varlen forward", fa_backend_name(be), fa_dtype_name(dt));
    ht_tensor *fo[2] = {&s.o, &s.l};
    ck_assert_int_ge(until_success(what, ctx, op_forward_varlen, &a, fo, 2), 1);
    snprintf(what, sizeof what, "%s/%s varlen backward", fa_backend_name(be), fa_dtype_name(dt));
    ht_tensor *bo[3] = {&s.dq, &s.dk, &s.dv};
    ck_assert_int_ge(until_success(what, ctx, op_backward_varlen, &a, bo, 3), 1);
    fa_context_destroy(ctx);
    set_free(&s);
}
END_TEST

/* A paged K/V: the decode path (Sq 1) and the tiles (Sq 20) over pages of 3 keys, the stage
 * the tiles gather a key tile's rows into included. _i: backend x Sq. */
typedef struct {
    ht_tensor *q, *o, *l;
    fa_tensor k, v;
    fa_paged_kv pages;
} paged_arg;

static fa_status op_forward_paged(fa_context *ctx, void *arg)
{
    paged_arg *a = arg;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    return fa_forward_paged(ctx, &p, &a->q->t, &a->k, &a->v, &a->pages, &a->o->t, &a->l->t);
}

START_TEST(paged_fails_cleanly)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    const fa_backend be = bes[_i % 3];
    const int64_t sq = _i / 3 ? 20 : 1, page = 3, npages = 300;
    static const int64_t used[3] = {0, 700, 40};
    int64_t table[3 * 240];
    for (int i = 0; i < 3 * 240; i++)
        table[i] = (i * 7) % npages; /* pages shared and in any order: all valid */
    ht_tensor q, o, l, kp, vp;
    ht_alloc(&q, FA_F32, 3, sq, 4, 24, SW_BSHD), ht_fill(&q, 1, -1, 1);
    ht_alloc(&o, FA_F32, 3, sq, 4, 16, SW_BSHD);
    ht_alloc_lse(&l, FA_F32, 3, sq, 4);
    ht_alloc(&kp, FA_F32, npages, page, 2, 24, SW_BSHD), ht_fill(&kp, 2, -1, 1);
    ht_alloc(&vp, FA_F32, npages, page, 2, 16, SW_BSHD), ht_fill(&vp, 3, -1, 1);
    paged_arg a = {&q, &o, &l, kp.t, vp.t,
                   {{table, FA_INDEX_INT64, 3 * 240}, 240, {used, FA_INDEX_INT64, 3}}};
    fa_context *ctx = ht_context(be, 2);
    char what[96];
    snprintf(what, sizeof what, "%s paged forward, Sq %lld", fa_backend_name(be), (long long)sq);
    ht_tensor *fo[2] = {&o, &l};
    ck_assert_int_ge(until_success(what, ctx, op_forward_paged, &a, fo, 2), 1);
    fa_context_destroy(ctx);
    ht_free(&q), ht_free(&o), ht_free(&l), ht_free(&kp), ht_free(&vp);
}
END_TEST

/* A cache that grows: the append waits for the allocations, so a failure leaves the cache as
 * it was (the caches are among the outputs checked). _i: backend. */
typedef struct {
    ht_tensor *q, *kc, *vc, *kn, *vn, *o;
    fa_indices lens;
} kvcache_arg;

static fa_status op_forward_kvcache(fa_context *ctx, void *arg)
{
    kvcache_arg *a = arg;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    return fa_forward_kvcache(ctx, &p, &a->q->t, &a->kc->t, &a->vc->t, &a->kn->t, &a->vn->t,
                              &a->lens, NULL, &a->o->t, NULL);
}

START_TEST(kvcache_fails_cleanly)
{
    static const fa_backend bes[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                      FA_BACKEND_TILED};
    static const int64_t lens[2] = {600, 3};
    ht_tensor q, kc, vc, kn, vn, o;
    ht_alloc(&q, FA_F32, 2, 2, 4, 24, SW_BSHD), ht_fill(&q, 1, -1, 1);
    ht_alloc(&kc, FA_F32, 2, 700, 2, 24, SW_BSHD);
    ht_alloc(&vc, FA_F32, 2, 700, 2, 16, SW_BSHD);
    ht_alloc(&kn, FA_F32, 2, 2, 2, 24, SW_BSHD), ht_fill(&kn, 2, -1, 1);
    ht_alloc(&vn, FA_F32, 2, 2, 2, 16, SW_BSHD), ht_fill(&vn, 3, -1, 1);
    ht_alloc(&o, FA_F32, 2, 2, 4, 16, SW_BSHD);
    kvcache_arg a = {&q, &kc, &vc, &kn, &vn, &o, {lens, FA_INDEX_INT64, 2}};
    fa_context *ctx = ht_context(bes[_i], 2);
    char what[64];
    snprintf(what, sizeof what, "%s kvcache forward", fa_backend_name(bes[_i]));
    ht_tensor *outs[3] = {&o, &kc, &vc};
    ck_assert_int_ge(until_success(what, ctx, op_forward_kvcache, &a, outs, 3), 1);
    fa_context_destroy(ctx);
    ht_free(&q), ht_free(&kc), ht_free(&vc), ht_free(&kn), ht_free(&vn), ht_free(&o);
}
END_TEST

START_TEST(context_creation_fails_cleanly)
{
    fa_options o;
    fa_options_init(&o);
    for (int n = 1; n <= MAX_N; n++) {
        fa_context *const sentinel = (fa_context *)&o, *ctx = sentinel; /* kept on failure */
        fai_fault_arm(n);
        fa_status s = fa_context_create(&o, &ctx);
        const int fired = fai_fault_fired();
        fai_fault_arm(0);
        if (!fired) {
            ck_assert_int_eq(s, FA_OK);
            ck_assert_int_ge(n, 2);
            fa_context_destroy(ctx);
            return;
        }
        ck_assert_int_eq(s, FA_ERR_NO_MEMORY);
        ck_assert_ptr_eq(ctx, sentinel);
    }
    ck_abort_msg("fa_context_create still failing after %d allocations", MAX_N);
}
END_TEST

START_TEST(merge_fails_cleanly)
{
    ht_tensor o[3], l[3];
    for (int k = 0; k < 3; k++) {
        ht_alloc(&o[k], FA_F32, 2, 9, 3, 8, SW_BSHD);
        ht_alloc_lse(&l[k], FA_F32, 2, 9, 3);
        if (k < 2) {
            ht_fill(&o[k], 10 + (uint64_t)k, -1, 1);
            ht_fill(&l[k], 20 + (uint64_t)k, -2, 2);
        }
    }
    const fa_tensor outs[2] = {o[0].t, o[1].t}, lses[2] = {l[0].t, l[1].t};
    for (int n = 1; n <= MAX_N; n++) {
        ht_poison(&o[2]), ht_poison(&l[2]);
        fai_fault_arm(n);
        fa_status s = fa_merge_states(2, outs, lses, &o[2].t, &l[2].t);
        const int fired = fai_fault_fired();
        fai_fault_arm(0);
        if (!fired) {
            ck_assert_int_eq(s, FA_OK);
            ck_assert_int_ge(n, 2);
            break;
        }
        ck_assert_int_eq(s, FA_ERR_NO_MEMORY);
        ck_assert(ht_is_poisoned(&o[2]) && ht_is_poisoned(&l[2]));
    }
    for (int k = 0; k < 3; k++)
        ht_free(&o[k]), ht_free(&l[k]);
}
END_TEST

/* The command's reader: NPY_ERR_NO_MEMORY (the command's exit 3), the array zeroed. */
START_TEST(npy_reader_fails_cleanly)
{
    char p[] = "/tmp/fa_faults_XXXXXX";
    int fd = mkstemp(p);
    ck_assert_int_ge(fd, 0);
    close(fd);
    const int64_t shape[2] = {3, 5};
    const float x[15] = {1, 2, 3};
    char err[256];
    ck_assert_msg(npy_write(p, NPY_F32, 2, shape, x, err, sizeof err) == 0, "%s", err);
    int n = 1;
    for (; n <= MAX_N; n++) {
        npy_array a;
        memset(&a, 0x77, sizeof a);
        npy_fault_arm(n);
        int r = npy_read(p, 1 << 20, &a, err, sizeof err);
        const int fired = npy_fault_fired();
        npy_fault_arm(0);
        if (!fired) {
            ck_assert_int_eq(r, 0);
            ck_assert(a.nbytes == sizeof x && memcmp(a.data, x, sizeof x) == 0);
            npy_free(&a);
            break;
        }
        ck_assert_msg(r == NPY_ERR_NO_MEMORY, "allocation %d: %d (%s)", n, r, err);
        ck_assert(strstr(err, "out of memory") != NULL);
        ck_assert(a.data == NULL && a.nbytes == 0 && a.ndim == 0);
    }
    ck_assert_int_eq(n, 3); /* header and data: two allocations, each tried */
    unlink(p);
}
END_TEST

Suite *make_faults_suite(void)
{
    Suite *s = suite_create("faults");
    TCase *tc = ht_tcase_create("allocation failures");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, forward_and_backward_fail_cleanly, 0, 18);
    tcase_add_loop_test(tc, varlen_fails_cleanly, 0, 9);
    tcase_add_loop_test(tc, paged_fails_cleanly, 0, 6);
    tcase_add_loop_test(tc, kvcache_fails_cleanly, 0, 3);
    tcase_add_test(tc, context_creation_fails_cleanly);
    tcase_add_test(tc, merge_fails_cleanly);
    tcase_add_test(tc, npy_reader_fails_cleanly);
    suite_add_tcase(s, tc);
    return s;
}
