/*
 * The vector exps' polynomials. The f32 exp's, shared by the AVX-512, AVX2 and NEON kernels:
 * after the reduction x = n ln2 + r, |r| <= ln2 / 2, exp(r) = 1 + r + r^2 q(r) with q of
 * degree 4 in Horner form (six FMAs in all, where the Taylor polynomial of degree 7 took seven).
 *
 * q is the minimax fit of (exp(r) - 1 - r) / r^2 on [-ln2/2, ln2/2] weighted to the relative
 * error of exp (bench/fit_exp_poly.py: iteratively reweighted least squares in 40-digit
 * arithmetic), max relative error 3.1e-9 before the coefficients are rounded to float (the
 * Taylor polynomial's truncation was 5.2e-9). Measured over every float <= 0 in float
 * arithmetic, tests/check_kernels.c: 0.882 ULP with the AVX-512 kernel (0.937 with Taylor).
 */
#ifndef FAI_KERNELS_EXP_POLY_H
#define FAI_KERNELS_EXP_POLY_H

/* Both exps reduce by x log2(e), log2(e) rounded to float: FAI_LOG2E_F, the recurrence's own. */
#include "core/log2e.h"

#define FAI_EXP_Q4 0x1.6a243p-10f  /* ~ 1/6! */
#define FAI_EXP_Q3 0x1.1239e4p-7f  /* ~ 1/5! */
#define FAI_EXP_Q2 0x1.5558f2p-5f  /* ~ 1/4! */
#define FAI_EXP_Q1 0x1.555492p-3f  /* ~ 1/3! */
#define FAI_EXP_Q0 0x1.fffffcp-2f  /* ~ 1/2! */

/*
 * The tile products' exp for P (simd/avx512bf16.c), which rounds P to bf16 right after:
 * 2^f = 1 + f e(f) on |f| <= 1/2, e the cubic minimax fit of (2^f - 1) / f weighted to the
 * relative error of 2^f (bench/fit_exp_poly.py): 2.8e-6 (2^-18.4) before the coefficients are
 * rounded to float, against 2^-8 for the rounding to bf16.
 */
#define FAI_EXP2_E3 0x1.3a02a6p-7f /* ~ ln2^4 / 4! */
#define FAI_EXP2_E2 0x1.c9fc9cp-5f /* ~ ln2^3 / 3! */
#define FAI_EXP2_E1 0x1.ec037ap-3f /* ~ ln2^2 / 2! */
#define FAI_EXP2_E0 0x1.62e12cp-1f /* ~ ln2         */

#endif
