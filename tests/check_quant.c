/*
 * Quantized K/V caches (FA_Q8_0, FA_Q4_0: ggml's blocks). Every code dequantizes to what the
 * format says (f16 scale and codes decoded here from their definitions); quantization is
 * ggml's reference rule bit for bit (hand-worked blocks, and the rule written out here apart
 * from core/quant.h, with f16 rounding by a search of the f16 values); a quantized cache gives
 * the very bits of an f32 cache holding its dequantized values, on every backend and kernel
 * set, decode and tiles, contiguous and paged (the dequantized values are exact in f32, so
 * only a wrong value or a different order of sums could tell them apart); fa_append_kv
 * quantizes new keys as ggml would; bad arguments are refused by name with nothing written.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { QB = 32 };

static int64_t block_bytes(fa_dtype dt) { return dt == FA_Q8_0 ? 34 : 18; }

/* IEEE binary16 bits to their value, from the format: sign, 5 exponent bits (bias 15), 10
 * fraction bits. */
static double f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double a = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                      : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -a : a;
}

/* The f16 nearest to x (finite), ties to the even code: a binary search of the positive codes,
 * whose values rise with the code. */
static uint16_t f16_nearest(float x)
{
    const uint16_t sign = signbit(x) ? 0x8000 : 0;
    const double a = fabs((double)x);
    if (a >= 65520.0)
        return sign | 0x7c00;
    unsigned lo = 0, hi = 0x7bff; /* value(lo) <= a, lo the largest such */
    while (lo < hi) {
        const unsigned mid = (lo + hi + 1) / 2;
        if (f16_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo < 0x7bff) {
        const double below = a - f16_value((uint16_t)lo), above = f16_value((uint16_t)(lo + 1)) - a;
        if (above < below || (above == below && (lo & 1)))
            lo++;
    }
    return sign | (uint16_t)lo;
}

/* ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref for one block, written from ggml's
 * rule (ggml-quants.c): q8_0 d = amax / 127, q = roundf(x / d by its reciprocal); q4_0 d =
 * (the first value of largest magnitude) / -8, u = min(15, (int8_t)(x id + 8.5)). */
static void ggml_block(fa_dtype dt, const float *x, uint8_t *out)
{
    float amax = 0, max = 0;
    for (int j = 0; j < QB; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = dt == FA_Q8_0 ? amax / 127 : max / -8, id = d ? 1.0f / d : 0.0f;
    const uint16_t h = f16_nearest(d);
    out[0] = (uint8_t)(h & 255), out[1] = (uint8_t)(h >> 8);
    if (dt == FA_Q8_0) {
        for (int j = 0; j < QB; j++)
            out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        return;
    }
    for (int j = 0; j < QB / 2; j++) { /* ggml's two statements: the product rounded first */
        volatile float x0 = x[j] * id, x1 = x[QB / 2 + j] * id;
        const int8_t u0 = (int8_t)(x0 + 8.5f), u1 = (int8_t)(x1 + 8.5f);
        out[2 + j] = (uint8_t)((u0 < 15 ? u0 : 15) | (u1 < 15 ? u1 : 15) << 4);
    }
}

/* Element j of a block, from the format's definition. */
static double block_value(fa_dtype dt, const uint8_t *blk, int j)
{
    const double d = f16_value((uint16_t)(blk[0] | blk[1] << 8));
    if (dt == FA_Q8_0)
        return d * (int8_t)blk[2 + j];
    const int u = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
    return d * (u - 8);
}

static uint64_t rng = 88172645463325252ull;
static double uniform(void) /* [0, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

/* Hand-worked blocks: q8_0 with d = 1 (ties away from zero, the extreme code), q4_0 with
 * d = 1 (the first of two largest magnitudes sets the sign, the clamp at 15, truncation). */
START_TEST(quantize_worked_blocks)
{
    float x[QB] = {127, -63.5f, 0.5f, -0.5f, 1.5f, 0, 100.25f};
    uint8_t got[34];
    const uint8_t q8[34] = {0x00, 0x3c, 0x7f, 0xc0, 0x01, 0xff, 0x02, 0x00, 0x64};
    ck_assert_int_eq(fa_convert(x, FA_F32, got, FA_Q8_0, QB), FA_OK);
    for (int i = 0; i < 34; i++)
        ck_assert_msg(got[i] == q8[i], "q8_0 byte %d: 0x%02x, want 0x%02x", i, got[i], q8[i]);

    float y[QB] = {-8, 7, 1, -1, 3.5f};
    y[16] = 8, y[17] = -0.5f, y[18] = 0.49f;
    const uint8_t q4[18] = {0x00, 0x3c, 0xf0, 0x8f, 0x89, 0x87, 0x8c, 0x88, 0x88, 0x88,
                            0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
    ck_assert_int_eq(fa_convert(y, FA_F32, got, FA_Q4_0, QB), FA_OK);
    for (int i = 0; i < 18; i++)
        ck_assert_msg(got[i] == q4[i], "q4_0 byte %d: 0x%02x, want 0x%02x", i, got[i], q4[i]);

    /* values so small that d is subnormal in f32 (ggml's reciprocal overflows there): scale 0,
     * codes 0 (q8_0) and 8 (q4_0), the values the same zeros (docs/DESIGN.md §1) */
    for (int j = 0; j < QB; j++)
        x[j] = (j % 3 - 1) * 0x1p-127f;
    ck_assert_int_eq(fa_convert(x, FA_F32, got, FA_Q8_0, QB), FA_OK);
    for (int i = 0; i < 34; i++)
        ck_assert_msg(got[i] == 0, "subnormal q8_0 byte %d: 0x%02x", i, got[i]);
    ck_assert_int_eq(fa_convert(x, FA_F32, got, FA_Q4_0, QB), FA_OK);
    for (int i = 0; i < 18; i++)
        ck_assert_msg(got[i] == (i < 2 ? 0 : 0x88), "subnormal q4_0 byte %d: 0x%02x", i, got[i]);
}
END_TEST

/* Blocks of every magnitude (zeros, ties, subnormal scales, scales near f16's largest), from
 * f32 and from f64 (rounded to f32 first), against ggml's rule. */
START_TEST(quantize_as_ggml)
{
    const fa_dtype dt = _i ? FA_Q4_0 : FA_Q8_0;
    enum { NB = 3000 };
    float *x = malloc(sizeof(float) * NB * QB);
    double *x64 = malloc(sizeof(double) * NB * QB);
    uint8_t *got = malloc((size_t)(NB * 34)), *got64 = malloc((size_t)(NB * 34)), want[34];
    for (int b = 0; b < NB; b++) {
        const double mag = ldexp(1, (int)(uniform() * 60) - 40); /* 2^-40 .. 2^19 */
        for (int j = 0; j < QB; j++) {
            double v = (2 * uniform() - 1) * mag;
            if (b % 7 == 1) /* ties: d = 2^k exactly (x_0 below), x / d a half-integer */
                v = ldexp(floor(uniform() * (dt == FA_Q8_0 ? 254 : 15)) -
                              (dt == FA_Q8_0 ? 127 : 7) + 0.5,
                          b % 40 - 20);
            if (b % 11 == 2)
                v = 0;
            x64[b * QB + j] = v + (b % 5 == 3 ? 1e-30 : 0); /* f64 values f32 rounds */
            x[b * QB + j] = (float)x64[b * QB + j];
        }
        if (b % 7 == 1) /* the tie blocks' scale: amax 127 x 2^k (q8_0), m = -8 x 2^k (q4_0) */
            x[b * QB] = (float)ldexp(dt == FA_Q8_0 ? 127 : -8, b % 40 - 20),
                   x64[b * QB] = x[b * QB];
        if (b % 13 == 4) /* an f16 scale's largest: amax = 127 x 65504 (q8_0), 8 x 65504 */
            x[b * QB + 5] = (float)(dt == FA_Q8_0 ? 127.0 * 65504 : -8.0 * 65504),
                    x64[b * QB + 5] = x[b * QB + 5];
    }
    ck_assert_int_eq(fa_convert(x, FA_F32, got, dt, NB * QB), FA_OK);
    ck_assert_int_eq(fa_convert(x64, FA_F64, got64, dt, NB * QB), FA_OK);
    const int64_t bb = block_bytes(dt);
    for (int b = 0; b < NB; b++) {
        ggml_block(dt, x + b * QB, want);
        ck_assert_msg(!memcmp(got + b * bb, want, (size_t)bb), "%s block %d differs from ggml's",
                      fa_dtype_name(dt), b);
        ck_assert_msg(!memcmp(got64 + b * bb, want, (size_t)bb), "%s block %d from f64",
                      fa_dtype_name(dt), b);
    }
    free(x), free(x64), free(got), free(got64);
}
END_TEST

/* Every code under scales of every kind (the smallest subnormal, negative, the largest),
 * dequantized to f64 and f32 as the format defines. */
START_TEST(dequantize_every_code)
{
    const fa_dtype dt = _i ? FA_Q4_0 : FA_Q8_0;
    const uint16_t scales[] = {0x3c00, 0x0001, 0xb555, 0x7bff, 0x2e66, 0x0000, 0x83ff};
    const int ns = sizeof scales / sizeof *scales, nb = dt == FA_Q8_0 ? 8 : 1;
    const int64_t bb = block_bytes(dt);
    uint8_t *blk = malloc((size_t)(ns * nb * bb));
    for (int s = 0; s < ns; s++)
        for (int b = 0; b < nb; b++) {
            uint8_t *p = blk + (s * nb + b) * bb;
            p[0] = (uint8_t)(scales[s] & 255), p[1] = (uint8_t)(scales[s] >> 8);
            for (int j = 0; j < bb - 2; j++) /* q8_0: codes 32 b .. 32 b + 31; q4_0: all 16 */
                p[2 + j] = (uint8_t)(dt == FA_Q8_0 ? 32 * b + j : (j | (15 - j) << 4));
        }
    const int n = ns * nb * QB;
    double *d = malloc(sizeof(double) * (size_t)n);
    float *f = malloc(sizeof(float) * (size_t)n);
    ck_assert_int_eq(fa_convert(blk, dt, d, FA_F64, (size_t)n), FA_OK);
    ck_assert_int_eq(fa_convert(blk, dt, f, FA_F32, (size_t)n), FA_OK);
    for (int e = 0; e < n; e++) {
        const double want = block_value(dt, blk + (e / QB) * bb, e % QB);
        ck_assert_msg(d[e] == want && (double)f[e] == want, "%s element %d: %.17g, %.9g, want %.17g",
                      fa_dtype_name(dt), e, d[e], (double)f[e], want);
    }
    free(blk), free(d), free(f);
}
END_TEST

/* A cache tensor of dtype dt (block or f32) over its own buffer: B x S x H x D, BSHD or BHSD. */
typedef struct {
    fa_tensor t;
    uint8_t *buf;
} cache_t;

static void cache_alloc(cache_t *c, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D,
                        int bhsd)
{
    fa_tensor_init(&c->t, NULL, dt, B, S, H, D, bhsd);
    const int64_t n = B * S * H * D;
    c->buf = malloc((size_t)(dt == FA_F32 ? 4 * n : n / QB * block_bytes(dt)) + 1);
    c->t.data = c->buf;
}

/* Random values (N(0, 1) times a scale per row) quantized into `q` and their dequantized
 * values into the f32 cache `f` (same dims and layout). */
static void cache_fill(cache_t *q, cache_t *f)
{
    const fa_tensor *t = &q->t;
    const int64_t D = t->headdim;
    float *row = malloc(sizeof(float) * (size_t)D);
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++) {
                const double scale = ldexp(1, (int)(uniform() * 6) - 3);
                for (int64_t e = 0; e < D; e++) {
                    const double u1 = uniform() + 1e-12, u2 = uniform();
                    row[e] = (float)(scale * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
                }
                const int64_t off = b * t->batch_stride + s * t->seq_stride + h * t->head_stride;
                uint8_t *qr = q->buf + off / QB * block_bytes(t->dtype);
                ck_assert_int_eq(fa_convert(row, FA_F32, qr, t->dtype, (size_t)D), FA_OK);
                ck_assert_int_eq(fa_convert(qr, t->dtype, (float *)f->buf + off, FA_F32, (size_t)D),
                                 FA_OK);
            }
    free(row);
}

/* Both results bit for bit. */
static void assert_same(const ht_tensor *a, const ht_tensor *b, const char *what)
{
    ck_assert_msg(!memcmp(a->t.data, b->t.data, a->nbytes - 8), "%s: the outputs differ", what);
}

/*
 * The quantized cache against the f32 cache of its dequantized values: out and LSE bit for
 * bit, on the reference, the conventional path and the tiled backend with every kernel set
 * this CPU runs, 1 and 2 threads; decode (Sq = 1, GQA 4, BSHD) and tiles (Sq = 40, causal,
 * BHSD); K and V of the same format and of the two.
 */
START_TEST(cache_reads_dequantized_values)
{
    static const fa_dtype fmts[3][2] = {{FA_Q8_0, FA_Q8_0}, {FA_Q4_0, FA_Q4_0}, {FA_Q8_0, FA_Q4_0}};
    const fa_dtype kd = fmts[_i % 3][0], vd = fmts[_i % 3][1];
    const int decode = _i < 3;
    /* D 96 for the mixed formats: P V's last dim block partial in the 64-dim sets (AVX-512) */
    const int64_t B = 2, sq = decode ? 1 : 40, sk = decode ? 700 : 90, hk = 2,
                  hq = decode ? 8 : 2, D = kd != vd ? 96 : decode ? 128 : 64;
    cache_t kq, vq, kf, vf;
    cache_alloc(&kq, kd, B, sk, hk, D, !decode), cache_alloc(&kf, FA_F32, B, sk, hk, D, !decode);
    cache_alloc(&vq, vd, B, sk, hk, D, !decode), cache_alloc(&vf, FA_F32, B, sk, hk, D, !decode);
    cache_fill(&kq, &kf), cache_fill(&vq, &vf);
    ht_tensor q, o1, o2, l1, l2;
    ht_alloc(&q, FA_F32, B, sq, hq, D, SW_BSHD);
    ht_fill(&q, 5, -1, 1);
    ht_alloc(&o1, FA_F32, B, sq, hq, D, SW_BSHD), ht_alloc(&o2, FA_F32, B, sq, hq, D, SW_BSHD);
    ht_alloc_lse(&l1, FA_F32, B, sq, hq), ht_alloc_lse(&l2, FA_F32, B, sq, hq);
    fa_params p;
    fa_params_init(&p);
    p.causal = !decode;
    int runs = 0;
    for (int x = -2; x < ht_nisas; x++) { /* -2 the reference, -1 conventional, then the sets */
        if (x >= 0 && !ht_isa_tested(x, FA_F32))
            continue;
        const fa_backend be = x == -2 ? FA_BACKEND_REFERENCE
                              : x == -1 ? FA_BACKEND_CONVENTIONAL : FA_BACKEND_TILED;
        ht_isa = x >= 0 ? ht_isas[x] : FA_ISA_AUTO;
        for (int threads = 1; threads <= (x >= 0 ? 2 : 1); threads++) {
            ht_poison(&o1), ht_poison(&o2);
            ck_assert_int_eq(ht_forward(be, threads, &p, &q.t, &kq.t, &vq.t, &o1.t, &l1.t), FA_OK);
            ck_assert_int_eq(ht_forward(be, threads, &p, &q.t, &kf.t, &vf.t, &o2.t, &l2.t), FA_OK);
            char what[128];
            snprintf(what, sizeof what, "%s/%s, %s, isa %s, %d threads, %s", fa_dtype_name(kd),
                     fa_dtype_name(vd), fa_backend_name(be), fa_isa_name(ht_isa), threads,
                     decode ? "decode" : "tiles");
            assert_same(&o1, &o2, what);
            assert_same(&l1, &l2, what);
            runs++;
        }
    }
    ht_isa = FA_ISA_AUTO;
    ck_assert_int_ge(runs, 4);
    if (decode) /* the tiled runs above took the decode path */
        ck_assert_int_gt(ht_decode_keys(1, &p, &q.t, &kq.t, &vq.t), 0);
    ht_free(&q), ht_free(&o1), ht_free(&o2), ht_free(&l1), ht_free(&l2);
    free(kq.buf), free(vq.buf), free(kf.buf), free(vf.buf);
}
END_TEST

/* A bf16 or f16 q over a q8_0 / q4_0 cache (no f32 twin: 16-bit q takes no f32 cache): the
 * tiled decode and tiles against the reference under the tolerance rule, the conventional path
 * (which dequantizes first) the yardstick. */
START_TEST(bf16_q_over_quantized_cache)
{
    const int decode = _i % 2;
    const fa_dtype qd = _i < 2 ? FA_BF16 : FA_F16;
    const int64_t B = 2, sq = decode ? 1 : 33, sk = 300, hk = 2, hq = decode ? 8 : 2, D = 64;
    cache_t kq, vq, kf, vf;
    cache_alloc(&kq, FA_Q8_0, B, sk, hk, D, 0), cache_alloc(&kf, FA_F32, B, sk, hk, D, 0);
    cache_alloc(&vq, FA_Q4_0, B, sk, hk, D, 0), cache_alloc(&vf, FA_F32, B, sk, hk, D, 0);
    cache_fill(&kq, &kf), cache_fill(&vq, &vf);
    ht_tensor q, q32, ref, conv, tiled;
    ht_alloc(&q, qd, B, sq, hq, D, SW_BSHD);
    ht_fill(&q, 9, -1, 1);
    ht_alloc(&q32, FA_F32, B, sq, hq, D, SW_BSHD);
    for (int64_t b = 0; b < B; b++) /* the yardstick's q: the bf16 values, exactly */
        for (int64_t s = 0; s < sq; s++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t e = 0; e < D; e++)
                    ht_set(&q32, b, s, h, e, ht_get(&q, b, s, h, e));
    ht_alloc(&ref, FA_F32, B, sq, hq, D, SW_BSHD);
    ht_alloc(&conv, qd, B, sq, hq, D, SW_BSHD), ht_alloc(&tiled, qd, B, sq, hq, D, SW_BSHD);
    fa_params p;
    fa_params_init(&p);
    p.causal = !decode;
    /* the reference over the f32 cache of the dequantized values (the same values) */
    ck_assert_int_eq(ht_forward(FA_BACKEND_REFERENCE, 1, &p, &q32.t, &kf.t, &vf.t, &ref.t, NULL),
                     FA_OK);
    ck_assert_int_eq(ht_forward(FA_BACKEND_CONVENTIONAL, 1, &p, &q.t, &kq.t, &vq.t, &conv.t, NULL),
                     FA_OK);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 2, &p, &q.t, &kq.t, &vq.t, &tiled.t, NULL),
                     FA_OK);
    fa_comparison c;
    const fa_tolerance tol = {.factor = 2};
    ck_assert_int_eq(fa_compare(&tiled.t, &ref.t, &conv.t, &tol, &c), FA_OK);
    ck_assert_msg(c.pass, "%s q, q8_0/q4_0 cache, %s: %s", fa_dtype_name(qd),
                  decode ? "decode" : "tiles", c.rule);
    ht_free(&q), ht_free(&q32), ht_free(&ref), ht_free(&conv), ht_free(&tiled);
    free(kq.buf), free(vq.buf), free(kf.buf), free(vf.buf);
}
END_TEST

/* Pages of 16 keys, shuffled, shared by nothing: q8_0 K and q4_0 V pages against f32 pages of
 * their values, bit for bit, on the tiled backend (2 threads; decode, and a causal chunk of 20
 * rows, 80 rows a kv head, past decode's 16: the tiles, whose K/V runs are gathered page by
 * page) and the reference. */
START_TEST(paged_cache_reads_dequantized_values)
{
    const int64_t B = 2, ps = 16, np = 8, hk = 2, hq = 8, D = 64, maxp = 4, sq = _i ? 20 : 1;
    cache_t kq, vq, kf, vf;
    cache_alloc(&kq, FA_Q8_0, np, ps, hk, D, 0), cache_alloc(&kf, FA_F32, np, ps, hk, D, 0);
    cache_alloc(&vq, FA_Q4_0, np, ps, hk, D, 0), cache_alloc(&vf, FA_F32, np, ps, hk, D, 0);
    cache_fill(&kq, &kf), cache_fill(&vq, &vf);
    const int32_t table[8] = {5, 2, 7, 0, 1, 6, 3, 4}, used[2] = {37, 50};
    fa_paged_kv pg = {.block_table = {table, FA_INDEX_INT32, B * maxp}, .max_pages = maxp,
                      .seqused_k = {used, FA_INDEX_INT32, B}};
    ht_tensor q, o1, o2;
    ht_alloc(&q, FA_F32, B, sq, hq, D, SW_BSHD);
    ht_fill(&q, 3, -1, 1);
    ht_alloc(&o1, FA_F32, B, sq, hq, D, SW_BSHD), ht_alloc(&o2, FA_F32, B, sq, hq, D, SW_BSHD);
    fa_params p;
    fa_params_init(&p);
    p.causal = sq > 1;
    const fa_backend bes[2] = {FA_BACKEND_TILED, FA_BACKEND_REFERENCE};
    for (int x = 0; x < 2; x++) {
        fa_context *ctx = ht_context(bes[x], 2);
        ht_poison(&o1), ht_poison(&o2);
        ck_assert_int_eq(fa_forward_paged(ctx, &p, &q.t, &kq.t, &vq.t, &pg, &o1.t, NULL), FA_OK);
        ck_assert_int_eq(fa_forward_paged(ctx, &p, &q.t, &kf.t, &vf.t, &pg, &o2.t, NULL), FA_OK);
        assert_same(&o1, &o2, fa_backend_name(bes[x]));
        fa_context_destroy(ctx);
    }
    ht_free(&q), ht_free(&o1), ht_free(&o2);
    free(kq.buf), free(vq.buf), free(kf.buf), free(vf.buf);
}
END_TEST

/* fa_append_kv of f32 keys into a q8_0 cache and f16 values into a q4_0 one: each new row's
 * blocks are ggml's quantization of its values, every other byte is as it was; a NaN among the
 * new keys is refused with nothing written. */
START_TEST(append_quantizes_as_ggml)
{
    const int64_t B = 2, S = 64, hk = 2, D = 64, sn = 3;
    cache_t k, v;
    cache_alloc(&k, FA_Q8_0, B, S, hk, D, 0), cache_alloc(&v, FA_Q4_0, B, S, hk, D, 0);
    const size_t kb = (size_t)(B * S * hk * D / QB * 34), vb = (size_t)(B * S * hk * D / QB * 18);
    for (size_t i = 0; i < kb; i++)
        k.buf[i] = (uint8_t)(uniform() * 256);
    for (size_t i = 0; i < vb; i++)
        v.buf[i] = (uint8_t)(uniform() * 256);
    uint8_t *k0 = malloc(kb), *v0 = malloc(vb);
    memcpy(k0, k.buf, kb), memcpy(v0, v.buf, vb);
    ht_tensor kn, vn;
    ht_alloc(&kn, FA_F32, B, sn, hk, D, SW_BSHD), ht_alloc(&vn, FA_F16, B, sn, hk, D, SW_BSHD);
    ht_fill(&kn, 21, -3, 3), ht_fill(&vn, 22, -2, 2);
    const int32_t lens[2] = {10, 61};
    const fa_indices cl = {lens, FA_INDEX_INT32, B};
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 1);
    ck_assert_int_eq(fa_append_kv(ctx, &kn.t, &vn.t, &k.t, &v.t, &cl, NULL), FA_OK);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < hk; h++) {
                const int64_t off = ((b * S + s) * hk + h) * D / QB; /* in blocks */
                const int fresh = s >= lens[b] && s < lens[b] + sn;
                for (int64_t blk = 0; blk < D / QB; blk++) {
                    uint8_t wk[34], wv[34];
                    if (fresh) {
                        float xk[QB], xv[QB];
                        for (int j = 0; j < QB; j++) {
                            xk[j] = (float)ht_get(&kn, b, s - lens[b], h, blk * QB + j);
                            xv[j] = (float)ht_get(&vn, b, s - lens[b], h, blk * QB + j);
                        }
                        ggml_block(FA_Q8_0, xk, wk), ggml_block(FA_Q4_0, xv, wv);
                    } else {
                        memcpy(wk, k0 + (off + blk) * 34, 34), memcpy(wv, v0 + (off + blk) * 18, 18);
                    }
                    ck_assert_msg(!memcmp(k.buf + (off + blk) * 34, wk, 34) &&
                                      !memcmp(v.buf + (off + blk) * 18, wv, 18),
                                  "b %lld s %lld h %lld block %lld (%s)", (long long)b,
                                  (long long)s, (long long)h, (long long)blk,
                                  fresh ? "appended" : "untouched");
                }
            }
    /* new keys already in the cache's formats: their blocks copied as they are (row 40 of
     * sequence 0, from a quantized row) */
    uint8_t kblk[2 * 34], vblk[2 * 18];
    float xr[64];
    for (int j = 0; j < 64; j++)
        xr[j] = (float)(uniform() * 4 - 2);
    ck_assert_int_eq(fa_convert(xr, FA_F32, kblk, FA_Q8_0, 64), FA_OK);
    ck_assert_int_eq(fa_convert(xr, FA_F32, vblk, FA_Q4_0, 64), FA_OK);
    cache_t kb1, vb1;
    cache_alloc(&kb1, FA_Q8_0, 1, 1, hk, D, 0), cache_alloc(&vb1, FA_Q4_0, 1, 1, hk, D, 0);
    for (int h = 0; h < hk; h++)
        memcpy(kb1.buf + h * 68, kblk, 68), memcpy(vb1.buf + h * 36, vblk, 36);
    const int32_t len40 = 40;
    const fa_indices cl1 = {&len40, FA_INDEX_INT32, 1};
    fa_tensor k1 = k.t, v1 = v.t; /* sequence 0 alone */
    k1.batch = v1.batch = 1;
    ck_assert_int_eq(fa_append_kv(ctx, &kb1.t, &vb1.t, &k1, &v1, &cl1, NULL), FA_OK);
    for (int h = 0; h < hk; h++)
        ck_assert(!memcmp(k.buf + ((40 * hk + h) * D / QB) * 34, kblk, 68) &&
                  !memcmp(v.buf + ((40 * hk + h) * D / QB) * 18, vblk, 36));
    free(kb1.buf), free(vb1.buf);
    /* refused, nothing written: f64 new keys (not a dtype the append quantizes), a NaN */
    memcpy(k0, k.buf, kb), memcpy(v0, v.buf, vb);
    ht_tensor k64;
    ht_alloc(&k64, FA_F64, B, sn, hk, D, SW_BSHD);
    ht_fill(&k64, 23, -1, 1);
    ck_assert_int_eq(fa_append_kv(ctx, &k64.t, &vn.t, &k.t, &v.t, &cl, NULL), FA_ERR_DTYPE);
    ck_assert_msg(strstr(fa_last_error(), "k_new->dtype = f64"), "%s", fa_last_error());
    ht_free(&k64);
    ht_set(&kn, 1, 2, 1, 40, NAN);
    ck_assert_int_eq(fa_append_kv(ctx, &kn.t, &vn.t, &k.t, &v.t, &cl, NULL), FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "k_new[1][2][1][40]"), "%s", fa_last_error());
    ck_assert(!memcmp(k0, k.buf, kb) && !memcmp(v0, v.buf, vb));
    fa_context_destroy(ctx);
    ht_free(&kn), ht_free(&vn);
    free(k.buf), free(v.buf), free(k0), free(v0);
}
END_TEST

