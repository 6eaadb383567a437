/* AVX-512 (F) kernels. Built with -mavx512f -mavx512dq -mavx512bw -mavx512vl; called only when
 * the CPU and OS support them (simd/cpu.c). */
#include "config.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "simd/exp_poly.h"
#include "simd/kernels.h"

#define MR 12
#define NR 32 /* two zmm of f32 */

/* Lane i of the mask is on iff i < n: none for n <= 0, all from 16 on. */
static inline __attribute__((always_inline)) __mmask16 lanes_below(int64_t n)
{
    return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/*
 * 12 x 32: 24 zmm accumulators; per k step two B loads and twelve A broadcasts feed 24 FMAs
 * (27 of the 32 registers). Measured against 8 x 32 and 14 x 32 in NOTES.md.
 *
 * The body is instantiated once per row count (ROWS a constant, every loop over rows fully
 * unrolled): with a variable row count the compiler keeps the accumulator arrays in memory,
 * which ran the kernel at less than half the FMA rate (perf annotate: a load, FMA and store
 * per term). And once more for whole tiles (FULL: nr == NR), whose loads and stores take no
 * mask: on Emerald Rapids a zero-masking load costs a uop on the FMA ports besides the load,
 * and the two masked B loads per k step held the kernel at 151-159 GFLOP/s where the same
 * loop without masks runs at 172 (B in L1, k = 128 and 256; the FMA peak measured there is
 * 175). Partial tiles mask columns beyond nr on load and store; rows beyond ROWS are never
 * touched.
 */
static inline __attribute__((always_inline)) __m512 load_cols__avx512(const int FULL, __mmask16 m,
                                                                      const float *x)
{
    return FULL ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(m, x);
}

static inline __attribute__((always_inline)) void store_cols__avx512(const int FULL, __mmask16 m,
                                                                     float *x, __m512 v)
{
    if (FULL)
        _mm512_storeu_ps(x, v);
    else
        _mm512_mask_storeu_ps(x, m, v);
}

static inline __attribute__((always_inline)) void
gemm_rows__avx512(const int ROWS, const int A_T, const int FULL, int64_t nr, int64_t k,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                  int64_t ldc, int accumulate, const float *cscale)
{
    const int64_t ars = A_T ? 1 : lda, acs = A_T ? lda : 1; /* A[i][p] = a[i ars + p acs] */
    const __mmask16 m0 = lanes_below(nr);
    const __mmask16 m1 = lanes_below(nr - 16);
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; i++) {
        c0[i] = accumulate ? load_cols__avx512(FULL, m0, c + i * ldc) : _mm512_setzero_ps();
        c1[i] = accumulate ? load_cols__avx512(FULL, m1, c + i * ldc + 16) : _mm512_setzero_ps();
        if (accumulate && cscale) {
            c0[i] = _mm512_mul_ps(c0[i], _mm512_set1_ps(cscale[i]));
            c1[i] = _mm512_mul_ps(c1[i], _mm512_set1_ps(cscale[i]));
        }
    }
    for (int64_t p = 0; p < k; p++) {
        const __m512 b0 = load_cols__avx512(FULL, m0, b + p * ldb);
        const __m512 b1 = load_cols__avx512(FULL, m1, b + p * ldb + 16);
#pragma GCC unroll 12
        for (int i = 0; i < ROWS; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * ars + p * acs]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < ROWS; i++) {
        if (!accumulate && cscale) {
            c0[i] = _mm512_mul_ps(c0[i], _mm512_set1_ps(cscale[i]));
            c1[i] = _mm512_mul_ps(c1[i], _mm512_set1_ps(cscale[i]));
        }
        store_cols__avx512(FULL, m0, c + i * ldc, c0[i]);
        store_cols__avx512(FULL, m1, c + i * ldc + 16, c1[i]);
    }
}

/*
 * A block of up to 16 x 16 in registers: rows r < rr with columns c < cc are loaded (the rest
 * is 0), transposed in four rounds, and output rows c < cc stored with lanes r < rr.
 *   1. unpack lo/hi of row pairs: 32-bit pairs (x[2g][j], x[2g+1][j]) side by side;
 *   2. unpack lo/hi of 64-bit words of pair-of-pairs: u[4g + t] holds, in 128-bit lane l,
 *      column 4l + t of rows 4g .. 4g + 3;
 *   3-4. two 128-bit-lane shuffles gather lane l of u[t], u[4 + t], u[8 + t], u[12 + t]:
 *      output row 4l + t.
 */
