/*
 * The semantic rules of docs/DESIGN.md §1 that a tolerance cannot see: empty rows exactly 0 with
 * LSE -inf and zero gradients; masked-out NaN/inf never reaching the output; NaN in an allowed
 * score propagating; the dropout mask replayed exactly from the Philox stream, and its keep
 * rate; bitwise determinism across calls and thread counts; merging of partial states.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "harness.h"
#include "api/api.h"
#include "simd/kernels.h"

static const fa_backend cpu_backends[3] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL,
                                           FA_BACKEND_TILED};
static const fa_dtype dtypes[4] = {FA_F64, FA_F32, FA_F16, FA_BF16};

typedef struct {
    ht_tensor q, k, v, o, l, dout, dq, dk, dv;
} set;

static void set_alloc(set *x, fa_dtype dt, int64_t B, int64_t sq, int64_t sk, int64_t hq,
                      int64_t hk, int64_t d, int64_t dv)
{
    ht_alloc(&x->q, dt, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->k, dt, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->v, dt, B, sk, hk, dv, SW_BSHD);
    ht_alloc(&x->o, dt, B, sq, hq, dv, SW_BSHD);
    ht_alloc(&x->dout, dt, B, sq, hq, dv, SW_BSHD);
    ht_alloc(&x->dq, dt, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->dk, dt, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->dv, dt, B, sk, hk, dv, SW_BSHD);
    ht_alloc_lse(&x->l, dt == FA_F64 ? FA_F64 : FA_F32, B, sq, hq);
    ht_fill(&x->q, 1, 1, -1);
    ht_fill(&x->k, 2, 1, -1);
    ht_fill(&x->v, 3, 1, -1);
    ht_fill(&x->dout, 4, 1, -1);
}

static void set_free(set *x)
{
    ht_free(&x->q), ht_free(&x->k), ht_free(&x->v), ht_free(&x->o), ht_free(&x->l);
    ht_free(&x->dout), ht_free(&x->dq), ht_free(&x->dk), ht_free(&x->dv);
}

static void set_run(fa_backend be, int threads, const fa_params *p, set *x)
{
    ck_assert_msg(ht_forward(be, threads, p, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->l.t) == FA_OK,
                  "%s forward: %s", fa_backend_name(be), fa_last_error());
    ck_assert_msg(ht_backward(be, threads, p, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->l.t,
                              &x->dout.t, &x->dq.t, &x->dk.t, &x->dv.t) == FA_OK,
                  "%s backward: %s", fa_backend_name(be), fa_last_error());
}

/* Bottom-right causal with Sq > Sk leaves rows i < Sq - Sk without keys; top-left causal with
 * Sk > Sq leaves keys j >= Sq without rows. Both must come out exactly 0 (LSE -inf). */
START_TEST(empty_rows_exact_zero)
{
    const fa_backend be = cpu_backends[_i / 4];
    const fa_dtype dt = dtypes[_i % 4];
    for (int top_left = 0; top_left < 2; top_left++) {
        const int64_t sq = top_left ? 70 : 150, sk = top_left ? 150 : 70;
        set x;
        set_alloc(&x, dt, 2, sq, sk, 2, 1, 24, 16);
        fa_params p;
        fa_params_init(&p);
        p.causal = 1;
        p.align = top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
        ht_poison(&x.o), ht_poison(&x.dq), ht_poison(&x.dk), ht_poison(&x.dv);
        set_run(be, 2, &p, &x);
        for (int64_t b = 0; b < 2; b++)
            for (int64_t h = 0; h < 2; h++) {
                for (int64_t i = 0; i < sq; i++) {
                    int empty = !top_left && i < sq - sk;
                    double lse = ht_get(&x.l, b, i, h, 0);
                    ck_assert_msg(empty ? lse == -INFINITY : isfinite(lse), "lse[%ld] = %g",
                                  (long)i, lse);
                    for (int64_t d = 0; d < 16; d++)
                        if (empty)
                            ck_assert(ht_get(&x.o, b, i, h, d) == 0.0);
                        else
                            ck_assert(isfinite(ht_get(&x.o, b, i, h, d)));
                    for (int64_t d = 0; d < 24 && empty; d++)
                        ck_assert(ht_get(&x.dq, b, i, h, d) == 0.0);
                }
                for (int64_t j = sq; top_left && j < sk; j++) { /* one kv head: h / 2 == 0 */
                    for (int64_t d = 0; d < 16; d++)
                        ck_assert(ht_get(&x.dv, b, j, h / 2, d) == 0.0);
                    for (int64_t d = 0; d < 24; d++)
                        ck_assert(ht_get(&x.dk, b, j, h / 2, d) == 0.0);
                }
            }
        set_free(&x);
    }
}
END_TEST

static int same_bits(const ht_tensor *a, const ht_tensor *b)
{
    return a->nbytes == b->nbytes && memcmp(a->buf, b->buf, a->nbytes) == 0;
}

/* Where two tensors of one shape first differ, for a failure message: "s<i> h<h> d<d>: x vs y"
 * (batch 0 of a dense BSHD tensor), or "equal". */
static const char *first_difference(const ht_tensor *a, const ht_tensor *b, char *buf, size_t n)
{
    const size_t es = a->t.dtype == FA_F64 ? 8 : a->t.dtype == FA_F32 ? 4 : 2;
    const int64_t hd = a->t.heads * a->t.headdim;
    for (size_t x = 0; x < a->nbytes / es; x++)
        if (memcmp((const char *)a->buf + x * es, (const char *)b->buf + x * es, es)) {
            const int64_t s = (int64_t)x / hd, h = (int64_t)x % hd / a->t.headdim,
                          d = (int64_t)x % a->t.headdim;
            snprintf(buf, n, "s%lld h%lld d%lld: %.9g vs %.9g", (long long)s, (long long)h,
                     (long long)d, ht_get(a, 0, s, h, d), ht_get(b, 0, s, h, d));
            return buf;
        }
    return "equal";
}

/* Same value, to the bit for the tiled path; for the reference up to float64 rounding, since a
 * head with a NaN or inf anywhere takes its row-by-row path instead of the blocked one. */
static int same_value(fa_backend be, double a, double b)
{
    if (be == FA_BACKEND_TILED)
        return a == b || (isnan(a) && isnan(b));
    return isfinite(a) == isfinite(b) && (a == b || fabs(a - b) <= 1e-14 * (1 + fabs(a)));
}

/*
 * NaN and inf in masked-out K/V rows leave every output they cannot reach unchanged: the
 * fused paths drop masked terms by selection. Two placements: keys that no row may see
 * (top-left causal, Sk > Sq: whole tiles outside every row's span) and one key in the middle
 * of a causal band, inside the partial tile that rows before it share with rows after it.
 * The conventional path multiplies masked terms by 0, as any GEMM formulation does, and is
 * documented not to promise this.
 */
START_TEST(masked_nonfinite_never_reaches_output)
{
    const fa_backend be = _i < 4 ? FA_BACKEND_REFERENCE : FA_BACKEND_TILED;
    const fa_dtype dt = dtypes[_i % 4];
    for (int middle = 0; middle < 2; middle++) {
        const int64_t sq = middle ? 100 : 40, sk = 100, bad_lo = middle ? 50 : 40,
                      bad_hi = middle ? 51 : 100;
        /* GQA 4/2 and dropout: the reference's row path meets the blocked. D = 16 keeps bf16
         * off AMX's tile products (Dqk must be a multiple of 32): there the poisoned V sends
         * its key tile to the f32 kernels, whose bits differ from the clean run's tiles */
        const int64_t dqk = 16, dv = 16;
        set clean, dirty;
        set_alloc(&clean, dt, 1, sq, sk, 4, 2, dqk, dv);
        set_alloc(&dirty, dt, 1, sq, sk, 4, 2, dqk, dv);
        for (int64_t j = bad_lo; j < bad_hi; j++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t d = 0; d < dqk; d++) {
                    ht_set(&dirty.k, 0, j, h, d, (j & 1) ? NAN : INFINITY);
                    if (d < dv)
                        ht_set(&dirty.v, 0, j, h, d, (j & 1) ? -INFINITY : NAN);
                }
        fa_params p;
        fa_params_init(&p);
        p.causal = 1;
        p.align = FA_ALIGN_TOP_LEFT;
        p.dropout_p = 0.2;
        p.dropout_seed = 31;
        set_run(be, 2, &p, &clean);
        set_run(be, 2, &p, &dirty);
        /* rows i < bad_lo may not see the poisoned keys: their out, LSE and dq are unchanged */
        for (int64_t i = 0; i < bad_lo && i < sq; i++)
            for (int64_t h = 0; h < 4; h++) {
                ck_assert(same_value(be, ht_get(&clean.l, 0, i, h, 0), ht_get(&dirty.l, 0, i, h, 0)));
                for (int64_t d = 0; d < dqk; d++) {
                    ck_assert_msg(d >= dv || same_value(be, ht_get(&clean.o, 0, i, h, d),
                                                        ht_get(&dirty.o, 0, i, h, d)),
                                  "middle=%d row %ld: out changed", middle, (long)i);
                    ck_assert(same_value(be, ht_get(&clean.dq, 0, i, h, d),
                                         ht_get(&dirty.dq, 0, i, h, d)));
                }
            }
        /* keys no row may see: their gradients are 0 and the others' are unchanged */
        for (int64_t j = 0; !middle && j < sk; j++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t d = 0; d < dqk; d++) {
                    ck_assert(same_value(be, ht_get(&clean.dk, 0, j, h, d),
                                         ht_get(&dirty.dk, 0, j, h, d)));
                    ck_assert(d >= dv || same_value(be, ht_get(&clean.dv, 0, j, h, d),
                                                    ht_get(&dirty.dv, 0, j, h, d)));
                }
        set_free(&clean), set_free(&dirty);
    }
}
END_TEST

