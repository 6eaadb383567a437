/*
 * The kernel tables: what a kernel set supplies to the tiled backend, and everything the
 * framework needs to know about it. The framework (simd/gemm.c, backends/tiled/) owns the
 * loops, tiling and edges; a set supplies a register-blocked GEMM micro-kernel of MR x NR (A
 * row-major or stored transposed, with a fused row scale of C on load or store) and the
 * vector operations around it: exp-and-sum, max, transposes, column dots, the backward's row,
 * a finiteness test, storage conversions. The vector sets write the loops around their
 * register blocks once, in simd/drivers_tpl.h. The ISA registry (simd/isas.def) lists the f32
 * sets; f64 storage has one portable set (simd/f64.c).
 *
 * Naming follows XNNPACK's order (dtype, op, tile, ISA): fa_f32_gemm_ukernel_12x32__avx512;
 * a table names each of its functions by the identifier it holds (FAI_KERNEL below).
 * Summation order is part of each kernel's contract: C[i][j] accumulates A[i][p] B[p][j] for
 * p = 0, 1, ..., k-1 in that order, one multiply-add rounded to the compute type each (fused,
 * or formed in double by the scalar set), so k split over calls gives the same bits; expsum's
 * sum is a fixed function of n. Results therefore never depend on the thread count.
 */
#ifndef FAI_SIMD_KERNELS_H
#define FAI_SIMD_KERNELS_H

#include <stdint.h>

#include "flashattn.h"

/* A table slot: the function, and its name for fa_context_describe and the tests. */
#define FAI_SLOT(type, slot)                                                                    \
    type slot;                                                                                  \
    const char *slot##_name
/* Fills a slot from the function's identifier, so the name cannot drift from the function:
 * in an initializer, and in a table filled at run time. */
#define FAI_KERNEL(slot, fn) .slot = fn, .slot##_name = #fn
#define FAI_SET_KERNEL(table, slot, fn) ((table).slot = fn, (table).slot##_name = #fn)

/*
 * C[mr x nr] (+)= A[mr x k] B[k x nr], all row-major with leading dimensions lda, ldb, ldc;
 * 1 <= mr <= MR, 1 <= nr <= NR. accumulate = 0 overwrites C. cscale (NULL or mr factors)
 * multiplies row i by cscale[i], one rounded product per element: with accumulate, C's row
 * before the sum (the online softmax's rescale of acc, fused into the load of C); without,
 * the finished product before the store (the score scale, fused into the store of S).
 * gemm_at reads A stored transposed: A[i][p] at a[p lda + i].
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
 * double (lse is large where logits are), and ds[c] = scale dS with dS = P (dp[c] - di), the
 * formula of core/gradient.h (z = 1, no cap) in vectors. */
typedef void (*fai_dsoftmax_f32)(int64_t n, const float *s, double lse, const float *dp, float di,
                                 float scale, float *p, float *ds);

/* dst[i] = src[i] widened exactly from storage dtype d (f16, bf16: vector conversions; the
 * other dtypes go to the portable fai_load_f32, whose signature this is). */
typedef void (*fai_widen_f32)(const void *src, fa_dtype d, int64_t n, float *dst);

/* dst[i] = src[i] rounded to storage dtype d, to nearest even (vector conversions where the
 * set has them; the other dtypes go to the portable fai_store_f32, whose signature this is).
 * A NaN stays a NaN (its payload may not). */
typedef void (*fai_narrow_f32)(void *dst, fa_dtype d, int64_t n, const float *src);

/* Whether x[0 .. n) holds no inf and no NaN. */
typedef int (*fai_finite_f32)(int64_t n, const float *x);

/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (packs K^T, V^T, dO^T, O^T). */
typedef void (*fai_transpose_f32)(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                  float *dst, int64_t ldd);

/* y[i] = exp(x[i] - m) for i < n; returns the sum of the y[i] in a fixed order. */
typedef float (*fai_expsum_f32)(int64_t n, const float *x, float m, float *y);

/* max x[i] for i < n by core's NaN-sticky max (core/fmath.h): NaN if any x[i] is NaN, -inf
 * for n = 0. */
typedef float (*fai_max_f32)(int64_t n, const float *x);