static inline __attribute__((always_inline)) void
transpose_block__avx512(const float *src, int64_t lds, int64_t rr, int64_t cc, float *dst,
                        int64_t ldd)
{
    const __mmask16 cm = lanes_below(cc);
    const __mmask16 rm = lanes_below(rr);
    __m512 x[16], t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        x[i] = i < rr ? _mm512_maskz_loadu_ps(cm, src + i * lds) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        t[2 * g] = _mm512_unpacklo_ps(x[2 * g], x[2 * g + 1]);
        t[2 * g + 1] = _mm512_unpackhi_ps(x[2 * g], x[2 * g + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m512d t0 = _mm512_castps_pd(t[4 * g]), t1 = _mm512_castps_pd(t[4 * g + 1]);
        const __m512d t2 = _mm512_castps_pd(t[4 * g + 2]), t3 = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512 w0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44);
        const __m512 w1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xee);
        const __m512 w2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44);
        const __m512 w3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xee);
        const __m512 out[4] = {_mm512_shuffle_f32x4(w0, w2, 0x88), _mm512_shuffle_f32x4(w0, w2, 0xdd),
                               _mm512_shuffle_f32x4(w1, w3, 0x88), _mm512_shuffle_f32x4(w1, w3, 0xdd)};
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++)
            if (4 * l + k < cc)
                _mm512_mask_storeu_ps(dst + (4 * l + k) * ldd, rm, out[l]);
    }
}

static void fa_f32_transpose__avx512(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                     float *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r += 16)
        for (int64_t c = 0; c < cols; c += 16)
            if (rows - r >= 16 && cols - c >= 16) /* constant masks: plain loads and stores */
                transpose_block__avx512(src + r * lds + c, lds, 16, 16, dst + c * ldd + r, ldd);
            else
                transpose_block__avx512(src + r * lds + c, lds, rows - r, cols - c,
                                        dst + c * ldd + r, ldd);
}

/*
 * exp in 16 lanes, inline (SLEEF's vector exp is an out-of-line call per vector; this one
 * halved the time the forward spends in exp). x = n ln2 + r with n the integer nearest to
 * x log2 e (the product unrounded, inside one FMA) and r by Cody-Waite in two FMAs,
 * |r| <= ln2 / 2 (plus rounding); exp(r) by a minimax polynomial of degree 6 in Horner form
 * (simd/exp_poly.h: 3.1e-9 relative before rounding); then 2^n by scalef, which
 * rounds once into the subnormals and gives 0 below them and inf above the range. x is first
 * clamped to [-110, 100] (exp(-110) rounds to 0 and exp(100) to inf, as do the values
 * clamped), which keeps n finite for +-inf; NaN passes the clamps (max/min return their second
 * operand when either is NaN) and stays NaN. Max error over every float <= 0: 0.882 ULP
 * (tests/check_kernels.c measures it and holds it to 1 ULP; SLEEF's Sleef_expf16_u10 measured
 * 0.986 there). Lanes below -104, whose exp rounds to 0 (exp(-104) < 2^-150, half the
 * smallest subnormal), are set to 0 by a mask instead: through scalef they underflow, which
 * Intel cores serve by a microcode assist (on the GPU machine's Xeon a forward whose scores
 * were one in eight -inf, a keep-mask's, ran at 0.35 of the plain one); the bits are the same.
 */
static inline __m512 exp__avx512(__m512 x)
{
    const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ);
    x = _mm512_mask_mov_ps(x, zero, _mm512_setzero_ps());
    x = _mm512_min_ps(_mm512_set1_ps(100.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
    /* n = x log2e rounded to an integer by adding and removing 1.5 * 2^23 (one FMA and one
     * subtraction on either vector port, where roundscale is two uops on one) */
    const __m512 shift = _mm512_set1_ps(0x1.8p23f);
    const __m512 n = _mm512_sub_ps(
        _mm512_fmadd_round_ps(x, _mm512_set1_ps(FAI_LOG2E_F), shift,
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e43p-1f), x); /* ln2 rounded to float */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-0x1.05c61p-29f), r);       /* ln2 - that float   */
    __m512 p = _mm512_set1_ps(FAI_EXP_Q4); /* exp(r) = 1 + r + r^2 q(r): simd/exp_poly.h */
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_scalef_ps(p, n));
}

