/*
 * Storage dtype conversions. Loads widen exactly. Stores round to nearest, ties to even,
 * straight from the source precision: an f64 value is rounded once to f16/bf16, never through
 * f32 first (double rounding would break ties such as 1 + 2^-11 + 2^-40 in f16).
 */
#include "config.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "core/quant.h"

size_t fai_dtype_size(fa_dtype d)
{
    switch (d) {
    case FA_F64: return 8;
    case FA_F32: return 4;
    case FA_F16:
    case FA_BF16: return 2;
    case FA_BOOL:
    case FA_E4M3:
    case FA_E5M2: return 1;
    case FA_Q8_0:
    case FA_Q4_0: return 0;
    }
    return 0;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits. Exact in f32. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31) /* inf; NaN with its payload, quieted as IEEE conversions and F16C do */
        return f32_from_bits(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0));
    return f32_from_bits(sign | ((e + 127 - 15) << 23) | (m << 13));
}

static inline float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

double fai_f16_to_f64(uint16_t h) { return f16_to_f32(h); }
double fai_bf16_to_f64(uint16_t h) { return bf16_to_f32(h); }

/*
 * Round |x| (finite, >= 0) to `frac` fraction bits with minimum normal exponent emin, ties to
 * even: the spacing of the target format at |x| is ulp = 2^(max(E, emin) - frac) where
 * 2^E <= |x| < 2^(E+1); x / ulp is exact, nearbyint rounds it under the default
 * round-to-nearest-even mode, and the product is exact again.
 */
static double round_to_format(double a, int frac, int emin)
{
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1): E = e - 1 */
    int E = e - 1 < emin ? emin : e - 1;
    double ulp = ldexp(1.0, E - frac);
    return nearbyint(a / ulp) * ulp;
}

/* Encodes a value already representable in a (1, ebits, frac) format with bias. */
static uint16_t encode_exact(double r, int frac, int emin, int bias)
{
    if (r < ldexp(1.0, emin)) /* zero or subnormal */
        return (uint16_t)ldexp(r, frac - emin);
    int e;
    double f = frexp(r, &e); /* r = f 2^e, f in [0.5, 1) */
    uint16_t biased = (uint16_t)(e - 1 + bias);
    uint16_t m = (uint16_t)ldexp(2 * f - 1, frac);
    return (uint16_t)((biased << frac) | m);
}

uint16_t fai_f64_to_f16(double x)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x))
        return sign | 0x7e00u;
    double a = fabs(x);
    /* 65504 is the largest f16; 65520 is halfway to 2^16 and rounds (to even) up to inf */
    if (a >= 65520.0)
        return sign | 0x7c00u;
    return sign | encode_exact(round_to_format(a, 10, -14), 10, -14, 15);
}

uint16_t fai_f64_to_bf16(double x)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x))
        return sign | 0x7fc0u;
    double a = fabs(x);
    /* largest bf16 (2 - 2^-7) 2^127; halfway above it, (2 - 2^-8) 2^127, rounds to inf */
    if (a >= 0x1.ffp127)
        return sign | 0x7f80u;
    return sign | encode_exact(round_to_format(a, 7, -126), 7, -126, 127);
}

/*
 * FP8 (the OCP 8-bit formats). e4m3 ("e4m3fn"): 4 exponent bits (bias 7), 3 fraction bits, no
 * infinity, NaN = S.1111.111, largest 448. e5m2: 5 exponent bits (bias 15), 2 fraction bits,
 * IEEE-like (exponent 31: inf or NaN), largest 57344. Widening is exact in f32 and f64.
 * Narrowing rounds to nearest even once; past the largest value it gives e4m3's NaN (it has
 * no infinity) and e5m2's infinity, as the IEEE-style conversions of ml_dtypes and PyTorch's
 * non-saturating casts do. Halfway above the largest values: 464 (e4m3), which rounds down to
 * 448 (its code is even), and 61440 (e5m2), which rounds up (57344's is odd).
 */
/* Every e4m3 code's value, generated from the definition (fai_e4m3_to_f64 computes it;
 * tests/check_fp8.c checks both against the format written out), for the row loads: a lookup
 * per element instead of an ldexp. Its NaN is the default quiet NaN with the code's sign. */
