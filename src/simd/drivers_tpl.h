/*
 * The vector sets' row drivers, written once: the loops, edges and dispatch around an ISA's
 * register blocks, as simd/gemm.c is the loop around their GEMM micro-kernels. Included once
 * by simd/avx2.c, avx512.c and neon.c, after their blocks; it defines the kernels below (each
 * `static`, named by the includer, so that the name the table carries, and
 * fa_context_describe prints, stands in the ISA's file):
 *
 *   gemm, gemm_at      the micro-kernels: a switch over the row counts (simd/gemm.c tiles C)
 *   coldot, dsoftmax   whole vectors of FAI_DRV_LANES columns, then one partial vector
 *   dot_rows           (decode's scores) key groups x row groups of up to 4, per dtype
 *   pv_rows            (decode's P V) key chunks x dim blocks x row groups of up to 4, per dtype
 *
 * Every block is always_inline and takes what shapes its code as compile-time constants: the
 * storage dtype D, the row count ROWS (a switch instantiates 1 to 4, so that every loop over
 * rows unrolls and the accumulators stay in registers: with a variable count the compiler
 * keeps them in memory, see the AVX-512 GEMM kernel) and whether the block is whole (FULL,
 * WHOLE: loads and stores without a mask or a staged copy). A partial block learns its valid
 * lanes from a tail value (below). What the blocks compute, and so every bit, is the set's:
 * the drivers only choose which block runs where, in an order that no sum depends on.
 *
 * The includer defines:
 *   FAI_DRV_ISA          its suffix (avx512): the blocks are FAI_DRV_FN(name), name__avx512
 *   FAI_DRV_LANES        floats in a vector
 *   FAI_DRV_TAIL         optional: the type of a tail value, and FAI_DRV_TAIL_OF(left) the value
 *                        for `left` valid lanes of a vector (any left: <= 0 none, >= LANES
 *                        all), which tests false where no lane is valid; without them, the
 *                        count itself clamped to [0, LANES] (int64_t)
 *   FAI_DRV_GEMM         the GEMM micro-kernel's name (fa_f32_gemm_ukernel_MRxNR__isa), and
 *   FAI_DRV_GEMM_AT      the gemm_at one's; both take their rows from
 *   FAI_DRV_MR           MR (a literal from 1 to 12, or a macro that is one) rows, by the block
 *                        gemm_rows(ROWS, A_T, nr, k, a, lda, b, ldb, c, ldc, accumulate,
 *                        cscale): the kernel's contract (kernels.h) for mr = ROWS, A read
 *                        transposed where A_T
 *   FAI_DRV_GEMM_NR      optional: NR, where the block takes whole tiles apart, gemm_rows(ROWS,
 *                        A_T, FULL, nr, ...) with FULL (nr = NR) a constant (the AVX-512 block:
 *                        no masks); done here, not by an always_inline wrapper in the set's
 *                        file, which moved the AVX-512 gemm_at's register allocation
 *   FAI_DRV_COLDOT       the coldot kernel's name; its block coldot_cols(FULL, tail, k, a, lda,
 *                        b, ldb, out): out[j] = sum_p a[p lda + j] b[p ldb + j] for the valid
 *                        lanes j of one vector
 *   FAI_DRV_DSOFTMAX     the dsoftmax kernel's name; its block dsoftmax_vec(FULL, tail, s, lse,
 *                        dp, di, scale, p, ds): the valid lanes of one vector
 *   FAI_DRV_DOT_ROWS     the dot_rows kernel's name (fa_f32_dot_rows_4xK__isa), and
 *   FAI_DRV_DOT_KEYS     K, the keys of its block dot_block(D, ROWS, WHOLE, nc, d, q, ldq, k,
 *                        kb, s, lds, scale): s[r lds + c] = q_r . k_c (times *scale) for
 *                        r < ROWS, c < nc <= K (WHOLE: nc = K), key c's row at k + c kb bytes;
 *                        its order of the sum over d is the set's, stated where it is defined
 *   FAI_DRV_PV_ROWS      the pv_rows kernel's name (fa_f32_pv_rows_4xP__isa), and
 *   FAI_DRV_PV_VECS      the vectors of its block (P = VECS LANES dims) pv_block(D, FULL, ROWS,
 *                        tail, n, p, ldp, v, vb, p0, acc, lda): acc rows r < ROWS, dims
 *                        [p0, p0 + P) += P V over keys [0, n) in order, tail[x] the valid lanes
 *                        of vector x (FULL: all of them), V's row c at v + c vb bytes
 */