/* y = exp(x - m), summed in 16 lanes, then the lanes by a fixed tree (halves, then halves of
 * those: _mm512_reduce_add_ps). */
static float fa_f32_expsum__avx512(int64_t n, const float *x, float m, float *y)
{
    const __m512 vm = _mm512_set1_ps(m);
    __m512 vsum = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) { /* whole vectors without masks: the mask ops share port 5 */
        const __m512 e = exp__avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(y + i, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    if (i < n) {
        const __mmask16 mk = lanes_below(n - i);
        const __m512 e = exp__avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, x + i), vm));
        _mm512_mask_storeu_ps(y + i, mk, e);
        vsum = _mm512_mask_add_ps(vsum, mk, vsum, e);
    }
    return _mm512_reduce_add_ps(vsum);
}

/* 16 columns per vector, one FMA chain per column in p order from 0: the GEMM kernel's
 * rounding of an element. Whole vectors load without a mask (see the GEMM kernel). */
static inline __attribute__((always_inline)) void
coldot_cols__avx512(const int FULL, __mmask16 mk, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *out)
{
    __m512 acc = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++)
        acc = _mm512_fmadd_ps(load_cols__avx512(FULL, mk, a + p * lda),
                              load_cols__avx512(FULL, mk, b + p * ldb), acc);
    store_cols__avx512(FULL, mk, out, acc);
}

/* The backward's row on 16 lanes: P = exp(s - lse) with the subtraction in double (two halves
 * of 8), ds = scale P (dp - di): core/gradient.h's dS with z = 1, no cap. Whole vectors
 * without masks, then one masked tail. */
static inline __attribute__((always_inline)) void
dsoftmax_vec__avx512(const int FULL, __mmask16 mk, const float *s, double lse, const float *dp,
                     float di, float scale, float *p, float *ds)
{
    const __m512d vl = _mm512_set1_pd(lse);
    const __m512 vdi = _mm512_set1_ps(di), vscale = _mm512_set1_ps(scale);
    const __m512 sv = load_cols__avx512(FULL, mk, s);
    const __m256 lo = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(sv)), vl));
    const __m256 hi = _mm512_cvtpd_ps(
        _mm512_sub_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sv), 1))), vl));
    const __m512 P = exp__avx512(_mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1));
    const __m512 g = _mm512_mul_ps(P, _mm512_sub_ps(load_cols__avx512(FULL, mk, dp), vdi));
    store_cols__avx512(FULL, mk, p, P);
    store_cols__avx512(FULL, mk, ds, _mm512_mul_ps(vscale, g));
}

/* x - x is 0 for finite x and NaN for inf and NaN: an ordered compare with 0 per lane. */
static int fa_f32_finite__avx512(int64_t n, const float *x)
{
    __mmask16 ok = 0xffff;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = lanes_below(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + i);
        ok &= _mm512_cmp_ps_mask(_mm512_sub_ps(v, v), _mm512_setzero_ps(), _CMP_EQ_OQ);
    }
    return ok == 0xffff;
}

/* core/fmath.h's NaN-sticky max: four running maxima (one chain would wait on the max's latency at every
 * vector); lanes that are NaN are collected in a mask by their own compare, since vmaxps drops
 * a NaN in its first operand, and decide the result. */
static float fa_f32_max__avx512(int64_t n, const float *x)
{
    __m512 vmax[4];
    for (int a = 0; a < 4; a++)
        vmax[a] = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) {
            const __m512 v = _mm512_loadu_ps(x + i + 16 * a);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            vmax[a] = _mm512_max_ps(vmax[a], v);
        }
    for (; i < n; i += 16) {
        const __mmask16 mk = lanes_below(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + i);
        nan |= _mm512_mask_cmp_ps_mask(mk, v, v, _CMP_UNORD_Q);
        vmax[0] = _mm512_mask_max_ps(vmax[0], mk, vmax[0], v);
    }
    if (nan)
        return NAN;
    return _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_max_ps(vmax[0], vmax[1]), _mm512_max_ps(vmax[2], vmax[3])));
}

