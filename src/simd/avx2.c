/* AVX2 + FMA kernels. Built with -mavx2 -mfma -mf16c; called only when the CPU and OS support
 * them (simd/cpu.c). */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "simd/exp_poly.h"
#include "simd/kernels.h"

#define MR 6
#define NR 16 /* two ymm of f32 */

/* Lane i of the mask is on iff i < n (n in [0, 8]). */
static __m256i lanes_below(int64_t n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 0 ? 0 : n > 8 ? 8 : n)), idx);
}

/*
 * 6 x 16: 12 ymm accumulators, two B loads and six A broadcasts per k step (16 registers).
 * The body is instantiated once per row count, every loop over rows fully unrolled, so the
 * accumulators stay in registers (see the AVX-512 kernel). Columns beyond nr are masked on
 * load and store.
 */
static inline __attribute__((always_inline)) void
gemm_rows__avx2(const int ROWS, const int A_T, int64_t nr, int64_t k, const float *a,
                int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                const float *cscale)
{
    const int64_t ars = A_T ? 1 : lda, acs = A_T ? lda : 1; /* A[i][p] = a[i ars + p acs] */
    const __m256i m0 = lanes_below(nr), m1 = lanes_below(nr - 8);
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int i = 0; i < ROWS; i++) {
        c0[i] = accumulate ? _mm256_maskload_ps(c + i * ldc, m0) : _mm256_setzero_ps();
        c1[i] = accumulate ? _mm256_maskload_ps(c + i * ldc + 8, m1) : _mm256_setzero_ps();
        if (accumulate && cscale) {
            c0[i] = _mm256_mul_ps(c0[i], _mm256_set1_ps(cscale[i]));
            c1[i] = _mm256_mul_ps(c1[i], _mm256_set1_ps(cscale[i]));
        }
    }
    if (nr == NR) {
        for (int64_t p = 0; p < k; p++) {
            const __m256 b0 = _mm256_loadu_ps(b + p * ldb), b1 = _mm256_loadu_ps(b + p * ldb + 8);
#pragma GCC unroll 6
            for (int i = 0; i < ROWS; i++) {
                const __m256 ai = _mm256_broadcast_ss(a + i * ars + p * acs);
                c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
                c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
            }
        }
    } else {
        for (int64_t p = 0; p < k; p++) {
            const __m256 b0 = _mm256_maskload_ps(b + p * ldb, m0);
            const __m256 b1 = _mm256_maskload_ps(b + p * ldb + 8, m1);
#pragma GCC unroll 6
            for (int i = 0; i < ROWS; i++) {
                const __m256 ai = _mm256_broadcast_ss(a + i * ars + p * acs);
                c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
                c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
            }
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < ROWS; i++) {
        if (!accumulate && cscale) {
            c0[i] = _mm256_mul_ps(c0[i], _mm256_set1_ps(cscale[i]));
            c1[i] = _mm256_mul_ps(c1[i], _mm256_set1_ps(cscale[i]));
        }
        _mm256_maskstore_ps(c + i * ldc, m0, c0[i]);
        _mm256_maskstore_ps(c + i * ldc + 8, m1, c1[i]);
    }
}

/* A load and a store of 8 lanes, whole (FULL) or masked: vmaskmovps costs more than a plain
 * move (a uop on a vector ALU port besides the load on Intel cores), so loops take whole
 * vectors without masks and only their tail with one (see the AVX-512 GEMM kernel). */
static inline __attribute__((always_inline)) __m256 load_cols__avx2(const int FULL, __m256i mk,
                                                                   const float *x)
{
    return FULL ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, mk);
}

static inline __attribute__((always_inline)) void store_cols__avx2(const int FULL, __m256i mk,
                                                                  float *x, __m256 v)
{
    if (FULL)
        _mm256_storeu_ps(x, v);
    else
        _mm256_maskstore_ps(x, mk, v);
}

/*
 * A block of up to 8 x 8 in registers (the AVX-512 block's rounds on 8 lanes): rows r < rr
 * with columns c < cc are loaded (the rest is 0); output rows c < cc are stored, lanes r < rr.
 *   1. unpack lo/hi of row pairs; 2. 64-bit unpacks: u[4g + t] holds, in 128-bit half h,
 *   column 4h + t of rows 4g .. 4g + 3; 3. the halves of u[t] and u[4 + t] joined: row 4h + t.
 */