/*
 * Decode's two products: a few query rows (a GQA group's rows of one kv head) against keys
 * read where they are stored, f32, f16 or bf16, widened exactly as they are loaded, so that no
 * packing pass reads K or V before the product does (backends/tiled/decode.c). Any nr >= 1;
 * key c's row is at k + c ldk (v + c ldv) elements of storage dtype kd (vd).
 *
 * dot_rows: s[r lds + c] = sum_p q[r ldq + p] k_c[p] over p < d, for r < nr, c < n, then times
 * *scale (one rounded product) when scale is not NULL. The order of the sum is a fixed
 * function of d, the same for every r and c whatever nr and n are (each set states it), so a
 * score's bits do not depend on how rows or keys are grouped into calls.
 * pv_rows: acc[r lda + p] += sum_c p[r ldp + c] v_c[p] for r < nr, p < dv, c = 0 .. n-1 in
 * that order, one multiply-add rounded to float each (fused, or formed in double by the
 * scalar set): n split over calls, or rows grouped differently, gives the same bits.
 */
typedef void (*fai_dot_rows_f32)(int64_t nr, int64_t n, int64_t d, const float *q, int64_t ldq,
                                 const void *k, int64_t ldk, fa_dtype kd, float *s, int64_t lds,
                                 const float *scale);
typedef void (*fai_pv_rows_f32)(int64_t nr, int64_t n, int64_t dv, const float *p, int64_t ldp,
                                const void *v, int64_t ldv, fa_dtype vd, float *acc,
                                int64_t lda);

/*
 * Tile products for bf16 storage (AMX's tiles, or AVX512_BF16's dot products in register
 * panels): the forward's S = Q K^T and O += P V and the backward's five products on bf16
 * operands (simd/amx.c and simd/avx512bf16.c have the formats, the rounding, and where
 * subnormals differ from the f32 kernels). NULL in every other set. The tiled
 * forward uses them for bf16 storage with Dqk a multiple of dqk_step and Dv of dv_step, P V
 * only over V tiles without inf or NaN (a masked key's exact 0 of P times an infinite v would
 * give NaN); the backward with both head dims multiples of dqk_step (backends/tiled/plan.c).
 */
/* K rows j < n (row stride ldk elements), d dims, into K^T as pairs along d, ldt columns */
typedef void (*fai_pack_kt_bf16)(int64_t n, int64_t d, const uint16_t *k, int64_t ldk,
                                 uint16_t *kt, int64_t ldt);
/* V rows j < n, zero rows up to nk (a multiple of keys), into pairs of keys */
typedef void (*fai_pack_v_bf16)(int64_t n, int64_t nk, int64_t dv, const uint16_t *v,
                                int64_t ldv, uint16_t *vt);
/* S rows [0, m) (rounded up to `rows`: q and s hold that many), columns [c0, c1) (rounded out
 * to 16, within ldt and lds) = Q K^T, times *scale when scale is not NULL (the rows and
 * columns beyond those are written too, and are junk) */
typedef void (*fai_qk_bf16)(int64_t m, int64_t c0, int64_t c1, int64_t d, const uint16_t *q,
                            int64_t ldq, const uint16_t *kt, int64_t ldt, float *s, int64_t lds,
                            const float *scale);
/* P for the tile products: p[c] = exp(y - m) rounded to bf16 (to nearest even) with
 * y = fl(scale x[c]) (scale 1: x as it is), c < n, m no less than any y (the forward's m is
 * its row's largest), and the f32 sum of the values before rounding. The exp need not be the
 * f32 expsum's, as P is rounded right after: each value lies within 2^-17 + 2^-23 |y - m| of
 * exp(y - m) relatively, whatever m's size (the set's kernel says how), or is 0 (only where
 * exp(y - m) < 2^-124); NaN where y - m is. y is formed first, so a row that takes scale here
 * and one that stored fl(scale x) and passes scale 1 agree to the bit. p may lie over x
 * (p = (uint16_t *)x). */
typedef float (*fai_expsum_bf16)(int64_t n, const float *x, float scale, float m, uint16_t *p);
/* acc rows [0, m) = diag(a) acc + P V over the key chunks in [0, nk) (nk <= ldp: all of the
 * packed keys, so that every row gets the same chunks): P bf16 rows of ldp, every element of
 * [0, nk) read (0 where a key is not to count), m rounded up to `rows` readable rows (those past
 * m reach no row of acc); scratch holds rows x dv floats */
