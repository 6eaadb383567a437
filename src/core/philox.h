/*
 * The dropout stream of docs/DESIGN.md §1: Philox4x32-10 (Salmon et al., SC'11, "Parallel random
 * numbers: as easy as 1, 2, 3"). Head b * Hq + h draws from its own key, derived from (seed,
 * offset, head) by one Philox call; the draw of (row i, key j) is word j % 4 of Philox(counter
 * {j / 4, i} as 64-bit halves, that key), compared with floor(p * 2^32). All of seed, offset,
 * head, row and key take part at full 64-bit width. Every backend draws its keep decisions from
 * here, so the same (seed, offset) drops the same elements everywhere.
 */
#ifndef FAI_CORE_PHILOX_H
#define FAI_CORE_PHILOX_H

#include <stdint.h>
#include "fmath.h"

#define FAI_PHILOX_M0 0xD2511F53u /* round multipliers (Random123 philox.h)      */
#define FAI_PHILOX_M1 0xCD9E8D57u
#define FAI_PHILOX_W0 0x9E3779B9u /* key schedule: golden ratio, sqrt(3) - 1     */
#define FAI_PHILOX_W1 0xBB67AE85u

typedef struct {
    uint32_t v[4];
} fai_u32x4;

FA_HOST_DEVICE static inline fai_u32x4 fai_philox4x32_10(fai_u32x4 ctr, uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += FAI_PHILOX_W0;
            k1 += FAI_PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)FAI_PHILOX_M0 * ctr.v[0];
        uint64_t p1 = (uint64_t)FAI_PHILOX_M1 * ctr.v[2];
        fai_u32x4 n;
        n.v[0] = (uint32_t)(p1 >> 32) ^ ctr.v[1] ^ k0;
        n.v[1] = (uint32_t)p1;
        n.v[2] = (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ k1;
        n.v[3] = (uint32_t)p0;
        ctr = n;
    }
    return ctr;
}

/* A call's dropout: seed and offset as the caller gave them (fa_params), and the threshold. */
typedef struct {
    uint64_t seed, offset;
    uint32_t threshold; /* keep iff u >= threshold = floor(p * 2^32); 0: dropout off */
    int64_t row0, col0; /* the stream's row and key of the call's row 0 and key 0: 0 but in a
                           placed call (a shard of a longer sequence, api/params.c:
                           fai_problem_place) */
} fai_dropout_params;

/* One (batch, head)'s stream: its Philox key, derived from (seed, offset, head). */
typedef struct {
    uint32_t k0, k1;
    uint32_t threshold;
    int64_t row0, col0; /* fai_dropout_params' */
} fai_dropout;

/* threshold 0 keeps everything: callers test `threshold != 0` to know dropout is on. */
FA_HOST_DEVICE static inline uint32_t fai_dropout_threshold(double p)
{
    return (uint32_t)(p * 4294967296.0); /* p in [0, 1): exact floor, < 2^32 */
}

/* The factor 1 / (1 - p) of the kept terms (1 without dropout): formed once per call. */
FA_HOST_DEVICE static inline double fai_dropout_keep_scale(double p) { return 1.0 / (1.0 - p); }

/*
 * The stream of head `head` (= b * Hq + h, any value below 2^64): key = the first two words of
 * Philox(counter {head lo, head hi, offset lo, offset hi}, key = seed). Every bit of seed,
 * offset and head reaches the key; for a fixed seed Philox is a bijection of the 128-bit
 * counter, so distinct (offset, head) give distinct blocks, and two of them share a stream
 * only if the 64-bit halves collide (chance m (m - 1) / 2^65 among m streams).
 */
FA_HOST_DEVICE static inline fai_dropout fai_dropout_make(const fai_dropout_params *p,
                                                          uint64_t head)
{
    fai_dropout d = {0, 0, p->threshold, p->row0, p->col0};
    if (!p->threshold)
        return d; /* dropout off: no key is ever used */
    fai_u32x4 ctr = {{(uint32_t)head, (uint32_t)(head >> 32), (uint32_t)p->offset,
                      (uint32_t)(p->offset >> 32)}};
    fai_u32x4 u = fai_philox4x32_10(ctr, (uint32_t)p->seed, (uint32_t)(p->seed >> 32));
    d.k0 = u.v[0];
    d.k1 = u.v[1];
    return d;
}

/* The Philox output block that holds the draws of keys 4 (J / 4) .. 4 (J / 4) + 3 of query
 * row I, where I = row0 + i and J = col0 + j are the row and key in the stream (the call's own
 * i and j but in a placed call): counter {J / 4 lo, J / 4 hi, I lo, I hi} under the head's
 * key.
 * Rows and keys below 2^62 each have their own counter: a head's stream does not repeat within
 * any tensor. */
FA_HOST_DEVICE static inline fai_u32x4 fai_dropout_block(const fai_dropout *d, int64_t i,
                                                         int64_t j)
{
    const uint64_t q = (uint64_t)(d->col0 + j) >> 2, r = (uint64_t)(d->row0 + i);
    fai_u32x4 ctr = {{(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)r, (uint32_t)(r >> 32)}};
    return fai_philox4x32_10(ctr, d->k0, d->k1);
}

/* Stream key J's draw in its block: word J % 4 (chosen by selects, so that a device keeps u in
 * registers rather than indexing it in local memory). */
FA_HOST_DEVICE static inline uint32_t fai_dropout_word(fai_u32x4 u, int64_t j)
{
    return (j & 2) ? ((j & 1) ? u.v[3] : u.v[2]) : ((j & 1) ? u.v[1] : u.v[0]);
}

/* The decision a draw u makes: keep iff u >= floor(p 2^32) (with p = 0 every draw keeps). */
FA_HOST_DEVICE static inline int fai_dropout_kept(const fai_dropout *d, uint32_t u)
{
    return u >= d->threshold;
}

/* The keep decision of (query row i, key j): one Philox call. */
FA_HOST_DEVICE static inline int fai_dropout_keep(const fai_dropout *d, int64_t i, int64_t j)
{
    return fai_dropout_kept(d, fai_dropout_word(fai_dropout_block(d, i, j), d->col0 + j));
}

/*
 * keep[c] = fai_dropout_keep(d, i, j0 + c) for c in [0, n), one Philox call per block of four
 * consecutive keys.
 */
FA_HOST_DEVICE static inline void fai_dropout_keep_row(const fai_dropout *d, int64_t i,
                                                       int64_t j0, int64_t n, unsigned char *keep)
{
    int64_t j = j0, end = j0 + n;
    while (j < end) {
        fai_u32x4 u = fai_dropout_block(d, i, j);
        for (int w = (int)((d->col0 + j) & 3); w < 4 && j < end; w++, j++)
            keep[j - j0] = (unsigned char)fai_dropout_kept(d, u.v[w]);
    }
}

#endif
