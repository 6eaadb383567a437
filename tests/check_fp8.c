/*
 * FP8 inputs (FA_E4M3, FA_E5M2, fa_params.descale_q/k/v): every code widened exactly, narrowing
 * to nearest even with the formats' overflow, the descales applied once, the tolerance rule
 * with the conventional FP8 path as its yardstick passing the fused path and failing realistic
 * bugs, an FP8 K/V cache under f32 q, and bad arguments refused with nothing written.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* The value of an FP8 code, from the formats' definitions (written apart from base/dtype.c):
 * e4m3: bias 7, 3 fraction bits, S.1111.111 NaN, no infinity; e5m2: bias 15, 2 fraction bits,
 * exponent 31 infinity (fraction 0) or NaN. */
static double fp8_value(fa_dtype dt, unsigned c)
{
    const int e4 = dt == FA_E4M3, fb = e4 ? 3 : 2, eb = e4 ? 4 : 5, bias = e4 ? 7 : 15;
    const unsigned m = c & ((1u << fb) - 1), e = (c >> fb) & ((1u << eb) - 1);
    const double sign = (c & 0x80) ? -1 : 1;
    if (e4 && e == 15 && m == 7)
        return NAN;
    if (!e4 && e == 31)
        return m ? NAN : sign * INFINITY;
    const double frac = (double)m / (double)(1u << fb);
    return sign * (e == 0 ? frac * pow(2, 1 - bias) : (1 + frac) * pow(2, (int)e - bias));
}

