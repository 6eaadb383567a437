/*
 * AMX kernels (AMX-TILE, AMX-BF16): the tiled forward's two products and the backward's five
 * for bf16 storage on tile registers, in place of the AVX512_BF16 set's dot products
 * (simd/avx512bf16.c, whose packing and exp this set keeps; the AVX-512 set's f32 kernels do
 * everything else). Built with -mamx-tile -mamx-bf16 -mavx512bf16 and the AVX-512 flags;
 * called only when the CPU, the OS (XCR0) and Linux's per-process permission for the tile
 * data allow it (simd/cpu.c).
 *
 * One TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one (stored as 16 rows of 16
 * pairs) into 16 x 16 f32: 8192 products, against 16 of an AVX-512 FMA.
 *   S  = Q K^T:  A = 16 rows of Q (bf16 as stored: its products are exact in f32), B = K^T
 *                packed as pairs along d; C stored into the score strip.
 *   O += P V:    P rounded to bf16 once by the exp that forms it (fa_bf16_expsum__avx512bf16;
 *                relative error <= 2^-8 per term, as FlashAttention-2 and -3 and PyTorch's CPU
 *                kernel round it; docs/notes/bf16.md has the measurement against splitting P
 *                into bf16 hi + lo), times V packed as pairs of keys; C is acc, rescaled by the
 *                online softmax's factor on the way in.
 *   The backward's products (fa_bf16_gemm_16x64__amx): S and dP as Q K^T above, dV, dK and dQ
 *                from P~ and scale dS rounded to bf16 once (backends/tiled/backward_tpl.h).
 * The tiles' sums run in an order fixed by the hardware and the loops below (not the f32
 * kernels' order), so the results do not depend on the thread count; they differ from the f32
 * path's in the last bits. The backward forms S with the forward's kernel, to the bit.
 *
 * Where the tiles differ from the f32 path in kind: TDPBF16PS reads subnormal bf16 inputs as 0
 * and flushes subnormal results to 0. So a Q, K or V element below 2^-126 in magnitude counts
 * as 0 (an inf times it gives NaN, not inf; a row whose allowed V are all subnormal gives 0,
 * not ~1e-39), and P below 2^-126 is 0. Such inputs are far outside attention's working range;
 * the f32 kernels (FA_ISA=avx512) keep them.
 */
#include "config.h"

#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "simd/kernels.h"

/* Tile configuration (palette 1): every one of the 8 tiles 16 rows x 64 bytes. A tile
 * register keeps its configuration per thread; each kernel call sets it and releases the tiles
 * at its end (so no caller state is assumed, and a thread does not carry 8 KiB of live tile
 * state through its context switches and signals afterwards). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void tiles_configure(void)
{
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* The accumulator tiles 0 .. nb - 1 (nb <= 4; each 16 x 16 f32) from or to the 16 x 16 nb
 * block of f32 at c, side by side, rows ld floats apart. Tile numbers are immediates: hence
 * the ifs rather than a loop. */
static inline __attribute__((always_inline)) void acc_tiles_load(int64_t nb, const float *c,
                                                                 int64_t ld)
{
    _tile_loadd(0, c, ld * 4);
    if (nb > 1)
        _tile_loadd(1, c + 16, ld * 4);
    if (nb > 2)
        _tile_loadd(2, c + 32, ld * 4);
    if (nb > 3)
        _tile_loadd(3, c + 48, ld * 4);
}

static inline __attribute__((always_inline)) void acc_tiles_store(int64_t nb, float *c, int64_t ld)
{
    _tile_stored(0, c, ld * 4);
    if (nb > 1)
        _tile_stored(1, c + 16, ld * 4);
    if (nb > 2)
        _tile_stored(2, c + 32, ld * 4);
    if (nb > 3)
        _tile_stored(3, c + 48, ld * 4);
}

/* The 32 x 32 blocks of Q K^T and P V: accumulators 0 (rows 0-15, columns 0-15), 1 (rows
 * 0-15, columns 16-31), 2 and 3 (rows 16-31), the second row or column half only where
 * two_rows or two_cols; c holds f32 rows ld floats apart. */