/* A NaN in q row 5 reaches row 5's output and LSE and no other row's: no silent zeros. */
START_TEST(nan_in_allowed_score_propagates)
{
    const fa_backend be = cpu_backends[_i / 4];
    const fa_dtype dt = dtypes[_i % 4];
    set x;
    set_alloc(&x, dt, 1, 30, 30, 1, 1, 8, 8);
    ht_set(&x.q, 0, 5, 0, 3, NAN);
    fa_params p;
    fa_params_init(&p);
    ck_assert_int_eq(ht_forward(be, 2, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t, &x.l.t), FA_OK);
    for (int64_t i = 0; i < 30; i++) {
        ck_assert(isnan(ht_get(&x.l, 0, i, 0, 0)) == (i == 5));
        for (int64_t d = 0; d < 8; d++)
            ck_assert(isnan(ht_get(&x.o, 0, i, 0, d)) == (i == 5));
    }
    set_free(&x);
}
END_TEST

/*
 * V = identity (Dv = Sk) makes O_ij = keep_ij P_ij / (1 - p): the zero pattern of O is the
 * drop pattern. It must equal the contract's Philox stream, evaluated here from its
 * definition: head b Hq + h's key = words 0, 1 of Philox({head, offset} as 64-bit halves, key
 * seed); the draw of (i, j) = word j % 4 of Philox({j / 4, i} as 64-bit halves, head's key);
 * keep iff u >= floor(p 2^32). q = 0 keeps every P_ij > 0, so a zero can only be a drop.
 */
START_TEST(dropout_mask_replayed_exactly)
{
    const fa_backend be = cpu_backends[_i / 4];
    const fa_dtype dt = dtypes[_i % 4];
    const int64_t B = 2, H = 3, sq = 21, sk = 37;
    const double pdrop = 0.35;
    const uint64_t seed = 0xa1b2c3d4e5f60718ull, offset = 0x500000007ull;
    ht_tensor q, k, v, o;
    ht_alloc(&q, dt, B, sq, H, 4, SW_BSHD);
    ht_alloc(&k, dt, B, sk, H, 4, SW_BSHD);
    ht_alloc(&v, dt, B, sk, H, sk, SW_BSHD);
    ht_alloc(&o, dt, B, sq, H, sk, SW_BSHD);
    ht_fill(&k, 9, 1, -1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < sk; j++)
            for (int64_t h = 0; h < H; h++)
                ht_set(&v, b, j, h, j, 1.0);
    fa_params p;
    fa_params_init(&p);
    p.dropout_p = pdrop;
    p.dropout_seed = seed;
    p.dropout_offset = offset;
    ck_assert_int_eq(ht_forward(be, 2, &p, &q.t, &k.t, &v.t, &o.t, NULL), FA_OK);
    const uint32_t thr = (uint32_t)floor(pdrop * 4294967296.0);
    int64_t kept = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t j = 0; j < sk; j++) {
                    const uint32_t u = ht_dropout_draw(seed, offset, (uint64_t)(b * H + h),
                                                       (uint64_t)i, (uint64_t)j);
                    int keep = u >= thr;
                    double x = ht_get(&o, b, i, h, j);
                    ck_assert_msg(keep == (x != 0), "b%ld h%ld i%ld j%ld: keep %d, out %g",
                                  (long)b, (long)h, (long)i, (long)j, keep, x);
                    /* kept: P = 1/sk (all scores 0), scaled by 1/(1-p) */
                    if (keep && dt == FA_F64)
                        ck_assert_double_eq_tol(x, 1.0 / (sk * (1 - pdrop)), 1e-15);
                    kept += keep;
                }
    ck_assert(kept > 0 && kept < B * H * sq * sk);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o);
}
END_TEST

/* Measured keep rate over 65536 decisions within 0.01 of 1 - p (its std. dev. is <= 0.002). */
START_TEST(dropout_keep_rate)
{
    const double ps[3] = {0.1, 0.5, 0.8};
    const int64_t n = 256;
    ht_tensor q, k, v, o;
    ht_alloc(&q, FA_F32, 1, n, 1, 4, SW_BSHD);
    ht_alloc(&k, FA_F32, 1, n, 1, 4, SW_BSHD);
    ht_alloc(&v, FA_F32, 1, n, 1, n, SW_BSHD);
    ht_alloc(&o, FA_F32, 1, n, 1, n, SW_BSHD);
    for (int64_t j = 0; j < n; j++)
        ht_set(&v, 0, j, 0, j, 1.0);
    for (int t = 0; t < 3; t++) {
        fa_params p;
        fa_params_init(&p);
        p.dropout_p = ps[t];
        p.dropout_seed = 12345 + (uint64_t)t;
        ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &p, &q.t, &k.t, &v.t, &o.t, NULL), FA_OK);
        int64_t kept = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++)
                kept += ht_get(&o, 0, i, 0, j) != 0;
        double rate = (double)kept / (double)(n * n);
        ck_assert_msg(fabs(rate - (1 - ps[t])) <= 0.01, "p=%g: keep rate %g", ps[t], rate);
    }
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o);
}
END_TEST

/* The offset's high 32 bits move the stream (15de60b ignored them: offsets 1 and 1 + 2^32 gave
 * the same drops); the seed's high bits as well. Identity V shows each call's drop pattern. */
START_TEST(dropout_offset_and_seed_are_64_bit)
{
    const fa_backend be = cpu_backends[_i];
    const int64_t n = 64;
    ht_tensor q, k, v, o[3];
    ht_alloc(&q, FA_F32, 1, n, 1, 4, SW_BSHD);
    ht_alloc(&k, FA_F32, 1, n, 1, 4, SW_BSHD);
    ht_alloc(&v, FA_F32, 1, n, 1, n, SW_BSHD);
    for (int64_t j = 0; j < n; j++)
        ht_set(&v, 0, j, 0, j, 1.0);
    const uint64_t seeds[3] = {7, 7, 7 + (1ull << 32)}, offsets[3] = {1, 1 + (1ull << 32), 1};
    for (int t = 0; t < 3; t++) {
        ht_alloc(&o[t], FA_F32, 1, n, 1, n, SW_BSHD);
        fa_params p;
        fa_params_init(&p);
        p.dropout_p = 0.5;
        p.dropout_seed = seeds[t];
        p.dropout_offset = offsets[t];
        ck_assert_int_eq(ht_forward(be, 1, &p, &q.t, &k.t, &v.t, &o[t].t, NULL), FA_OK);
    }
    for (int t = 1; t < 3; t++) {
        int64_t differ = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++)
                differ += (ht_get(&o[0], 0, i, 0, j) != 0) != (ht_get(&o[t], 0, i, 0, j) != 0);
        /* independent streams at p = 1/2 disagree on half the n^2 = 4096 decisions */
        ck_assert_msg(differ > n * n / 4, "%s: call %d drops like call 0 (%lld differ)",
                      fa_backend_name(be), t, (long long)differ);
    }
    ht_free(&q), ht_free(&k), ht_free(&v);
    for (int t = 0; t < 3; t++)
        ht_free(&o[t]);
}
END_TEST

/* Bitwise equal results across repeated calls and num_threads 1, 2, 3; last, the tiled bf16
 * on emulated tile products (tests/tiles_emulated.c), which take these head dims. */