static inline __attribute__((always_inline)) void
transpose_block__avx2(const int FULL, const float *src, int64_t lds, int64_t rr, int64_t cc,
                      float *dst, int64_t ldd)
{
    const __m256i cm = lanes_below(cc), rm = lanes_below(rr);
    __m256 x[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        x[i] = i < rr ? load_cols__avx2(FULL, cm, src + i * lds) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        t[2 * g] = _mm256_unpacklo_ps(x[2 * g], x[2 * g + 1]);
        t[2 * g + 1] = _mm256_unpackhi_ps(x[2 * g], x[2 * g + 1]);
    }
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) {
        const __m256d t0 = _mm256_castps_pd(t[4 * g]), t1 = _mm256_castps_pd(t[4 * g + 1]);
        const __m256d t2 = _mm256_castps_pd(t[4 * g + 2]), t3 = _mm256_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(t0, t2));
        u[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(t0, t2));
        u[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(t1, t3));
        u[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(t1, t3));
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        if (k < cc)
            store_cols__avx2(FULL, rm, dst + k * ldd, _mm256_permute2f128_ps(u[k], u[4 + k], 0x20));
        if (4 + k < cc)
            store_cols__avx2(FULL, rm, dst + (4 + k) * ldd,
                             _mm256_permute2f128_ps(u[k], u[4 + k], 0x31));
    }
}

static void fa_f32_transpose__avx2(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                   float *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r += 8)
        for (int64_t c = 0; c < cols; c += 8)
            if (rows - r >= 8 && cols - c >= 8) /* a whole block: plain loads and stores */
                transpose_block__avx2(1, src + r * lds + c, lds, 8, 8, dst + c * ldd + r, ldd);
            else
                transpose_block__avx2(0, src + r * lds + c, lds, rows - r, cols - c,
                                      dst + c * ldd + r, ldd);
}

/*
 * exp in 8 lanes, inline: the AVX-512 kernel's reduction and polynomial (see there). AVX2 has
 * no scalef, so 2^n is applied in two factors 2^(n>>1) and 2^(n - (n>>1)), each a normal float
 * built in its exponent field for n in [-159, 145] (the clamps bound n); the first product is
 * exact, the second rounds once, into the subnormals or to 0 and inf where exp does. Max error
 * over every float <= 0: measured by tests/check_kernels.c and held to 1 ULP.
 */
static inline __m256 exp__avx2(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(100.0f), _mm256_max_ps(_mm256_set1_ps(-110.0f), x));
    /* rounds as in exp__avx512, in the caller's rounding mode (round to nearest assumed) */
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 n =
        _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(FAI_LOG2E_F), shift), shift);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e43p-1f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-0x1.05c61p-29f), r);
    __m256 p = _mm256_set1_ps(FAI_EXP_Q4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FAI_EXP_Q3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FAI_EXP_Q2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FAI_EXP_Q1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FAI_EXP_Q0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1), bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* y = exp(x - m), summed in 8 lanes (masked-off lanes add 0), then the lanes in order. */
static inline __attribute__((always_inline)) __m256
expsum_vec__avx2(const int FULL, __m256i mk, const float *x, __m256 vm, float *y, __m256 vsum)
{
    const __m256 e = exp__avx2(_mm256_sub_ps(load_cols__avx2(FULL, mk, x), vm));
    store_cols__avx2(FULL, mk, y, e);
    return _mm256_add_ps(vsum, FULL ? e : _mm256_and_ps(e, _mm256_castsi256_ps(mk)));
}

static float fa_f32_expsum__avx2(int64_t n, const float *x, float m, float *y)
{
    const __m256 vm = _mm256_set1_ps(m);
    __m256 vsum = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        vsum = expsum_vec__avx2(1, _mm256_setzero_si256(), x + i, vm, y + i, vsum);
    if (i < n)
        vsum = expsum_vec__avx2(0, lanes_below(n - i), x + i, vm, y + i, vsum);
    float lanes[8], sum = 0;
    _mm256_storeu_ps(lanes, vsum);
    for (int l = 0; l < 8; l++)
        sum += lanes[l];
    return sum;
}

/* 8 columns per vector, one FMA chain per column in p order from 0 (the GEMM kernel's
 * rounding). */
static inline __attribute__((always_inline)) void
coldot_cols__avx2(const int FULL, int64_t left, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *out)
{
    const __m256i mk = lanes_below(left);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++)
        acc = _mm256_fmadd_ps(load_cols__avx2(FULL, mk, a + p * lda),
                              load_cols__avx2(FULL, mk, b + p * ldb), acc);
    store_cols__avx2(FULL, mk, out, acc);
}

/* The backward's row on 8 lanes: P = exp(s - lse) with the subtraction in double (two halves
 * of 4), ds = scale P (dp - di): core/gradient.h's dS with z = 1, no cap. */
