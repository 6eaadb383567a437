/*
 * AVX512_BF16 kernels: the tiled forward's two products and the backward's five for bf16
 * storage by VDPBF16PS, completing the AVX-512 set (whose f32 kernels do everything else), for
 * CPUs whose bf16 dot products outrun widening to f32 (AMD Zen 5; the rule and the
 * measurement behind it are simd/cpu.c's fai_cpu_bf16_dots_rule). Built with -mavx512bf16 and
 * the AVX-512 flags. The AMX set (simd/amx.c) takes this set's packing and exp and puts its
 * own products on tiles.
 *
 * One VDPBF16PS zmm adds to each of 16 f32 lanes the products of one pair of bf16 (a 32-bit
 * word of each operand): lane l of acc += a[2l+1] b[2l+1], then += a[2l] b[2l], each product
 * exact in f32 and each addition rounded to nearest even (Intel's definition; inputs and
 * results below 2^-126 count as 0, as on the tiles). The operands are the tile products'
 * (kernels.h): B is K^T, V or the backward's operands packed as pairs along the sum, 16
 * columns of one pair row in a zmm, and A's pair for a row is broadcast to every lane, so a
 * C element sums its pairs in order, p = 0, 1, ...: its bits depend neither on the blocking
 * nor on the thread count. They differ from the f32 path's in the last bits (one rounding per
 * product there, two per pair here), and from the tiles'.
 *
 * Every product is one loop, `panel`: rows of C in blocks of PANEL_ROWS, columns in blocks of
 * up to 16 PANEL_VECS, the accumulators in registers over the whole sum, B's column block
 * (kpairs x 64 columns, 16 KiB for Q K^T at D=128) kept in L1 while the row blocks pass.
 */
#include "config.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "simd/exp_poly.h"
#include "simd/kernels.h"

/*
 * The panel: PANEL_ROWS x 16 PANEL_VECS accumulators (16 of the 32 zmm; B's PANEL_VECS vectors
 * and a broadcast beside them), so each pair step loads 4 vectors of B and broadcasts 4 words
 * of A for 16 dot products, half a load per dot product (a Zen 5 core loads two vectors a
 * cycle). Not yet measured on a Zen 5, where AUTO takes this set (docs/notes/bf16.md).
 */
enum { PANEL_ROWS = 4, PANEL_VECS = 4 };

/*
 * c[i][16 v + l] for i < R, v < V, l < 16:
 *   start: 0 (c_in NULL), or c_in's element, times f[i] where f is not NULL (one rounding);
 *   then += a[i] pair p . b pair row p, lanes 16 v + l, for p = 0 .. kpairs - 1 in order;
 *   then times *scale where scale is not NULL (one rounding); stored to c.
 * a: R rows of lda bf16 (pair p at a + i lda + 2 p); b: pair rows 2 ldb bf16 apart (pair row
 * p, column j at b + p 2 ldb + 2 j); c_in and c rows ldc floats apart (c_in may equal c).
 * R and V are constants at every call site, so the accumulators live in registers.
 */
static inline __attribute__((always_inline)) void panel(const int R, const int V, int64_t kpairs,
                                                         const uint16_t *a, int64_t lda,
                                                         const uint16_t *b, int64_t ldb,
                                                         const float *c_in, const float *f,
                                                         const float *scale, float *c,
                                                         int64_t ldc)
{
    __m512 acc[PANEL_ROWS][PANEL_VECS];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        const __m512 fi = _mm512_set1_ps(f ? f[i] : 1.0f);
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            acc[i][v] = !c_in ? _mm512_setzero_ps()
                        : f   ? _mm512_mul_ps(_mm512_loadu_ps(c_in + i * ldc + 16 * v), fi)
                              : _mm512_loadu_ps(c_in + i * ldc + 16 * v);
    }
    for (int64_t p = 0; p < kpairs; p++) {
        const uint16_t *bp = b + p * 2 * ldb;
        __m512bh bv[PANEL_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            bv[v] = (__m512bh)_mm512_loadu_si512(bp + 32 * v);
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            uint32_t w;
            memcpy(&w, a + i * lda + 2 * p, sizeof w);
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)w);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], bv[v], ai);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale ? *scale : 1.0f);
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            _mm512_storeu_ps(c + i * ldc + 16 * v,
                             scale ? _mm512_mul_ps(acc[i][v], sc) : acc[i][v]);
}

/* panel() with R in 1 .. PANEL_ROWS and V in 1 .. PANEL_VECS as constants: one instance each
 * (any other shape is a caller's broken contract: n not a multiple of 16). */
