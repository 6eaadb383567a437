/* src/core and the dtype conversions: Philox known answers, mask geometry against brute
 * force, the recurrence on the article's worked example, rounding to f16/bf16. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/recurrence.h"
#include "harness.h"
#include "backends/tiled/plan.h"
#include "base/dtype.h"

/* Random123's known-answer vectors for Philox4x32-10 (kat_vectors), as docs/DESIGN.md §1 lists. */
START_TEST(philox_known_answers)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[3] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int t = 0; t < 3; t++) {
        fai_u32x4 c = {{kat[t].ctr[0], kat[t].ctr[1], kat[t].ctr[2], kat[t].ctr[3]}};
        fai_u32x4 r = fai_philox4x32_10(c, kat[t].key[0], kat[t].key[1]);
        for (int w = 0; w < 4; w++)
            ck_assert_msg(r.v[w] == kat[t].out[w], "vector %d word %d: %08x, want %08x", t, w,
                          r.v[w], kat[t].out[w]);
    }
}
END_TEST

/* The row helper must give, for any start and length, the decision the contract defines per
 * element, keep iff u >= floor(p 2^32) -- also for rows, keys, heads and offsets past 2^32. */
START_TEST(dropout_row_matches_definition)
{
    const uint64_t seed = 0x0123456789abcdefull;
    static const struct {
        uint64_t offset, head, i, j0;
    } at[] = {
        {77, 5, 11, 0},
        {0x500000007ull, 5, 11, 0},
        {77, 0x300000005ull, 11, 0},
        {77, 5, 0x700000000bull, 0},
        {77, 5, 11, 0x1400000000ull},
        {~0ull, ~0ull >> 1, (1ull << 62) - 40, (1ull << 62) - 40},
    };
    /* and a placed call's stream (api/params.c: fai_problem_place): row i and key j of the call
     * draw the stream's row0 + i and col0 + j, also where col0 is no multiple of 4 */
    static const int64_t origin[3][2] = {{0, 0}, {5, 3}, {1 << 20, 4098}};
    for (size_t t = 0; t < sizeof at / sizeof at[0]; t++)
        for (int o = 0; o < 3; o++) {
            const fai_dropout_params p = {.seed = seed, .offset = at[t].offset,
                                          .threshold = fai_dropout_threshold(0.3),
                                          .row0 = origin[o][0], .col0 = origin[o][1]};
            ck_assert_uint_eq(p.threshold, (uint32_t)floor(0.3 * 4294967296.0));
            const fai_dropout d = fai_dropout_make(&p, at[t].head);
            unsigned char keep[64];
            for (int64_t j0 = 0; j0 < 9; j0++)
                for (int64_t n = 1; n < 20; n++) {
                    const int64_t s0 = (int64_t)at[t].j0 + j0;
                    fai_dropout_keep_row(&d, (int64_t)at[t].i, s0, n, keep);
                    for (int64_t c = 0; c < n; c++) {
                        const uint32_t u = ht_dropout_draw(
                            seed, at[t].offset, at[t].head, at[t].i + (uint64_t)origin[o][0],
                            (uint64_t)(s0 + c + origin[o][1]));
                        ck_assert_msg(keep[c] == (u >= p.threshold), "case %zu j %lld", t,
                                      (long long)(s0 + c));
                        ck_assert_int_eq(keep[c], fai_dropout_keep(&d, (int64_t)at[t].i, s0 + c));
                    }
                }
        }
}
END_TEST

/* Every 64-bit input reaches the draws: offsets, heads, rows and keys that agree in their low
 * 32 bits (the 2^32-periodic stream of 15de60b) give different blocks. */
START_TEST(dropout_stream_is_64_bit)
{
    const fai_dropout_params p = {.seed = 99, .offset = 1, .threshold = 1},
                             q = {.seed = 99, .offset = 1 + (1ull << 32), .threshold = 1};
    const fai_dropout a = fai_dropout_make(&p, 3), b = fai_dropout_make(&q, 3),
                      c = fai_dropout_make(&p, 3 + (1ull << 32));
    ck_assert(a.k0 != b.k0 || a.k1 != b.k1);
    ck_assert(a.k0 != c.k0 || a.k1 != c.k1);
    const int64_t big = (int64_t)1 << 32;
    const fai_u32x4 u = fai_dropout_block(&a, 7, 8), r = fai_dropout_block(&a, 7 + big, 8),
                    k = fai_dropout_block(&a, 7, 8 + 4 * big);
    ck_assert(memcmp(&u, &r, sizeof u) != 0);
    ck_assert(memcmp(&u, &k, sizeof u) != 0);
}
END_TEST