#define FAI_DRV_PASTE_(name, isa) name##__##isa
#define FAI_DRV_PASTE(name, isa) FAI_DRV_PASTE_(name, isa)
#define FAI_DRV_FN(name) FAI_DRV_PASTE(name, FAI_DRV_ISA)

#ifndef FAI_DRV_TAIL
#define FAI_DRV_TAIL int64_t
#define FAI_DRV_TAIL_OF(left)                                                                   \
    ((left) >= FAI_DRV_LANES ? (int64_t)FAI_DRV_LANES : (left) <= 0 ? (int64_t)0 : (left))
#endif

/* ---------------------------------------------------------------- the GEMM micro-kernels */

/* C(1, A) C(2, A) ... C(n, A): FAI_DRV_UPTO(n)(C, A), n a literal from 1 to 12. */
#define FAI_DRV_CAT_(a, b) a##b
#define FAI_DRV_CAT(a, b) FAI_DRV_CAT_(a, b)
#define FAI_DRV_UPTO(n) FAI_DRV_CAT(FAI_DRV_UPTO_, n)
#define FAI_DRV_UPTO_1(C, A) C(1, A)
#define FAI_DRV_UPTO_2(C, A) FAI_DRV_UPTO_1(C, A) C(2, A)
#define FAI_DRV_UPTO_3(C, A) FAI_DRV_UPTO_2(C, A) C(3, A)
#define FAI_DRV_UPTO_4(C, A) FAI_DRV_UPTO_3(C, A) C(4, A)
#define FAI_DRV_UPTO_5(C, A) FAI_DRV_UPTO_4(C, A) C(5, A)
#define FAI_DRV_UPTO_6(C, A) FAI_DRV_UPTO_5(C, A) C(6, A)
#define FAI_DRV_UPTO_7(C, A) FAI_DRV_UPTO_6(C, A) C(7, A)
#define FAI_DRV_UPTO_8(C, A) FAI_DRV_UPTO_7(C, A) C(8, A)
#define FAI_DRV_UPTO_9(C, A) FAI_DRV_UPTO_8(C, A) C(9, A)
#define FAI_DRV_UPTO_10(C, A) FAI_DRV_UPTO_9(C, A) C(10, A)
#define FAI_DRV_UPTO_11(C, A) FAI_DRV_UPTO_10(C, A) C(11, A)
#define FAI_DRV_UPTO_12(C, A) FAI_DRV_UPTO_11(C, A) C(12, A)

/* The exported kernels, A row-major (gemm) or stored transposed (gemm_at): a switch over the
 * row counts 1 to MR, so that every instance of the set's block has constant loop bounds (the
 * micro-kernel's contract, 1 <= mr <= MR, leaves no other case). */
#ifdef FAI_DRV_GEMM_NR
#define FAI_DRV_GEMM_CASE(r, A_T)                                                               \
    case r:                                                                                     \
        if (nr == FAI_DRV_GEMM_NR)                                                              \
            FAI_DRV_FN(gemm_rows)(r, A_T, 1, FAI_DRV_GEMM_NR, k, a, lda, b, ldb, c, ldc,        \
                                  accumulate, cscale);                                          \
        else                                                                                    \
            FAI_DRV_FN(gemm_rows)(r, A_T, 0, nr, k, a, lda, b, ldb, c, ldc, accumulate,         \
                                  cscale);                                                      \
        break;
#else
#define FAI_DRV_GEMM_CASE(r, A_T)                                                               \
    case r:                                                                                     \
        FAI_DRV_FN(gemm_rows)(r, A_T, nr, k, a, lda, b, ldb, c, ldc, accumulate, cscale);       \
        break;
#endif
#define FAI_DRV_GEMM_UKERNEL(name, A_T)                                                         \
    static void name(int64_t mr, int64_t nr, int64_t k, const float *a, int64_t lda,            \
                     const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,        \
                     const float *cscale)                                                       \
    {                                                                                           \
        switch (mr) { FAI_DRV_UPTO(FAI_DRV_MR)(FAI_DRV_GEMM_CASE, A_T) }                        \
    }
FAI_DRV_GEMM_UKERNEL(FAI_DRV_GEMM, 0)
FAI_DRV_GEMM_UKERNEL(FAI_DRV_GEMM_AT, 1)
#undef FAI_DRV_GEMM_UKERNEL
#undef FAI_DRV_GEMM_CASE

