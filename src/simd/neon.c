/* NEON (AArch64 Advanced SIMD) kernels. AArch64 always has them; tested on x86 build machines
 * under qemu-aarch64 (.ci/run). */
#include "config.h"

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "core/fmath.h"
#include "simd/exp_poly.h"
#include "simd/kernels.h"

#define MR 8
#define NR 8 /* two q registers of f32 */

/*
 * 8 x 8: 16 accumulators, two B loads per k step, A entries by scalar-operand FMAs. The body
 * is instantiated once per row count, every loop over rows fully unrolled, so the
 * accumulators stay in registers (see the AVX-512 kernel). Partial column tiles go through a
 * zero-padded copy of the B row and a staged store.
 */
static inline __attribute__((always_inline)) void
gemm_rows__neon(const int ROWS, const int A_T, int64_t nr, int64_t k, const float *a,
                int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                const float *cscale)
{
    const int64_t ars = A_T ? 1 : lda, acs = A_T ? lda : 1; /* A[i][p] = a[i ars + p acs] */
    float32x4_t c0[MR], c1[MR];
    float tmp[NR];
#pragma GCC unroll 8
    for (int i = 0; i < ROWS; i++) {
        c0[i] = vdupq_n_f32(0);
        c1[i] = vdupq_n_f32(0);
        if (accumulate) {
            memset(tmp, 0, sizeof tmp);
            memcpy(tmp, c + i * ldc, (size_t)nr * sizeof(float));
            c0[i] = vld1q_f32(tmp);
            c1[i] = vld1q_f32(tmp + 4);
            if (cscale) {
                c0[i] = vmulq_n_f32(c0[i], cscale[i]);
                c1[i] = vmulq_n_f32(c1[i], cscale[i]);
            }
        }
    }
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * ldb;
        if (nr < NR) {
            memset(tmp, 0, sizeof tmp);
            memcpy(tmp, bp, (size_t)nr * sizeof(float));
            bp = tmp;
        }
        const float32x4_t b0 = vld1q_f32(bp), b1 = vld1q_f32(bp + 4);
#pragma GCC unroll 8
        for (int i = 0; i < ROWS; i++) {
            const float ai = a[i * ars + p * acs];
            c0[i] = vfmaq_n_f32(c0[i], b0, ai);
            c1[i] = vfmaq_n_f32(c1[i], b1, ai);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < ROWS; i++) {
        if (!accumulate && cscale) {
            c0[i] = vmulq_n_f32(c0[i], cscale[i]);
            c1[i] = vmulq_n_f32(c1[i], cscale[i]);
        }
        vst1q_f32(tmp, c0[i]);
        vst1q_f32(tmp + 4, c1[i]);
        memcpy(c + i * ldc, tmp, (size_t)nr * sizeof(float));
    }
}

/* Four floats at x: all of them (FULL), or the first `left` (< 4) through a zero-padded copy,
 * read no further; stored likewise, the partial vector through a staged copy. */
static inline __attribute__((always_inline)) float32x4_t
load_cols__neon(const int FULL, int64_t left, const float *x)
{
    if (FULL)
        return vld1q_f32(x);
    float t[4] = {0, 0, 0, 0};
    memcpy(t, x, (size_t)left * sizeof(float));
    return vld1q_f32(t);
}

static inline __attribute__((always_inline)) void
store_cols__neon(const int FULL, int64_t left, float *x, float32x4_t v)
{
    if (FULL) {
        vst1q_f32(x, v);
    } else {
        float t[4];
        vst1q_f32(t, v);
        memcpy(x, t, (size_t)left * sizeof(float));
    }
}

/*
 * exp in 4 lanes, inline: the AVX2 kernel's reduction, polynomial and two-factor 2^n (see
 * there); FMAX/FMIN return NaN for a NaN operand, so NaN passes the clamps. Max error over the
 * floats <= 0: measured by tests/check_kernels.c (a stride of them under qemu) and held to 1 ULP.
 */