/* Each bad argument of a block format: its own status, the argument named, nothing written. */
START_TEST(bad_block_arguments)
{
    const int64_t B = 1, sq = 2, sk = 40, H = 2, D = 64;
    cache_t k, v, kf16;
    cache_alloc(&k, FA_Q8_0, B, sk, H, D, 0), cache_alloc(&v, FA_Q4_0, B, sk, H, D, 0);
    cache_alloc(&kf16, FA_F32, B, sk, H, D, 0);
    memset(k.buf, 0, (size_t)(B * sk * H * D / QB * 34)), memset(v.buf, 0, (size_t)(B * sk * H * D / QB * 18));
    kf16.t.dtype = FA_F16;
    ht_tensor q, out, q64, o64, qblk;
    ht_alloc(&q, FA_F32, B, sq, H, D, SW_BSHD), ht_alloc(&out, FA_F32, B, sq, H, D, SW_BSHD);
    ht_alloc(&q64, FA_F64, B, sq, H, D, SW_BSHD), ht_alloc(&o64, FA_F64, B, sq, H, D, SW_BSHD);
    ht_alloc(&qblk, FA_F32, B, sq, H, D, SW_BSHD);
    ht_fill(&q, 1, -1, 1), ht_fill(&q64, 1, -1, 1);
    qblk.t.dtype = FA_Q8_0;
    fa_tensor k48 = k.t, kstride = k.t, khs = k.t, bias = k.t;
    k48.headdim = 48;
    kstride.seq_stride = H * D + 16;
    kstride.seqlen = sk / 2;
    khs.head_stride = D + 8, khs.seq_stride = 2 * (D + 32), khs.seqlen = sk / 2;
    bias.batch = 1, bias.seqlen = sq, bias.heads = 1, bias.headdim = sk;
    struct {
        const fa_tensor *q, *k, *v, *bias;
        fa_status want;
        const char *says;
    } cases[] = {
        {&q.t, &k48, &v.t, NULL, FA_ERR_SHAPE, "k->headdim = 48 is not a multiple of 32"},
        {&q.t, &kstride, &v.t, NULL, FA_ERR_STRIDE, "k->seq_stride = 144 is not a multiple"},
        {&q.t, &khs, &v.t, NULL, FA_ERR_STRIDE, "k->head_stride = 72 is not a multiple"},
        {&qblk.t, &k.t, &v.t, NULL, FA_ERR_DTYPE, "q->dtype = q8_0"},
        {&q.t, &k.t, &kf16.t, NULL, FA_ERR_DTYPE, "has both k and v in block formats"},
        {&q64.t, &k.t, &v.t, NULL, FA_ERR_DTYPE, "under f32, f16 or bf16 q"},
        {&q.t, &kf16.t, &v.t, NULL, FA_ERR_DTYPE, "v->dtype = q4_0"},
        {&q.t, &k.t, &v.t, &bias, FA_ERR_DTYPE, "a block format is a K/V cache's only"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fa_params p;
        fa_params_init(&p);
        p.bias = cases[c].bias;
        ht_poison(&out), ht_poison(&o64);
        const fa_status st = ht_forward(FA_BACKEND_TILED, 1, &p, cases[c].q, cases[c].k,
                                        cases[c].v, cases[c].q == &q64.t ? &o64.t : &out.t,
                                        NULL);
        ck_assert_msg(st == cases[c].want, "case %zu: %s (%s)", c, fa_status_string(st),
                      fa_last_error());
        ck_assert_msg(strstr(fa_last_error(), cases[c].says), "case %zu: '%s' lacks '%s'", c,
                      fa_last_error(), cases[c].says);
        ck_assert(ht_is_poisoned(&out) && ht_is_poisoned(&o64));
    }
    /* no output is of a block format: FP8 inputs' out, fa_merge_states' out and states */
    ht_tensor q8, k8, v8;
    ht_alloc(&q8, FA_E4M3, B, sq, H, D, SW_BSHD), ht_alloc(&k8, FA_E4M3, B, sk, H, D, SW_BSHD);
    ht_alloc(&v8, FA_E4M3, B, sk, H, D, SW_BSHD);
    ht_fill(&q8, 2, -1, 1), ht_fill(&k8, 3, -1, 1), ht_fill(&v8, 4, -1, 1);
    cache_t oq;
    cache_alloc(&oq, FA_Q8_0, B, sq, H, D, 0);
    memset(oq.buf, 0x5a, (size_t)(B * sq * H * D / QB * 34));
    uint8_t *oq0 = malloc((size_t)(B * sq * H * D / QB * 34));
    memcpy(oq0, oq.buf, (size_t)(B * sq * H * D / QB * 34));
    fa_params p8;
    fa_params_init(&p8);
    ck_assert_int_eq(ht_forward(FA_BACKEND_TILED, 1, &p8, &q8.t, &k8.t, &v8.t, &oq.t, NULL),
                     FA_ERR_DTYPE);
    ck_assert_msg(strstr(fa_last_error(), "out->dtype = q8_0"), "%s", fa_last_error());
    ht_tensor lse1, lse2;
    ht_alloc_lse(&lse1, FA_F32, B, sq, H), ht_alloc_lse(&lse2, FA_F32, B, sq, H);
    ht_poison(&lse2);
    ck_assert_int_eq(fa_merge_states(1, &out.t, &lse1.t, &oq.t, &lse2.t), FA_ERR_DTYPE);
    ck_assert_int_eq(fa_merge_states(1, &oq.t, &lse1.t, &out.t, &lse2.t), FA_ERR_DTYPE);
    ck_assert_msg(strstr(fa_last_error(), "outs[0]->dtype = q8_0"), "%s", fa_last_error());
    ck_assert(!memcmp(oq0, oq.buf, (size_t)(B * sq * H * D / QB * 34)) && ht_is_poisoned(&lse2));
    ht_free(&q8), ht_free(&k8), ht_free(&v8), ht_free(&lse1), ht_free(&lse2);
    free(oq.buf), free(oq0);
    /* the backward takes no block cache */
    fa_params p;
    fa_params_init(&p);
    ht_tensor lse, dq;
    ht_alloc_lse(&lse, FA_F32, B, sq, H);
    ht_alloc(&dq, FA_F32, B, sq, H, D, SW_BSHD);
    ht_poison(&dq);
    ck_assert_int_eq(ht_backward(FA_BACKEND_TILED, 1, &p, &q.t, &k.t, &v.t, &out.t, &lse.t,
                                 &out.t, &dq.t, &k.t, &v.t),
                     FA_ERR_UNSUPPORTED);
    ck_assert(ht_is_poisoned(&dq));
    /* fa_convert: whole blocks, finite values; fa_compare: no block format */
    float x[64] = {0}, y[64];
    uint8_t blk[68], before[68];
    memset(blk, 0xab, sizeof blk), memcpy(before, blk, sizeof blk);
    ck_assert_int_eq(fa_convert(x, FA_F32, blk, FA_Q8_0, 33), FA_ERR_SHAPE);
    ck_assert_int_eq(fa_convert(blk, FA_Q4_0, y, FA_F32, 40), FA_ERR_SHAPE);
    x[37] = INFINITY;
    ck_assert_int_eq(fa_convert(x, FA_F32, blk, FA_Q8_0, 64), FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "src[37]"), "%s", fa_last_error());
    ck_assert(!memcmp(blk, before, sizeof blk));
    fa_comparison cmp;
    const fa_tolerance tol = {.factor = 2};
    ck_assert_int_eq(fa_compare(&k.t, &k.t, &k.t, &tol, &cmp), FA_ERR_DTYPE);
    ht_free(&q), ht_free(&out), ht_free(&q64), ht_free(&o64), ht_free(&qblk), ht_free(&lse),
        ht_free(&dq);
    free(k.buf), free(v.buf), free(kf16.buf);
}
END_TEST

Suite *make_quant_suite(void)
{
    Suite *s = suite_create("quant");
    TCase *formats = ht_tcase_create("formats"), *cache = ht_tcase_create("cache"),
          *append = ht_tcase_create("append"), *args = ht_tcase_create("arguments");
    tcase_add_test(formats, quantize_worked_blocks);
    tcase_add_loop_test(formats, quantize_as_ggml, 0, 2);
    tcase_add_loop_test(formats, dequantize_every_code, 0, 2);
    tcase_add_loop_test(cache, cache_reads_dequantized_values, 0, 6);
    tcase_add_loop_test(cache, bf16_q_over_quantized_cache, 0, 4);
    tcase_add_loop_test(cache, paged_cache_reads_dequantized_values, 0, 2);
    tcase_add_test(append, append_quantizes_as_ggml);
    tcase_add_test(args, bad_block_arguments);
    suite_add_tcase(s, formats);
    suite_add_tcase(s, cache);
    suite_add_tcase(s, append);
    suite_add_tcase(s, args);
    return s;
}