/* 16 FP8 codes (lanes outside mk read as 0), exactly, as fp8_widen8__avx2 says (avx2.c): e5m2
 * is an f16's top byte; e4m3's magnitude << 7 is an f16 of 2^-8 its value; its NaN the default
 * quiet NaN with the code's sign. */
static inline __attribute__((always_inline)) __m512 fp8_widen16__avx512(fa_dtype d,
                                                                         const uint8_t *p,
                                                                         __mmask16 mk)
{
    const __m256i c = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mk, p));
    if (d == FA_E5M2)
        return _mm512_cvtph_ps(_mm256_slli_epi16(c, 8));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(c, _mm256_set1_epi16(0x80)), 8),
                  mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7f));
    const __m512 f = _mm512_mul_ps(
        _mm512_cvtph_ps(_mm256_or_si256(sign, _mm256_slli_epi16(mag, 7))), _mm512_set1_ps(256.0f));
    const __m512 nan = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(sign), 16), _mm512_set1_epi32(0x7fc00000)));
    const __mmask16 is_nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));
    return _mm512_mask_blend_ps(is_nan, f, nan);
}

/* f16 by the F16C-style conversion of 16 halves, bf16 by widening to 32 bits and shifting the
 * bits into the top half: both exact, NaN payloads kept; FP8 by fp8_widen16__avx512. */
static void fa_f32_widen__avx512(const void *src, fa_dtype d, int64_t n, float *dst)
{
    if (d == FA_E4M3 || d == FA_E5M2) {
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 mk = lanes_below(n - i);
            _mm512_mask_storeu_ps(dst + i, mk, fp8_widen16__avx512(d, (const uint8_t *)src + i, mk));
        }
        return;
    }
    if (d != FA_F16 && d != FA_BF16) {
        fai_load_f32(src, d, n, dst);
        return;
    }
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = lanes_below(n - i);
        const __m256i x = _mm256_maskz_loadu_epi16(mk, h + i);
        const __m512 y = d == FA_F16 ? _mm512_cvtph_ps(x)
                                     : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
        _mm512_mask_storeu_ps(dst + i, mk, y);
    }
}

/* f16 by the conversion instruction under round-to-nearest-even: one rounding from f32. bf16
 * by the portable rounding's integer arithmetic on the bits (dtype.c): a NaN keeps its sign
 * and top payload bits and is made quiet; any other value adds 0x7fff plus the kept part's
 * lowest bit (ties to even, inf stays inf, overflow carries into inf) and keeps the top half. */
static void fa_f32_narrow__avx512(void *dst, fa_dtype d, int64_t n, const float *src)
{
    if (d != FA_F16 && d != FA_BF16) {
        fai_store_f32(dst, d, n, src);
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = lanes_below(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(mk, src + i);
        __m256i y;
        if (d == FA_F16) {
            y = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        } else {
            const __m512i u = _mm512_castps_si512(x), top = _mm512_srli_epi32(u, 16);
            const __m512i odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
            const __m512i rounded = _mm512_srli_epi32(
                _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
            const __m512i quiet = _mm512_or_si512(top, _mm512_set1_epi32(0x40));
            y = _mm512_cvtepi32_epi16(
                _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, quiet));
        }
        _mm256_mask_storeu_epi16(h + i, mk, y);
    }
}

/* ---------------------------------------------------------------- decode's products */

/* 16 elements of a row of block format D (core/quant.h) from element p (a multiple of 16: the
 * first or second half of one block): the codes widened to int32 and converted, times the
 * block's scale d, each product exact (core/quant.h): the values of an f32 row of the
 * dequantized elements. A row is whole blocks, so the 16 codes are always there to read. */
static inline __attribute__((always_inline)) __m512 load_block__avx512(const fa_dtype D,
                                                                       const void *row, int64_t p)
{
    int j;
    uint16_t h;
    const uint8_t *blk = fai_block_at(D, row, p, &j, &h);
    const __m512 d = _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))));
    __m512i q;
    if (D == FA_Q8_0) {
        q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + j)));
    } else { /* the 16 bytes' low nibbles (j = 0) or high (j = 16), minus 8 */
        const __m512i u = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
        q = _mm512_sub_epi32(_mm512_and_si512(j < 16 ? u : _mm512_srli_epi32(u, 4),
                                              _mm512_set1_epi32(15)),
                             _mm512_set1_epi32(8));
    }
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
}