static int same_value(double a, double b)
{
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

/* All 256 codes of both formats, through fa_convert to f64 and to f32: exact. */
START_TEST(widen_every_code)
{
    const fa_dtype dt = _i ? FA_E5M2 : FA_E4M3;
    uint8_t codes[256];
    double d[256];
    float f[256];
    for (unsigned c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    ck_assert_int_eq(fa_convert(codes, dt, d, FA_F64, 256), FA_OK);
    ck_assert_int_eq(fa_convert(codes, dt, f, FA_F32, 256), FA_OK);
    int nans = 0, infs = 0;
    for (unsigned c = 0; c < 256; c++) {
        const double want = fp8_value(dt, c);
        ck_assert_msg(same_value(d[c], want), "%s 0x%02x: %.17g, want %.17g", fa_dtype_name(dt),
                      c, d[c], want);
        ck_assert_msg(same_value(f[c], want), "%s 0x%02x: %.9g (f32)", fa_dtype_name(dt), c,
                      (double)f[c]);
        nans += isnan(want) != 0, infs += isinf(want) != 0;
    }
    ck_assert_int_eq(nans, dt == FA_E4M3 ? 2 : 6);
    ck_assert_int_eq(infs, dt == FA_E4M3 ? 0 : 2);
}
END_TEST

/* Narrowing: every finite code comes back to itself; halfway between two neighbours rounds to
 * the even code, anything above halfway up; past the largest value e4m3 gives NaN (no
 * infinity) and e5m2 infinity. Halfway above the largest value ties to even as any other:
 * e4m3's 464 rounds down to 448 (an even code), e5m2's 61440 up (57344's code is odd). */
START_TEST(narrow_to_nearest_even)
{
    const fa_dtype dt = _i ? FA_E5M2 : FA_E4M3;
    for (unsigned c = 0; c < 256; c++) {
        const double v = fp8_value(dt, c);
        if (isnan(v))
            continue;
        uint8_t back;
        ck_assert_int_eq(fa_convert(&v, FA_F64, &back, dt, 1), FA_OK);
        ck_assert_msg(back == c, "%s 0x%02x -> %.9g -> 0x%02x", fa_dtype_name(dt), c, v, back);
    }
    const unsigned top = dt == FA_E4M3 ? 0x7e : 0x7b; /* the largest finite code */
    for (unsigned c = 0; c < top; c++) {                /* the positive neighbours */
        const double lo = fp8_value(dt, c), hi = fp8_value(dt, c + 1), mid = (lo + hi) / 2;
        const double probes[3] = {mid, nextafter(mid, INFINITY), nextafter(mid, 0)};
        const unsigned want[3] = {(c & 1) ? c + 1 : c, c + 1, c};
        for (int x = 0; x < 3; x++) {
            uint8_t got;
            fa_convert(&probes[x], FA_F64, &got, dt, 1);
            ck_assert_msg(got == want[x], "%s %.17g: 0x%02x, want 0x%02x", fa_dtype_name(dt),
                          probes[x], got, want[x]);
        }
    }
    const double largest = fp8_value(dt, top), halfway = dt == FA_E4M3 ? 464 : 61440;
    const double probes[4] = {nextafter(halfway, 0), halfway, nextafter(halfway, INFINITY), 1e30};
    for (int x = 0; x < 4; x++) {
        uint8_t got;
        fa_convert(&probes[x], FA_F64, &got, dt, 1);
        const double v = fp8_value(dt, got);
        const int down = x == 0 || (x == 1 && dt == FA_E4M3);
        if (down)
            ck_assert_msg(v == largest, "%s %.17g -> %g", fa_dtype_name(dt), probes[x], v);
        else
            ck_assert_msg(dt == FA_E4M3 ? isnan(v) : v == INFINITY, "%s %.17g -> %g",
                          fa_dtype_name(dt), probes[x], v);
    }
}
END_TEST

typedef struct {
    ht_tensor q, k, v, o, l;
} fwd_set;

static void fwd_alloc(fwd_set *x, fa_dtype in, fa_dtype kv, fa_dtype out, int64_t B, int64_t sq,
                      int64_t sk, int64_t hq, int64_t hk, int64_t d)
{
    ht_alloc(&x->q, in, B, sq, hq, d, SW_BSHD);
    ht_alloc(&x->k, kv, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->v, kv, B, sk, hk, d, SW_BSHD);
    ht_alloc(&x->o, out, B, sq, hq, d, SW_BSHD);
    ht_alloc_lse(&x->l, FA_F32, B, sq, hq);
}

static void fwd_free(fwd_set *x)
{
    ht_free(&x->q), ht_free(&x->k), ht_free(&x->v), ht_free(&x->o), ht_free(&x->l);
}

/* FP8 values for x: N(0, 1) scaled by `spread`, rounded to the format by ht_set's store. */
static void fill_fp8(ht_tensor *x, uint64_t seed, double spread)
{
    ht_fill(x, seed, 1, -1); /* lo > hi: normal draws */
    for (int64_t b = 0; b < x->t.batch; b++)
        for (int64_t s = 0; s < x->t.seqlen; s++)
            for (int64_t h = 0; h < x->t.heads; h++)
                for (int64_t d = 0; d < x->t.headdim; d++)
                    ht_set(x, b, s, h, d, spread * ht_get(x, b, s, h, d));
}

static void run(fa_backend be, const fa_params *p, fwd_set *x)
{
    ck_assert_msg(ht_forward(be, 2, p, &x->q.t, &x->k.t, &x->v.t, &x->o.t, &x->l.t) == FA_OK,
                  "%s forward: %s", fa_backend_name(be), fa_last_error());
}

/* descale (b, hk) = one of a few values with 3 significant bits, so that descale x code is
 * exact in f32 and the f32 twins below hold the very values the FP8 inputs stand for. */
static const float descale_of[4] = {0.3125f, 1.5f, 0.75f, 2.5f};

/* FP8 inputs with descales per (batch, kv head) against f32 inputs holding the descaled values:
 * the reference agrees to float64 rounding (both of its paths), the tiled path to f32
 * rounding, on GQA groups. A
 * descale applied twice (or not at all) is off by the descale itself. */
START_TEST(descale_applied_once)
{
    const fa_backend be = _i ? FA_BACKEND_TILED : FA_BACKEND_REFERENCE;
    const int64_t B = 2, sq = 90, sk = 110, hq = 4, hk = 2, D = 32;
    fwd_set a, w;
    fwd_alloc(&a, FA_E4M3, FA_E4M3, FA_F32, B, sq, sk, hq, hk, D);
    fwd_alloc(&w, FA_F32, FA_F32, FA_F32, B, sq, sk, hq, hk, D);
    fill_fp8(&a.q, 1, 2), fill_fp8(&a.k, 2, 2), fill_fp8(&a.v, 3, 2);
    float dq[4], dk[4], dv[4];
    for (int x = 0; x < 4; x++)
        dq[x] = descale_of[x], dk[x] = descale_of[(x + 1) % 4], dv[x] = descale_of[(x + 2) % 4];
    ht_tensor *const fp8[3] = {&a.q, &a.k, &a.v}, *const f32[3] = {&w.q, &w.k, &w.v};
    const float *const ds[3] = {dq, dk, dv};
    for (int t = 0; t < 3; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < fp8[t]->t.seqlen; s++)
                for (int64_t h = 0; h < fp8[t]->t.heads; h++)
                    for (int64_t d = 0; d < D; d++) {
                        const int64_t kvh = t == 0 ? h / (hq / hk) : h;
                        ht_set(f32[t], b, s, h, d,
                               ds[t][b * hk + kvh] * ht_get(fp8[t], b, s, h, d));
                    }
    /* a NaN in the last key's V: the row that sees it is NaN in both, and the reference takes
     * its row-by-row path for that kv head (the blocked one for the others) */
    ht_set(&a.v, 1, sk - 1, 1, 0, NAN), ht_set(&w.v, 1, sk - 1, 1, 0, NAN);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    run(be, &p, &w);
    p.descale_q = dq, p.descale_k = dk, p.descale_v = dv;
    p.descale_layout = FA_DESCALE_PER_KV_HEAD;
    run(be, &p, &a);
    const double tol = be == FA_BACKEND_REFERENCE ? 1e-12 : 1e-5;
    ck_assert_msg(ht_max_err(&a.o, &w.o) <= tol * ht_max_abs(&w.o), "%s: O %g apart (max %g)",
                  fa_backend_name(be), ht_max_err(&a.o, &w.o), ht_max_abs(&w.o));
    ck_assert_msg(ht_max_err(&a.l, &w.l) <= tol * ht_max_abs(&w.l) + 1e-6, "%s: LSE %g apart",
                  fa_backend_name(be), ht_max_err(&a.l, &w.l));
    fwd_free(&a);
    fwd_free(&w);
}
END_TEST

/* The tolerance rule on FP8 (e4m3 inputs, descales per kv head, bf16, f32 and f64 out): the fused
 * path passes against the reference with the conventional FP8 path (P rounded to e4m3 before
 * P V, as FlashAttention-3) as the yardstick; candidates with the realistic bugs fail: v's
 * descale forgotten, the descales of kv heads swapped (a q head indexing them by itself), the
 * bytes read as the other FP8 format. */
START_TEST(fp8_rule_passes_fused_fails_bugs)
{
    static const fa_dtype outs[3] = {FA_BF16, FA_F32, FA_F64};
    const fa_dtype out = outs[_i];
    const int64_t B = 1, sq = 128, sk = 256, hq = 4, hk = 2, D = 64;
    fwd_set ref, conv, cand;
    fwd_alloc(&ref, FA_E4M3, FA_E4M3, FA_F64, B, sq, sk, hq, hk, D);
    fwd_alloc(&conv, FA_E4M3, FA_E4M3, out, B, sq, sk, hq, hk, D);
    fwd_alloc(&cand, FA_E4M3, FA_E4M3, out, B, sq, sk, hq, hk, D);
    fwd_set *const sets[3] = {&ref, &conv, &cand};
    for (int s = 0; s < 3; s++) { /* the same codes in all three */
        fill_fp8(&sets[s]->q, 4, 3), fill_fp8(&sets[s]->k, 5, 3), fill_fp8(&sets[s]->v, 6, 3);
    }
    const float dq[2] = {0.5f, 1.25f}, dk[2] = {0.75f, 0.25f}, dv[2] = {2.0f, 0.625f};
    fa_params p;
    fa_params_init(&p);
    p.descale_q = dq, p.descale_k = dk, p.descale_v = dv;
    p.descale_layout = FA_DESCALE_PER_KV_HEAD;
    run(FA_BACKEND_REFERENCE, &p, &ref);
    run(FA_BACKEND_CONVENTIONAL, &p, &conv);
    const fa_tolerance tol = {.factor = 2};
    fa_comparison c;
    for (int bug = 0; bug < 4; bug++) {
        fa_params pc = p;
        const float swapped_k[2] = {dk[1], dk[0]};
        fa_tensor qv = cand.q.t, kv = cand.k.t, vv = cand.v.t, *q = &cand.q.t, *k = &cand.k.t,
                  *v = &cand.v.t;
        if (bug == 1)
            pc.descale_v = NULL;
        if (bug == 2)
            pc.descale_k = swapped_k;
        if (bug == 3) { /* e4m3 bytes read as e5m2 */
            qv.dtype = kv.dtype = vv.dtype = FA_E5M2;
            q = &qv, k = &kv, v = &vv;
        }
        ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &pc, q, k, v, &cand.o.t, NULL), FA_OK);
        ck_assert_int_eq(fa_compare(&cand.o.t, &ref.o.t, &conv.o.t, &tol, &c), FA_OK);
        ck_assert_msg(c.pass == (bug == 0), "%s out, bug %d: %s (max %g)",
                      fa_dtype_name(out), bug, c.rule, c.max_abs);
    }
    /* the yardstick rounds P to e4m3: its own error is well above the fused path's */
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &p, &cand.q.t, &cand.k.t, &cand.v.t,
                                &cand.o.t, NULL), FA_OK);
    ck_assert_int_eq(fa_compare(&cand.o.t, &ref.o.t, &conv.o.t, &tol, &c), FA_OK);
    ck_assert_msg(c.max_abs < c.baseline_err, "fused %g vs conventional FP8 %g", c.max_abs,
                  c.baseline_err);
    fwd_free(&ref);
    fwd_free(&conv);
    fwd_free(&cand);
}
END_TEST