START_TEST(deterministic_across_threads)
{
    const int emulated = _i == 6;
    if (emulated && ht_emulated_tiles_skipped())
        return;
    const fa_backend be = emulated ? FA_BACKEND_TILED : cpu_backends[_i / 2];
    const fa_dtype dt = emulated || _i % 2 ? FA_BF16 : FA_F32;
    ht_kernels = emulated ? ht_emulated_tiles() : NULL;
    /* bf16 at Dqk 64, Dv 32: AMX's tile products where the CPU has them */
    const int64_t dqk = dt == FA_BF16 ? 64 : 40, dv = dt == FA_BF16 ? 32 : 24;
    set first;
    set_alloc(&first, dt, 2, 150, 170, 4, 2, dqk, dv);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.dropout_p = 0.1;
    p.dropout_seed = 5;
    p.softcap = 4;
    set_run(be, 1, &p, &first);
    const int threads[4] = {1, 2, 3, 2};
    for (int t = 0; t < 4; t++) {
        set again;
        set_alloc(&again, dt, 2, 150, 170, 4, 2, dqk, dv);
        set_run(be, threads[t], &p, &again);
        ck_assert_msg(same_bits(&first.o, &again.o), "%s out differs at %d threads",
                      fa_backend_name(be), threads[t]);
        ck_assert(same_bits(&first.l, &again.l));
        ck_assert_msg(same_bits(&first.dq, &again.dq), "%s dq differs at %d threads",
                      fa_backend_name(be), threads[t]);
        ck_assert_msg(same_bits(&first.dk, &again.dk), "%s dk differs at %d threads",
                      fa_backend_name(be), threads[t]);
        ck_assert_msg(same_bits(&first.dv, &again.dv), "%s dv differs at %d threads",
                      fa_backend_name(be), threads[t]);
        set_free(&again);
    }
    set_free(&first);
}
END_TEST

/*
 * The decode path (group x Sq rows per kv head <= 16): bitwise the same at 1, 2 and 3 threads
 * and on a second call (its key chunks and their merge order are the problem's), over shapes
 * whose threads split the keys (B = 1, one kv head), the kv heads, or both; the plan takes the
 * path for them at every thread count, and not under FA_DECODE=0 or with dropout; its error
 * is held to twice the tiles' (FA_DECODE=0) plus the output's rounding.
 */
START_TEST(decode_deterministic_across_threads)
{
    static const struct {
        int64_t b, sq, sk, hq, hk, d;
        fa_dtype dt;
        int causal;
        int64_t left, tokens;
    } c[4] = {{1, 1, 3000, 8, 1, 64, FA_F16, 1, -1, 0}, {2, 2, 1300, 8, 4, 40, FA_BF16, 1, -1, 0},
              {1, 3, 777, 3, 3, 128, FA_F32, 0, -1, 0},
              {1, 2, 3000, 8, 2, 64, FA_F16, 1, 1000, 700}}; /* sink tokens: two runs of chunks */
    const int x = _i;
    set first;
    set_alloc(&first, c[x].dt, c[x].b, c[x].sq, c[x].sk, c[x].hq, c[x].hk, c[x].d, c[x].d);
    fa_params p;
    fa_params_init(&p);
    p.causal = c[x].causal;
    p.window_left = c[x].left;
    p.sink_tokens = c[x].tokens;
    ck_assert(ht_forward(FA_BACKEND_TILED, 1, &p, &first.q.t, &first.k.t, &first.v.t, &first.o.t,
                         &first.l.t) == FA_OK);
    const int threads[4] = {1, 2, 3, 2};
    for (int t = 0; t < 4; t++) {
        set again;
        set_alloc(&again, c[x].dt, c[x].b, c[x].sq, c[x].sk, c[x].hq, c[x].hk, c[x].d, c[x].d);
        ck_assert(ht_forward(FA_BACKEND_TILED, threads[t], &p, &again.q.t, &again.k.t,
                             &again.v.t, &again.o.t, &again.l.t) == FA_OK);
        ck_assert_msg(same_bits(&first.o, &again.o), "case %d: out differs at %d threads", x,
                      threads[t]);
        ck_assert_msg(same_bits(&first.l, &again.l), "case %d: lse differs at %d threads", x,
                      threads[t]);
        set_free(&again);
    }
    set tiles;
    set_alloc(&tiles, c[x].dt, c[x].b, c[x].sq, c[x].sk, c[x].hq, c[x].hk, c[x].d, c[x].d);
    setenv("FA_DECODE", "0", 1);
    const fa_status st = ht_forward(FA_BACKEND_TILED, 2, &p, &tiles.q.t, &tiles.k.t, &tiles.v.t,
                                    &tiles.o.t, &tiles.l.t);
    unsetenv("FA_DECODE");
    ck_assert(st == FA_OK);
    ht_tensor ref;
    ht_alloc(&ref, FA_F64, c[x].b, c[x].sq, c[x].hq, c[x].d, SW_BSHD);
    ck_assert(ht_forward(FA_BACKEND_REFERENCE, 1, &p, &first.q.t64, &first.k.t64, &first.v.t64,
                         &ref.t, NULL) == FA_OK);
    const double e_decode = ht_max_err(&first.o, &ref), e_tiles = ht_max_err(&tiles.o, &ref);
    for (int t = 1; t <= 3; t++)
        ck_assert_msg(ht_decode_keys(t, &p, &first.q.t, &first.k.t, &first.v.t) > 0,
                      "case %d: the plan does not take the decode path at %d threads", x, t);
    setenv("FA_DECODE", "0", 1);
    const int64_t off = ht_decode_keys(2, &p, &first.q.t, &first.k.t, &first.v.t);
    unsetenv("FA_DECODE");
    fa_params pd = p;
    pd.dropout_p = 0.1;
    ck_assert_msg(off == 0 && ht_decode_keys(2, &pd, &first.q.t, &first.k.t, &first.v.t) == 0,
                  "case %d: the decode path is taken under FA_DECODE=0 or with dropout", x);
    /* the storage's unit roundoff: the output's own rounding */
    const double eps = c[x].dt == FA_F16 ? 0x1p-11 : c[x].dt == FA_BF16 ? 0x1p-8 : 0x1p-24;
    ck_assert_msg(e_decode <= 2 * e_tiles + eps, "case %d: decode error %g, tiles %g", x,
                  e_decode, e_tiles);
    ht_free(&ref);
    set_free(&tiles);
    set_free(&first);
}
END_TEST

/* The tiled backward in one pass and in two (FA_BACKWARD_PASSES) gives the same bits: dQ sums
 * the same terms in the same order either way. Masks with partial tiles in both alignments,
 * a window with ALiBi, GQA, softcap and dropout, and inf/NaN in masked K and V rows (the
 * selection path), a NaN in an allowed Q row; sizes around the tiles. bf16 at head dims the
 * tile products take (on the set's own where it has them, AMX; then on emulated ones), and
 * cases 1-3 at 32-row query tiles against 64-key tiles, so that a query tile's first key lies
 * off the key tiles' grid (their sums run in chunks from a tile's first key: pass 2 must keep
 * pass 1's tiles) and the passes group rows differently (which kernels a block takes must not
 * depend on the rows it holds). */
START_TEST(backward_one_pass_equals_two)
{
    const fa_dtype dt = _i > 0 ? FA_BF16 : FA_F32;
    if (_i == 2 && ht_emulated_tiles_skipped())
        return;
    ht_kernels = _i == 2 ? ht_emulated_tiles() : NULL; /* the tile paths on any CPU */
    const int64_t dqk = dt == FA_BF16 ? 64 : 40, dv = dt == FA_BF16 ? 32 : 24;
    int64_t bq, bk;
    ht_tiles(dqk, dv, dt, &bq, &bk);
    const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    for (int c = 0; c < 4; c++) {
        const int64_t sq = c == 1 ? bq + 3 : 70, sk = c == 1 ? 50 : bk + 5;
        fa_params p;
        fa_params_init(&p);
        p.causal = c != 2;
        p.align = c == 3 ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
        p.window_left = c == 2 ? 20 : -1;
        p.window_right = c == 2 ? 5 : -1;
        p.alibi_slopes = c == 2 ? slopes : NULL;
        p.softcap = c == 0 ? 3 : 0;
        p.dropout_p = c == 0 || c == 3 ? 0.15 : 0;
        p.dropout_seed = 77;
        set runs[2];
        for (int passes = 1; passes <= 2; passes++) {
            set *x = &runs[passes - 1];
            set_alloc(x, dt, 2, sq, sk, 4, 2, dqk, dv);
            if (c == 3) /* top-left causal: rows i < 60 never see keys 60 .. sk */
                for (int64_t j = 60; j < sk; j++)
                    for (int64_t d = 0; d < 24; d++) {
                        ht_set(&x->k, 1, j, 1, d, NAN);
                        ht_set(&x->v, 1, j, 1, d, INFINITY);
                    }
            setenv("FA_BACKWARD_PASSES", passes == 1 ? "1" : "2", 1);
            if (c == 1) /* a NaN in one allowed Q row: its own outputs only */
                ht_set(&x->q, 0, sq - 1, 0, 0, NAN);
            if (c >= 1)
                setenv("FA_TILES", "32x64", 1);
            set_run(FA_BACKEND_TILED, 2, &p, x);
            unsetenv("FA_BACKWARD_PASSES");
            unsetenv("FA_TILES");
        }
        ck_assert_msg(same_bits(&runs[0].dq, &runs[1].dq), "case %d: dq differs", c);
        ck_assert_msg(same_bits(&runs[0].dk, &runs[1].dk), "case %d: dk differs", c);
        ck_assert_msg(same_bits(&runs[0].dv, &runs[1].dv), "case %d: dv differs", c);
        set_free(&runs[0]), set_free(&runs[1]);
    }
}
END_TEST