/* 16 elements of a stored row from element p, widened exactly (lanes outside mk are 0); the
 * dtype is a constant where this is inlined, FULL loads without a mask; a block format
 * dequantized (load_block__avx512: its rows are whole blocks, so never partial); FP8 by
 * fp8_widen16__avx512. */
static inline __attribute__((always_inline)) __m512 load_widen__avx512(const fa_dtype D,
                                                                       const int FULL,
                                                                       __mmask16 mk,
                                                                       const void *row, int64_t p)
{
    if (D == FA_E4M3 || D == FA_E5M2)
        return fp8_widen16__avx512(D, (const uint8_t *)row + p, FULL ? (__mmask16)0xffff : mk);
    if (D == FA_Q8_0 || D == FA_Q4_0)
        return FULL ? load_block__avx512(D, row, p)
                    : _mm512_maskz_mov_ps(mk, load_block__avx512(D, row, p));
    if (D == FA_F32)
        return FULL ? _mm512_loadu_ps((const float *)row + p)
                    : _mm512_maskz_loadu_ps(mk, (const float *)row + p);
    const __m256i x = FULL ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + p))
                           : _mm256_maskz_loadu_epi16(mk, (const uint16_t *)row + p);
    return D == FA_F16 ? _mm512_cvtph_ps(x)
                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

/*
 * The sums of the lanes of 16 vectors: lane 4i + t of the result is the sum of a[4i + t]'s 16
 * lanes, always in one order: within each 128-bit block (l0 + l2) + (l1 + l3), then the
 * blocks (b0 + b1) + (b2 + b3). Lanes of different vectors never meet, so a vector whose sum
 * is not wanted may hold anything.
 */
static inline __attribute__((always_inline)) __m512 sum_lanes_16__avx512(const __m512 a[16])
{
    __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* per block: a0 l0+l2, a1 l0+l2, a0 l1+l3, a1 l1+l3 */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* per block: the block sums of a[4i .. 4i + 3] */
        const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* blocks b0 + b1, b2 + b3 of c[2i], then of c[2i + 1] */
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88),
                         _mm512_shuffle_f32x4(d[0], d[1], 0xdd));
}

/* ROWS (<= 4) rows against nc (<= 4; 4 where KEYS4) keys: one accumulator per (row, key), 16
 * lanes over p (lane t takes p = t, t + 16, ... in order, a fused multiply-add each), then
 * sum_lanes_16__avx512. Keys past nc are not loaded (their accumulators multiply zeros: 0, or
 * NaN for an inf q, never stored). */
static inline __attribute__((always_inline)) void
dot_block__avx512(const fa_dtype D, const int ROWS, const int KEYS4, int64_t nc, int64_t d,
                  const float *q,
                  int64_t ldq, const char *k, int64_t kb, float *s, int64_t lds,
                  const float *scale)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 16 <= d; p += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kv[c] = KEYS4 || c < nc ? load_widen__avx512(D, 1, 0, k + c * kb, p)
                                    : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m512 qv = _mm512_loadu_ps(q + r * ldq + p);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[4 * r + c] = _mm512_fmadd_ps(qv, kv[c], acc[4 * r + c]);
        }
    }
    if (p < d) {
        const __mmask16 mk = lanes_below(d - p);
        __m512 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kv[c] = KEYS4 || c < nc ? load_widen__avx512(D, 0, mk, k + c * kb, p)
                                    : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m512 qv = _mm512_maskz_loadu_ps(mk, q + r * ldq + p);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[4 * r + c] = _mm512_fmadd_ps(qv, kv[c], acc[4 * r + c]);
        }
    }
    __m512 sums = sum_lanes_16__avx512(acc);
    if (scale)
        sums = _mm512_mul_ps(sums, _mm512_set1_ps(*scale));
    /* row r's nc sums are lanes 4r .. 4r + nc - 1 */
    const __mmask8 keys = (__mmask8)((1u << nc) - 1);
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) {
        const __m128 row = r == 0   ? _mm512_castps512_ps128(sums)
                           : r == 1 ? _mm512_extractf32x4_ps(sums, 1)
                           : r == 2 ? _mm512_extractf32x4_ps(sums, 2)
                                    : _mm512_extractf32x4_ps(sums, 3);
        _mm_mask_storeu_ps(s + r * lds, keys, row);
    }
}