static inline float32x4_t exp__neon(float32x4_t x)
{
    x = vminq_f32(vdupq_n_f32(100.0f), vmaxq_f32(vdupq_n_f32(-110.0f), x));
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, FAI_LOG2E_F));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0x1.62e43p-1f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-0x1.05c61p-29f));
    float32x4_t p = vdupq_n_f32(FAI_EXP_Q4);
    p = vfmaq_f32(vdupq_n_f32(FAI_EXP_Q3), p, r);
    p = vfmaq_f32(vdupq_n_f32(FAI_EXP_Q2), p, r);
    p = vfmaq_f32(vdupq_n_f32(FAI_EXP_Q1), p, r);
    p = vfmaq_f32(vdupq_n_f32(FAI_EXP_Q0), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t ni = vcvtq_s32_f32(n), n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    const int32x4_t bias = vdupq_n_s32(127);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

/* y = exp(x - m). Sum: 4 lanes, then the lanes in order; the tail goes through a padded copy
 * whose extra lanes are not summed. */
static float fa_f32_expsum__neon(int64_t n, const float *x, float m, float *y)
{
    const float32x4_t vm = vdupq_n_f32(m);
    float32x4_t vsum = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t e = exp__neon(vsubq_f32(vld1q_f32(x + i), vm));
        vst1q_f32(y + i, e);
        vsum = vaddq_f32(vsum, e);
    }
    float lanes[4], sum = 0;
    vst1q_f32(lanes, vsum);
    for (int l = 0; l < 4; l++)
        sum += lanes[l];
    if (i < n) {
        float t[4] = {0, 0, 0, 0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        vst1q_f32(t, exp__neon(vsubq_f32(vld1q_f32(t), vm)));
        for (int64_t l = 0; l < n - i; l++) {
            y[i + l] = t[l];
            sum += t[l];
        }
    }
    return sum;
}

/* core/fmath.h's NaN-sticky max: FMAX returns NaN when either operand is NaN, so the vector
 * part keeps a NaN by itself. */
static float fa_f32_max__neon(int64_t n, const float *x)
{
    float32x4_t vmax = vdupq_n_f32(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vmax = vmaxq_f32(vmax, vld1q_f32(x + i));
    float m = vmaxvq_f32(vmax);
    for (; i < n; i++)
        m = fai_nanmax_f32(m, x[i]);
    return m;
}

/* 4 x 4 blocks by two rounds of trn1/trn2 (32-bit, then 64-bit), the edges portably. */
static void fa_f32_transpose__neon(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                   float *dst, int64_t ldd)
{
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        int64_t c = 0;
        for (; c + 4 <= cols; c += 4) {
            const float *s = src + r * lds + c;
            const float32x4_t x0 = vld1q_f32(s), x1 = vld1q_f32(s + lds);
            const float32x4_t x2 = vld1q_f32(s + 2 * lds), x3 = vld1q_f32(s + 3 * lds);
            /* t0 = (x0[0], x1[0], x0[2], x1[2]), t1 = (x0[1], x1[1], x0[3], x1[3]), ... */
            const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(x0, x1));
            const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(x0, x1));
            const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(x2, x3));
            const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(x2, x3));
            float *d = dst + c * ldd + r;
            vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
            vst1q_f32(d + ldd, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
            vst1q_f32(d + 2 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
            vst1q_f32(d + 3 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
        }
        fai_transpose_f32_portable(4, cols - c, src + r * lds + c, lds, dst + c * ldd + r, ldd);
    }
    fai_transpose_f32_portable(rows - r, cols, src + r * lds, lds, dst + r, ldd);
}

/* 4 columns per vector, one FMA chain per column in p order from 0 (the GEMM kernel's
 * rounding). */
static inline __attribute__((always_inline)) void
coldot_cols__neon(const int FULL, int64_t left, int64_t k, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float *out)
{
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t p = 0; p < k; p++)
        acc = vfmaq_f32(acc, load_cols__neon(FULL, left, a + p * lda),
                        load_cols__neon(FULL, left, b + p * ldb));
    store_cols__neon(FULL, left, out, acc);
}

/* The backward's row on 4 lanes: core/gradient.h's dS with z = 1, no cap (kernels.h). */
static inline __attribute__((always_inline)) void
dsoftmax_vec__neon(const int FULL, int64_t left, const float *s, double lse, const float *dp,
                   float di, float scale, float *p, float *ds)
{
    const float64x2_t vl = vdupq_n_f64(lse);
    const float32x4_t vdi = vdupq_n_f32(di);
    const float32x4_t sv = load_cols__neon(FULL, left, s);
    const float32x2_t lo = vcvt_f32_f64(vsubq_f64(vcvt_f64_f32(vget_low_f32(sv)), vl));
    const float32x2_t hi = vcvt_f32_f64(vsubq_f64(vcvt_high_f64_f32(sv), vl));
    const float32x4_t P = exp__neon(vcombine_f32(lo, hi));
    const float32x4_t g = vmulq_f32(P, vsubq_f32(load_cols__neon(FULL, left, dp), vdi));
    store_cols__neon(FULL, left, p, P);
    store_cols__neon(FULL, left, ds, vmulq_n_f32(g, scale));
}