/* An FP8 K/V cache under f32 q (FlashInfer's FP8 KV cache), descales per tensor, on a causal
 * chunk: the tiled and conventional paths against the reference under the rule. */
START_TEST(fp8_cache_under_f32_q)
{
    const fa_dtype kvd = _i ? FA_E5M2 : FA_E4M3;
    const int64_t B = 2, sq = 40, sk = 300, H = 2, D = 64;
    fwd_set ref, conv, tiled;
    fwd_alloc(&ref, FA_F32, kvd, FA_F32, B, sq, sk, H, H, D);
    fwd_alloc(&conv, FA_F32, kvd, FA_F32, B, sq, sk, H, H, D);
    fwd_alloc(&tiled, FA_F32, kvd, FA_F32, B, sq, sk, H, H, D);
    fwd_set *const sets[3] = {&ref, &conv, &tiled};
    for (int s = 0; s < 3; s++) {
        ht_fill(&sets[s]->q, 7, 1, -1);
        fill_fp8(&sets[s]->k, 8, 4), fill_fp8(&sets[s]->v, 9, 4);
    }
    const float dk = 0.125f, dv = 0.375f;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.descale_k = &dk, p.descale_v = &dv;
    run(FA_BACKEND_REFERENCE, &p, &ref);
    run(FA_BACKEND_CONVENTIONAL, &p, &conv);
    run(FA_BACKEND_TILED, &p, &tiled);
    const fa_tolerance tol = {.factor = 2};
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&tiled.o.t, &ref.o.t, &conv.o.t, &tol, &c), FA_OK);
    ck_assert_msg(c.pass, "%s cache: %s", fa_dtype_name(kvd), c.rule);
    fwd_free(&ref);
    fwd_free(&conv);
    fwd_free(&tiled);
}
END_TEST

