/*
 * Where rows are: row s of (b, head h) of the tensor of role r, and, for a run of n rows,
 * row s + c at c * *ld elements past it (c < n; ld may be NULL). Query-side roles (q, out,
 * dout, dq) take a query head and row; key-side ones (k, v, dk, dv) a kv head and key. Every
 * row the host backends read or write is addressed here and nowhere else (tests/layers.sh
 * checks it): another layout enters through these functions (a paged KV cache through
 * fai_kv_rows, variable-length batches through both). A run of keys is one stride only within
 * a page: fai_kv_run_len says how many of n keys from j lie in one run, and a caller that
 * reads runs either splits them there (the decode path) or gathers them (fai_kv_gather, for
 * the tiles). The CUDA kernels address device rows through their own views (cuda/launch.h).
 * These are in the backends' inner loops: static inline, every one.
 */
#ifndef FAI_BACKENDS_ROWS_H
#define FAI_BACKENDS_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"
#include "backends/problem.h"

/* The one layout today: every role's tensor strided, row s + c at c seq_stride. */
static inline void *fai_strided_rows(const fa_tensor *t, int64_t b, int64_t h, int64_t s,
                                     int64_t *ld)
{
    if (ld)
        *ld = t->seq_stride;
    return fai_row(t, b, s, h);
}

static inline void *fai_q_rows(const fai_problem *pr, fai_role r, int64_t b, int64_t h,
                               int64_t i, int64_t n, int64_t *ld)
{
    (void)n;
    return fai_strided_rows(pr->io[r], pr->qb0 + b, h, pr->q0 + i, ld);
}

/* n must not pass fai_kv_run_len(pr, j, n). */
static inline void *fai_kv_rows(const fai_problem *pr, fai_role r, int64_t b, int64_t hk,
                                int64_t j, int64_t n, int64_t *ld)
{
    (void)n;
    if (pr->page_size == 0)
        return fai_strided_rows(pr->io[r], pr->kb0 + b, hk, pr->k0 + j, ld);
    const int64_t page = fai_index_at(pr->table, (pr->seq0 + b) * pr->table_stride +
                                                     j / pr->page_size);
    return fai_strided_rows(pr->io[r], page, hk, j % pr->page_size, ld);
}

/* Row i of kv head hk of sequence b of the new keys (FAI_K: k_new) or values (FAI_V: v_new)
 * that a cache appends. */
static inline const void *fai_new_key_row(const fai_problem *pr, fai_role r, int64_t b,
                                          int64_t hk, int64_t i)
{
    return fai_row(r == FAI_K ? pr->k_new : pr->v_new, b, i, hk);
}

/* How many of the n keys from j lie in one run of fai_kv_rows: n, but for pages. */
static inline int64_t fai_kv_run_len(const fai_problem *pr, int64_t j, int64_t n)
{
    if (pr->page_size == 0)
        return n;
    const int64_t left = pr->page_size - j % pr->page_size;
    return n < left ? n : left;
}

static inline void *fai_q_row(const fai_problem *pr, fai_role r, int64_t b, int64_t h, int64_t i)
{
    return fai_q_rows(pr, r, b, h, i, 1, NULL);
}

static inline void *fai_kv_row(const fai_problem *pr, fai_role r, int64_t b, int64_t hk,
                               int64_t j)
{
    return fai_kv_rows(pr, r, b, hk, j, 1, NULL);
}

/* The LSE of row i of (b, h) (f32 or f64 storage). */
static inline void fai_lse_write(const fai_problem *pr, int64_t b, int64_t h, int64_t i,
                                 double x)
{
    fai_lse_store(pr->io[FAI_LSE], pr->qb0 + b, h, pr->q0 + i, x);
}

static inline double fai_lse_read(const fai_problem *pr, int64_t b, int64_t h, int64_t i)
{
    return fai_lse_load(pr->io[FAI_LSE], pr->qb0 + b, h, pr->q0 + i);
}

/* Row i of query head h of batch b of a tensor in the bias's shape (the bias, or its
 * gradient): its Sk entries from key 0, a dim of 1 read at index 0 (broadcast). A bias comes
 * only with a dense call, whose rows have no bases. */
static inline void *fai_bias_row_of(const fa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    return fai_row(t, t->batch == 1 ? 0 : b, t->seqlen == 1 ? 0 : i, t->heads == 1 ? 0 : h);
}

static inline const void *fai_bias_row(const fai_problem *pr, int64_t b, int64_t h, int64_t i)
{
    return fai_bias_row_of(pr->bias, b, h, i);
}

/* Keys [j, j + n) of kv head hk of role r as one run of dim elements (storage dtype): where
 * they are stored when they lie in one run of the layout, else copied into stage (n x dim,
 * *ld = dim). Reading either gives the same values, so the results do not depend on it. */
static inline const void *fai_kv_gather(const fai_problem *pr, fai_role r, int64_t b,
                                        int64_t hk, int64_t j, int64_t n, int64_t dim,
                                        void *stage, int64_t *ld)
{
    if (fai_kv_run_len(pr, j, n) == n)
        return fai_kv_rows(pr, r, b, hk, j, n, ld);
    const fa_dtype dt = fai_role_dtype(pr, r);
    const size_t row = (size_t)fai_dtype_bytes(dt, dim);
    for (int64_t c = 0; c < n;) {
        const int64_t m = fai_kv_run_len(pr, j + c, n - c);
        int64_t l;
        const char *src = fai_kv_rows(pr, r, b, hk, j + c, m, &l);
        for (int64_t x = 0; x < m; x++)
            memcpy((char *)stage + (size_t)(c + x) * row, src + fai_dtype_bytes(dt, x * l), row);
        c += m;
    }
    *ld = dim;
    return stage;
}

#endif
