/*
 * The block-sparse mask (fa_params.block_mask) as the API layer expanded it (fai_block_map)
 * and the queries the backends make of it: whether a key is listed for a row, whether a tile
 * of keys meets or is covered by the listed blocks of a run of rows, and the span of keys they
 * list there. Used in the inner loops: static inline.
 */
#ifndef FAI_BACKENDS_BLOCKS_H
#define FAI_BACKENDS_BLOCKS_H

#include <stdint.h>

#include "backends/problem.h"

/* A block-sparse mask expanded: listed[((b * heads + h) * q_blocks + r) * kv_blocks + c] is 1
 * where query block r of (b, h) lists key block c (batch, heads: B or 1, Hq or 1). */
typedef struct fai_block_map {
    const unsigned char *listed;
    int64_t batch, heads, q_block, kv_block, q_blocks, kv_blocks;
} fai_block_map;

/* Query block r of (b, h)'s row of the map (kv_blocks bytes), broadcast dims read at 0. */
static inline const unsigned char *fai_block_row(const fai_block_map *m, int64_t b, int64_t h,
                                                 int64_t r)
{
    const int64_t bb = m->batch == 1 ? 0 : b, hh = m->heads == 1 ? 0 : h;
    return m->listed + ((bb * m->heads + hh) * m->q_blocks + r) * m->kv_blocks;
}

/* Whether the block mask lists the block of key j for the block of row i of (b, h) (1 without a
 * block mask). */
static inline int fai_block_listed(const fai_problem *pr, int64_t b, int64_t h, int64_t i,
                                   int64_t j)
{
    const fai_block_map *m = pr->blocks;
    return !m || fai_block_row(m, b, h, i / m->q_block)[j / m->kv_block];
}

/* Whether the block mask lists, for some row of [i0, i1) of (b, h), some key of [j0, j0 + n) (1
 * without a block mask): a tile of keys that it lists for none of its rows can be skipped. */
static inline int fai_blocks_meet(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                  int64_t i1, int64_t j0, int64_t n)
{
    const fai_block_map *m = pr->blocks;
    if (!m || i0 >= i1 || n <= 0)
        return 1;
    for (int64_t r = i0 / m->q_block; r <= (i1 - 1) / m->q_block; r++) {
        const unsigned char *row = fai_block_row(m, b, h, r);
        for (int64_t c = j0 / m->kv_block; c <= (j0 + n - 1) / m->kv_block; c++)
            if (row[c])
                return 1;
    }
    return 0;
}

/* Whether the block mask lists every key block of [j0, j0 + n) for every query block of rows
 * [i0, i1) of (b, h) (1 without one): those scores then take nothing from it. */
static inline int fai_blocks_cover(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                   int64_t i1, int64_t j0, int64_t n)
{
    const fai_block_map *m = pr->blocks;
    if (!m)
        return 1;
    for (int64_t r = i0 / m->q_block; r <= (i1 - 1) / m->q_block; r++) {
        const unsigned char *row = fai_block_row(m, b, h, r);
        for (int64_t c = j0 / m->kv_block; c <= (j0 + n - 1) / m->kv_block; c++)
            if (!row[c])
                return 0;
    }
    return 1;
}

/* The keys of [j0, j0 + n) in key blocks the block mask lists for some row of [i0, i1) of
 * (b, h), from the first such block to the last, as columns [*lo, *hi) of the tile ([0, n)
 * without a block mask; *lo >= *hi if none). */
static inline void fai_blocks_span(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                   int64_t i1, int64_t j0, int64_t n, int64_t *lo, int64_t *hi)
{
    const fai_block_map *m = pr->blocks;
    *lo = 0, *hi = n;
    if (!m)
        return;
    const int64_t c0 = j0 / m->kv_block, c1 = (j0 + n - 1) / m->kv_block;
    int64_t first = c1 + 1, last = c0 - 1;
    for (int64_t r = i0 / m->q_block; r <= (i1 - 1) / m->q_block; r++) {
        const unsigned char *row = fai_block_row(m, b, h, r);
        for (int64_t c = c0; c <= c1; c++)
            if (row[c]) {
                first = c < first ? c : first;
                last = c > last ? c : last;
            }
    }
    const int64_t a = first * m->kv_block - j0, z = (last + 1) * m->kv_block - j0;
    *lo = a > 0 ? a : 0;
    *hi = z < n ? z : n;
}

#endif