/*
 * An FP8 cache on the decode path (Sq = 1, GQA 4, f32 q): out and LSE bit for bit those of an
 * f32 cache holding its widened values, on the tiled backend with every kernel set this CPU
 * runs, 1 and 2 threads; D 128 (whole vectors) and D 38 (every set's partial vector); the
 * codes: every finite one of the format (subnormals among them) in K, normals in V but for a
 * NaN in one row of one kv head (its rows' last dim NaN in both). Then descales per
 * kv head against the f32 cache of the descaled values: to f32 rounding (a descale applied
 * twice or to the wrong head is off by the descale itself).
 */
START_TEST(fp8_cache_decode_reads_widened_values)
{
    const fa_dtype kvd = _i % 2 ? FA_E5M2 : FA_E4M3;
    const int64_t B = 2, sq = 1, sk = 700, hq = 8, hk = 2, D = _i < 2 ? 128 : 38;
    fwd_set a, w;
    fwd_alloc(&a, FA_F32, kvd, FA_F32, B, sq, sk, hq, hk, D);
    fwd_alloc(&w, FA_F32, FA_F32, FA_F32, B, sq, sk, hq, hk, D);
    ht_fill(&a.q, 11, -1, 1), ht_fill(&w.q, 11, -1, 1);
    fill_fp8(&a.v, 12, 2);
    uint64_t x = 13; /* K: random codes, every finite one among them */
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < sk; s++)
            for (int64_t h = 0; h < hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    x = x * 6364136223846793005u + 1442695040888963407u;
                    uint8_t c = (uint8_t)(x >> 56);
                    if (isnan(fp8_value(kvd, c)) || isinf(fp8_value(kvd, c)))
                        c &= 0x83; /* keep NaN and inf out of K: V's NaN row tests that */
                    ((uint8_t *)a.k.t.data)[b * a.k.t.batch_stride + s * a.k.t.seq_stride +
                                            h * a.k.t.head_stride + d] = c;
                }
    ht_set(&a.v, 1, sk / 2, 1, D - 1, NAN);
    for (int64_t b = 0; b < B; b++) /* the f32 twin: the very values */
        for (int64_t s = 0; s < sk; s++)
            for (int64_t h = 0; h < hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    ht_set(&w.k, b, s, h, d, ht_get(&a.k, b, s, h, d));
                    ht_set(&w.v, b, s, h, d, ht_get(&a.v, b, s, h, d));
                }
    fa_params p;
    fa_params_init(&p);
    /* scores of about unit spread (the codes' RMS: ~100 e4m3, ~8000 e5m2, over 128 dims), so
     * that P spreads over many keys and P V reads many V rows */
    p.scale = kvd == FA_E4M3 ? 1e-3f : 2e-5f;
    int runs = 0;
    for (int i = 0; i < ht_nisas; i++) {
        if (!ht_isa_tested(i, FA_F32))
            continue;
        ht_isa = ht_isas[i];
        for (int threads = 1; threads <= 2; threads++) {
            ht_poison(&a.o), ht_poison(&w.o);
            ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, threads, &p, &a.q.t, &a.k.t, &a.v.t,
                                        &a.o.t, &a.l.t), FA_OK);
            ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, threads, &p, &w.q.t, &w.k.t, &w.v.t,
                                        &w.o.t, &w.l.t), FA_OK);
            ck_assert_msg(!memcmp(a.o.t.data, w.o.t.data, a.o.nbytes - 8) &&
                              !memcmp(a.l.t.data, w.l.t.data, a.l.nbytes - 8),
                          "%s cache, D %lld, isa %s, %d threads: out or LSE differs",
                          fa_dtype_name(kvd), (long long)D, fa_isa_name(ht_isa), threads);
            runs++;
        }
    }
    ht_isa = FA_ISA_AUTO;
    ck_assert_int_ge(runs, 2);
    ck_assert(isnan(ht_get(&a.o, 1, 0, 4, D - 1)) && !isnan(ht_get(&a.o, 1, 0, 3, D - 1)));
    ck_assert_int_gt(ht_decode_keys(1, &p, &a.q.t, &a.k.t, &a.v.t), 0); /* decode it was */

    float dk[4], dv[4];
    for (int y = 0; y < 4; y++)
        dk[y] = descale_of[y], dv[y] = descale_of[(y + 1) % 4];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < sk; s++)
            for (int64_t h = 0; h < hk; h++)
                for (int64_t d = 0; d < D; d++) {
                    ht_set(&w.k, b, s, h, d, dk[b * hk + h] * ht_get(&a.k, b, s, h, d));
                    ht_set(&w.v, b, s, h, d, dv[b * hk + h] * ht_get(&a.v, b, s, h, d));
                }
    ht_set(&a.v, 1, sk / 2, 1, D - 1, 1), ht_set(&w.v, 1, sk / 2, 1, D - 1, dv[3]);
    run(FA_BACKEND_TILED, &p, &w);
    p.descale_k = dk, p.descale_v = dv, p.descale_layout = FA_DESCALE_PER_KV_HEAD;
    run(FA_BACKEND_TILED, &p, &a);
    ck_assert_msg(ht_max_err(&a.o, &w.o) <= 1e-5 * ht_max_abs(&w.o), "descales: O %g apart",
                  ht_max_err(&a.o, &w.o));
    ck_assert_msg(ht_max_err(&a.l, &w.l) <= 1e-5 * ht_max_abs(&w.l) + 1e-6,
                  "descales: LSE %g apart", ht_max_err(&a.l, &w.l));
    fwd_free(&a);
    fwd_free(&w);
}
END_TEST