/* 4 FP8 codes, exactly, as fp8_widen8__avx2 says (avx2.c): e5m2 is an f16's top byte; e4m3's
 * magnitude << 7 is an f16 of 2^-8 its value (FCVTL widens f16 subnormals exactly); its NaN
 * the default quiet NaN with the code's sign, as in base/dtype.c. */
static inline __attribute__((always_inline)) float32x4_t fp8_widen4__neon(const fa_dtype D,
                                                                          const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    const uint16x4_t c = vget_low_u16(vmovl_u8(vcreate_u8(w)));
    if (D == FA_E5M2)
        return vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(c, 8)));
    const uint16x4_t sign = vshl_n_u16(vand_u16(c, vdup_n_u16(0x80)), 8),
                     mag = vand_u16(c, vdup_n_u16(0x7f));
    const float32x4_t f = vmulq_n_f32(
        vcvt_f32_f16(vreinterpret_f16_u16(vorr_u16(sign, vshl_n_u16(mag, 7)))), 256.0f);
    const uint32x4_t nan = vorrq_u32(vshll_n_u16(sign, 16), vdupq_n_u32(0x7fc00000));
    const uint32x4_t is_nan =
        vreinterpretq_u32_s32(vmovl_s16(vreinterpret_s16_u16(vceq_u16(mag, vdup_n_u16(0x7f)))));
    return vbslq_f32(is_nan, vreinterpretq_f32_u32(nan), f);
}

/* f16 by FCVTL, bf16 by a 16-bit left shift into 32 bits: both exact, NaN payloads kept; FP8
 * by fp8_widen4__neon. The last partial vector goes through zero-padded copies. */
static void fa_f32_widen__neon(const void *src, fa_dtype d, int64_t n, float *dst)
{
    if (d == FA_E4M3 || d == FA_E5M2) {
        for (int64_t i = 0; i < n; i += 4) {
            const int64_t w = n - i < 4 ? n - i : 4;
            uint8_t t[4] = {0, 0, 0, 0};
            memcpy(t, (const uint8_t *)src + i, (size_t)w);
            float o[4];
            vst1q_f32(o, d == FA_E4M3 ? fp8_widen4__neon(FA_E4M3, t)
                                      : fp8_widen4__neon(FA_E5M2, t));
            memcpy(dst + i, o, (size_t)w * sizeof(float));
        }
        return;
    }
    if (d != FA_F16 && d != FA_BF16) {
        fai_load_f32(src, d, n, dst);
        return;
    }
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i += 4) {
        const int64_t w = n - i < 4 ? n - i : 4;
        uint16_t t[4] = {0, 0, 0, 0};
        memcpy(t, h + i, (size_t)w * sizeof(uint16_t));
        const uint16x4_t x = vld1_u16(t);
        const float32x4_t y = d == FA_F16 ? vcvt_f32_f16(vreinterpret_f16_u16(x))
                                          : vreinterpretq_f32_u32(vshll_n_u16(x, 16));
        float o[4];
        vst1q_f32(o, y);
        memcpy(dst + i, o, (size_t)w * sizeof(float));
    }
}

/* f16 by FCVTN under the default round-to-nearest-even mode: one rounding from f32. */
static void fa_f32_narrow__neon(void *dst, fa_dtype d, int64_t n, const float *src)
{
    if (d != FA_F16) {
        fai_store_f32(dst, d, n, src);
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i += 4) {
        const int64_t w = n - i < 4 ? n - i : 4;
        float t[4] = {0, 0, 0, 0};
        uint16_t o[4];
        memcpy(t, src + i, (size_t)w * sizeof(float));
        vst1_u16(o, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(t))));
        memcpy(h + i, o, (size_t)w * sizeof(uint16_t));
    }
}

/* ---------------------------------------------------------------- decode's products */

/* 4 elements of a row of block format D (core/quant.h) from element p (a multiple of 4, so
 * within one block): the codes widened to int32 and converted, times the block's scale d, each
 * product exact (core/quant.h): the values of an f32 row of the dequantized elements. */