static inline __attribute__((always_inline)) void block_load(float *c, int64_t ld, int two_rows,
                                                             int two_cols)
{
    _tile_loadd(0, c, ld * 4);
    if (two_cols)
        _tile_loadd(1, c + 16, ld * 4);
    if (two_rows) {
        _tile_loadd(2, c + 16 * ld, ld * 4);
        if (two_cols)
            _tile_loadd(3, c + 16 * ld + 16, ld * 4);
    }
}

static inline __attribute__((always_inline)) void block_store(float *c, int64_t ld, int two_rows,
                                                              int two_cols)
{
    _tile_stored(0, c, ld * 4);
    if (two_cols)
        _tile_stored(1, c + 16, ld * 4);
    if (two_rows) {
        _tile_stored(2, c + 16 * ld, ld * 4);
        if (two_cols)
            _tile_stored(3, c + 16 * ld + 16, ld * 4);
    }
}

/* The 16 rows of a tile at b, stride bytes apart, fetched towards L1 (a hint: no fault, no
 * effect on any result). */
static inline __attribute__((always_inline)) void tile_prefetch(const uint16_t *b, int64_t stride)
{
    for (int i = 0; i < 16; i++)
        _mm_prefetch((const char *)b + i * stride, _MM_HINT_T0);
}

/* One k step of 32 into a block: A's 16-row tiles at a and a + 16 rows (lda elements to a row)
 * times B's pair tiles at b and 16 columns over (ldb pairs to a pair row), each tile loaded
 * once and used twice. Where next is not NULL, the B tiles of the step after (at next, same
 * ldb) are fetched towards L1 between the products. */
static inline __attribute__((always_inline)) void block_step(const uint16_t *a, int64_t lda,
                                                             const uint16_t *b, int64_t ldb,
                                                             const uint16_t *next, int two_rows,
                                                             int two_cols)
{
    _tile_loadd(4, a, lda * 2);
    _tile_loadd(6, b, ldb * 4);
    _tile_dpbf16ps(0, 4, 6);
    if (next)
        tile_prefetch(next, ldb * 4);
    if (two_cols) {
        _tile_loadd(7, b + 32, ldb * 4);
        _tile_dpbf16ps(1, 4, 7);
        if (next)
            tile_prefetch(next + 32, ldb * 4);
    }
    if (two_rows) {
        _tile_loadd(5, a + 16 * lda, lda * 2);
        _tile_dpbf16ps(2, 5, 6);
        if (two_cols)
            _tile_dpbf16ps(3, 5, 7);
    }
}

/*
 * s[r][c] = sum_p q[r][p] kt[p][c] for rows r < m rounded up to 16 and columns [c0, c1) rounded
 * out to 16 (the rest of those rows and columns are written too, and are junk to the caller);
 * then, with scale, every element written times *scale, rounded once. q must hold m rounded up
 * to 16 rows (those past m only reach junk rows of s).
 * Blocks of 32 rows x 32 columns: two row tiles of Q times two column tiles of K^T into four
 * accumulators, so that each tile loaded serves two products (K^T's tiles, which a key tile
 * holds more of than L1 does, are read once per 32 rows rather than per 16); a last 16 rows or
 * 16 columns take the same loop with half the tiles. Every element sums its k steps in the same
 * order whatever the blocking, so its bits do not depend on it.
 */