/* The forward's output and LSE do not depend on how the query rows are grouped: query tiles
 * and strips of any size, aligned to the GEMM kernel's row panels or not (a strip of 5, a tile
 * of 7), give the bits of one tile holding every row, for a fixed key tile. Causal in both
 * alignments (partial tiles start strips mid-panel), a window with ALiBi and dropout, and
 * NaN/inf in masked K/V rows (the selection path) with dropout; f32 with every distinct kernel
 * set this CPU runs (ht_isa_tested; their panels differ: MR 4, 6, 8, 12), bf16 on the sets with
 * tile products (AMX: rows in blocks of 16 from any row; Dqk 64 and Dv 32 so that they run, and
 * 64-key tiles so that P V has more than one chunk of 32 keys), or once on emulated ones where
 * no set has them, and f64. _i: f32 on ht_isas[_i], bf16 on ht_isas[_i - ht_nisas], f64 at
 * 2 ht_nisas. */
START_TEST(forward_bits_independent_of_query_grouping)
{
    const fa_dtype dt = _i < ht_nisas ? FA_F32 : _i < 2 * ht_nisas ? FA_BF16 : FA_F64;
    const fa_isa isa = dt == FA_F64 ? FA_ISA_AUTO : ht_isas[_i % ht_nisas];
    if (dt != FA_F64 && !ht_isa_tested(_i % ht_nisas, dt))
        return;
    if (dt == FA_BF16 && !fai_kernels_for(isa)->bf16) { /* no tile products of its own */
        if (isa != fai_isa_best(NULL) || ht_emulated_tiles_skipped())
            return;
        ht_kernels = ht_emulated_tiles(); /* emulated ones instead, once */
    }
    ht_isa = isa;
    const int tiles_run = dt == FA_BF16;
    const int64_t dqk = tiles_run ? 64 : 40, dv = tiles_run ? 32 : 24, bk = tiles_run ? 64 : 32;
    const float slopes[2] = {0.5f, 0.125f};
    static const int64_t tiles[][2] = {{7, 5}, {48, 24}, {64, 13}, {30, 30}}; /* Bq, Br */
    for (int c = 0; c < 3; c++) {
        fa_params p;
        fa_params_init(&p);
        p.causal = c != 1;
        p.align = c == 2 ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
        p.window_left = c == 1 ? 17 : -1;
        p.window_right = c == 1 ? 3 : -1;
        p.alibi_slopes = c == 1 ? slopes : NULL;
        p.dropout_p = c != 0 ? 0.2 : 0;
        p.dropout_seed = 9;
        set whole;
        set_alloc(&whole, dt, 1, 100, 90, 2, 1, dqk, dv);
        if (c == 2) /* top-left causal: rows < 60 never see keys 60 .. 89 */
            for (int64_t j = 60; j < 90; j++)
                for (int64_t d = 0; d < dqk; d++) {
                    ht_set(&whole.k, 0, j, 0, d, NAN);
                    if (d < dv)
                        ht_set(&whole.v, 0, j, 0, d, INFINITY);
                }
        char spec[64];
        snprintf(spec, sizeof spec, "100x%lldx100", (long long)bk);
        setenv("FA_TILES", spec, 1);
        ck_assert(ht_forward(FA_BACKEND_TILED, 1, &p, &whole.q.t, &whole.k.t, &whole.v.t,
                             &whole.o.t, &whole.l.t) == FA_OK);
        for (size_t t = 0; t < sizeof tiles / sizeof *tiles; t++) {
            set x;
            set_alloc(&x, dt, 1, 100, 90, 2, 1, dqk, dv);
            memcpy(x.k.buf, whole.k.buf, x.k.nbytes);
            memcpy(x.v.buf, whole.v.buf, x.v.nbytes);
            snprintf(spec, sizeof spec, "%lldx%lldx%lld", (long long)tiles[t][0], (long long)bk,
                     (long long)tiles[t][1]);
            setenv("FA_TILES", spec, 1);
            ck_assert(ht_forward(FA_BACKEND_TILED, 2, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t,
                                 &x.l.t) == FA_OK);
            char at[160];
            ck_assert_msg(same_bits(&whole.o, &x.o), "case %d tiles %s: out differs at %s", c,
                          spec, first_difference(&whole.o, &x.o, at, sizeof at));
            ck_assert_msg(same_bits(&whole.l, &x.l), "case %d tiles %s: lse differs", c, spec);
            set_free(&x);
        }
        unsetenv("FA_TILES");
        set_free(&whole);
    }
}
END_TEST

/* One context used from two threads at once (docs/DESIGN.md §2): each call's result equals a lone
 * call's. */
START_TEST(shared_context_concurrent_calls)
{
    set lone, conc[2];
    set_alloc(&lone, FA_F32, 1, 90, 110, 2, 1, 32, 32);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    set_run(FA_BACKEND_TILED, 1, &p, &lone);
    for (int t = 0; t < 2; t++)
        set_alloc(&conc[t], FA_F32, 1, 90, 110, 2, 1, 32, 32);
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 1);
    fa_status st[2];
#pragma omp parallel num_threads(2)
    {
        set *x = &conc[omp_get_thread_num()];
        st[omp_get_thread_num()] =
            fa_forward(ctx, &p, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->l.t);
    }
    size_t cur = 1;
    fa_memory_stats(ctx, &cur, NULL);
    ck_assert_uint_eq(cur, 0);
    fa_context_destroy(ctx);
    for (int t = 0; t < 2; t++) {
        ck_assert_int_eq(st[t], FA_OK);
        ck_assert(same_bits(&lone.o, &conc[t].o) && same_bits(&lone.l, &conc[t].l));
        set_free(&conc[t]);
    }
    set_free(&lone);
}
END_TEST

/*
 * Four caller threads (pthreads, so that each opens its own OpenMP team) on one tiled context
 * of 2 threads, forward then backward, f32 and bf16 by turns, while a fifth reads
 * fa_memory_stats: each result equals a lone call's bit for bit, every call returns its own
 * status, the counters come back to 0. CI runs this case under ThreadSanitizer.
 */
#define CALLERS 4
typedef struct {
    fa_context *ctx;
    set *x;
    fa_params p;
    fa_status fwd, bwd;
} caller;

static void *caller_run(void *arg)
{
    caller *c = arg;
    c->fwd = fa_forward(c->ctx, &c->p, &c->x->q.t, &c->x->k.t, &c->x->v.t, &c->x->o.t,
                        &c->x->l.t);
    c->bwd = fa_backward(c->ctx, &c->p, &c->x->q.t, &c->x->k.t, &c->x->v.t, &c->x->o.t,
                         &c->x->l.t, &c->x->dout.t, &c->x->dq.t, &c->x->dk.t, &c->x->dv.t);
    return NULL;
}

/* Reads the counters while the callers allocate; counts the reads that saw current > peak
 * (fa_memory_stats once returned such pairs to a concurrent reader). Asserts nothing itself:
 * Check's assertions belong to the test's own thread. */
typedef struct {
    fa_context *ctx;
    int inconsistent;
} stats_watch;

static void *stats_reader(void *arg)
{
    stats_watch *w = arg;
    for (int i = 0; i < 2000; i++) {
        size_t cur, peak;
        fa_memory_stats(w->ctx, &cur, &peak);
        w->inconsistent += cur > peak;
    }
    return NULL;
}