/* ---------------------------------------------------------------- the backward's rows */

static void FAI_DRV_COLDOT(int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float *out)
{
    int64_t j = 0;
    for (; j + FAI_DRV_LANES <= n; j += FAI_DRV_LANES)
        FAI_DRV_FN(coldot_cols)(1, FAI_DRV_TAIL_OF(FAI_DRV_LANES), k, a + j, lda, b + j, ldb,
                                out + j);
    if (j < n)
        FAI_DRV_FN(coldot_cols)(0, FAI_DRV_TAIL_OF(n - j), k, a + j, lda, b + j, ldb, out + j);
}

static void FAI_DRV_DSOFTMAX(int64_t n, const float *s, double lse, const float *dp, float di,
                             float scale, float *p, float *ds)
{
    int64_t c = 0;
    for (; c + FAI_DRV_LANES <= n; c += FAI_DRV_LANES)
        FAI_DRV_FN(dsoftmax_vec)(1, FAI_DRV_TAIL_OF(FAI_DRV_LANES), s + c, lse, dp + c, di,
                                 scale, p + c, ds + c);
    if (c < n)
        FAI_DRV_FN(dsoftmax_vec)(0, FAI_DRV_TAIL_OF(n - c), s + c, lse, dp + c, di, scale,
                                 p + c, ds + c);
}

/* ---------------------------------------------------------------- decode's products */

/* BLOCK(ROWS) for the `left` rows still to do, at most 4, ROWS a constant in each case. */
#define FAI_DRV_ROWS_SWITCH(left, BLOCK)                                                        \
    switch ((left) < 4 ? (left) : 4) {                                                          \
    case 1: BLOCK(1); break;                                                                    \
    case 2: BLOCK(2); break;                                                                    \
    case 3: BLOCK(3); break;                                                                    \
    default: BLOCK(4); break;                                                                   \
    }

/* Keys in groups of K (a whole group's block takes K as a constant), rows in groups of 4. */
static inline __attribute__((always_inline)) void
dot_rows_dtype(const fa_dtype D, int64_t nr, int64_t n, int64_t d, const float *q, int64_t ldq,
               const void *k, int64_t ldk, float *s, int64_t lds, const float *scale)
{
    const int64_t kb = fai_dtype_bytes(D, ldk);
    for (int64_t c = 0; c < n; c += FAI_DRV_DOT_KEYS) {
        const int64_t nc = n - c < FAI_DRV_DOT_KEYS ? n - c : FAI_DRV_DOT_KEYS;
        const char *kc = (const char *)k + c * kb;
        for (int64_t r = 0; r < nr; r += 4) {
            const float *qr = q + r * ldq;
            float *sr = s + r * lds + c;
#define DOT_BLOCK(ROWS)                                                                         \
    (nc == FAI_DRV_DOT_KEYS                                                                     \
         ? FAI_DRV_FN(dot_block)(D, ROWS, 1, FAI_DRV_DOT_KEYS, d, qr, ldq, kc, kb, sr, lds,     \
                                 scale)                                                         \
         : FAI_DRV_FN(dot_block)(D, ROWS, 0, nc, d, qr, ldq, kc, kb, sr, lds, scale))
            FAI_DRV_ROWS_SWITCH(nr - r, DOT_BLOCK)
#undef DOT_BLOCK
        }
    }
}

/* Every K/V dtype of a decode has a vector widening that instantiates the driver: f32, f16,
 * bf16, FP8 and the block formats (every set's dot_block and pv_block take them), each widened
 * or dequantized exactly (base/dtype.c, core/quant.h), so their rows are read in an f32 row's
 * order; any other goes to the portable kernel (simd/scalar.c). */
