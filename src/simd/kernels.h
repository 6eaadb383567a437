/*
 * The kernel-table interface: what an ISA supplies to the tiled backend. The framework
 * (src/simd/gemm.c, src/tiled_tpl.h) owns the loops, tiling and edges; an ISA supplies a
 * register-blocked GEMM micro-kernel of MR x NR (A row-major or stored transposed, with a fused
 * row scale of C on load or store) and the vector operations around it: exp-and-sum, max,
 * transposes, column dots, the backward's row, a finiteness test, f16/bf16 conversions.
 *
 * Naming follows XNNPACK's order (dtype, op, tile, ISA): fa_f32_gemm_ukernel_12x32__avx512.
 * Summation order is part of each kernel's contract: C[i][j] accumulates A[i][p] B[p][j] for
 * p = 0, 1, ..., k-1 in that order, one multiply-add rounded to float each (fused, or formed in
 * double by the scalar set), so k split over calls gives the same bits; expsum's sum
 * is a fixed function of n. Results therefore never depend on the thread count.
 */
#ifndef FAI_SIMD_KERNELS_H
#define FAI_SIMD_KERNELS_H

#include <stdint.h>

#include "flashattn.h"

/*
 * C[mr x nr] (+)= A[mr x k] B[k x nr], all row-major with leading dimensions lda, ldb, ldc;
 * 1 <= mr <= MR, 1 <= nr <= NR. accumulate = 0 overwrites C. cscale (NULL or mr factors)
 * multiplies row i by cscale[i], one rounded product per element: with accumulate, C's row
 * before the sum (the online softmax's rescale of acc, fused into the load of C); without,
 * the finished product before the store (the score scale, fused into the store of S).
 */
typedef void (*fai_gemm_ukernel_f32)(int64_t mr, int64_t nr, int64_t k, const float *a,
                                     int64_t lda, const float *b, int64_t ldb, float *c,
                                     int64_t ldc, int accumulate, const float *cscale);

/* out[j] = sum_p a[p][j] b[p][j] for j < n, p = 0 .. k-1 (rows of leading dimension lda, ldb):
 * dots of columns, each rounded exactly as the GEMM kernel rounds a C element (the backward's
 * D_i = dO_i . O_i, from dO^T and O^T, must round like dP = dO V^T). */
typedef void (*fai_coldot_f32)(int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                               int64_t ldb, float *out);

/* The backward's row without dropout or softcap: p[c] = P = exp(s[c] - lse), the subtraction in
 * double (lse is large where logits are), and ds[c] = scale (P (dp[c] - di)). */
typedef void (*fai_dsoftmax_f32)(int64_t n, const float *s, double lse, const float *dp, float di,
                                 float scale, float *p, float *ds);

/* dst[i] = src[i] widened exactly from storage dtype d (f16, bf16: vector conversions; the
 * other dtypes go to the portable fai_load_f32). */
typedef void (*fai_widen_f32)(const void *src, fa_dtype d, int64_t n, float *dst);

/* dst[i] = src[i] rounded to storage dtype d, to nearest even (f16: vector conversions; the
 * other dtypes go to the portable fai_store_f32, whose signature this is). A NaN stays a NaN (its payload may not). */
typedef void (*fai_narrow_f32)(void *dst, fa_dtype d, int64_t n, const float *src);

/* Whether x[0 .. n) holds no inf and no NaN. */
typedef int (*fai_finite_f32)(int64_t n, const float *x);

/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (packs K^T, V^T, dO^T, O^T). */
typedef void (*fai_transpose_f32)(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                  float *dst, int64_t ldd);

/* y[i] = exp(x[i] - m) for i < n; returns the sum of the y[i] in a fixed order. */
typedef float (*fai_expsum_f32)(int64_t n, const float *x, float m, float *y);

/* max x[i] for i < n: NaN if any x[i] is NaN, -inf for n = 0. */
typedef float (*fai_max_f32)(int64_t n, const float *x);

/*
 * Tile products for bf16 storage (AMX): the forward's S = Q K^T and O += P V on bf16 operands
 * (simd/amx.c has the formats, the rounding, and where subnormals differ from the f32
 * kernels). NULL in every set but AMX's. The tiled
 * forward uses them for bf16 storage with Dqk a multiple of 32 and Dv of 16, P V only over V
 * tiles without inf or NaN (P = hi + lo times an infinite v would give NaN where P v is inf).
 */