static const float e4m3_values[256] = {
    0.0f, 0x1p-9f, 0x1p-8f, 0x1.8p-8f, 0x1p-7f, 0x1.4p-7f, 0x1.8p-7f, 0x1.cp-7f,
    0x1p-6f, 0x1.2p-6f, 0x1.4p-6f, 0x1.6p-6f, 0x1.8p-6f, 0x1.ap-6f, 0x1.cp-6f, 0x1.ep-6f,
    0x1p-5f, 0x1.2p-5f, 0x1.4p-5f, 0x1.6p-5f, 0x1.8p-5f, 0x1.ap-5f, 0x1.cp-5f, 0x1.ep-5f,
    0x1p-4f, 0x1.2p-4f, 0x1.4p-4f, 0x1.6p-4f, 0x1.8p-4f, 0x1.ap-4f, 0x1.cp-4f, 0x1.ep-4f,
    0x1p-3f, 0x1.2p-3f, 0x1.4p-3f, 0x1.6p-3f, 0x1.8p-3f, 0x1.ap-3f, 0x1.cp-3f, 0x1.ep-3f,
    0x1p-2f, 0x1.2p-2f, 0x1.4p-2f, 0x1.6p-2f, 0x1.8p-2f, 0x1.ap-2f, 0x1.cp-2f, 0x1.ep-2f,
    0x1p-1f, 0x1.2p-1f, 0x1.4p-1f, 0x1.6p-1f, 0x1.8p-1f, 0x1.ap-1f, 0x1.cp-1f, 0x1.ep-1f,
    0x1p0f, 0x1.2p0f, 0x1.4p0f, 0x1.6p0f, 0x1.8p0f, 0x1.ap0f, 0x1.cp0f, 0x1.ep0f,
    0x1p1f, 0x1.2p1f, 0x1.4p1f, 0x1.6p1f, 0x1.8p1f, 0x1.ap1f, 0x1.cp1f, 0x1.ep1f,
    0x1p2f, 0x1.2p2f, 0x1.4p2f, 0x1.6p2f, 0x1.8p2f, 0x1.ap2f, 0x1.cp2f, 0x1.ep2f,
    0x1p3f, 0x1.2p3f, 0x1.4p3f, 0x1.6p3f, 0x1.8p3f, 0x1.ap3f, 0x1.cp3f, 0x1.ep3f,
    0x1p4f, 0x1.2p4f, 0x1.4p4f, 0x1.6p4f, 0x1.8p4f, 0x1.ap4f, 0x1.cp4f, 0x1.ep4f,
    0x1p5f, 0x1.2p5f, 0x1.4p5f, 0x1.6p5f, 0x1.8p5f, 0x1.ap5f, 0x1.cp5f, 0x1.ep5f,
    0x1p6f, 0x1.2p6f, 0x1.4p6f, 0x1.6p6f, 0x1.8p6f, 0x1.ap6f, 0x1.cp6f, 0x1.ep6f,
    0x1p7f, 0x1.2p7f, 0x1.4p7f, 0x1.6p7f, 0x1.8p7f, 0x1.ap7f, 0x1.cp7f, 0x1.ep7f,
    0x1p8f, 0x1.2p8f, 0x1.4p8f, 0x1.6p8f, 0x1.8p8f, 0x1.ap8f, 0x1.cp8f, NAN,
    -0.0f, -0x1p-9f, -0x1p-8f, -0x1.8p-8f, -0x1p-7f, -0x1.4p-7f, -0x1.8p-7f, -0x1.cp-7f,
    -0x1p-6f, -0x1.2p-6f, -0x1.4p-6f, -0x1.6p-6f, -0x1.8p-6f, -0x1.ap-6f, -0x1.cp-6f, -0x1.ep-6f,
    -0x1p-5f, -0x1.2p-5f, -0x1.4p-5f, -0x1.6p-5f, -0x1.8p-5f, -0x1.ap-5f, -0x1.cp-5f, -0x1.ep-5f,
    -0x1p-4f, -0x1.2p-4f, -0x1.4p-4f, -0x1.6p-4f, -0x1.8p-4f, -0x1.ap-4f, -0x1.cp-4f, -0x1.ep-4f,
    -0x1p-3f, -0x1.2p-3f, -0x1.4p-3f, -0x1.6p-3f, -0x1.8p-3f, -0x1.ap-3f, -0x1.cp-3f, -0x1.ep-3f,
    -0x1p-2f, -0x1.2p-2f, -0x1.4p-2f, -0x1.6p-2f, -0x1.8p-2f, -0x1.ap-2f, -0x1.cp-2f, -0x1.ep-2f,
    -0x1p-1f, -0x1.2p-1f, -0x1.4p-1f, -0x1.6p-1f, -0x1.8p-1f, -0x1.ap-1f, -0x1.cp-1f, -0x1.ep-1f,
    -0x1p0f, -0x1.2p0f, -0x1.4p0f, -0x1.6p0f, -0x1.8p0f, -0x1.ap0f, -0x1.cp0f, -0x1.ep0f,
    -0x1p1f, -0x1.2p1f, -0x1.4p1f, -0x1.6p1f, -0x1.8p1f, -0x1.ap1f, -0x1.cp1f, -0x1.ep1f,
    -0x1p2f, -0x1.2p2f, -0x1.4p2f, -0x1.6p2f, -0x1.8p2f, -0x1.ap2f, -0x1.cp2f, -0x1.ep2f,
    -0x1p3f, -0x1.2p3f, -0x1.4p3f, -0x1.6p3f, -0x1.8p3f, -0x1.ap3f, -0x1.cp3f, -0x1.ep3f,
    -0x1p4f, -0x1.2p4f, -0x1.4p4f, -0x1.6p4f, -0x1.8p4f, -0x1.ap4f, -0x1.cp4f, -0x1.ep4f,
    -0x1p5f, -0x1.2p5f, -0x1.4p5f, -0x1.6p5f, -0x1.8p5f, -0x1.ap5f, -0x1.cp5f, -0x1.ep5f,
    -0x1p6f, -0x1.2p6f, -0x1.4p6f, -0x1.6p6f, -0x1.8p6f, -0x1.ap6f, -0x1.cp6f, -0x1.ep6f,
    -0x1p7f, -0x1.2p7f, -0x1.4p7f, -0x1.6p7f, -0x1.8p7f, -0x1.ap7f, -0x1.cp7f, -0x1.ep7f,
    -0x1p8f, -0x1.2p8f, -0x1.4p8f, -0x1.6p8f, -0x1.8p8f, -0x1.ap8f, -0x1.cp8f, -NAN,
};