START_TEST(four_callers_share_a_context)
{
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.dropout_p = 0.1;
    p.dropout_seed = 3;
    set lone[2], x[CALLERS];
    for (int d = 0; d < 2; d++) {
        set_alloc(&lone[d], d ? FA_BF16 : FA_F32, 1, 70, 90, 4, 2, 32, 32);
        set_run(FA_BACKEND_TILED, 2, &p, &lone[d]);
    }
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 2);
    caller c[CALLERS];
    pthread_t th[CALLERS + 1];
    for (int t = 0; t < CALLERS; t++) {
        set_alloc(&x[t], t % 2 ? FA_BF16 : FA_F32, 1, 70, 90, 4, 2, 32, 32);
        c[t] = (caller){ctx, &x[t], p, FA_ERR_DEVICE, FA_ERR_DEVICE};
    }
    for (int t = 0; t < CALLERS; t++)
        ck_assert_int_eq(pthread_create(&th[t], NULL, caller_run, &c[t]), 0);
    stats_watch watch = {ctx, 0};
    ck_assert_int_eq(pthread_create(&th[CALLERS], NULL, stats_reader, &watch), 0);
    for (int t = 0; t <= CALLERS; t++)
        pthread_join(th[t], NULL);
    ck_assert_msg(watch.inconsistent == 0, "%d reads saw current > peak", watch.inconsistent);
    size_t cur = 1;
    fa_memory_stats(ctx, &cur, NULL);
    ck_assert_uint_eq(cur, 0);
    fa_context_destroy(ctx);
    for (int t = 0; t < CALLERS; t++) {
        ck_assert_int_eq(c[t].fwd, FA_OK);
        ck_assert_int_eq(c[t].bwd, FA_OK);
        const set *l = &lone[t % 2];
        ck_assert_msg(same_bits(&l->o, &x[t].o) && same_bits(&l->l, &x[t].l) &&
                          same_bits(&l->dq, &x[t].dq) && same_bits(&l->dk, &x[t].dk) &&
                          same_bits(&l->dv, &x[t].dv),
                      "caller %d: a result differs from the lone call's", t);
        set_free(&x[t]);
    }
    set_free(&lone[0]), set_free(&lone[1]);
}
END_TEST

/*
 * Allowed keys whose score is -inf carry P = 0, and 0 * inf is NaN: the reference multiplies
 * (only masked and dropped terms are skipped), and the tiled path must agree whatever its tiles
 * — a row's keys fall into FULL or PARTIAL tiles depending on Bq and Bk, and both must treat
 * them alike — and on its decode path (tiles not forced: 6 rows of one head). The NaN pattern
 * of O and dV must match the reference's at every tile size.
 */
START_TEST(allowed_zero_probability_times_inf)
{
    const int64_t sq = 6, sk = 9, D = 2;
    set x, r;
    set_alloc(&x, FA_F32, 1, sq, sk, 1, 1, D, D);
    set_alloc(&r, FA_F32, 1, sq, sk, 1, 1, D, D);
    for (int64_t i = 0; i < sq; i++)
        for (int64_t d = 0; d < D; d++)
            ht_set(&x.q, 0, i, 0, d, 1.0);
    for (int64_t j = 0; j < sk; j++)
        for (int64_t d = 0; d < D; d++) {
            ht_set(&x.k, 0, j, 0, d, j % 3 == 0 ? -INFINITY : 0.25 * (double)j); /* s = -inf */
            ht_set(&x.v, 0, j, 0, d, j == 3 ? INFINITY : 1.0 + (double)j);
        }
    ht_set(&x.dout, 0, 4, 0, 1, INFINITY);
    fa_params p;
    fa_params_init(&p);
    p.window_left = 2;
    p.align = FA_ALIGN_TOP_LEFT;
    set_run(FA_BACKEND_REFERENCE, 1, &p, &x);
    memcpy(r.o.buf, x.o.buf, x.o.nbytes);
    memcpy(r.dv.buf, x.dv.buf, x.dv.nbytes);
    const char *tiles[] = {"1x1", "1x2", "2x2", "3x4", "6x9", "16x16", "decode"};
    ck_assert(ht_decode_keys(1, &p, &x.q.t, &x.k.t, &x.v.t) > 0);
    for (size_t t = 0; t < sizeof tiles / sizeof *tiles; t++) {
        if (strcmp(tiles[t], "decode"))
            setenv("FA_TILES", tiles[t], 1);
        set_run(FA_BACKEND_TILED, 1, &p, &x);
        unsetenv("FA_TILES");
        for (int64_t i = 0; i < sq; i++)
            for (int64_t d = 0; d < D; d++)
                ck_assert_msg(isnan(ht_get(&x.o, 0, i, 0, d)) == isnan(ht_get(&r.o, 0, i, 0, d)),
                              "tiles %s: O[%ld][%ld] = %g, reference %g", tiles[t], (long)i,
                              (long)d, ht_get(&x.o, 0, i, 0, d), ht_get(&r.o, 0, i, 0, d));
        for (int64_t j = 0; j < sk; j++)
            for (int64_t d = 0; d < D; d++)
                ck_assert_msg(isnan(ht_get(&x.dv, 0, j, 0, d)) == isnan(ht_get(&r.dv, 0, j, 0, d)),
                              "tiles %s: dV[%ld][%ld] = %g, reference %g", tiles[t], (long)j,
                              (long)d, ht_get(&x.dv, 0, j, 0, d), ht_get(&r.dv, 0, j, 0, d));
    }
    set_free(&x), set_free(&r);
}
END_TEST

/* A view of keys [j0, j0 + n) of t: same strides, shifted data, shorter seqlen. */
static fa_tensor key_slice(const ht_tensor *x, int64_t j0, int64_t n)
{
    fa_tensor t = x->t64;
    t.data = (double *)t.data + j0 * t.seq_stride;
    t.seqlen = n;
    return t;
}

/*
 * Attention sinks, from their definition (written out here in float64): LSE_i = ln(sum_j
 * exp(s_ij) + exp(sink_h)), O_i = sum_j exp(s_ij - LSE_i) v_j, on every CPU backend, in f64
 * and f32, on a decode shape over three chunks (the tiled decode path: the sink meets the
 * chunks' merge) and a prefill shape whose first 90 rows see no key (bottom-right causal,
 * Sq > Sk: LSE = sink, O = 0 exactly; whole blocks of the reference's and tiles of the tiled
 * path without a key). Sinks: finite, -inf (no sink), and one that outweighs every key. Two
 * more shapes add sink tokens (StreamingLLM) beside a window: the first keys exempt from the
 * window's left bound, so a row's keys are two runs.
 */
static const float test_sinks[4] = {0.5f, -INFINITY, 6.0f, -2.0f};

static void sink_definition(const set *x, int64_t B, int64_t sq, int64_t sk, int64_t hq,
                            int64_t hk, int64_t d, int causal, int64_t left, int64_t tokens,
                            double *o, double *lse)
{
    const double scale = 1 / sqrt((double)d);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                const int64_t hi = causal ? i + sk - sq + 1 : sk; /* bottom-right */
                double s[1100], mx = test_sinks[h], sum = 0;
                for (int64_t j = 0; j < hi; j++) {
                    s[j] = -INFINITY; /* the window's left bound, but for the sink tokens */
                    if (left >= 0 && j < i + sk - sq - left && j >= tokens)
                        continue;
                    double dot = 0;
                    for (int64_t e = 0; e < d; e++)
                        dot += ht_get(&x->q, b, i, h, e) * ht_get(&x->k, b, j, h / (hq / hk), e);
                    s[j] = scale * dot;
                    mx = s[j] > mx ? s[j] : mx;
                }
                if (mx == -INFINITY) { /* no key, no sink */
                    lse[(b * hq + h) * sq + i] = -INFINITY;
                    for (int64_t e = 0; e < d; e++)
                        o[((b * sq + i) * hq + h) * d + e] = 0;
                    continue;
                }
                sum = exp(test_sinks[h] - mx);
                for (int64_t j = 0; j < hi; j++)
                    sum += exp(s[j] - mx);
                const double L = mx + log(sum);
                lse[(b * hq + h) * sq + i] = L;
                for (int64_t e = 0; e < d; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < hi; j++)
                        acc += exp(s[j] - L) * ht_get(&x->v, b, j, h / (hq / hk), e);
                    o[((b * sq + i) * hq + h) * d + e] = acc;
                }
            }
}