static fai_mask random_mask(uint64_t *s, int64_t *sq, int64_t *sk, int64_t *sink_tokens)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = *s >> 16;
    *sq = 1 + (int64_t)(r % 23);
    *sk = 1 + (int64_t)((r >> 8) % 23);
    int causal = (r >> 16) & 1;
    int64_t left = (int64_t)((r >> 17) % 9) - 1, right = (int64_t)((r >> 21) % 9) - 1;
    *sink_tokens = (int64_t)((r >> 26) % 6);
    return fai_mask_make(*sq, *sk, causal, left, right, (r >> 25) & 1, *sink_tokens);
}

/* Whether key j is in row i's interval (fai_mask_row), as a predicate. */
static int allowed(const fai_mask *m, int64_t i, int64_t j)
{
    int64_t lo, hi;
    fai_mask_row(m, i, &lo, &hi);
    return j >= lo && j < hi;
}

/* The definition of docs/DESIGN.md §1 step 4, written out again: off, L, R, n as there. */
static int definition(const fai_mask *m, int64_t i, int64_t j, int64_t n)
{
    return (m->left < 0 || j >= i + m->off - m->left || j < n) &&
           (m->right < 0 || j <= i + m->off + m->right);
}

/* Classification, key span and query span of a plain mask against its per-element predicate. */
static void check_plain_geometry(const fai_mask *m, int64_t sq, int64_t i0, int64_t i1,
                                 int64_t j0, int64_t j1)
{
    int any = 0, all = 1;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = j0; j < j1; j++) {
            any |= allowed(m, i, j);
            all &= allowed(m, i, j);
        }
    fai_tile_class want = !any ? FAI_TILE_EMPTY : all ? FAI_TILE_FULL : FAI_TILE_PARTIAL;
    ck_assert_int_eq(fai_mask_classify(m, i0, i1, j0, j1), want);

    int64_t lo, hi;
    fai_mask_key_span(m, i0, i1, &lo, &hi);
    for (int64_t j = 0; j < m->sk; j++) {
        int seen = 0;
        for (int64_t i = i0; i < i1; i++)
            seen |= allowed(m, i, j);
        ck_assert_msg(seen == (j >= lo && j < hi), "key span [%ld,%ld) vs key %ld", (long)lo,
                      (long)hi, (long)j);
    }
    fai_mask_query_span(m, sq, j0, j1, &lo, &hi); /* j1 may pass a part's Sk */
    for (int64_t i = 0; i < sq; i++) {
        int seen = 0;
        for (int64_t j = j0; j < j1; j++)
            seen |= allowed(m, i, j);
        ck_assert_msg(seen == (i >= lo && i < hi), "query span [%ld,%ld) vs row %ld", (long)lo,
                      (long)hi, (long)i);
    }
}

/* Every mask, sink tokens included: fai_mask_allows is the definition, the parts partition
 * it with part 0's keys before part 1's in every row, and each part is a plain mask whose
 * interval functions match its own predicate. */