double fai_e4m3_to_f64(uint8_t c)
{
    const int sign = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return sign ? -NAN : NAN;
    const double a = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return sign ? -a : a;
}

/* e5m2 is the top byte of an f16 (the same exponent bias, two of its ten fraction bits): its
 * value is that f16's, NaN payloads converted as f16's are (the vector kernels do the same). */
double fai_e5m2_to_f64(uint8_t c) { return f16_to_f32((uint16_t)(c << 8)); }

uint8_t fai_f64_to_e4m3(double x)
{
    const uint8_t sign = signbit(x) ? 0x80u : 0;
    const double a = fabs(x);
    if (isnan(x) || a > 464.0) /* 464, halfway from 448, rounds to 448's even code */
        return sign | 0x7fu;
    return sign | (uint8_t)encode_exact(round_to_format(a, 3, -6), 3, -6, 7);
}

uint8_t fai_f64_to_e5m2(double x)
{
    const uint8_t sign = signbit(x) ? 0x80u : 0;
    if (isnan(x))
        return sign | 0x7fu;
    const double a = fabs(x);
    if (a >= 61440.0)
        return sign | 0x7cu;
    return sign | (uint8_t)encode_exact(round_to_format(a, 2, -14), 2, -14, 15);
}

/* f32 -> bf16, ties to even, by integer arithmetic on the bits (same result as above). */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet the NaN, keep its sign */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n elements (a multiple of 32) of blocks of format d dequantized into dst (core/quant.h). */
static void load_blocks(const uint8_t *src, fa_dtype d, int64_t n, float *dst)
{
    for (int64_t p = 0; p < n; p += FAI_QBLOCK) {
        int j0;
        uint16_t h;
        const uint8_t *blk = fai_block_at(d, src, p, &j0, &h);
        const float scale = f16_to_f32(h);
        for (int j = 0; j < FAI_QBLOCK; j++)
            dst[p + j] = d == FA_Q8_0 ? fai_q8_0_value(scale, blk + 2, j)
                                      : fai_q4_0_value(scale, blk + 2, j);
    }
}

/* n finite f32 values (a multiple of 32) quantized into blocks of format d (core/quant.h). */
static void store_blocks(uint8_t *dst, fa_dtype d, int64_t n, const float *src)
{
    const int64_t bytes = fai_dtype_bytes(d, FAI_QBLOCK);
    for (int64_t b = 0; b < n / FAI_QBLOCK; b++, dst += bytes, src += FAI_QBLOCK) {
        float scale;
        if (d == FA_Q8_0)
            fai_q8_0_quantize(src, &scale, (int8_t *)(dst + 2));
        else
            fai_q4_0_quantize(src, &scale, dst + 2);
        const uint16_t h = fai_f64_to_f16(scale);
        dst[0] = (uint8_t)(h & 255);
        dst[1] = (uint8_t)(h >> 8);
    }
}