START_TEST(sinks_match_definition)
{
    static const struct {
        int64_t b, sq, sk, hq, hk, d;
        int causal;
        int64_t left, tokens;
    } c[4] = {{2, 3, 1100, 4, 2, 16, 1, -1, 0}, /* three decode chunks */
              {1, 140, 50, 4, 1, 24, 1, -1, 0}, /* rows 0-89: no key */
              /* with sink tokens: 4 keys, then a window from key 797 or later, over chunks
               * 0 and 1-2 of the decode path; 30 beside a window of 21 over tiles */
              {2, 3, 1100, 4, 2, 16, 1, 300, 4},
              {1, 140, 150, 4, 1, 24, 1, 20, 30}};
    const fa_backend be = cpu_backends[_i % 3];
    const fa_dtype dt = (_i / 3) % 2 ? FA_F32 : FA_F64;
    const int x = _i / 6;
    set s;
    set_alloc(&s, dt, c[x].b, c[x].sq, c[x].sk, c[x].hq, c[x].hk, c[x].d, c[x].d);
    fa_params p;
    fa_params_init(&p);
    p.causal = c[x].causal;
    p.sink_logits = test_sinks;
    p.window_left = c[x].left;
    p.sink_tokens = c[x].tokens;
    ck_assert_msg(ht_forward(be, 2, &p, &s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.l.t) == FA_OK, "%s",
                  fa_last_error());
    const size_t n = (size_t)(c[x].b * c[x].sq * c[x].hq);
    double *o = malloc(n * (size_t)c[x].d * sizeof(double)), *lse = malloc(n * sizeof(double));
    sink_definition(&s, c[x].b, c[x].sq, c[x].sk, c[x].hq, c[x].hk, c[x].d, c[x].causal,
                    c[x].left, c[x].tokens, o, lse);
    const double tol = dt == FA_F64 ? 1e-12 : 2e-6;
    for (int64_t b = 0; b < c[x].b; b++)
        for (int64_t h = 0; h < c[x].hq; h++)
            for (int64_t i = 0; i < c[x].sq; i++) {
                const double want = lse[(b * c[x].hq + h) * c[x].sq + i];
                const double got = ht_get(&s.l, b, i, h, 0);
                const int empty = c[x].causal && i < c[x].sq - c[x].sk;
                ck_assert_msg(empty ? got == (double)test_sinks[h] || (isinf(got) && isinf(want))
                                    : fabs(got - want) <= tol * (1 + fabs(want)),
                              "%s %s case %d lse (%ld,%ld,%ld): %.17g, want %.17g",
                              fa_backend_name(be), fa_dtype_name(dt), x, (long)b, (long)h,
                              (long)i, got, want);
                for (int64_t e = 0; e < c[x].d; e++) {
                    const double wo = o[((b * c[x].sq + i) * c[x].hq + h) * c[x].d + e];
                    const double go = ht_get(&s.o, b, i, h, e);
                    ck_assert_msg(empty ? go == 0 : fabs(go - wo) <= tol * 4,
                                  "%s %s case %d out (%ld,%ld,%ld,%ld): %.17g, want %.17g",
                                  fa_backend_name(be), fa_dtype_name(dt), x, (long)b, (long)i,
                                  (long)h, (long)e, go, wo);
                }
            }
    free(o), free(lse);
    set_free(&s);
}
END_TEST

/*
 * The sink's gradient against central differences of L = sum O . G (G = dout), on the
 * reference in float64 (fa_backward given the reference's own O and LSE); the gradients of q,
 * k, v with sinks likewise at a few elements (the backward's LSE includes the sink); and the
 * tiled backward's (f32) against the reference's.
 */
static double sink_loss(const set *s, const fa_params *p, ht_tensor *o)
{
    ck_assert(ht_forward(FA_BACKEND_REFERENCE, 1, p, &s->q.t, &s->k.t, &s->v.t, &o->t, NULL) ==
              FA_OK);
    double L = 0;
    for (int64_t b = 0; b < s->q.t.batch; b++)
        for (int64_t i = 0; i < s->q.t.seqlen; i++)
            for (int64_t h = 0; h < s->q.t.heads; h++)
                for (int64_t e = 0; e < s->v.t.headdim; e++)
                    L += ht_get(o, b, i, h, e) * ht_get(&s->dout, b, i, h, e);
    return L;
}

START_TEST(sink_gradient_finite_differences)
{
    const int64_t B = 2, sq = 5, sk = 9, hq = 4, hk = 2, d = 8;
    set s;
    set_alloc(&s, FA_F64, B, sq, sk, hq, hk, d, d);
    float sinks[4] = {0.5f, -INFINITY, 1.5f, -0.25f}, grad[4] = {7, 7, 7, 7};
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.sink_logits = sinks;
    p.sink_grad = grad;
    ck_assert(ht_forward(FA_BACKEND_REFERENCE, 1, &p, &s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.l.t) ==
              FA_OK);
    ck_assert_msg(ht_backward(FA_BACKEND_REFERENCE, 2, &p, &s.q.t, &s.k.t, &s.v.t, &s.o.t, &s.l.t,
                              &s.dout.t, &s.dq.t, &s.dk.t, &s.dv.t) == FA_OK,
                  "%s", fa_last_error());
    ht_tensor o;
    ht_alloc(&o, FA_F64, B, sq, hq, d, SW_BSHD);
    ck_assert(grad[1] == 0); /* no sink, no gradient */
    for (int h = 0; h < 4; h++) {
        if (h == 1)
            continue;
        /* sinks are floats: steps of a power of two keep s +- eps exact */
        const float s0 = sinks[h], eps = 0x1p-12f;
        sinks[h] = s0 + eps;
        const double up = sink_loss(&s, &p, &o);
        sinks[h] = s0 - eps;
        const double down = sink_loss(&s, &p, &o);
        sinks[h] = s0;
        const double fd = (up - down) / (2 * (double)eps);
        ck_assert_msg(fabs(grad[h] - fd) <= 1e-5 * (1 + fabs(fd)),
                      "sink %d: gradient %.9g, central difference %.9g", h, (double)grad[h], fd);
    }
    /* dq, dk, dv at one element each, by central differences on the f64 inputs */
    ht_tensor *in[3] = {&s.q, &s.k, &s.v}, *gr[3] = {&s.dq, &s.dk, &s.dv};
    for (int t = 0; t < 3; t++) {
        const int64_t b = 1, j = 2, h = 1, e = 3;
        const double x0 = ht_get(in[t], b, j, h, e), eps = 1e-6;
        ht_set(in[t], b, j, h, e, x0 + eps);
        const double up = sink_loss(&s, &p, &o);
        ht_set(in[t], b, j, h, e, x0 - eps);
        const double down = sink_loss(&s, &p, &o);
        ht_set(in[t], b, j, h, e, x0);
        const double fd = (up - down) / (2 * eps), g = ht_get(gr[t], b, j, h, e);
        ck_assert_msg(fabs(g - fd) <= 1e-6 * (1 + fabs(fd)), "d%s: %.12g, central difference %.12g",
                      t == 0 ? "q" : t == 1 ? "k" : "v", g, fd);
    }
    /* the tiled backward in f32, on the same values */
    set f;
    set_alloc(&f, FA_F32, B, sq, sk, hq, hk, d, d);
    float tgrad[4];
    p.sink_grad = tgrad;
    ck_assert(ht_forward(FA_BACKEND_TILED, 2, &p, &f.q.t, &f.k.t, &f.v.t, &f.o.t, &f.l.t) == FA_OK);
    ck_assert(ht_backward(FA_BACKEND_TILED, 2, &p, &f.q.t, &f.k.t, &f.v.t, &f.o.t, &f.l.t,
                          &f.dout.t, &f.dq.t, &f.dk.t, &f.dv.t) == FA_OK);
    for (int h = 0; h < 4; h++)
        ck_assert_msg(fabs(tgrad[h] - grad[h]) <= 1e-5 * (1 + fabs(grad[h])),
                      "tiled sink %d: %.9g vs the reference's %.9g", h, (double)tgrad[h],
                      (double)grad[h]);
    ck_assert_msg(ht_max_err(&f.dq, &s.dq) <= 1e-5 && ht_max_err(&f.dk, &s.dk) <= 1e-5 &&
                      ht_max_err(&f.dv, &s.dv) <= 1e-5,
                  "tiled gradients with sinks: dq %g dk %g dv %g", ht_max_err(&f.dq, &s.dq),
                  ht_max_err(&f.dk, &s.dk), ht_max_err(&f.dv, &s.dv));
    ht_free(&o);
    set_free(&f);
    set_free(&s);
}
END_TEST

/*
 * A cache dtype apart from q's (f16 or bf16 K and V under f32 or bf16 Q and O, f32
 * accumulation: ggml's layout): the forward of each CPU backend, the tiled one on its decode
 * path and on its tiles, against the reference on the same stored values; the combinations
 * that are not taken refused with FA_ERR_DTYPE naming the tensor, and the backward with
 * FA_ERR_UNSUPPORTED; nothing written.
 */
