/*
 * The AVX-512 exp, shared by the AVX-512 set (kernels/avx512.c) and the bf16 exp of the
 * AVX512_BF16 and AMX sets (kernels/avx512bf16.c), so that the two give the same bits.
 * Include only in files built with the AVX-512 flags.
 */
#ifndef FAI_KERNELS_EXP_AVX512_H
#define FAI_KERNELS_EXP_AVX512_H

#include <immintrin.h>

#include "kernels/exp_poly.h"

/*
 * exp in 16 lanes, inline (SLEEF's vector exp is an out-of-line call per vector; this one
 * halved the time the forward spends in exp). x = n ln2 + r with n the integer nearest to
 * x log2 e (the product unrounded, inside one FMA) and r by Cody-Waite in two FMAs,
 * |r| <= ln2 / 2 (plus rounding); exp(r) by a minimax polynomial of degree 6 in Horner form
 * (kernels/exp_poly.h: 3.1e-9 relative before rounding); then 2^n by scalef, which
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
        _mm512_fmadd_round_ps(x, _mm512_set1_ps(0x1.715476p+0f), shift,
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        shift);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e43p-1f), x); /* ln2 rounded to float */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-0x1.05c61p-29f), r);       /* ln2 - that float   */
    __m512 p = _mm512_set1_ps(FAI_EXP_Q4); /* exp(r) = 1 + r + r^2 q(r): kernels/exp_poly.h */
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FAI_EXP_Q0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_scalef_ps(p, n));
}

#endif