typedef void (*fai_pv_bf16)(int64_t m, int64_t nk, int64_t dv, const uint16_t *p, int64_t ldp,
                            const uint16_t *vt, float *acc, int64_t ldacc, const float *a,
                            void *scratch);

/* C rows [0, m), columns [0, n) (+)= A B (accumulate = 0 overwrites): A bf16 rows of lda
 * elements (k of them, a multiple of `keys`; m rounded up to `rows` readable rows), B as
 * pairs along k, ldb of them to a pair row (pack_kt's or pack_v's form), C f32 rows of ldc;
 * n a multiple of dv_step. Rows of C from m on are not touched. The backward's five products
 * (backends/tiled/backward_tpl.h). */
typedef void (*fai_gemm_bf16)(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                              const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                              int accumulate);

typedef struct fai_kernels_bf16_s {
    int64_t rows;     /* the products take query rows in blocks of this many                */
    int64_t keys;     /* ... and keys in chunks of this many (P V); K^T is packed to them    */
    int64_t dqk_step; /* Q K^T's k step: Dqk must be a multiple                              */
    int64_t dv_step;  /* P V's n step: Dv must be a multiple                                 */
    FAI_SLOT(fai_pack_kt_bf16, pack_kt);
    FAI_SLOT(fai_pack_v_bf16, pack_v);
    FAI_SLOT(fai_qk_bf16, qk);
    FAI_SLOT(fai_expsum_bf16, expsum);
    FAI_SLOT(fai_pv_bf16, pv);
    FAI_SLOT(fai_gemm_bf16, gemm);
} fai_kernels_bf16;

/* A kernel set for f32 accumulation (f32, f16 and bf16 storage). */
typedef struct fai_kernels_f32_s {
    fa_isa isa;
    int64_t mr, nr; /* the GEMM micro-kernel's tile */
    FAI_SLOT(fai_gemm_ukernel_f32, gemm);
    FAI_SLOT(fai_gemm_ukernel_f32, gemm_at);
    FAI_SLOT(fai_expsum_f32, expsum);
    FAI_SLOT(fai_max_f32, max);
    FAI_SLOT(fai_transpose_f32, transpose);
    FAI_SLOT(fai_coldot_f32, coldot);
    FAI_SLOT(fai_dsoftmax_f32, dsoftmax);
    FAI_SLOT(fai_finite_f32, finite);
    FAI_SLOT(fai_widen_f32, widen);
    FAI_SLOT(fai_narrow_f32, narrow);
    FAI_SLOT(fai_dot_rows_f32, dot_rows);
    FAI_SLOT(fai_pv_rows_f32, pv_rows);
    const fai_kernels_bf16 *bf16; /* tile products for bf16 storage, or NULL */
} fai_kernels_f32;

/* The same operations in double, for f64 storage: one portable set (simd/f64.c). */
typedef void (*fai_gemm_ukernel_f64)(int64_t mr, int64_t nr, int64_t k, const double *a,
                                     int64_t lda, const double *b, int64_t ldb, double *c,
                                     int64_t ldc, int accumulate, const double *cscale);
typedef double (*fai_expsum_f64)(int64_t n, const double *x, double m, double *y);
typedef double (*fai_max_f64)(int64_t n, const double *x);
typedef void (*fai_transpose_f64)(int64_t rows, int64_t cols, const double *src, int64_t lds,
                                  double *dst, int64_t ldd);
typedef void (*fai_coldot_f64)(int64_t n, int64_t k, const double *a, int64_t lda,
                               const double *b, int64_t ldb, double *out);
typedef void (*fai_dsoftmax_f64)(int64_t n, const double *s, double lse, const double *dp,
                                 double di, double scale, double *p, double *ds);
typedef int (*fai_finite_f64)(int64_t n, const double *x);
typedef void (*fai_widen_f64)(const void *src, fa_dtype d, int64_t n, double *dst);
typedef void (*fai_narrow_f64)(void *dst, fa_dtype d, int64_t n, const double *src);