START_TEST(kv_dtype_apart_from_q)
{
    static const fa_dtype combo[3][2] = {{FA_F32, FA_F16}, {FA_F32, FA_BF16}, {FA_BF16, FA_F16}};
    static const struct {
        int64_t b, sq, sk, hq, hk, d;
    } c[2] = {{2, 2, 700, 8, 2, 64}, {1, 100, 130, 4, 2, 40}}; /* decode; the tiles */
    const fa_dtype qd = combo[_i % 3][0], kd = combo[_i % 3][1];
    const int x = _i / 3;
    ht_tensor q, k, v, o, l, ref;
    ht_alloc(&q, qd, c[x].b, c[x].sq, c[x].hq, c[x].d, SW_BSHD);
    ht_alloc(&k, kd, c[x].b, c[x].sk, c[x].hk, c[x].d, SW_BSHD);
    ht_alloc(&v, kd, c[x].b, c[x].sk, c[x].hk, c[x].d, SW_BSHD);
    ht_alloc(&o, qd, c[x].b, c[x].sq, c[x].hq, c[x].d, SW_BSHD);
    ht_alloc_lse(&l, FA_F32, c[x].b, c[x].sq, c[x].hq);
    ht_alloc(&ref, FA_F64, c[x].b, c[x].sq, c[x].hq, c[x].d, SW_BSHD);
    ht_fill(&q, 11, 1, -1), ht_fill(&k, 12, 1, -1), ht_fill(&v, 13, 1, -1);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    ck_assert(ht_forward(FA_BACKEND_REFERENCE, 2, &p, &q.t64, &k.t64, &v.t64, &ref.t, NULL) ==
              FA_OK);
    /* O's own rounding dominates: f32 ~1e-7, bf16 2^-9 relative */
    const double tol = (qd == FA_F32 ? 2e-6 : 8e-3) * (1 + ht_max_abs(&ref));
    const fa_backend bes[4] = {FA_BACKEND_REFERENCE, FA_BACKEND_CONVENTIONAL, FA_BACKEND_TILED,
                               FA_BACKEND_TILED};
    for (int t = 0; t < 4; t++) {
        if (t == 3)
            setenv("FA_DECODE", "0", 1);
        const fa_status st = ht_forward(bes[t], 2, &p, &q.t, &k.t, &v.t, &o.t, &l.t);
        unsetenv("FA_DECODE");
        ck_assert_msg(st == FA_OK, "%s: %s", fa_backend_name(bes[t]), fa_last_error());
        const double e = ht_max_err(&o, &ref);
        ck_assert_msg(e <= tol, "%s%s q %s, k/v %s, case %d: error %g > %g",
                      fa_backend_name(bes[t]), t == 3 ? " (tiles)" : "", fa_dtype_name(qd),
                      fa_dtype_name(kd), x, e, tol);
    }
    if (x == 0)
        ck_assert(ht_decode_keys(2, &p, &q.t, &k.t, &v.t) > 0); /* the decode path took it */
    /* not taken: f16 q with a bf16 cache, k and v apart, f64 q; the backward */
    ht_poison(&o);
    fa_tensor qq = q.t, vv = v.t;
    qq.dtype = FA_F16;
    if (kd == FA_BF16) /* (f16 q with an f16 cache is one dtype) */
        ck_assert(ht_forward(FA_BACKEND_TILED, 1, &p, &qq, &k.t, &v.t, &o.t, NULL) ==
                  FA_ERR_DTYPE);
    vv.dtype = kd == FA_F16 ? FA_BF16 : FA_F16;
    ck_assert(ht_forward(FA_BACKEND_TILED, 1, &p, &q.t, &k.t, &vv, &o.t, NULL) == FA_ERR_DTYPE);
    ck_assert(strstr(fa_last_error(), "v->dtype") != NULL);
    qq.dtype = FA_F64;
    ck_assert(ht_forward(FA_BACKEND_TILED, 1, &p, &qq, &k.t, &v.t, &o.t, NULL) == FA_ERR_DTYPE);
    ck_assert(strstr(fa_last_error(), "k->dtype") != NULL);
    ck_assert(ht_is_poisoned(&o));
    ht_tensor dq, dk, dv;
    ht_alloc(&dq, qd, c[x].b, c[x].sq, c[x].hq, c[x].d, SW_BSHD);
    ht_alloc(&dk, kd, c[x].b, c[x].sk, c[x].hk, c[x].d, SW_BSHD);
    ht_alloc(&dv, kd, c[x].b, c[x].sk, c[x].hk, c[x].d, SW_BSHD);
    ht_poison(&dq), ht_poison(&dk), ht_poison(&dv);
    ck_assert(ht_backward(FA_BACKEND_TILED, 1, &p, &q.t, &k.t, &v.t, &o.t, &l.t, &o.t, &dq.t,
                          &dk.t, &dv.t) == FA_ERR_UNSUPPORTED);
    ck_assert(strstr(fa_last_error(), "forward only") != NULL);
    ck_assert(ht_is_poisoned(&dq) && ht_is_poisoned(&dk) && ht_is_poisoned(&dv));
    ht_free(&dq), ht_free(&dk), ht_free(&dv);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o), ht_free(&l), ht_free(&ref);
}
END_TEST

/* Attention over keys split in two, merged, equals attention over all keys; an empty state is
 * neutral even when its O holds garbage; out may be outs[0]. */
START_TEST(merge_states_matches_full_attention)
{
    const int64_t sq = 13, sk = 29, split = 11, H = 2, D = 6;
    ht_tensor q, k, v, full, lfull, o[3], l[3];
    ht_alloc(&q, FA_F64, 1, sq, H, D, SW_BSHD);
    ht_alloc(&k, FA_F64, 1, sk, H, D, SW_BSHD);
    ht_alloc(&v, FA_F64, 1, sk, H, D, SW_BSHD);
    ht_alloc(&full, FA_F64, 1, sq, H, D, SW_BSHD);
    ht_alloc_lse(&lfull, FA_F64, 1, sq, H);
    ht_fill(&q, 1, 1, -1), ht_fill(&k, 2, 1, -1), ht_fill(&v, 3, 1, -1);
    for (int s = 0; s < 3; s++) {
        ht_alloc(&o[s], FA_F64, 1, sq, H, D, SW_BSHD);
        ht_alloc_lse(&l[s], FA_F64, 1, sq, H);
    }
    fa_params p;
    fa_params_init(&p);
    p.align = FA_ALIGN_TOP_LEFT;
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 1, &p, &q.t64, &k.t64, &v.t64, &full.t,
                                &lfull.t), FA_OK);
    fa_tensor k0 = key_slice(&k, 0, split), v0 = key_slice(&v, 0, split);
    fa_tensor k1 = key_slice(&k, split, sk - split), v1 = key_slice(&v, split, sk - split);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 1, &p, &q.t64, &k0, &v0, &o[0].t, &l[0].t), FA_OK);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 1, &p, &q.t64, &k1, &v1, &o[1].t, &l[1].t), FA_OK);
    /* the empty state: LSE -inf, O garbage that must never be read */
    for (int64_t i = 0; i < sq; i++)
        for (int64_t h = 0; h < H; h++) {
            ht_set(&l[2], 0, i, h, 0, -INFINITY);
            for (int64_t d = 0; d < D; d++)
                ht_set(&o[2], 0, i, h, d, NAN);
        }
    fa_tensor outs[3] = {o[0].t, o[1].t, o[2].t}, lses[3] = {l[0].t, l[1].t, l[2].t};
    ck_assert_int_eq(fa_merge_states(3, outs, lses, &o[0].t, &l[0].t), FA_OK); /* in place */
    ck_assert(ht_max_err(&o[0], &full) <= 1e-14);
    ck_assert(ht_max_err(&l[0], &lfull) <= 1e-14);
    /* merging only empty states is empty: O = 0, LSE = -inf */
    ck_assert_int_eq(fa_merge_states(1, &outs[2], &lses[2], &o[1].t, &l[1].t), FA_OK);
    ck_assert(ht_get(&o[1], 0, 3, 1, 2) == 0 && ht_get(&l[1], 0, 3, 1, 0) == -INFINITY);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&full), ht_free(&lfull);
    for (int s = 0; s < 3; s++)
        ht_free(&o[s]), ht_free(&l[s]);
}
END_TEST

/* Placed calls (api/params.c: fai_problem_place, what context parallelism is made of): a
 * problem cut into row ranges and key ranges, each block a placed call at its global
 * positions, gives the whole call's results once the blocks' states are merged (forward) and
 * their gradients summed (backward), with causal masks in both alignments, a window with sink
 * tokens, ALiBi and dropout: f64 on the reference to 1e-12 (its backward over row ranges
 * against all keys), f32 on the tiled backend. */
