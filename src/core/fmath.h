/*
 * Elementary functions used by the score pipeline and the recurrence, one name per type for
 * host and device. On the host they are SLEEF's 1.0-ULP scalar functions, so results do not
 * depend on which libm the program happens to link; nvcc sees CUDA's own.
 */
#ifndef FAI_CORE_FMATH_H
#define FAI_CORE_FMATH_H

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__
#define fai_expf expf
#define fai_exp exp
#define fai_logf logf
#define fai_log log
#define fai_tanhf tanhf
#define fai_tanh tanh
#else
#define FA_HOST_DEVICE
#include <sleef.h>
static inline float fai_expf(float x) { return Sleef_expf_u10(x); }
static inline double fai_exp(double x) { return Sleef_exp_u10(x); }
static inline float fai_logf(float x) { return Sleef_logf_u10(x); }
static inline double fai_log(double x) { return Sleef_log_u10(x); }
static inline float fai_tanhf(float x) { return Sleef_tanhf_u10(x); }
static inline double fai_tanh(double x) { return Sleef_tanh_u10(x); }
#endif

#endif