static inline __attribute__((always_inline)) float32x4_t
load4_block__neon(const fa_dtype D, const void *row, int64_t p)
{
    int j;
    uint16_t h;
    const uint8_t *blk = fai_block_at(D, row, p, &j, &h);
    const float d = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
    uint32_t w; /* the 4 code bytes: q8_0's j .. j + 3; q4_0's nibbles in bytes j % 16 .. */
    memcpy(&w, blk + 2 + (D == FA_Q8_0 ? j : j % 16), sizeof w);
    const uint8x8_t b = vcreate_u8(w);
    int32x4_t q;
    if (D == FA_Q8_0) {
        q = vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b))));
    } else { /* low nibbles for j < 16, high after; minus 8 */
        const uint8x8_t u = j < 16 ? vand_u8(b, vdup_n_u8(15)) : vshr_n_u8(b, 4);
        q = vsubq_s32(vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(u)))),
                      vdupq_n_s32(8));
    }
    return vmulq_n_f32(vcvtq_f32_s32(q), d);
}

/* 4 elements of a stored row from element p, widened exactly (f16 by FCVTL, bf16 by a shift,
 * FP8 by fp8_widen4__neon, a block format by load4_block__neon); where WHOLE is 0, only the
 * first `left` (< 4) are read and the rest are 0 (a block format's rows are whole blocks:
 * never partial). */
static inline __attribute__((always_inline)) float32x4_t
load4_widen__neon(const fa_dtype D, const int WHOLE, int64_t left, const void *row, int64_t p)
{
    if (D == FA_E4M3 || D == FA_E5M2) {
        const uint8_t *c = (const uint8_t *)row + p;
        uint8_t t[4] = {0, 0, 0, 0};
        if (!WHOLE) {
            memcpy(t, c, (size_t)left);
            c = t;
        }
        return fp8_widen4__neon(D, c);
    }
    if (D == FA_Q8_0 || D == FA_Q4_0) {
        float32x4_t x = load4_block__neon(D, row, p);
        if (!WHOLE) {
            const uint32x4_t lane = {0, 1, 2, 3};
            x = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(x),
                                                vcltq_u32(lane, vdupq_n_u32((uint32_t)left))));
        }
        return x;
    }
    if (D == FA_F32)
        return load_cols__neon(WHOLE, left, (const float *)row + p);
    const uint16_t *h = (const uint16_t *)row + p;
    uint16_t t[4] = {0, 0, 0, 0};
    if (!WHOLE) {
        memcpy(t, h, (size_t)left * sizeof(uint16_t));
        h = t;
    }
    const uint16x4_t x = vld1_u16(h);
    return D == FA_F16 ? vcvt_f32_f16(vreinterpret_f16_u16(x))
                       : vreinterpretq_f32_u32(vshll_n_u16(x, 16));
}

/* One step of dot_block__neon over dims [p, p + 4) (the first `left` where WHOLE is 0). */
static inline __attribute__((always_inline)) void
dot_step__neon(const fa_dtype D, const int ROWS, const int KEYS4, const int WHOLE, int64_t left,
               int64_t nc, const float *q, int64_t ldq, const char *k, int64_t kb, int64_t p,
               float32x4_t acc[16])
{
    float32x4_t kv[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
        kv[c] = KEYS4 || c < nc ? load4_widen__neon(D, WHOLE, left, k + c * kb, p)
                                : vdupq_n_f32(0);
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) {
        const float32x4_t qv = load4_widen__neon(FA_F32, WHOLE, left, q + r * ldq, p);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[4 * r + c] = vfmaq_f32(acc[4 * r + c], qv, kv[c]);
    }
}

/* ROWS (<= 4) rows against nc (<= 4; 4 where KEYS4) keys: one accumulator per (row, key), 4
 * lanes over p (lane t takes p = t, t + 4, ... in order, a fused multiply-add each), then each
 * accumulator's lanes in one tree, (l0 + l1) + (l2 + l3), by two pairwise adds that give row
 * r's four keys in one vector. Keys past nc are not loaded (their accumulators multiply zeros,
 * never stored). */