static void fa_bf16_qk_32x32__amx(int64_t m, int64_t c0, int64_t c1, int64_t d, const uint16_t *q,
                                  int64_t ldq, const uint16_t *kt, int64_t ldt, float *s,
                                  int64_t lds, const float *scale)
{
    tiles_configure();
    const int64_t j0 = c0 & ~(int64_t)15, j1 = (c1 + 15) & ~(int64_t)15;
    for (int64_t r = 0; r < m; r += 32) {
        const int two_rows = m - r > 16;
        for (int64_t j = j0; j < j1; j += 32) {
            const int two_cols = j1 - j > 16;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t p = 0; p < d; p += 32) /* pair row p / 2, column j */
                block_step(q + r * ldq + p, ldq, kt + 2 * j + p * ldt, ldt, NULL, two_rows,
                           two_cols);
            float *out = s + r * lds + j;
            block_store(out, lds, two_rows, two_cols);
            if (!scale)
                continue;
            /* the block just stored, while it is in L1, in whole vectors: beyond [0, m) x
             * [c0, c1) it is junk either way */
            const __m512 f = _mm512_set1_ps(*scale);
            for (int64_t i = 0; i < (two_rows ? 32 : 16); i++)
                for (int64_t c = 0; c < (two_cols ? 32 : 16); c += 16)
                    _mm512_storeu_ps(out + i * lds + c,
                                     _mm512_mul_ps(_mm512_loadu_ps(out + i * lds + c), f));
        }
    }
    _tile_release();
}

/*
 * acc[r][:] = a[r] acc[r][:] + sum_c p[r][c] v[c][:] for rows r < m, over every key chunk of 32
 * in [0, nk), P bf16 as the caller rounded it (the set's expsum), 0 where a key does not count:
 * the same chunks for every row. That keeps a row's bits independent of the rows it is
 * grouped with: the tiles flush subnormal sums to 0 (and may not keep a NaN's payload), so
 * even an all-zero chunk can change acc, and it must be applied to every row alike. V's packed
 * keys must be finite. dv is a multiple of 16. scratch: 16 dv floats. Rows go by 32 where
 * there are, in blocks of 32 x 32 as in Q K^T (each V tile read once per 32 rows), then by 16:
 * each block rescaled, multiplied and stored in place; a last block of fewer than 16 rows
 * staged (its P rows past m are read, and reach only the stage's rows past m) and only its
 * rows < m copied back. Every element sums the same chunks in the same order whatever the
 * blocking.
 */
static void fa_bf16_pv_32x32__amx(int64_t m, int64_t nk, int64_t dv, const uint16_t *p,
                                  int64_t ldp, const uint16_t *vt, float *acc, int64_t ldacc,
                                  const float *a, void *scratch)
{
    tiles_configure();
    float *stage = scratch;
    for (int64_t r = 0; r < m;) {
        /* rows r .. r + span - 1: two whole blocks of 16, one, or a last partial one */
        const int64_t rows = m - r >= 32 ? 32 : m - r < 16 ? m - r : 16;
        const int64_t span = rows > 16 ? 32 : 16;
        /* whole blocks: acc rescaled in place (rows whose factor is 1 as they are) and taken
         * by the tiles where it lies; a partial one through the stage */
        float *blk = rows >= 16 ? acc + r * ldacc : stage;
        const int64_t ldb = rows >= 16 ? ldacc : dv;
        for (int64_t i = 0; i < span; i++) {
            float *st = blk + i * ldb;
            if (i >= rows) {
                memset(st, 0, (size_t)dv * sizeof(float));
                continue;
            }
            const __m512 f = _mm512_set1_ps(a[r + i]);
            const float *ar = acc + (r + i) * ldacc;
            for (int64_t x = 0; x < dv && (st != ar || a[r + i] != 1); x += 16)
                _mm512_storeu_ps(st + x, _mm512_mul_ps(_mm512_loadu_ps(ar + x), f));
        }
        const int two_rows = span == 32;
        for (int64_t d0 = 0; d0 < dv; d0 += 32) {
            const int two_cols = dv - d0 > 16;
            block_load(blk + d0, ldb, two_rows, two_cols);
            for (int64_t k = 0; k < nk; k += 32) { /* pair row k / 2, column d0 */
                const uint16_t *b = vt + ((k / 2) * dv + d0) * 2;
                /* V's tiles come from L2 (a 256-key tile's V is 64 KiB at Dv = 128): those of
                 * the next step fetched during this one's products, the next columns' first
                 * after the last (paired timer on the Xeon, four runs: a strip took 0.93,
                 * 0.94, 0.96 and 1.01 of its time without; K^T's fetched a whole block ahead
                 * in Q K^T made it slower, 1.03-1.06) */
                const uint16_t *next = k + 32 < nk ? b + 32 * dv : d0 + 32 < dv ? vt + (d0 + 32) * 2
                                                                                 : NULL;
                block_step(p + r * ldp + k, ldp, b, dv, next, two_rows, two_cols);
            }
            block_store(blk + d0, ldb, two_rows, two_cols);
        }
        for (int64_t i = 0; blk == stage && i < rows; i++)
            memcpy(acc + (r + i) * ldacc, stage + i * dv, (size_t)dv * sizeof(float));
        r += span;
    }
    _tile_release();
}

