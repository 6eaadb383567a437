/*
 * The block formats of a quantized K/V cache (FA_Q8_0, FA_Q4_0: ggml's block_q8_0 and
 * block_q4_0, bit for bit), written once: what a block's bytes mean (the dequantized value is
 * the definition every backend computes with) and how a row of values becomes blocks (ggml's
 * reference quantization, quantize_row_q8_0_ref / quantize_row_q4_0_ref, which fa_append_kv and
 * fa_convert follow, so that a cache we append to holds the bytes llama.cpp would write).
 *
 * A block holds FAI_QBLOCK = 32 consecutive elements of a row: an IEEE binary16 scale d (the
 * first two bytes, little-endian), then the codes.
 *   q8_0 (34 bytes): q[j] int8 for j < 32; element j = d q[j].
 *   q4_0 (18 bytes): qs[16]; element j < 16 is the low nibble of qs[j], element j >= 16 the
 *                    high nibble of qs[j - 16], each an unsigned u in 0..15; element = d (u - 8).
 *
 * Exactness: d widens exactly to f32; d q is exact in f32 (|q| <= 128 has 8 significant bits,
 * d 11, and the product's 19 bits fit f32's 24; the exponent cannot leave f32's range from an
 * f16's), so a dequantized element is one f32 value, the same in f32 and f64 arithmetic, with
 * no rounding. A kernel that widens the codes and multiplies by d therefore reads the very
 * values an f32 cache holding the dequantized row would give it: a quantized cache and that
 * f32 cache give the same results bit for bit wherever the kernels sum in the same order
 * (tests/check_quant.c holds the tiled backend to this).
 */
#ifndef FAI_CORE_QUANT_H
#define FAI_CORE_QUANT_H

#include <math.h>
#include <stdint.h>

#define FAI_QBLOCK 32      /* elements of a block                                        */
#define FAI_Q8_0_BYTES 34  /* f16 d + 32 int8                                            */
#define FAI_Q4_0_BYTES 18  /* f16 d + 16 bytes of nibbles                                */

/* Element j (< 32) of a q8_0 block whose scale is d (already widened). */
static inline float fai_q8_0_value(float d, const uint8_t *codes, int j)
{
    return d * (float)(int8_t)codes[j];
}

/* Element j (< 32) of a q4_0 block whose scale is d: its nibble u, value d (u - 8). */
static inline float fai_q4_0_value(float d, const uint8_t *codes, int j)
{
    const int u = j < 16 ? codes[j] & 15 : codes[j - 16] >> 4;
    return d * (float)(u - 8);
}

/*
 * ggml's q8_0 rule for 32 f32 values x (all finite): amax = max |x_j|, d = amax / 127 (f32),
 * id = 1 / d (0 when d = 0), q_j = roundf(x_j id) (to nearest, halfway away from zero), and
 * the block stores d rounded to f16 (to nearest even). The codes come from the unrounded d,
 * as ggml forms them: *d_out is that f32 d; the caller rounds it to f16. For a normal d,
 * |x_j id| <= 127 up to a rounding of the product, whose roundf cannot pass 127.5: q_j lies in
 * [-127, 127]. A subnormal d (amax < 127 x 2^-126) has no exact reciprocal (ggml's codes there
 * overflow int8, its behaviour undefined): id is taken as 0, every code 0; the block's f16
 * scale is 0 anyway (d < 2^-25), so its values are the same zeros.
 */
static inline void fai_q8_0_quantize(const float *x, float *d_out, int8_t *q)
{
    float amax = 0.0f;
    for (int j = 0; j < FAI_QBLOCK; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = amax / 127.0f, id = isnormal(d) ? 1.0f / d : 0.0f;
    for (int j = 0; j < FAI_QBLOCK; j++)
        q[j] = (int8_t)roundf(x[j] * id);
    *d_out = d;
}

/*
 * ggml's q4_0 rule for 32 f32 values x (all finite): m = the first x_j of largest magnitude,
 * sign kept; d = m / -8 (f32), id = 1 / d (0 when d = 0); u_j = min(15, trunc(p_j + 8.5)) with
 * p_j = x_j id rounded to f32 before the sum (ggml's two statements: a fused multiply-add
 * truncates differently near integers, so the product goes through a volatile, which no
 * compiler contracts) and the truncation of ggml's (int8_t) cast (p_j + 8.5 >= 0.5 less a
 * rounding, so it is the floor, and u_j >= 0); the block stores d rounded to f16 and the u_j as
 * nibbles. m itself maps to -8 exactly (u 0), -m to 8, clamped to u 15 (7): the format's 16
 * codes are asymmetric. A subnormal d (|m| < 8 x 2^-126): id 0, every u 8, as for q8_0.
 */
static inline void fai_q4_0_quantize(const float *x, float *d_out, uint8_t *qs)
{
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < FAI_QBLOCK; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            m = x[j];
        }
    const float d = m / -8.0f, id = isnormal(d) ? 1.0f / d : 0.0f;
    for (int j = 0; j < FAI_QBLOCK / 2; j++) {
        volatile float p0 = x[j] * id, p1 = x[j + 16] * id;
        const int u0 = (int)(p0 + 8.5f), u1 = (int)(p1 + 8.5f);
        qs[j] = (uint8_t)((u0 < 15 ? u0 : 15) | (u1 < 15 ? u1 : 15) << 4);
    }
    *d_out = d;
}

#endif
