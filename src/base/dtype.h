/*
 * Storage dtypes (base/dtype.c): element sizes and row conversions, exact when widening and
 * rounded once to nearest even when narrowing (docs/DESIGN.md §1); and where a tensor's rows are.
 */
#ifndef FAI_BASE_DTYPE_H
#define FAI_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/quant.h"
#include "flashattn.h"

/* Bytes of one element (0 for a block format: use fai_dtype_bytes). */
size_t fai_dtype_size(fa_dtype d);

/* Whether d is a block format (FA_Q8_0, FA_Q4_0: core/quant.h), whose elements come in blocks
 * of FAI_QBLOCK; its counts and offsets in elements are whole blocks (the tensor checks). */
static inline int fai_dtype_is_block(fa_dtype d) { return d == FA_Q8_0 || d == FA_Q4_0; }

/* Bytes of n elements of d, and so the byte offset of element n of a run: n x the element
 * size, or n / FAI_QBLOCK blocks of a block format (n a multiple of FAI_QBLOCK). */
static inline int64_t fai_dtype_bytes(fa_dtype d, int64_t n)
{
    return d == FA_Q8_0   ? n / FAI_QBLOCK * FAI_Q8_0_BYTES
           : d == FA_Q4_0 ? n / FAI_QBLOCK * FAI_Q4_0_BYTES
                          : n * (int64_t)fai_dtype_size(d);
}

/* Element p of a row of blocks of format d: the address of its block (whose codes start two
 * bytes in), *j its place in the block, *scale the block's binary16 scale d as stored (its
 * two bytes little-endian: core/quant.h). Every reader of a block starts here. */
static inline const uint8_t *fai_block_at(fa_dtype d, const void *row, int64_t p, int *j,
                                          uint16_t *scale)
{
    const uint8_t *blk = (const uint8_t *)row + fai_dtype_bytes(d, p - p % FAI_QBLOCK);
    *j = (int)(p % FAI_QBLOCK);
    *scale = (uint16_t)(blk[0] | blk[1] << 8);
    return blk;
}
/* Row conversions: loads are exact; stores round to nearest even (f16/bf16 directly from the
 * source precision, never through a second rounding). FA_BOOL, a keep-mask, loads as the bias
 * it means (0 where it keeps, -inf where it masks) and stores back (-inf: 0, else 1). A block
 * format loads its dequantized values (exact) and stores by ggml's quantization of the values
 * as f32 (core/quant.h; an f64 source is rounded to f32 first, as ggml's functions take f32),
 * n a multiple of 32 and the row at a block's start; its values must be finite (the callers
 * check: the quantization of an inf or NaN is not defined). */
void fai_load_f32(const void *src, fa_dtype d, int64_t n, float *dst);
void fai_load_f64(const void *src, fa_dtype d, int64_t n, double *dst);
void fai_store_f32(void *dst, fa_dtype d, int64_t n, const float *src);
void fai_store_f64(void *dst, fa_dtype d, int64_t n, const double *src);
uint16_t fai_f64_to_f16(double x);
uint16_t fai_f64_to_bf16(double x);
double fai_f16_to_f64(uint16_t h);
double fai_bf16_to_f64(uint16_t h);
/* FP8 codes (base/dtype.c says which formats): exact widening, narrowing to nearest even. */
double fai_e4m3_to_f64(uint8_t c);
double fai_e5m2_to_f64(uint8_t c);
uint8_t fai_f64_to_e4m3(double x);
uint8_t fai_f64_to_e5m2(double x);
/* Whether d is an FP8 storage dtype. */
static inline int fai_dtype_is_fp8(fa_dtype d) { return d == FA_E4M3 || d == FA_E5M2; }

/* Address of row s of head h of batch b of t (the headdim elements are contiguous from it). */
static inline void *fai_row(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (char *)t->data +
           fai_dtype_bytes(t->dtype, b * t->batch_stride + s * t->seq_stride + h * t->head_stride);
}

/* The LSE of (b, h, row i): stored as f32 or f64. */
static inline void fai_lse_store(const fa_tensor *t, int64_t b, int64_t h, int64_t i, double x)
{
    void *p = fai_row(t, b, i, h);
    if (t->dtype == FA_F64)
        *(double *)p = x;
    else
        *(float *)p = (float)x;
}

static inline double fai_lse_load(const fa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    const void *p = fai_row(t, b, i, h);
    return t->dtype == FA_F64 ? *(const double *)p : (double)*(const float *)p;
}

#endif