/*
 * c[r][j] (+)= sum_p a[r][p] b[p][j] for rows r < m, columns j < n (a multiple of 16), p < k (a
 * multiple of 32): A bf16 rows of lda elements, read in blocks of 16 rows (m rounded up to 16
 * must be readable), B as pairs along p with ldb pairs to a pair row, C f32 rows of ldc. A
 * last block of fewer than 16 rows goes through a staged copy, so rows of C from m on are
 * never touched (they may be another block's: the backward's dQ rows of a whole head).
 */
static void fa_bf16_gemm_16x64__amx(int64_t m, int64_t n, int64_t k, const uint16_t *a,
                                    int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                                    int64_t ldc, int accumulate)
{
    float stage[16 * 64];
    tiles_configure();
    for (int64_t r = 0; r < m; r += 16) {
        const int64_t rows = m - r < 16 ? m - r : 16;
        for (int64_t j = 0; j < n; j += 64) {
            const int64_t nb = (n - j) / 16 < 4 ? (n - j) / 16 : 4;
            float *cb = c + r * ldc + j;
            int64_t ld = ldc;
            if (rows < 16) {
                for (int64_t i = 0; accumulate && i < rows; i++)
                    memcpy(stage + i * 64, cb + i * ldc, (size_t)(16 * nb) * sizeof(float));
                cb = stage;
                ld = 64;
            }
            if (accumulate) {
                acc_tiles_load(nb, cb, ld);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int64_t p = 0; p < k; p += 32) {
                const uint16_t *bp = b + ((p / 2) * ldb + j) * 2;
                _tile_loadd(4, a + r * lda + p, lda * 2);
                _tile_loadd(5, bp, ldb * 4);
                _tile_dpbf16ps(0, 4, 5);
                if (nb > 1) {
                    _tile_loadd(6, bp + 32, ldb * 4);
                    _tile_dpbf16ps(1, 4, 6);
                }
                if (nb > 2) {
                    _tile_loadd(7, bp + 64, ldb * 4);
                    _tile_dpbf16ps(2, 4, 7);
                }
                if (nb > 3) {
                    _tile_loadd(5, bp + 96, ldb * 4);
                    _tile_dpbf16ps(3, 4, 5);
                }
            }
            acc_tiles_store(nb, cb, ld);
            for (int64_t i = 0; cb == stage && i < rows; i++)
                memcpy(c + (r + i) * ldc + j, stage + i * 64, (size_t)(16 * nb) * sizeof(float));
        }
    }
    _tile_release();
}

/* The AVX512_BF16 set's products, with Q K^T, P V and the backward's GEMM on the tiles (its
 * packing is the tiles' B format, and its exp forms P as the tiles take it): filled once. */
static fai_kernels_bf16 amx_bf16;
static fai_kernels_f32 amx_set;

static void amx_set_fill(void)
{
    amx_bf16 = *fai_kernels_avx512bf16()->bf16; /* its constants are the tiles' shape */
    FAI_SET_KERNEL(amx_bf16, qk, fa_bf16_qk_32x32__amx);
    FAI_SET_KERNEL(amx_bf16, pv, fa_bf16_pv_32x32__amx);
    FAI_SET_KERNEL(amx_bf16, gemm, fa_bf16_gemm_16x64__amx);
    amx_set = *fai_kernels_avx512();
    amx_set.isa = FA_ISA_AMX;
    amx_set.bf16 = &amx_bf16;
}

const fai_kernels_f32 *fai_kernels_amx(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_set_fill);
    return &amx_set;
}