START_TEST(mask_geometry_matches_brute_force)
{
    uint64_t s = 42;
    int split = 0;
    for (int trial = 0; trial < 4000; trial++) {
        int64_t sq, sk, n;
        fai_mask m = random_mask(&s, &sq, &sk, &n);
        int64_t i0 = (int64_t)((s >> 30) % (uint64_t)sq), j0 = (int64_t)((s >> 40) % (uint64_t)sk);
        int64_t i1 = i0 + 1 + (int64_t)((s >> 35) % (uint64_t)(sq - i0));
        int64_t j1 = j0 + 1 + (int64_t)((s >> 45) % (uint64_t)(sk - j0));
        fai_mask part[2];
        const int np = fai_mask_parts(&m, part);
        ck_assert_int_eq(np, m.left >= 0 && n > 0 ? 2 : 1);
        split += np == 2;
        for (int64_t i = 0; i < sq; i++) {
            int64_t last0 = -1, first1 = -1;
            for (int64_t j = 0; j < sk; j++) {
                const int want = definition(&m, i, j, n);
                ck_assert_int_eq(fai_mask_allows(&m, i, j), want);
                int in = 0;
                for (int q = 0; q < np; q++)
                    in += j < part[q].sk && allowed(&part[q], i, j);
                ck_assert_msg(in == want, "row %ld key %ld: %d parts, allowed %d", (long)i,
                              (long)j, in, want);
                if (np == 2 && j < part[0].sk && allowed(&part[0], i, j)) {
                    ck_assert_int_lt(first1, 0); /* no part-1 key before a part-0 key */
                    last0 = j;
                }
                if (np == 2 && allowed(&part[1], i, j)) {
                    ck_assert_int_lt(last0, j);
                    first1 = first1 < 0 ? j : first1;
                }
            }
        }
        for (int q = 0; q < np; q++)
            check_plain_geometry(&part[q], sq, i0, i1, j0, j1);
    }
    ck_assert_int_gt(split, 500);
}
END_TEST

/* The article's §4.3: scores [1, 2] then [0, 3]. After the first block m = 2 and the weights
 * are [e^-1, 1]; the second block moves m to 3, rescales by e^-1 and adds [e^-3, 1]. */
START_TEST(recurrence_worked_example)
{
    const double blocks[2][2] = {{1, 2}, {0, 3}}, v[4] = {10, 20, 30, 40};
    double m = -INFINITY, l = 0, acc = 0, a;
    for (int blk = 0; blk < 2; blk++) {
        double bmax = fmax(blocks[blk][0], blocks[blk][1]);
        ck_assert(fai_online_rescale_f64(&m, bmax, &a));
        if (blk == 0) {
            ck_assert(m == 2 && a == 0);
        } else {
            ck_assert(m == 3);
            ck_assert_double_eq_tol(a, exp(-1.0), 1e-16);
        }
        l *= a;
        acc *= a;
        for (int c = 0; c < 2; c++) {
            l += exp(blocks[blk][c] - m);
            acc += exp(blocks[blk][c] - m) * v[2 * blk + c];
        }
        if (blk == 0)
            ck_assert_double_eq_tol(l, exp(-1.0) + 1, 1e-15);
    }
    double lse, f = fai_online_finalize_f64(m, l, 1.0, &lse);
    const double w[4] = {exp(-2.0), exp(-1.0), exp(-3.0), 1.0};
    double sum = w[0] + w[1] + w[2] + w[3], want = 0;
    for (int j = 0; j < 4; j++)
        want += w[j] / sum * v[j];
    ck_assert_double_eq_tol(acc * f, want, 1e-13);
    ck_assert_double_eq_tol(lse, 3 + log(sum), 1e-15);

    /* a block with nothing allowed before anything was seen is skipped, never NaN */
    double m2 = -INFINITY, a2 = 7;
    ck_assert(!fai_online_rescale_f64(&m2, -INFINITY, &a2));
    ck_assert(m2 == -INFINITY && a2 == 7);
    ck_assert(fai_online_finalize_f64(m2, 0, 1.0, &lse) == 0 && lse == -INFINITY);
}
END_TEST

START_TEST(merge_lse_neutral_empty_state)
{
    const double l1[3] = {-INFINITY, 0.5, -INFINITY};
    ck_assert_double_eq_tol(fai_merge_lse_f64(l1, 3), 0.5, 1e-16);
    ck_assert(fai_merge_weight_f64(-INFINITY, 0.5) == 0);
    const double l2[2] = {-INFINITY, -INFINITY};
    ck_assert(fai_merge_lse_f64(l2, 2) == -INFINITY);
    ck_assert(fai_merge_weight_f64(-INFINITY, -INFINITY) == 0);
    const double l3[2] = {1000, 1000}; /* no overflow: ln(2 e^1000) */
    ck_assert_double_eq_tol(fai_merge_lse_f64(l3, 2), 1000 + log(2.0), 1e-12);
}
END_TEST