static void panel_any(int R, int V, int64_t kpairs, const uint16_t *a, int64_t lda,
                      const uint16_t *b, int64_t ldb, const float *c_in, const float *f,
                      const float *scale, float *c, int64_t ldc)
{
#define PANEL_CASE(r, v)                                                                        \
    case (r) * 8 + (v):                                                                         \
        panel(r, v, kpairs, a, lda, b, ldb, c_in, f, scale, c, ldc);                            \
        return;
#define PANEL_ROW(r) PANEL_CASE(r, 1) PANEL_CASE(r, 2) PANEL_CASE(r, 3) PANEL_CASE(r, 4)
    switch (R * 8 + V) {
        PANEL_ROW(1)
        PANEL_ROW(2)
        PANEL_ROW(3)
        PANEL_ROW(4)
    default:
        abort();
    }
#undef PANEL_ROW
#undef PANEL_CASE
}

/*
 * C rows [0, m), columns [0, n) (n a multiple of 16) over kpairs pairs, column blocks of 64
 * outside, row blocks of PANEL_ROWS inside (B's block stays in L1 while A's rows pass), a last
 * partial row block by a narrower panel: rows of C from m on are neither read nor written.
 * c_in, f and scale as in panel(), f indexed by row.
 */
static void product(int64_t m, int64_t n, int64_t kpairs, const uint16_t *a, int64_t lda,
                    const uint16_t *b, int64_t ldb, const float *c_in, const float *f,
                    const float *scale, float *c, int64_t ldc)
{
    for (int64_t j = 0; j < n; j += 16 * PANEL_VECS) {
        const int V = (n - j) / 16 < PANEL_VECS ? (int)((n - j) / 16) : PANEL_VECS;
        for (int64_t r = 0; r < m; r += PANEL_ROWS) {
            const int R = m - r < PANEL_ROWS ? (int)(m - r) : PANEL_ROWS;
            panel_any(R, V, kpairs, a + r * lda, lda, b + 2 * j, ldb,
                      c_in ? c_in + r * ldc + j : NULL, f ? f + r : NULL, scale,
                      c + r * ldc + j, ldc);
        }
    }
}

/* kt[(p ldt + j) 2 + t] = k[j ldk + 2 p + t] for j < n, 0 for j in [n, ldt): K^T as 32-bit pairs
 * of dims, the B operand of Q K^T. A pair is one 32-bit word, so with ldk even this is the
 * AVX-512 set's transpose of 32-bit elements (it moves bits; no arithmetic touches them). */
static void fa_bf16_pack_kt__avx512bf16(int64_t n, int64_t d, const uint16_t *k, int64_t ldk,
                                        uint16_t *kt, int64_t ldt)
{
    uint32_t *dst = (uint32_t *)kt;
    if (ldk % 2 == 0 && (uintptr_t)k % 4 == 0) { /* rows of whole, aligned words */
        fai_kernels_avx512()->transpose(n, d / 2, (const float *)k, ldk / 2, (float *)kt, ldt);
        for (int64_t p = 0; p < d / 2; p++)
            memset(dst + p * ldt + n, 0, (size_t)(ldt - n) * sizeof *dst);
        return;
    }
    for (int64_t j = 0; j < ldt; j++)
        for (int64_t p = 0; p < d / 2; p++) {
            uint32_t w = 0;
            if (j < n)
                memcpy(&w, k + j * ldk + 2 * p, sizeof w);
            dst[p * ldt + j] = w;
        }
}

/* vt[(p dv + c) 2 + t] = v[(2 p + t) ldv + c] for keys 2 p + t < n, 0 up to nk keys: V as
 * pairs of keys, the B operand of P V. Two rows interleave 32 columns at a time (16 at the
 * end of a row: dv is a multiple of 16) by two-source word permutes; a last odd row pairs
 * with zeros, and so do the keys up to nk. */
static void fa_bf16_pack_v__avx512bf16(int64_t n, int64_t nk, int64_t dv, const uint16_t *v,
                                       int64_t ldv, uint16_t *vt)
{
    /* word 2i + t of the output: column i (lo) or 16 + i (hi) of row t (t = 1: source b) */
    static const uint16_t lo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const uint16_t hi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                    24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    const __m512i lo_idx = _mm512_loadu_si512(lo), hi_idx = _mm512_loadu_si512(hi);
    for (int64_t j = 0; j < nk; j += 2) {
        uint16_t *out = vt + (j / 2) * dv * 2;
        for (int64_t c = 0; c < dv; c += 32) {
            const int whole = dv - c >= 32; /* else 16 columns left */
            const __mmask32 mk = whole ? 0xffffffffu : 0xffffu;
            const __m512i a = j < n ? _mm512_maskz_loadu_epi16(mk, v + j * ldv + c)
                                    : _mm512_setzero_si512();
            const __m512i b = j + 1 < n ? _mm512_maskz_loadu_epi16(mk, v + (j + 1) * ldv + c)
                                        : _mm512_setzero_si512();
            _mm512_storeu_si512(out + 2 * c, _mm512_permutex2var_epi16(a, lo_idx, b));
            if (whole)
                _mm512_storeu_si512(out + 2 * c + 32, _mm512_permutex2var_epi16(a, hi_idx, b));
        }
    }
}