static inline __attribute__((always_inline)) void
dsoftmax_vec__avx2(const int FULL, int64_t left, const float *s, double lse, const float *dp,
                   float di, float scale, float *p, float *ds)
{
    const __m256i mk = lanes_below(left);
    const __m256d vl = _mm256_set1_pd(lse);
    const __m256 vdi = _mm256_set1_ps(di), vscale = _mm256_set1_ps(scale);
    const __m256 sv = load_cols__avx2(FULL, mk, s);
    const __m128 lo = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(sv)), vl));
    const __m128 hi = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(sv, 1)), vl));
    const __m256 P = exp__avx2(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1));
    const __m256 g = _mm256_mul_ps(P, _mm256_sub_ps(load_cols__avx2(FULL, mk, dp), vdi));
    store_cols__avx2(FULL, mk, p, P);
    store_cols__avx2(FULL, mk, ds, _mm256_mul_ps(vscale, g));
}

/* x - x is 0 for finite x and NaN for inf and NaN (masked-off lanes load 0). */
static int fa_f32_finite__avx2(int64_t n, const float *x)
{
    __m256 bad = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_maskload_ps(x + i, lanes_below(n - i));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    }
    return _mm256_movemask_ps(bad) == 0;
}

/* core/fmath.h's NaN-sticky max over the row: a NaN lane decides the result. */
static float fa_f32_max__avx2(int64_t n, const float *x)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax = ninf, nan = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i mk = lanes_below(n - i);
        const __m256 v = _mm256_maskload_ps(x + i, mk);
        const __m256 live = _mm256_castsi256_ps(mk);
        nan = _mm256_or_ps(nan, _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), live));
        vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, v, live));
    }
    if (_mm256_movemask_ps(nan))
        return NAN;
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, vmax);
    for (int l = 0; l < 8; l++)
        m = lanes[l] > m ? lanes[l] : m;
    return m;
}

/*
 * 8 FP8 codes, exactly, through F16C. e5m2 is the top byte of an f16. e4m3's magnitude bits
 * shifted 7 left are an f16 with the same exponent field under bias 15 instead of 7 (its
 * subnormals f16 subnormals), so that f16 times 2^8 is the value, exact in f32; its NaN
 * (magnitude 0x7f) becomes the default quiet NaN with the code's sign, as in base/dtype.c.
 */
static inline __attribute__((always_inline)) __m256 fp8_widen8__avx2(fa_dtype d,
                                                                     const uint8_t *p)
{
    const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    if (d == FA_E5M2)
        return _mm256_cvtph_ps(_mm_slli_epi16(c, 8));
    const __m128i sign = _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8),
                  mag = _mm_and_si128(c, _mm_set1_epi16(0x7f));
    const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(_mm_or_si128(sign, _mm_slli_epi16(mag, 7))),
                                   _mm256_set1_ps(256.0f));
    const __m256 nan = _mm256_castsi256_ps(_mm256_or_si256(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(sign), 16), _mm256_set1_epi32(0x7fc00000)));
    const __m256i is_nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    return _mm256_blendv_ps(f, nan, _mm256_castsi256_ps(is_nan));
}

/* f16 by F16C, bf16 by widening to 32 bits and shifting into the top half: both exact, NaN
 * payloads kept; FP8 by fp8_widen8__avx2. The last partial vector goes through a zero-padded
 * copy. */
static void fa_f32_widen__avx2(const void *src, fa_dtype d, int64_t n, float *dst)
{
    if (d == FA_E4M3 || d == FA_E5M2) {
        const uint8_t *c = src;
        for (int64_t i = 0; i < n; i += 8) {
            uint8_t t[8] = {0};
            const uint8_t *p = c + i;
            if (n - i < 8) {
                memcpy(t, p, (size_t)(n - i));
                p = t;
            }
            const __m256 y = fp8_widen8__avx2(d, p);
            if (n - i >= 8)
                _mm256_storeu_ps(dst + i, y);
            else
                _mm256_maskstore_ps(dst + i, lanes_below(n - i), y);
        }
        return;
    }
    if (d != FA_F16 && d != FA_BF16) {
        fai_load_f32(src, d, n, dst);
        return;
    }
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i += 8) {
        uint16_t t[8] = {0};
        const uint16_t *p = h + i;
        if (n - i < 8) {
            memcpy(t, p, (size_t)(n - i) * sizeof(uint16_t));
            p = t;
        }
        const __m128i x = _mm_loadu_si128((const __m128i *)p);
        const __m256 y = d == FA_F16 ? _mm256_cvtph_ps(x)
                                     : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
        if (n - i >= 8) /* a masked store only at the end: AMD's runs far slower than a store */
            _mm256_storeu_ps(dst + i, y);
        else
            _mm256_maskstore_ps(dst + i, lanes_below(n - i), y);
    }
}