/* ROWS (<= 4) rows of acc, dims [p0, p0 + 64) (mk: the valid lanes of each of the four
 * vectors, all of them where FULL), += P V over keys [0, n). */
static inline __attribute__((always_inline)) void
pv_block__avx512(const fa_dtype D, const int FULL, const int ROWS, const __mmask16 *mk,
                 int64_t n, const float *p, int64_t ldp, const char *v, int64_t vb, int64_t p0,
                 float *acc, int64_t lda)
{
    /* (a vector without a lane, mk[x] = 0, is never addressed: it lies past the row) */
    __m512 a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            a[r][x] = FULL     ? _mm512_loadu_ps(acc + r * lda + p0 + 16 * x)
                      : mk[x] ? _mm512_maskz_loadu_ps(mk[x], acc + r * lda + p0 + 16 * x)
                               : _mm512_setzero_ps();
    for (int64_t c = 0; c < n; c++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            vv[x] = FULL || mk[x] ? load_widen__avx512(D, FULL, FULL ? 0 : mk[x], v + c * vb,
                                                       p0 + 16 * x)
                                  : _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const __m512 w = _mm512_set1_ps(p[r * ldp + c]);
#pragma GCC unroll 4
            for (int x = 0; x < 4; x++)
                a[r][x] = _mm512_fmadd_ps(w, vv[x], a[r][x]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++) {
            if (FULL)
                _mm512_storeu_ps(acc + r * lda + p0 + 16 * x, a[r][x]);
            else if (mk[x])
                _mm512_mask_storeu_ps(acc + r * lda + p0 + 16 * x, mk[x], a[r][x]);
        }
}

/* ---------------------------------------------------------------- the drivers */

#define FAI_DRV_ISA avx512
#define FAI_DRV_GEMM fa_f32_gemm_ukernel_12x32__avx512
#define FAI_DRV_GEMM_AT fa_f32_gemm_at_ukernel_12x32__avx512
#define FAI_DRV_MR MR
#define FAI_DRV_GEMM_NR NR
#define FAI_DRV_LANES 16
#define FAI_DRV_TAIL __mmask16
#define FAI_DRV_TAIL_OF lanes_below
#define FAI_DRV_COLDOT fa_f32_coldot__avx512
#define FAI_DRV_DSOFTMAX fa_f32_dsoftmax__avx512
#define FAI_DRV_DOT_ROWS fa_f32_dot_rows_4x4__avx512
#define FAI_DRV_DOT_KEYS 4
#define FAI_DRV_PV_ROWS fa_f32_pv_rows_4x64__avx512
#define FAI_DRV_PV_VECS 4
#include "simd/drivers_tpl.h"

static const fai_kernels_f32 avx512 = {
    .isa = FA_ISA_AVX512,
    .mr = MR,
    .nr = NR,
    FAI_KERNEL(gemm, fa_f32_gemm_ukernel_12x32__avx512),
    FAI_KERNEL(gemm_at, fa_f32_gemm_at_ukernel_12x32__avx512),
    FAI_KERNEL(expsum, fa_f32_expsum__avx512),
    FAI_KERNEL(max, fa_f32_max__avx512),
    FAI_KERNEL(transpose, fa_f32_transpose__avx512),
    FAI_KERNEL(coldot, fa_f32_coldot__avx512),
    FAI_KERNEL(dsoftmax, fa_f32_dsoftmax__avx512),
    FAI_KERNEL(finite, fa_f32_finite__avx512),
    FAI_KERNEL(widen, fa_f32_widen__avx512),
    FAI_KERNEL(narrow, fa_f32_narrow__avx512),
    FAI_KERNEL(dot_rows, fa_f32_dot_rows_4x4__avx512),
    FAI_KERNEL(pv_rows, fa_f32_pv_rows_4x64__avx512),
};

const fai_kernels_f32 *fai_kernels_avx512(void) { return &avx512; }