/*
 * s[r][c] = sum_p q[r][p] kt[p][c] for rows r < m and columns [c0, c1) rounded out to 16 (the
 * rest of those columns is written too, and is junk to the caller); then, with scale, every
 * element written times *scale, rounded once.
 */
static void fa_bf16_qk_4x64__avx512bf16(int64_t m, int64_t c0, int64_t c1, int64_t d,
                                        const uint16_t *q, int64_t ldq, const uint16_t *kt,
                                        int64_t ldt, float *s, int64_t lds, const float *scale)
{
    const int64_t j0 = c0 & ~(int64_t)15, j1 = (c1 + 15) & ~(int64_t)15;
    product(m, j1 - j0, d / 2, q, ldq, kt + 2 * j0, ldt, NULL, NULL, scale, s + j0, lds);
}

#define FAI_RN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/*
 * exp(d) in 16 lanes for P = exp(y - m), d = y - m <= 0, which is rounded to bf16 (relative
 * error up to 2^-8) right after: so not the f32 kernels' exp (simd/avx512.c: 0.88 ULP in
 * 16 vector instructions) but one of about 2^-18 in 10. d L = n + f with L = log2e rounded to
 * float: n the integer nearest to d L (the product unrounded inside one FMA with 1.5 * 2^23,
 * which a subtraction removes again), f = fl(d L - n) by one FMA, |f| <= 1/2 (plus rounding);
 * 2^f = 1 + f e(f), e the minimax cubic of simd/exp_poly.h (2.8e-6 relative before
 * rounding; Horner in four FMAs, each |term| < 1, so their roundings add about 2^-22); then
 * 2^n by scalef, exact. The reduction's steps take an explicit rounding mode, which no compiler
 * option reassociates. Errors relative to exp(d): those, 2^-25 from f's rounding and |d| 2^-25
 * from L's: within 2^-18 + 2^-25 |d|. Lanes with d < -86 give 0 (exp(-86) < 2^-124: P is a
 * fraction of the row's largest, 1, and the products read a subnormal bf16 as 0 anyway), and
 * d is clamped to -86 first, so that no lane's scalef makes a subnormal (a microcode assist on
 * Intel cores) and -inf forms no inf - inf. NaN passes the clamp (max returns its second
 * operand when either is NaN) and stays NaN.
 */
static inline __m512 exp_p__avx512bf16(__m512 d)
{
    const __m512 lo = _mm512_set1_ps(-86.0f), log2e = _mm512_set1_ps(FAI_LOG2E_F),
                 shift = _mm512_set1_ps(0x1.8p23f);
    const __mmask16 keep = _mm512_cmp_ps_mask(d, lo, _CMP_NLT_UQ);
    d = _mm512_max_ps(lo, d);
    const __m512 n =
        _mm512_sub_round_ps(_mm512_fmadd_round_ps(d, log2e, shift, FAI_RN), shift, FAI_RN);
    const __m512 f = _mm512_fmsub_round_ps(d, log2e, n, FAI_RN);
    __m512 e = _mm512_set1_ps(FAI_EXP2_E3);
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(FAI_EXP2_E2));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(FAI_EXP2_E1));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(FAI_EXP2_E0));
    return _mm512_maskz_scalef_ps(keep, _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.0f)), n);
}

/*
 * p[c] = bf16(exp(y - m)) with y = fl(scale x[c]), the sum of the exps before rounding
 * returned (16 lanes, then their tree): the rounding of P V's operand in the pass that forms
 * it, so that the forward's strip neither scales its scores in a pass of its own nor stores P
 * in f32 to read it back. y and y - m are rounded on their own, by an explicit rounding mode
 * (no compiler fuses them into one FMA), so that a strip that folds its scale in here and one
 * that stored fl(scale x) and passes scale 1 agree to the bit. fl(y - m) is exact where y lies
 * within a factor 2 of m, else off by |y - m| 2^-24: with exp_p's error each value lies within
 * 2^-17 + 2^-23 |y - m| of exp(y - m), relatively, whatever m's own size (a row whose scores
 * are all about -3.4e38, a mask added as bf16's lowest, gets exp(0) = 1 where y = m).
 * p may lie over x (p = (uint16_t *)x: each store lands on scores already read).
 */