/* Each bad FP8 argument: its own status, and no output written. */
START_TEST(bad_fp8_arguments)
{
    const int64_t B = 2, sq = 8, sk = 10, H = 2, D = 8;
    fwd_set x;
    fwd_alloc(&x, FA_E4M3, FA_E4M3, FA_BF16, B, sq, sk, H, H, D);
    ht_tensor k16, o8, f32q;
    ht_alloc(&k16, FA_F16, B, sk, H, D, SW_BSHD);
    ht_alloc(&o8, FA_E4M3, B, sq, H, D, SW_BSHD);
    ht_alloc(&f32q, FA_F32, B, sq, H, D, SW_BSHD);
    const float zero = 0, neg = -1, nan = NAN, inf = INFINITY, one = 1;
    struct {
        const fa_tensor *q, *k, *v;
        fa_tensor *out;
        const float *dq;
        int layout;
        fa_status want;
        const char *says;
    } cases[] = {
        {&x.q.t, &x.k.t, &x.v.t, &x.o.t, &zero, 0, FA_ERR_INVALID_ARGUMENT, "descale_q[0] = 0"},
        {&x.q.t, &x.k.t, &x.v.t, &x.o.t, &neg, 0, FA_ERR_INVALID_ARGUMENT, "descale_q[0] = -1"},
        {&x.q.t, &x.k.t, &x.v.t, &x.o.t, &nan, 0, FA_ERR_INVALID_ARGUMENT, "descale_q[0] = nan"},
        {&x.q.t, &x.k.t, &x.v.t, &x.o.t, &inf, 0, FA_ERR_INVALID_ARGUMENT, "descale_q[0] = inf"},
        {&x.q.t, &x.k.t, &x.v.t, &x.o.t, &one, 9, FA_ERR_INVALID_ARGUMENT, "descale_layout"},
        {&f32q.t, &x.k.t, &x.v.t, &x.o.t, &one, 0, FA_ERR_INVALID_ARGUMENT, "FP8 tensors"},
        {&x.q.t, &k16.t, &x.v.t, &x.o.t, NULL, 0, FA_ERR_DTYPE, "v->dtype"},
        {&x.q.t, &x.k.t, &x.v.t, &o8.t, NULL, 0, FA_ERR_DTYPE, "out->dtype"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fa_params p;
        fa_params_init(&p);
        p.descale_q = cases[c].dq;
        p.descale_layout = (fa_descale_layout)cases[c].layout;
        ht_poison(&x.o), ht_poison(&o8);
        const fa_status st = ht_forward(FA_BACKEND_TILED, 1, &p, cases[c].q, cases[c].k,
                                        cases[c].v, cases[c].out, NULL);
        ck_assert_msg(st == cases[c].want, "case %zu: %s (%s)", c, fa_status_string(st),
                      fa_last_error());
        ck_assert_msg(strstr(fa_last_error(), cases[c].says), "case %zu: '%s' lacks '%s'", c,
                      fa_last_error(), cases[c].says);
        ck_assert(ht_is_poisoned(&x.o) && ht_is_poisoned(&o8));
    }
    /* FP8 is forward only */
    fa_params p;
    fa_params_init(&p);
    ck_assert_int_eq(ht_backward(FA_BACKEND_TILED, 1, &p, &x.q.t, &x.k.t, &x.v.t, &x.o.t, &x.l.t,
                                 &x.o.t, &x.q.t, &x.k.t, &x.v.t),
                     FA_ERR_UNSUPPORTED);
    ht_free(&k16), ht_free(&o8), ht_free(&f32q);
    fwd_free(&x);
}
END_TEST

Suite *make_fp8_suite(void)
{
    Suite *s = suite_create("fp8");
    TCase *tc = ht_tcase_create("fp8");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, widen_every_code, 0, 2);
    tcase_add_loop_test(tc, narrow_to_nearest_even, 0, 2);
    tcase_add_loop_test(tc, descale_applied_once, 0, 2);
    tcase_add_loop_test(tc, fp8_rule_passes_fused_fails_bugs, 0, 3);
    tcase_add_loop_test(tc, fp8_cache_under_f32_q, 0, 2);
    tcase_add_loop_test(tc, fp8_cache_decode_reads_widened_values, 0, 4);
    tcase_add_test(tc, bad_fp8_arguments);
    suite_add_tcase(s, tc);
    return s;
}