static void FAI_DRV_DOT_ROWS(int64_t nr, int64_t n, int64_t d, const float *q, int64_t ldq,
                             const void *k, int64_t ldk, fa_dtype kd, float *s, int64_t lds,
                             const float *scale)
{
    if (kd == FA_F16)
        dot_rows_dtype(FA_F16, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else if (kd == FA_BF16)
        dot_rows_dtype(FA_BF16, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else if (kd == FA_F32)
        dot_rows_dtype(FA_F32, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else if (kd == FA_Q8_0)
        dot_rows_dtype(FA_Q8_0, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else if (kd == FA_Q4_0)
        dot_rows_dtype(FA_Q4_0, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else if (kd == FA_E4M3)
        dot_rows_dtype(FA_E4M3, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else if (kd == FA_E5M2)
        dot_rows_dtype(FA_E5M2, nr, n, d, q, ldq, k, ldk, s, lds, scale);
    else
        fai_dot_rows_f32_portable(nr, n, d, q, ldq, k, ldk, kd, s, lds, scale);
}

/* keys per pass over the dims: 64 rows of V (16 KiB of f32) stay in L1 */
#define FAI_DRV_PV_KEYS 64
#define FAI_DRV_PV_DIMS (FAI_DRV_PV_VECS * FAI_DRV_LANES)

/* Keys in chunks of FAI_DRV_PV_KEYS, each over the dims in blocks of P (a block's tails
 * computed once for all its row groups; only the last block can be partial), rows in groups
 * of 4. Every acc element still takes its keys in order: a chunk's keys, then the next's. */
static inline __attribute__((always_inline)) void
pv_rows_dtype(const fa_dtype D, int64_t nr, int64_t n, int64_t dv, const float *p, int64_t ldp,
              const void *v, int64_t ldv, float *acc, int64_t lda)
{
    const int64_t vb = fai_dtype_bytes(D, ldv);
    for (int64_t c = 0; c < n; c += FAI_DRV_PV_KEYS) {
        const int64_t nc = n - c < FAI_DRV_PV_KEYS ? n - c : FAI_DRV_PV_KEYS;
        const char *vc = (const char *)v + c * vb;
        for (int64_t p0 = 0; p0 < dv; p0 += FAI_DRV_PV_DIMS) {
            FAI_DRV_TAIL tail[FAI_DRV_PV_VECS];
            for (int x = 0; x < FAI_DRV_PV_VECS; x++)
                tail[x] = FAI_DRV_TAIL_OF(dv - p0 - FAI_DRV_LANES * x);
            const int full = dv - p0 >= FAI_DRV_PV_DIMS;
            for (int64_t r = 0; r < nr; r += 4) {
                const float *pr = p + r * ldp + c;
                float *ar = acc + r * lda;
#define PV_BLOCK(ROWS)                                                                          \
    (full ? FAI_DRV_FN(pv_block)(D, 1, ROWS, tail, nc, pr, ldp, vc, vb, p0, ar, lda)            \
          : FAI_DRV_FN(pv_block)(D, 0, ROWS, tail, nc, pr, ldp, vc, vb, p0, ar, lda))
                FAI_DRV_ROWS_SWITCH(nr - r, PV_BLOCK)
#undef PV_BLOCK
            }
        }
    }
}

static void FAI_DRV_PV_ROWS(int64_t nr, int64_t n, int64_t dv, const float *p, int64_t ldp,
                            const void *v, int64_t ldv, fa_dtype vd, float *acc, int64_t lda)
{
    if (vd == FA_F16)
        pv_rows_dtype(FA_F16, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else if (vd == FA_BF16)
        pv_rows_dtype(FA_BF16, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else if (vd == FA_F32)
        pv_rows_dtype(FA_F32, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else if (vd == FA_Q8_0)
        pv_rows_dtype(FA_Q8_0, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else if (vd == FA_Q4_0)
        pv_rows_dtype(FA_Q4_0, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else if (vd == FA_E4M3)
        pv_rows_dtype(FA_E4M3, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else if (vd == FA_E5M2)
        pv_rows_dtype(FA_E5M2, nr, n, dv, p, ldp, v, ldv, acc, lda);
    else
        fai_pv_rows_f32_portable(nr, n, dv, p, ldp, v, ldv, vd, acc, lda);
}

#undef FAI_DRV_ROWS_SWITCH
#undef FAI_DRV_PV_KEYS
#undef FAI_DRV_PV_DIMS
#undef FAI_DRV_UPTO_1
#undef FAI_DRV_UPTO_2
#undef FAI_DRV_UPTO_3
#undef FAI_DRV_UPTO_4
#undef FAI_DRV_UPTO_5
#undef FAI_DRV_UPTO_6
#undef FAI_DRV_UPTO_7
#undef FAI_DRV_UPTO_8
#undef FAI_DRV_UPTO_9
#undef FAI_DRV_UPTO_10
#undef FAI_DRV_UPTO_11
#undef FAI_DRV_UPTO_12
#undef FAI_DRV_UPTO
#undef FAI_DRV_CAT
#undef FAI_DRV_CAT_
#undef FAI_DRV_FN
#undef FAI_DRV_PASTE
#undef FAI_DRV_PASTE_