/* Every f16 and bf16 value survives the round trip through double exactly. */
START_TEST(half_round_trip_exact)
{
    for (uint32_t h = 0; h < 65536; h++) {
        double f = fai_f16_to_f64((uint16_t)h), b = fai_bf16_to_f64((uint16_t)h);
        if (!isnan(f))
            ck_assert_uint_eq(fai_f64_to_f16(f), h);
        else
            ck_assert(isnan(fai_f16_to_f64(fai_f64_to_f16(f))));
        if (!isnan(b))
            ck_assert_uint_eq(fai_f64_to_bf16(b), h);
        else
            ck_assert(isnan(fai_bf16_to_f64(fai_f64_to_bf16(b))));
    }
}
END_TEST

/* Rounding is to the nearest representable value, ties to the even encoding: checked against
 * the two neighbours of the result, for random doubles and for exact midpoints. */
static void check_nearest(double x, uint16_t (*enc)(double), double (*dec)(uint16_t))
{
    uint16_t r = enc(x);
    double y = dec(r);
    if (isinf(y)) { /* overflow: x must be at least halfway past the largest finite value */
        uint16_t big = (uint16_t)((r & 0x8000u) | ((r & 0x7fffu) - 1));
        double max = dec(big), below = dec((uint16_t)(big - 1));
        ck_assert(fabs(x) >= fabs(max) + (fabs(max) - fabs(below)) / 2);
        return;
    }
    for (int step = -1; step <= 1; step += 2) {
        uint16_t nb = (uint16_t)(r + step);
        if (((r & 0x7fffu) == 0 && step < 0) || isnan(dec(nb)) || isinf(dec(nb)))
            continue;
        double z = dec(nb), dy = fabs(x - y), dz = fabs(x - z);
        ck_assert_msg(dy < dz || (dy == dz && (r & 1) == 0), "x=%a -> %a, neighbour %a", x, y, z);
    }
}

START_TEST(half_rounding_nearest_even)
{
    uint64_t s = 7;
    for (int t = 0; t < 200000; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double mant = 1 + (double)(s >> 12) * 0x1p-52;
        int e = (int)((s >> 3) % 90) - 45;
        double x = ldexp(mant, e) * ((s & 1) ? -1 : 1);
        check_nearest(x, fai_f64_to_f16, fai_f16_to_f64);
        check_nearest(ldexp(x, (int)((s >> 20) % 200) - 100), fai_f64_to_bf16, fai_bf16_to_f64);
    }
    for (uint32_t h = 1; h < 0x7bff; h++) { /* midpoints between consecutive f16 values */
        double mid = (fai_f16_to_f64((uint16_t)h) + fai_f16_to_f64((uint16_t)(h + 1))) / 2;
        check_nearest(mid, fai_f64_to_f16, fai_f16_to_f64);
        ck_assert_uint_eq(fai_f64_to_f16(mid), (h & 1) ? h + 1 : h);
    }
    ck_assert_uint_eq(fai_f64_to_f16(65519.99), 0x7bff);
    ck_assert_uint_eq(fai_f64_to_f16(65520.0), 0x7c00);
    ck_assert_uint_eq(fai_f64_to_f16(0x1p-25), 0);          /* tie with 0: even */
    ck_assert_uint_eq(fai_f64_to_f16(0x1.0000001p-25), 1);  /* just above: min subnormal */
    ck_assert_uint_eq(fai_f64_to_bf16(1 + 0x1p-8), 0x3f80); /* tie: even */
    ck_assert_uint_eq(fai_f64_to_bf16(1 + 0x1p-8 + 0x1p-40), 0x3f81);
}
END_TEST