static inline __attribute__((always_inline)) void
dot_block__neon(const fa_dtype D, const int ROWS, const int KEYS4, int64_t nc, int64_t d,
                const float *q, int64_t ldq, const char *k, int64_t kb, float *s, int64_t lds,
                const float *scale)
{
    float32x4_t acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        acc[i] = vdupq_n_f32(0);
    int64_t p = 0;
    for (; p + 4 <= d; p += 4)
        dot_step__neon(D, ROWS, KEYS4, 1, 4, nc, q, ldq, k, kb, p, acc);
    if (p < d)
        dot_step__neon(D, ROWS, KEYS4, 0, d - p, nc, q, ldq, k, kb, p, acc);
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) {
        const float32x4_t *a = acc + 4 * r;
        float32x4_t sums = vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
        if (scale)
            sums = vmulq_n_f32(sums, *scale);
        store_cols__neon(KEYS4, nc, s + r * lds, sums);
    }
}

/* ROWS (<= 4) rows of acc, dims [p0, p0 + 16) (left[x]: the valid lanes of vector x, 4 each
 * where FULL), += P V over keys [0, n), each key one fused multiply-add per element. Partial
 * vectors go through zero-padded copies and a staged store. */
static inline __attribute__((always_inline)) void
pv_block__neon(const fa_dtype D, const int FULL, const int ROWS, const int64_t *left, int64_t n,
               const float *p, int64_t ldp, const char *v, int64_t vb, int64_t p0, float *acc,
               int64_t lda)
{
    /* (a vector without a lane, left[x] = 0, is never addressed: it lies past the row) */
    float32x4_t a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            a[r][x] = FULL || left[x] ? load4_widen__neon(FA_F32, FULL, left[x],
                                                          acc + r * lda + p0, 4 * x)
                                      : vdupq_n_f32(0);
    for (int64_t c = 0; c < n; c++) {
        float32x4_t vv[4];
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++)
            vv[x] = FULL || left[x] ? load4_widen__neon(D, FULL, left[x], v + c * vb, p0 + 4 * x)
                                    : vdupq_n_f32(0);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            const float w = p[r * ldp + c];
#pragma GCC unroll 4
            for (int x = 0; x < 4; x++)
                a[r][x] = vfmaq_n_f32(a[r][x], vv[x], w);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
        for (int x = 0; x < 4; x++) {
            float *o = acc + r * lda + p0 + 4 * x;
            if (FULL) {
                vst1q_f32(o, a[r][x]);
            } else if (left[x]) {
                float t[4];
                vst1q_f32(t, a[r][x]);
                memcpy(o, t, (size_t)left[x] * sizeof(float));
            }
        }
}

/* ---------------------------------------------------------------- the drivers */

#define FAI_DRV_ISA neon
#define FAI_DRV_GEMM fa_f32_gemm_ukernel_8x8__neon
#define FAI_DRV_GEMM_AT fa_f32_gemm_at_ukernel_8x8__neon
#define FAI_DRV_MR MR
#define FAI_DRV_LANES 4
#define FAI_DRV_COLDOT fa_f32_coldot__neon
#define FAI_DRV_DSOFTMAX fa_f32_dsoftmax__neon
#define FAI_DRV_DOT_ROWS fa_f32_dot_rows_4x4__neon
#define FAI_DRV_DOT_KEYS 4
#define FAI_DRV_PV_ROWS fa_f32_pv_rows_4x16__neon
#define FAI_DRV_PV_VECS 4
#include "simd/drivers_tpl.h"

static const fai_kernels_f32 neon = {
    .isa = FA_ISA_NEON,
    .mr = MR,
    .nr = NR,
    FAI_KERNEL(gemm, fa_f32_gemm_ukernel_8x8__neon),
    FAI_KERNEL(gemm_at, fa_f32_gemm_at_ukernel_8x8__neon),
    FAI_KERNEL(expsum, fa_f32_expsum__neon),
    FAI_KERNEL(max, fa_f32_max__neon),
    FAI_KERNEL(transpose, fa_f32_transpose__neon),
    FAI_KERNEL(coldot, fa_f32_coldot__neon),
    FAI_KERNEL(dsoftmax, fa_f32_dsoftmax__neon),
    FAI_KERNEL(finite, fai_finite_f32_portable),
    FAI_KERNEL(widen, fa_f32_widen__neon),
    FAI_KERNEL(narrow, fa_f32_narrow__neon),
    FAI_KERNEL(dot_rows, fa_f32_dot_rows_4x4__neon),
    FAI_KERNEL(pv_rows, fa_f32_pv_rows_4x16__neon),
};

const fai_kernels_f32 *fai_kernels_neon(void) { return &neon; }
