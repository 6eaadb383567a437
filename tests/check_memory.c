/*
 * Peak memory through fa_memory_stats: the tiled path's is flat in N (O(threads x tile)), but
 * for the backward's single pass, which adds dQ of a kv head's rows per thread; the
 * conventional path's grows as N^2 (S and P for every head). The counters return to zero.
 */
#include "config.h"

#include <stdlib.h>

#include "harness.h"

static size_t peak_of(fa_backend be, int64_t n, int backward)
{
    ht_tensor q, k, v, o, l, dq, dk, dv;
    ht_alloc(&q, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc(&k, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc(&v, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc(&o, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc(&dq, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc(&dk, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc(&dv, FA_F32, 1, n, 2, 64, SW_BSHD);
    ht_alloc_lse(&l, FA_F32, 1, n, 2);
    ht_fill(&q, 1, 1, -1), ht_fill(&k, 2, 1, -1), ht_fill(&v, 3, 1, -1);
    fa_context *ctx = ht_context(be, 2);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    ck_assert_int_eq(fa_forward(ctx, &p, &q.t, &k.t, &v.t, &o.t, &l.t), FA_OK);
    if (backward) {
        fa_memory_stats_reset(ctx);
        ck_assert_int_eq(fa_backward(ctx, &p, &q.t, &k.t, &v.t, &o.t, &l.t, &o.t, &dq.t, &dk.t,
                                     &dv.t), FA_OK);
    }
    size_t cur = 1, peak = 0;
    ck_assert_int_eq(fa_memory_stats(ctx, &cur, &peak), FA_OK);
    ck_assert_uint_eq(cur, 0); /* everything the call allocated was freed */
    ck_assert_uint_gt(peak, 0);
    fa_context_destroy(ctx);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o), ht_free(&l);
    ht_free(&dq), ht_free(&dk), ht_free(&dv);
    return peak;
}

/* _i: 0 forward, 1 backward in two passes, 2 backward in one pass */
START_TEST(tiled_peak_flat_conventional_quadratic)
{
    const int backward = _i > 0;
    setenv("FA_BACKWARD_PASSES", _i == 2 ? "1" : "2", 1);
    size_t t256 = peak_of(FA_BACKEND_TILED, 256, backward);
    size_t t1024 = peak_of(FA_BACKEND_TILED, 1024, backward);
    unsetenv("FA_BACKWARD_PASSES");
    size_t c256 = peak_of(FA_BACKEND_CONVENTIONAL, 256, backward);
    size_t c1024 = peak_of(FA_BACKEND_CONVENTIONAL, 1024, backward);
    /* one pass: each of the 2 threads holds dQ of a kv head's rows (group 1, N x 64 floats) */
    const size_t dq_growth = _i == 2 ? 2 * (1024 - 256) * 64 * sizeof(float) : 0;
    ck_assert_msg(t1024 - t256 == dq_growth, "tiled peak %zu at N=256, %zu at N=1024", t256,
                  t1024);
    /* S and P alone are 2 B H N^2 floats (the backward keeps dP too); the rest is O(N) packed
     * operands per thread. From N = 256 to 1024 linear growth would be 4x, quadratic 16x. */
    const size_t sp256 = 2 * 2 * 256 * 256 * sizeof(float), sp1024 = 16 * sp256;
    ck_assert_msg(c256 >= sp256 && c1024 >= sp1024, "conventional peak %zu below S + P", c1024);
    double ratio = (double)c1024 / (double)c256;
    ck_assert_msg(ratio > 10 && ratio <= 16, "conventional peak ratio %.2f", ratio);
    /* the whole tiled workspace is smaller than the conventional path's S and P alone */
    ck_assert_msg(t1024 < sp1024, "tiled %zu vs S + P %zu at N=1024", t1024, sp1024);
}
END_TEST

Suite *make_memory_suite(void)
{
    Suite *s = suite_create("memory");
    TCase *tc = ht_tcase_create("memory");
    tcase_add_loop_test(tc, tiled_peak_flat_conventional_quadratic, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}