/* f16 by F16C under round-to-nearest-even: one rounding from f32; the last partial vector
 * through a staged store. */
static void fa_f32_narrow__avx2(void *dst, fa_dtype d, int64_t n, const float *src)
{
    if (d != FA_F16) {
        fai_store_f32(dst, d, n, src);
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i += 8) {
        const __m128i y = _mm256_cvtps_ph(_mm256_maskload_ps(src + i, lanes_below(n - i)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, y);
        memcpy(h + i, t, (size_t)(n - i < 8 ? n - i : 8) * sizeof(uint16_t));
    }
}

/* ------------------------------------------------------------------ decode's products */

/* Eight f32 of a row of block format D (core/quant.h) from element p (a multiple of 8, so
 * within one block): the codes widened to int32 and converted, times the block's scale d, each
 * product exact (core/quant.h): the very values an f32 row of the dequantized elements holds. A
 * row is whole blocks, so the eight codes are always there to read. */
static inline __attribute__((always_inline)) __m256 load8_block__avx2(const fa_dtype D,
                                                                      const char *row, int64_t p)
{
    int j;
    uint16_t h;
    const uint8_t *blk = fai_block_at(D, row, p, &j, &h);
    const __m256 d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    __m256i q;
    if (D == FA_Q8_0) {
        q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + j)));
    } else { /* nibbles of bytes j % 16 .. + 7: low for j < 16, high after; minus 8 */
        const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + j % 16)));
        q = _mm256_sub_epi32(_mm256_and_si256(j < 16 ? u : _mm256_srli_epi32(u, 4),
                                              _mm256_set1_epi32(15)),
                             _mm256_set1_epi32(8));
    }
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
}

/* Eight f32 of a row of storage D from element p: all of them (FULL), or the first `left`
 * (< 8) with zeros after, read no further; f16 and bf16 widened exactly, as widen does; a
 * block format dequantized (load8_block__avx2; its rows are whole blocks, so never partial);
 * FP8 by fp8_widen8__avx2. */
static inline __attribute__((always_inline)) __m256
load8_widen__avx2(const fa_dtype D, const int FULL, int64_t left, const char *row, int64_t p)
{
    if (D == FA_E4M3 || D == FA_E5M2) {
        const uint8_t *c = (const uint8_t *)row + p;
        uint8_t t[8] = {0};
        if (!FULL) {
            memcpy(t, c, (size_t)left);
            c = t;
        }
        return fp8_widen8__avx2(D, c);
    }
    if (D == FA_Q8_0 || D == FA_Q4_0) {
        const __m256 x = load8_block__avx2(D, row, p);
        return FULL ? x : _mm256_and_ps(x, _mm256_castsi256_ps(lanes_below(left)));
    }
    if (D == FA_F32) {
        const float *x = (const float *)row + p;
        return FULL ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, lanes_below(left));
    }
    const uint16_t *h = (const uint16_t *)row + p;
    uint16_t t[8] = {0};
    if (!FULL) {
        memcpy(t, h, (size_t)left * sizeof(uint16_t));
        h = t;
    }
    const __m128i x = _mm_loadu_si128((const __m128i *)h);
    return D == FA_F16 ? _mm256_cvtph_ps(x)
                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}

/* The eight lanes of x added in a fixed tree: (l0 + l4 + l2 + l6) + (l1 + l5 + l3 + l7). */
static inline __attribute__((always_inline)) float sum8__avx2(__m256 x)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* ROWS (<= 4) rows x nc (<= 2; 2 where KEYS2) keys: 8 accumulators, over p in vectors of 8.
 * The sum's order: 8 lanes over p (lane t: p = t, t + 8, ..., fused), then sum8__avx2. */