typedef struct fai_kernels_f64_s { /* one set, never reported by name: plain slots */
    int64_t mr, nr;
    fai_gemm_ukernel_f64 gemm, gemm_at;
    fai_expsum_f64 expsum;
    fai_max_f64 max;
    fai_transpose_f64 transpose;
    fai_coldot_f64 coldot;
    fai_dsoftmax_f64 dsoftmax;
    fai_finite_f64 finite;
    fai_widen_f64 widen;
    fai_narrow_f64 narrow;
} fai_kernels_f64;

/* The sets this build carries: one accessor per line of simd/isas.def (defined only where
 * the set is built; simd/registry.c references only those), and the f64 set. */
#define FAI_ISA(name, NAME) const fai_kernels_f32 *fai_kernels_##name(void);
#include "simd/isas.def"
#undef FAI_ISA
const fai_kernels_f64 *fai_kernels_f64_portable(void);

/* simd/registry.c: whether this CPU (and OS) can run an ISA's kernels (detected once,
 * thread-safely: simd/cpu.c); the set for isa (never AUTO), or NULL if it is not built or
 * not supported here; FA_ISA_AUTO's choice, the first supported ISA in the registry's order
 * that fai_cpu_auto_takes takes (*why, where why is not NULL: the rule's reason for it, or for a
 * set it passed over on the way, else NULL); the ISA's name
 * ("invalid" for a value that is none) and the ISA of a name (FA_ISA_AUTO if none). */
int fai_cpu_supports(fa_isa isa);
const fai_kernels_f32 *fai_kernels_for(fa_isa isa);
fa_isa fai_isa_best(const char **why);
const char *fai_isa_name(fa_isa isa);
fa_isa fai_isa_from_name(const char *name);
/* The detection of each ISA (simd/cpu.c). */
#define FAI_ISA(name, NAME) int fai_cpu_##name(void);
#include "simd/isas.def"
#undef FAI_ISA
/* Whether FA_ISA_AUTO takes a set this CPU runs (else it tries the next), and why: *why is a
 * sentence naming the measurement behind the rule, or NULL for a set taken wherever it runs. */
int fai_cpu_auto_takes(fa_isa isa, const char **why);
int fai_cpu_bf16_dots_rule(int amd_family, const char **why);

/* simd/gemm.c: C[m x n] (+)= A[m x k] B[k x n] with any m, n: the framework's loop over
 * MR x NR tiles of the set's micro-kernel. cscale (m entries, or NULL) as in the micro-kernel.
 * The _at forms read A stored transposed (A[i][p] at a[p * lda + i]): the forward's Q K^T from
 * Q packed in MR-row panels (lda = MR, the score scale in cscale), the backward's P^T dO and
 * dS^T Q without forming P^T and dS^T. Each C element's bits are those of the plain form on
 * the transposed copy (same terms, same order). */
void fai_gemm_f32(const fai_kernels_f32 *kt, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                  int accumulate, const float *cscale);
void fai_gemm_at_f32(const fai_kernels_f32 *kt, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                     int accumulate, const float *cscale);
void fai_gemm_f64(const fai_kernels_f64 *kt, int64_t m, int64_t n, int64_t k, const double *a,
                  int64_t lda, const double *b, int64_t ldb, double *c, int64_t ldc,
                  int accumulate, const double *cscale);
void fai_gemm_at_f64(const fai_kernels_f64 *kt, int64_t m, int64_t n, int64_t k,
                     const double *a, int64_t lda, const double *b, int64_t ldb, double *c,
                     int64_t ldc, int accumulate, const double *cscale);

/* Portable kernels other sets reuse (simd/scalar.c). */
void fai_transpose_f32_portable(int64_t rows, int64_t cols, const float *src, int64_t lds,
                                float *dst, int64_t ldd);
int fai_finite_f32_portable(int64_t n, const float *x);
void fai_dot_rows_f32_portable(int64_t nr, int64_t n, int64_t d, const float *q, int64_t ldq,
                               const void *k, int64_t ldk, fa_dtype kd, float *s, int64_t lds,
                               const float *scale);
void fai_pv_rows_f32_portable(int64_t nr, int64_t n, int64_t dv, const float *p, int64_t ldp,
                              const void *v, int64_t ldv, fa_dtype vd, float *acc, int64_t lda);

#endif
