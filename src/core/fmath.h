/*
 * Elementary functions used by the score pipeline and the recurrence, one name per type for
 * host and device, and the NaN-sticky max that every row maximum of the library is made of.
 *
 * Which exp/log/tanh each path runs, exactly:
 *  - everything that calls these names on the host (core's formulas: the score pipeline's
 *    softcap, the recurrence's log, the merge; the portable f32 and f64 kernels' exp) runs
 *    SLEEF's 1.0-ULP scalar functions, so those results do not depend on the libm linked;
 *  - the vector kernels run their own exp (simd/exp_poly.h, 0.882 ULP, tested
 *    exhaustively in tests/check_kernels.c);
 *  - the reference (backends/reference.c: its softmax's exp and log) and the conventional
 *    path (backends/conventional.c: exp, log, tanh) call the C library's double functions,
 *    as the frameworks they stand for do: their last bits follow the libm (glibc's exp and log
 *    are within 1 ULP), which the tolerance rule of docs/DESIGN.md §4 is far above;
 *  - nvcc sees CUDA's own functions (and the tensor-core kernels exp2 by ex2.approx).
 */
#ifndef FAI_CORE_FMATH_H
#define FAI_CORE_FMATH_H

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__
#define fai_expf expf
#define fai_exp2f exp2f
#define fai_exp exp
#define fai_log log
#define fai_tanhf tanhf
#define fai_tanh tanh
#else
#define FA_HOST_DEVICE
#include <sleef.h>
static inline float fai_expf(float x) { return Sleef_expf_u10(x); }
static inline float fai_exp2f(float x) { return Sleef_exp2f_u10(x); }
static inline double fai_exp(double x) { return Sleef_exp_u10(x); }
static inline double fai_log(double x) { return Sleef_log_u10(x); }
static inline float fai_tanhf(float x) { return Sleef_tanhf_u10(x); }
static inline double fai_tanh(double x) { return Sleef_tanh_u10(x); }
#endif

/*
 * The running maximum of docs/DESIGN.md §1, where a NaN sticks: x if x > m or x is NaN, else m.
 * Once m is NaN every later x leaves it NaN (x > NaN is false), so one NaN score makes its row's
 * max NaN whatever comes before or after it, and the row is NaN (docs/DESIGN.md §1); fmax would
 * drop it. Start from m = -inf: a row with no score, or only -inf ones, has max -inf.
 */
FA_HOST_DEVICE static inline float fai_nanmax_f32(float m, float x)
{
    return x > m || x != x ? x : m;
}

FA_HOST_DEVICE static inline double fai_nanmax_f64(double m, double x)
{
    return x > m || x != x ? x : m;
}

#endif