static inline __attribute__((always_inline)) void
dot_block__avx2(const fa_dtype D, const int ROWS, const int KEYS2, int64_t nc, int64_t d,
                const float *q, int64_t ldq, const char *k, int64_t kb, float *s, int64_t lds,
                const float *scale)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        acc[i] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= d; p += 8) {
        __m256 kv[2];
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
            kv[c] = KEYS2 || c < nc ? load8_widen__avx2(D, 1, 0, k + c * kb, p)
                                    : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m256 qv = _mm256_loadu_ps(q + r * ldq + p);
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++)
                acc[2 * r + c] = _mm256_fmadd_ps(qv, kv[c], acc[2 * r + c]);
        }
    }
    if (p < d) {
        __m256 kv[2];
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
            kv[c] = KEYS2 || c < nc ? load8_widen__avx2(D, 0, d - p, k + c * kb, p)
                                    : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m256 qv = _mm256_maskload_ps(q + r * ldq + p, lanes_below(d - p));
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++)
                acc[2 * r + c] = _mm256_fmadd_ps(qv, kv[c], acc[2 * r + c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
            if (KEYS2 || c < nc) {
                const float x = sum8__avx2(acc[2 * r + c]);
                s[r * lds + c] = scale ? x * *scale : x;
            }
}

/* ROWS (<= 4) rows of acc, dims [p0, p0 + 16) (left[x]: the valid lanes of vector x, 8 each
 * where FULL), += P V over keys [0, n), each key one fused multiply-add per element. */
static inline __attribute__((always_inline)) void
pv_block__avx2(const fa_dtype D, const int FULL, const int ROWS, const int64_t *left, int64_t n,
               const float *p, int64_t ldp, const char *v, int64_t vb, int64_t p0, float *acc,
               int64_t lda)
{
    /* (a vector without a lane, left[x] = 0, is never addressed: it lies past the row) */
    __m256 a[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 2
        for (int x = 0; x < 2; x++)
            a[r][x] = FULL      ? _mm256_loadu_ps(acc + r * lda + p0 + 8 * x)
                      : left[x] ? _mm256_maskload_ps(acc + r * lda + p0 + 8 * x,
                                                     lanes_below(left[x]))
                                : _mm256_setzero_ps();
    for (int64_t c = 0; c < n; c++) {
        __m256 vv[2];
#pragma GCC unroll 2
        for (int x = 0; x < 2; x++)
            vv[x] = FULL || left[x] ? load8_widen__avx2(D, FULL, left[x], v + c * vb, p0 + 8 * x)
                                    : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m256 w = _mm256_set1_ps(p[r * ldp + c]);
#pragma GCC unroll 2
            for (int x = 0; x < 2; x++)
                a[r][x] = _mm256_fmadd_ps(w, vv[x], a[r][x]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 2
        for (int x = 0; x < 2; x++) {
            if (FULL)
                _mm256_storeu_ps(acc + r * lda + p0 + 8 * x, a[r][x]);
            else if (left[x])
                _mm256_maskstore_ps(acc + r * lda + p0 + 8 * x, lanes_below(left[x]), a[r][x]);
        }
}

/* ---------------------------------------------------------------- the drivers */

#define FAI_DRV_ISA avx2
#define FAI_DRV_GEMM fa_f32_gemm_ukernel_6x16__avx2
#define FAI_DRV_GEMM_AT fa_f32_gemm_at_ukernel_6x16__avx2
#define FAI_DRV_MR MR
#define FAI_DRV_LANES 8
#define FAI_DRV_COLDOT fa_f32_coldot__avx2
#define FAI_DRV_DSOFTMAX fa_f32_dsoftmax__avx2
#define FAI_DRV_DOT_ROWS fa_f32_dot_rows_4x2__avx2
#define FAI_DRV_DOT_KEYS 2
#define FAI_DRV_PV_ROWS fa_f32_pv_rows_4x16__avx2
#define FAI_DRV_PV_VECS 2
#include "simd/drivers_tpl.h"

static const fai_kernels_f32 avx2 = {
    .isa = FA_ISA_AVX2,
    .mr = MR,
    .nr = NR,
    FAI_KERNEL(gemm, fa_f32_gemm_ukernel_6x16__avx2),
    FAI_KERNEL(gemm_at, fa_f32_gemm_at_ukernel_6x16__avx2),
    FAI_KERNEL(expsum, fa_f32_expsum__avx2),
    FAI_KERNEL(max, fa_f32_max__avx2),
    FAI_KERNEL(transpose, fa_f32_transpose__avx2),
    FAI_KERNEL(coldot, fa_f32_coldot__avx2),
    FAI_KERNEL(dsoftmax, fa_f32_dsoftmax__avx2),
    FAI_KERNEL(finite, fa_f32_finite__avx2),
    FAI_KERNEL(widen, fa_f32_widen__avx2),
    FAI_KERNEL(narrow, fa_f32_narrow__avx2),
    FAI_KERNEL(dot_rows, fa_f32_dot_rows_4x2__avx2),
    FAI_KERNEL(pv_rows, fa_f32_pv_rows_4x16__avx2),
};

const fai_kernels_f32 *fai_kernels_avx2(void) { return &avx2; }