static float fa_bf16_expsum__avx512bf16(int64_t n, const float *x, float scale, float m,
                                        uint16_t *p)
{
    const __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m);
    __m512 vsum = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 y = _mm512_mul_round_ps(_mm512_loadu_ps(x + i), vs, FAI_RN);
        const __m512 e = exp_p__avx512bf16(_mm512_sub_round_ps(y, vm, FAI_RN));
        _mm256_storeu_si256((__m256i *)(p + i), (__m256i)_mm512_cvtneps_pbh(e));
        vsum = _mm512_add_ps(vsum, e);
    }
    if (i < n) {
        const __mmask16 mk = (__mmask16)((1u << (n - i)) - 1);
        const __m512 y = _mm512_mul_round_ps(_mm512_maskz_loadu_ps(mk, x + i), vs, FAI_RN);
        const __m512 e = exp_p__avx512bf16(_mm512_sub_round_ps(y, vm, FAI_RN));
        _mm256_mask_storeu_epi16(p + i, mk, (__m256i)_mm512_cvtneps_pbh(e));
        vsum = _mm512_mask_add_ps(vsum, mk, vsum, e);
    }
    return _mm512_reduce_add_ps(vsum);
}
#undef FAI_RN

/*
 * acc[r][:] = a[r] acc[r][:] + sum_c p[r][c] v[c][:] for rows r < m, over every key pair in
 * [0, nk), P bf16 as the caller rounded it (expsum above), 0 where a key does not count: the
 * same pairs for every row (a subnormal sum flushed to 0 by an all-zero pair must reach every
 * row alike, so a row's bits do not depend on the rows it is grouped with). V's packed keys
 * must be finite. Rows of acc from m on are neither read nor written; scratch is not needed.
 */
static void fa_bf16_pv_4x64__avx512bf16(int64_t m, int64_t nk, int64_t dv, const uint16_t *p,
                                        int64_t ldp, const uint16_t *vt, float *acc,
                                        int64_t ldacc, const float *a, void *scratch)
{
    (void)scratch;
    product(m, dv, nk / 2, p, ldp, vt, dv, acc, a, NULL, acc, ldacc);
}

/*
 * c[r][j] (+)= sum_p a[r][p] b[p][j] for rows r < m, columns j < n (a multiple of 16), p < k (a
 * multiple of 2): A bf16 rows of lda elements, B as pairs along p with ldb pairs to a pair
 * row, C f32 rows of ldc; rows of C from m on are neither read nor written.
 */
static void fa_bf16_gemm_4x64__avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a,
                                          int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                                          int64_t ldc, int accumulate)
{
    product(m, n, k / 2, a, lda, b, ldb, accumulate ? c : NULL, NULL, NULL, c, ldc);
}

/* The constants are AMX's tiles' shape, which the AMX set keeps with this table (so that the
 * framework's blocking, packing and padding serve both sets alike); the panels need less (rows
 * one at a time, pairs of keys and dims). */
static const fai_kernels_bf16 avx512bf16_bf16 = {
    .rows = 16,     /* a tile's rows                                      */
    .keys = 32,     /* P V's k step on the tiles: 32 bf16 of P a tile row */
    .dqk_step = 32, /* Q K^T's k step on the tiles: 32 bf16 of Q a row     */
    .dv_step = 16,  /* P V's n step on the tiles: 16 f32 columns a tile     */
    FAI_KERNEL(pack_kt, fa_bf16_pack_kt__avx512bf16),
    FAI_KERNEL(pack_v, fa_bf16_pack_v__avx512bf16),
    FAI_KERNEL(qk, fa_bf16_qk_4x64__avx512bf16),
    FAI_KERNEL(expsum, fa_bf16_expsum__avx512bf16),
    FAI_KERNEL(pv, fa_bf16_pv_4x64__avx512bf16),
    FAI_KERNEL(gemm, fa_bf16_gemm_4x64__avx512bf16),
};

/* The AVX-512 set with these products added: filled once. */
static fai_kernels_f32 avx512bf16_set;

static void avx512bf16_set_fill(void)
{
    avx512bf16_set = *fai_kernels_avx512();
    avx512bf16_set.isa = FA_ISA_AVX512BF16;
    avx512bf16_set.bf16 = &avx512bf16_bf16;
}

const fai_kernels_f32 *fai_kernels_avx512bf16(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, avx512bf16_set_fill);
    return &avx512bf16_set;
}