/* fa_convert: the public face of the same conversions, with its own argument checks. */
START_TEST(convert_public)
{
    const double in[4] = {1 + 0x1p-8, 1 + 0x1p-8 + 0x1p-40, -65520.0, 0x1p-25};
    uint16_t bf[4], hf[4];
    ck_assert_int_eq(fa_convert(in, FA_F64, bf, FA_BF16, 4), FA_OK);
    ck_assert_int_eq(fa_convert(in, FA_F64, hf, FA_F16, 4), FA_OK);
    ck_assert_uint_eq(bf[0], 0x3f80); /* tie to even */
    ck_assert_uint_eq(bf[1], 0x3f81);
    ck_assert_uint_eq(hf[2], 0xfc00); /* -inf */
    ck_assert_uint_eq(hf[3], 0);
    float f[4];
    ck_assert_int_eq(fa_convert(bf, FA_BF16, f, FA_F32, 4), FA_OK);
    ck_assert(f[0] == 1.0f && f[1] == 1.0f + 0x1p-7f);
    ck_assert_int_eq(fa_convert(in, (fa_dtype)9, f, FA_F32, 4), FA_ERR_DTYPE);
    ck_assert_int_eq(fa_convert(NULL, FA_F64, f, FA_F32, 4), FA_ERR_NULL_POINTER);
    ck_assert_int_eq(fa_convert(NULL, FA_F64, NULL, FA_F32, 0), FA_OK);
}
END_TEST

static int is_pow2(int64_t x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

/* Both passes keep the two key panels within 1/4 of L2; the forward's query tile is the largest
 * (up to 4096 rows) whose Q and acc take at most twice L2, and its score strip fills at most
 * half of L1d (in rows, a multiple of every kernel set's MR); the backward keeps its five score
 * tiles within 2/3 of L2. */
START_TEST(plan_fits_caches)
{
    const int64_t l1s[3] = {32 << 10, 48 << 10, 64 << 10}, l2s[3] = {256 << 10, 1 << 20, 2 << 20};
    const int64_t dims[5] = {16, 59, 64, 128, 256};
    for (int c = 0; c < 3; c++)
        for (int d = 0; d < 5; d++)
            for (size_t es = 4; es <= 8; es += 4) {
                const int64_t D = dims[d], e = (int64_t)es, l2 = l2s[c];
                fai_cache_info ci = {l1s[c], l2, "test"};
                fai_tiles f = fai_plan_forward_tiles(&ci, D, D, es, 12),
                          b = fai_plan_backward_tiles(&ci, D, D, es);
                ck_assert(is_pow2(f.bq) && is_pow2(f.bk) && is_pow2(b.bq) && is_pow2(b.bk));
                ck_assert(f.bk >= 16 && f.bk <= 256 && f.bq >= 16 && f.bq <= 4096);
                ck_assert(b.bk >= 16 && b.bk <= 256 && b.bq >= 16 && b.bq <= 256);
                ck_assert(f.bk == b.bk); /* the panel bound */
                if (b.bk > 16)
                    ck_assert(b.bk * 2 * D * e <= l2 / 4);
                ck_assert_msg(f.bq * 2 * D * e <= 2 * l2 || f.bq == 16, "D=%lld", (long long)D);
                ck_assert(f.bq == 4096 || 2 * f.bq * 2 * D * e > 2 * l2); /* no larger one */
                ck_assert(f.br % 24 == 0 && f.br >= 24);
                ck_assert(f.br == 24 || f.br * f.bk * e <= ci.l1d / 2);
                ck_assert((f.br + 24) * f.bk * e > ci.l1d / 2);
                if (b.bq > 16)
                    ck_assert(5 * b.bq * b.bk * e <= l2 / 3 * 2);
            }
    fai_cache_info ci;
    fai_cache_detect(&ci);
    ck_assert(ci.l1d >= 4096 && ci.l2 >= ci.l1d);
}
END_TEST

Suite *make_core_suite(void)
{
    Suite *s = suite_create("core");
    TCase *tc = ht_tcase_create("core");
    tcase_add_test(tc, philox_known_answers);
    tcase_add_test(tc, dropout_row_matches_definition);
    tcase_add_test(tc, dropout_stream_is_64_bit);
    tcase_add_test(tc, mask_geometry_matches_brute_force);
    tcase_add_test(tc, recurrence_worked_example);
    tcase_add_test(tc, merge_lse_neutral_empty_state);
    tcase_add_test(tc, half_round_trip_exact);
    tcase_add_test(tc, half_rounding_nearest_even);
    tcase_add_test(tc, convert_public);
    tcase_add_test(tc, plan_fits_caches);
    suite_add_tcase(s, tc);
    return s;
}