void fai_load_f32(const void *src, fa_dtype d, int64_t n, float *dst)
{
    switch (d) {
    case FA_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case FA_F64:
        /* A narrowing load; no path of the library takes it (f64 storage computes in f64),
         * but the function stays total over fa_dtype. */
        for (int64_t i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i];
        break;
    case FA_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case FA_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case FA_BOOL: /* a keep-mask, as the bias it is: 0 where it keeps, -inf where it masks */
        for (int64_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i] ? 0 : -INFINITY;
        break;
    case FA_E4M3:
        for (int64_t i = 0; i < n; i++) dst[i] = e4m3_values[((const uint8_t *)src)[i]];
        break;
    case FA_E5M2:
        for (int64_t i = 0; i < n; i++) dst[i] = fai_e5m2_to_f64(((const uint8_t *)src)[i]);
        break;
    case FA_Q8_0:
    case FA_Q4_0: load_blocks(src, d, n, dst); break;
    }
}

void fai_load_f64(const void *src, fa_dtype d, int64_t n, double *dst)
{
    switch (d) {
    case FA_F64: memcpy(dst, src, (size_t)n * sizeof(double)); break;
    case FA_F32:
        for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i];
        break;
    case FA_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case FA_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case FA_BOOL: /* a keep-mask, as the bias it is: 0 where it keeps, -inf where it masks */
        for (int64_t i = 0; i < n; i++) dst[i] = ((const uint8_t *)src)[i] ? 0 : -INFINITY;
        break;
    case FA_E4M3:
        for (int64_t i = 0; i < n; i++) dst[i] = e4m3_values[((const uint8_t *)src)[i]];
        break;
    case FA_E5M2:
        for (int64_t i = 0; i < n; i++) dst[i] = fai_e5m2_to_f64(((const uint8_t *)src)[i]);
        break;
    case FA_Q8_0:
    case FA_Q4_0: { /* the values are f32's (core/quant.h): through f32, exactly */
        float x[256];
        for (int64_t i = 0; i < n; i += 256) {
            const int64_t m = n - i < 256 ? n - i : 256;
            load_blocks((const uint8_t *)src + fai_dtype_bytes(d, i), d, m, x);
            for (int64_t e = 0; e < m; e++) dst[i + e] = x[e];
        }
        break;
    }
    }
}

void fai_store_f32(void *dst, fa_dtype d, int64_t n, const float *src)
{
    switch (d) {
    case FA_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case FA_F64:
        for (int64_t i = 0; i < n; i++) ((double *)dst)[i] = src[i];
        break;
    case FA_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fai_f64_to_f16(src[i]);
        break;
    case FA_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = f32_to_bf16(src[i]);
        break;
    case FA_BOOL: /* the inverse of the load: -inf masks (0), anything else keeps (1) */
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = src[i] != -INFINITY;
        break;
    case FA_E4M3: /* from f32 exactly widened: one rounding */
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fai_f64_to_e4m3(src[i]);
        break;
    case FA_E5M2:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fai_f64_to_e5m2(src[i]);
        break;
    case FA_Q8_0:
    case FA_Q4_0: store_blocks(dst, d, n, src); break;
    }
}

void fai_store_f64(void *dst, fa_dtype d, int64_t n, const double *src)
{
    switch (d) {
    case FA_F64: memcpy(dst, src, (size_t)n * sizeof(double)); break;
    case FA_F32:
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)src[i];
        break;
    case FA_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fai_f64_to_f16(src[i]);
        break;
    case FA_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fai_f64_to_bf16(src[i]);
        break;
    case FA_BOOL:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = src[i] != -INFINITY;
        break;
    case FA_E4M3:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fai_f64_to_e4m3(src[i]);
        break;
    case FA_E5M2:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = fai_f64_to_e5m2(src[i]);
        break;
    case FA_Q8_0:
    case FA_Q4_0: { /* ggml quantizes f32 values: each rounded to f32 first */
        float x[256];
        for (int64_t i = 0; i < n; i += 256) {
            const int64_t m = n - i < 256 ? n - i : 256;
            for (int64_t e = 0; e < m; e++) x[e] = (float)src[i + e];
            store_blocks((uint8_t *)dst + fai_dtype_bytes(d, i), d, m, x);
        }
        break;
    }
    }
}