START_TEST(placed_blocks_make_the_whole)
{
    const int tiled = _i & 1, top_left = _i >> 1;
    const fa_dtype dt = tiled ? FA_F32 : FA_F64;
    const int64_t Sq = 50, Sk = 70, Hq = 4, Hk = 2, D = 24; /* bottom-right: offset 20 */
    const int64_t rcut[3] = {0, 40, Sq}, kcut[4] = {0, 25, 52, Sk};
    const float slopes[4] = {0.3f, 0.1f, 0.05f, 0.2f};
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.align = top_left ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
    p.window_left = 60; /* wider than a block's rows and keys, narrower than the sequence */
    p.sink_tokens = 3;
    p.alibi_slopes = slopes;
    p.dropout_p = 0.2;
    p.dropout_seed = 42;
    ht_tensor q, k, v, dout, o, lse, dq, dk, dv, bo, blse, bdq, bdk, bdv, acc_o, acc_l;
    ht_alloc(&q, dt, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc(&k, dt, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&v, dt, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&dout, dt, 1, Sq, Hq, D, SW_BSHD);
    ht_fill(&q, 1, -1, 1);
    ht_fill(&k, 2, -1, 1);
    ht_fill(&v, 3, -1, 1);
    ht_fill(&dout, 4, -1, 1);
    ht_alloc(&o, dt, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc_lse(&lse, dt, 1, Sq, Hq);
    ht_alloc(&dq, dt, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc(&dk, dt, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&dv, dt, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&bo, dt, 1, Sq, Hq, D, SW_BSHD); /* one block's results, at its rows */
    ht_alloc_lse(&blse, dt, 1, Sq, Hq);
    ht_alloc(&bdq, dt, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc(&bdk, dt, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&bdv, dt, 1, Sk, Hk, D, SW_BSHD);
    ht_alloc(&acc_o, dt, 1, Sq, Hq, D, SW_BSHD);
    ht_alloc_lse(&acc_l, dt, 1, Sq, Hq);
    fa_context *ctx = ht_context(tiled ? FA_BACKEND_TILED : FA_BACKEND_REFERENCE, 2);
    ck_assert_int_eq(fa_forward(ctx, &p, &q.t, &k.t, &v.t, &o.t, &lse.t), FA_OK);
    ck_assert_int_eq(fa_backward(ctx, &p, &q.t, &k.t, &v.t, &o.t, &lse.t, &dout.t, &dq.t, &dk.t,
                                 &dv.t), FA_OK);
    /* the sums of the blocks' gradients, in f64 */
    double *sdq = calloc((size_t)(Sq * Hq * D), sizeof(double));
    double *sdk = calloc((size_t)(Sk * Hk * D), sizeof(double));
    double *sdv = calloc((size_t)(Sk * Hk * D), sizeof(double));
    for (int r = 0; r < 2; r++) {
        const int64_t r0 = rcut[r], m = rcut[r + 1] - r0;
        for (int x = 0; x < 3; x++) {
            const int64_t k0 = kcut[x], n = kcut[x + 1] - k0;
            const fai_place pl = {r0, k0, Sq, Sk};
            fa_tensor qv = q.t, kv = k.t, vv = v.t, ov = o.t, lv = lse.t, gv = dout.t,
                      bov = bo.t, blv = blse.t, bqv = bdq.t, bkv = bdk.t, bvv = bdv.t;
            fa_tensor *const qs[7] = {&qv, &ov, &lv, &gv, &bov, &blv, &bqv};
            for (int t = 0; t < 7; t++) {
                qs[t]->data = fai_row(qs[t], 0, r0, 0);
                qs[t]->seqlen = m;
            }
            fa_tensor *const ks[4] = {&kv, &vv, &bkv, &bvv};
            for (int t = 0; t < 4; t++) {
                ks[t]->data = fai_row(ks[t], 0, k0, 0);
                ks[t]->seqlen = n;
            }
            ck_assert_int_eq(fai_forward_placed(ctx, &p, &qv, &kv, &vv, &pl, &bov, &blv, 0),
                             FA_OK);
            fa_tensor ao = acc_o.t, al = acc_l.t;
            ao.data = fai_row(&ao, 0, r0, 0), ao.seqlen = m;
            al.data = fai_row(&al, 0, r0, 0), al.seqlen = m;
            const fa_tensor so[2] = {ao, bov}, sl[2] = {al, blv}; /* the first: a copy */
            ck_assert_int_eq(fa_merge_states(x == 0 ? 1 : 2, x == 0 ? &so[1] : so,
                                             x == 0 ? &sl[1] : sl, &ao, &al), FA_OK);
            /* the backward of the block from the whole call's out and lse: the tiled backend's
             * (the reference recomputes the softmax over the call's keys: it refuses a block of
             * some keys, and takes the row range against all of them, once per row range) */
            if (!tiled) {
                ck_assert_int_eq(fai_backward_placed(ctx, &p, &qv, &kv, &vv, &pl, &ov, &lv, &gv,
                                                     &bqv, &bkv, &bvv, 0), FA_ERR_UNSUPPORTED);
                if (x > 0)
                    continue;
                kv = k.t, vv = v.t, bkv = bdk.t, bvv = bdv.t;
            }
            const fai_place pg = {r0, tiled ? k0 : 0, Sq, Sk};
            ck_assert_int_eq(fai_backward_placed(ctx, &p, &qv, &kv, &vv, &pg, &ov, &lv, &gv,
                                                 &bqv, &bkv, &bvv, 0), FA_OK);
            const int64_t kg = tiled ? k0 : 0, ng = tiled ? n : Sk;
            for (int64_t i = 0; i < m; i++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t d = 0; d < D; d++)
                        sdq[((r0 + i) * Hq + h) * D + d] += ht_get(&bdq, 0, r0 + i, h, d);
            for (int64_t j = 0; j < ng; j++)
                for (int64_t h = 0; h < Hk; h++)
                    for (int64_t d = 0; d < D; d++) {
                        sdk[((kg + j) * Hk + h) * D + d] += ht_get(&bdk, 0, kg + j, h, d);
                        sdv[((kg + j) * Hk + h) * D + d] += ht_get(&bdv, 0, kg + j, h, d);
                    }
        }
    }
    const double tol = tiled ? 2e-5 : 1e-12;
    double eo = ht_max_err(&acc_o, &o), el = 0, eq = 0, ek = 0, ev = 0;
    for (int64_t i = 0; i < Sq; i++)
        for (int64_t h = 0; h < Hq; h++) {
            const double a = ht_get(&acc_l, 0, i, h, 0), b = ht_get(&lse, 0, i, h, 0);
            el = fmax(el, a == b ? 0 : fabs(a - b));
            for (int64_t d = 0; d < D; d++)
                eq = fmax(eq, fabs(sdq[(i * Hq + h) * D + d] - ht_get(&dq, 0, i, h, d)));
        }
    for (int64_t j = 0; j < Sk; j++)
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t d = 0; d < D; d++) {
                ek = fmax(ek, fabs(sdk[(j * Hk + h) * D + d] - ht_get(&dk, 0, j, h, d)));
                ev = fmax(ev, fabs(sdv[(j * Hk + h) * D + d] - ht_get(&dv, 0, j, h, d)));
            }
    ck_assert_msg(eo <= tol && el <= tol && eq <= 4 * tol && ek <= 4 * tol && ev <= 4 * tol,
                  "%s %s: out %g lse %g dq %g dk %g dv %g", tiled ? "tiled" : "reference",
                  top_left ? "top-left" : "bottom-right", eo, el, eq, ek, ev);
    /* a place that does not hold the call's rows is refused */
    const fai_place bad = {Sq - 1, 0, Sq, Sk};
    ck_assert_int_eq(fai_forward_placed(ctx, &p, &q.t, &k.t, &v.t, &bad, &bo.t, &blse.t, 0),
                     FA_ERR_SHAPE);
    fa_context_destroy(ctx);
    free(sdq);
    free(sdk);
    free(sdv);
    ht_tensor *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv, &bo, &blse, &bdq, &bdk, &bdv,
                        &acc_o, &acc_l};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ht_free(all[i]);
}
END_TEST

Suite *make_semantics_suite(void)
{
    Suite *s = suite_create("semantics");
    TCase *tc = ht_tcase_create("semantics");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, empty_rows_exact_zero, 0, 12);
    tcase_add_loop_test(tc, masked_nonfinite_never_reaches_output, 0, 8);
    tcase_add_loop_test(tc, nan_in_allowed_score_propagates, 0, 12);
    tcase_add_loop_test(tc, dropout_mask_replayed_exactly, 0, 12);
    tcase_add_test(tc, dropout_keep_rate);
    tcase_add_loop_test(tc, dropout_offset_and_seed_are_64_bit, 0, 3);
    tcase_add_loop_test(tc, backward_one_pass_equals_two, 0, 3);
    tcase_add_loop_test(tc, forward_bits_independent_of_query_grouping, 0, 2 * ht_nisas + 1);
    tcase_add_test(tc, allowed_zero_probability_times_inf);
    tcase_add_test(tc, merge_states_matches_full_attention);
    tcase_add_loop_test(tc, sinks_match_definition, 0, 24);
    tcase_add_test(tc, sink_gradient_finite_differences);
    tcase_add_loop_test(tc, kv_dtype_apart_from_q, 0, 6);
    tcase_add_loop_test(tc, placed_blocks_make_the_whole, 0, 4);
    suite_add_tcase(s, tc);
    /* threads: what CI's ThreadSanitizer stage runs (CK_RUN_CASE=concurrency) */
    TCase *cc = ht_tcase_create("concurrency");
    tcase_set_timeout(cc, 600);
    tcase_add_loop_test(cc, deterministic_across_threads, 0, 7);
    tcase_add_loop_test(cc, decode_deterministic_across_threads, 0, 4);
    tcase_add_test(cc, shared_context_concurrent_calls);
    tcase_add_test(cc, four_callers_share_a_context);
    suite_add_tcase(s, cc);
    return s;
}