typedef struct fai_kernels_bf16_s {
    const char *name;
    /* K rows j < n (row stride ldk elements), d dims, into K^T as pairs along d, ldt columns */
    void (*pack_kt)(int64_t n, int64_t d, const uint16_t *k, int64_t ldk, uint16_t *kt,
                    int64_t ldt);
    /* V rows j < n, zero rows up to nk (a multiple of 32), into pairs of keys */
    void (*pack_v)(int64_t n, int64_t nk, int64_t dv, const uint16_t *v, int64_t ldv,
                   uint16_t *vt);
    /* S rows [0, m) (rounded up to 16: q and s hold that many), columns [c0, c1) (rounded
     * out to 16, within ldt and lds) = Q K^T, times *scale when scale is not NULL (the rows
     * and columns beyond those are written too, and are junk) */
    void (*qk)(int64_t m, int64_t c0, int64_t c1, int64_t d, const uint16_t *q, int64_t ldq,
               const uint16_t *kt, int64_t ldt, float *s, int64_t lds, const float *scale);
    /* acc rows [0, m) = diag(a) acc + P[:, c0:c1] V[c0:c1], over the key chunks of 32 in
     * [0, nk) (nk <= ldp: all of the packed keys, so that every row gets the same chunks);
     * scratch holds 16 x (4 ldp + 4 dv) bytes */
    void (*pv)(int64_t m, int64_t c0, int64_t c1, int64_t nk, int64_t dv, const float *p,
               int64_t ldp, const uint16_t *vt, float *acc, int64_t ldacc, const float *a,
               void *scratch);
} fai_kernels_bf16;

typedef struct fai_kernels_f32_s {
    fa_isa isa;
    const char *gemm_name, *exp_name;
    int64_t mr, nr;
    fai_gemm_ukernel_f32 gemm, gemm_at; /* gemm_at: A stored transposed, A[i][p] at a[p lda + i] */
    fai_expsum_f32 expsum;
    fai_max_f32 max;
    fai_transpose_f32 transpose;
    fai_coldot_f32 coldot;
    fai_dsoftmax_f32 dsoftmax;
    fai_finite_f32 finite;
    fai_widen_f32 widen;
    fai_narrow_f32 narrow;
    const fai_kernels_bf16 *bf16; /* tile products for bf16 storage, or NULL */
} fai_kernels_f32;

/* The kernel sets this build carries (NULL where not built). */
extern const fai_kernels_f32 fai_kernels_f32_scalar;
const fai_kernels_f32 *fai_kernels_f32_avx2(void);
const fai_kernels_f32 *fai_kernels_f32_avx512(void);
const fai_kernels_f32 *fai_kernels_f32_neon(void);
const fai_kernels_f32 *fai_kernels_f32_amx(void);

/* Whether this CPU (and OS) can run an ISA's kernels; detected once, thread-safely. */
int fai_cpu_supports(fa_isa isa);
/* The kernel set for isa (never AUTO), or NULL if it is not built or not supported here. */
const fai_kernels_f32 *fai_kernels_f32_for(fa_isa isa);
/* Newest supported ISA first: amx, avx512, avx2, neon, scalar. */
fa_isa fai_isa_best(void);

/* C[m x n] (+)= A[m x k] B[k x n] with any m, n: the framework's loop over MR x NR tiles.
 * cscale (m entries, or NULL) as in the micro-kernel. */
void fai_gemm_f32(const fai_kernels_f32 *kt, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                  int accumulate, const float *cscale);
/* The same with A stored transposed (A[i][p] at a[p * lda + i]): the forward's Q K^T from Q
 * packed in MR-row panels (lda = MR, the score scale in cscale), the backward's P^T dO and
 * dS^T Q without forming P^T and dS^T. Each C element's bits are those of fai_gemm_f32 on the
 * transposed copy (same terms, same order). */
void fai_gemm_at_f32(const fai_kernels_f32 *kt, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                     int accumulate, const float *cscale);
/* The same in double, portable (the f64 storage path). */
void fai_gemm_f64(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda, const double *b,
                  int64_t ldb, double *c, int64_t ldc, int accumulate, const double *cscale);
void fai_gemm_at_f64(int64_t m, int64_t n, int64_t k, const double *a, int64_t lda,
                     const double *b, int64_t ldb, double *c, int64_t ldc, int accumulate,
                     const double *cscale);
/* Portable transposes: the scalar set's, and the f64 path's. */
void fai_transpose_f32_portable(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                float *dst, int64_t ldd);
void fai_transpose_f64(int64_t rows, int64_t cols, const double *src, int64_t lds, double *dst,
                       int64_t ldd);
/* Portable finiteness tests: the scalar set's, and the f64 path's. */
int fai_finite_f32_portable(int64_t n, const float *x);
int fai_finite_f64(int64_t n, const double *x);
/* The f64 path's column dots, rounded as fai_gemm_f64 rounds. */
void fai_coldot_f64(int64_t n, int64_t k, const double *a, int64_t lda, const double *b,
                    int64_t ldb, double *out);

#endif
