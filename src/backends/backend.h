/*
 * The interface between the API layer (src/api/) and the backends: the context a call runs
 * with, the validated problem, and the table a backend registers. The API layer checks every
 * argument and resolves every default before a backend sees the problem, so a backend never
 * has to validate, and a failed check never reaches code that writes an output.
 */
#ifndef FAI_BACKENDS_BACKEND_H
#define FAI_BACKENDS_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "flashattn.h"
#include "base/base.h"
#include "base/dtype.h"
#include "core/philox.h"
#include "core/score.h"
#include "simd/kernels.h"

/* ------------------------------------------------------------------ the context */

/* What the environment forces on the tiled backend, for tile sweeps: FA_TILES=BQxBK[xBR]
 * (bq = 0: not forced), FA_BACKWARD_PASSES=1|2 (0: planned) and FA_DECODE=0 (the forward's
 * decode path never taken; 1 or unset: where the plan takes it). */
typedef struct {
    int64_t bq, bk, br;
    int backward_passes;
    int decode_off;
} fai_tiled_forced;

struct fa_context {
    fai_mem mem;                    /* the bytes allocated for this context (fa_memory_stats) */
    fa_backend backend;             /* resolved: never AUTO */
    int backend_auto;               /* AUTO was asked: a call whose q is device memory runs on
                                       CUDA, when it is built */
    fa_isa isa;                     /* resolved: never AUTO */
    const char *isa_why;            /* AUTO's reason for it where a rule decided, else NULL */
    const fai_kernels_f32 *kernels; /* the ISA's kernel set */
    int num_threads;                /* > 0 */
    fai_cache_info cache;
    fai_tiled_forced tiled;
    struct {
        void *stream;      /* fa_options.cuda_stream */
        int deterministic; /* fa_options.deterministic */
    } cuda;
};

/* ------------------------------------------------------------------ a validated problem */

/* The tensors of a call, by role. */
typedef enum { FAI_Q, FAI_K, FAI_V, FAI_OUT, FAI_LSE, FAI_DOUT, FAI_DQ, FAI_DK, FAI_DV } fai_role;

/* An int32 or int64 array of the caller's, read where it lies. */
typedef struct {
    const void *data;
    int wide; /* int64 */
} fai_index;

static inline int64_t fai_index_at(fai_index x, int64_t i)
{
    return x.wide ? ((const int64_t *)x.data)[i] : (int64_t)((const int32_t *)x.data)[i];
}

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

/* What the mask is made of (fai_mask_make), kept for the sequences of a batch. */
typedef struct {
    int causal, top_left;
    int64_t left, right, sink_tokens;
} fai_mask_spec;

/*
 * Everything a backend needs, checked and resolved by the API layer: dims, mask, score
 * parameters, dropout, and the tensors (NULL where the op has none: forward has no dout, dq,
 * dk, dv; lse may be NULL in a forward).
 *
 * A call of nseq > 0 sequences is made of one problem per sequence (fai_group), each with
 * batch 1, which a backend runs one by one (fai_run_groups) or all at once (fai_run_call);
 * the call's own dims b, sq, sk and its mask are no backend's to read. Sequence s is
 *   - in a variable-length batch (cu_q set): q-side rows [cu_q[s], cu_q[s + 1]) and keys
 *     [cu_k[s], cu_k[s + 1]) of batch 0, the tensors packed along seqlen;
 *   - over a paged K/V (page_size > 0): q-side batch s, and seqused[s] keys, key j in page
 *     table[s * table_stride + j / page_size] at its row j % page_size (k and v are pages:
 *     batch = page, seqlen = page_size); pages may be shared between sequences;
 *   - over a contiguous cache with used lengths (seqused set, page_size 0): q-side and key
 *     batch s, seqused[s] keys.
 * With new keys to append (k_new, v_new: B x s_new rows), a cache's sequence s holds
 * seqused[s] + s_new keys once fai_run_groups or fai_run_call has written them
 * (fai_append_new_keys).
 * A sequence's problem has its rows' bases: q-side rows from row q0 of batch qb0, keys from
 * row k0 of batch kb0, and seq0, the call's index of its batch 0 (its dropout stream, its row
 * of the page table).
 */
typedef struct {
    int64_t b, hq, hk, sq, sk, dqk, dv, group; /* group = Hq / Hk */
    int64_t nseq;             /* > 0: a call of that many sequences, run one by one */
    fai_index cu_q, cu_k;     /* a variable-length batch: nseq + 1 offsets each, else NULL */
    int64_t page_size;        /* > 0: k and v are pages */
    int64_t table_stride;     /* entries per sequence in the page table */
    fai_index table, seqused; /* the page table; nseq used lengths (a cache's), else NULL */
    const fa_tensor *k_new, *v_new; /* keys to append to a cache first, or NULL */
    int64_t s_new;                  /* their rows per sequence */
    fai_mask_spec mask_spec;
    int64_t q0, k0, qb0, kb0, seq0; /* where the rows lie: 0 but in a sequence of a call */
    fa_dtype dtype;    /* storage of out, dout and the gradients (and of q, but for FP8 q) */
    fa_dtype q_dtype;  /* storage of q: dtype, or an FP8 format (out then f32, f16 or bf16) */
    fa_dtype kv_dtype; /* storage of k and v (and dk, dv): dtype, or a forward's f16 / bf16
                          cache under f32 or bf16 q */
    fai_mask mask;
    fai_score score;
    const fa_tensor *bias;    /* the bias tensor (fa_params.bias: batch B or 1, seqlen Sq or 1,
                                 heads Hq or 1, headdim Sk), or NULL; score.bias says where it
                                 enters */
    const fa_tensor *bias_grad; /* the backward's d loss / d bias (the bias's shape), or NULL */
    /* a block-sparse mask, checked and expanded by the API layer (fai_block_listed), or NULL */
    const struct fai_block_map *blocks;
    const float *descale_q, *descale_k, *descale_v; /* FP8 descale factors, or NULL (1) */
    int descale_per_head; /* they are B x Hk (fa_params.descale_layout), else one each */
    const float *slopes; /* Hq, or NULL */
    const float *sinks;  /* Hq sink logits (finite or -inf), or NULL */
    float *sink_grad;    /* a device backend's backward: Hq floats of host memory for d loss /
                            d sink_h, or NULL (a host backend's is the API layer's to form) */
    double keep_scale;   /* 1 / (1 - dropout_p): kept terms' factor (core/philox.h) */
    fai_dropout_params drop; /* threshold 0: dropout off */
    const fa_tensor *io[FAI_DV + 1];
} fai_problem;

/* The tensor of a role: for what a backend asks of it besides its rows (is there one, its
 * dtype); rows go through the accessors below. */
static inline const fa_tensor *fai_io(const fai_problem *pr, fai_role r) { return pr->io[r]; }

/*
 * Where rows are: row s of (b, head h) of the tensor of role r, and, for a run of n rows,
 * row s + c at c * *ld elements past it (c < n; ld may be NULL). Query-side roles (q, out,
 * dout, dq) take a query head and row; key-side ones (k, v, dk, dv) a kv head and key. Every
 * row the host backends read or write is addressed here and nowhere else: another layout
 * enters through these functions (a paged KV cache through fai_kv_rows, variable-length
 * batches through both). A run of keys is one stride only within a page: fai_kv_run_len says
 * how many of n keys from j lie in one run, and a caller that reads runs either splits them
 * there (the decode path) or gathers them (fai_kv_gather, for the tiles). The CUDA kernels
 * address device rows through their own views (cuda/launch.h).
 */
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

/* The storage dtype of a role's rows. */
static inline fa_dtype fai_role_dtype(const fai_problem *pr, fai_role r)
{
    if (r == FAI_Q)
        return pr->q_dtype;
    return r == FAI_K || r == FAI_V || r == FAI_DK || r == FAI_DV ? pr->kv_dtype : pr->dtype;
}

/* The FP8 descale factor of (b, kv head hk) in one of the arrays (1 without one). */
static inline double fai_descale_at(const fai_problem *pr, const float *d, int64_t b, int64_t hk)
{
    return !d ? 1.0 : pr->descale_per_head ? (double)d[(pr->seq0 + b) * pr->hk + hk] : (double)d[0];
}

/* What the descales of (b, hk) multiply: the score scale (q's times k's) and O (v's). Exact in
 * double (two floats' product); a float path rounds it once. */
static inline double fai_descale_qk(const fai_problem *pr, int64_t b, int64_t hk)
{
    return fai_descale_at(pr, pr->descale_q, b, hk) * fai_descale_at(pr, pr->descale_k, b, hk);
}

static inline double fai_descale_v(const fai_problem *pr, int64_t b, int64_t hk)
{
    return fai_descale_at(pr, pr->descale_v, b, hk);
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

static inline float fai_slope(const fai_problem *pr, int64_t h)
{
    return pr->slopes ? pr->slopes[h] : 0.0f;
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

/* Whether the block mask lists the block of key j for the block of row i of (b, h) (1 without a
 * block mask); and the keys [*lo, *hi) of j's key block. */
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

/* Whether the scores take a per-key row of additions: the bias tensor's entries, the block
 * mask's -inf, or both (what the tiled strips load per row: fai_row_bias). */
static inline int fai_row_biased(const fai_problem *pr) { return pr->bias || pr->blocks; }

/* The bias's factor for head h in the pipeline's bias term (core/score.h): the slope where
 * the slopes scale the bias, else 1; what its gradient is multiplied by. */
static inline double fai_bias_factor(const fai_problem *pr, int64_t h)
{
    return pr->score.bias_by_slope ? (double)fai_slope(pr, h) : 1.0;
}

/* Head h's sink logit: -inf (no sink) without sinks. */
static inline float fai_sink(const fai_problem *pr, int64_t h)
{
    return pr->sinks ? pr->sinks[h] : -INFINITY;
}

/* The dropout stream of (b, h). */
static inline fai_dropout fai_dropout_for(const fai_problem *pr, int64_t b, int64_t h)
{
    return fai_dropout_make(&pr->drop, (uint64_t)((pr->seq0 + b) * pr->hq + h));
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
    const size_t es = fai_dtype_size(fai_role_dtype(pr, r)), row = (size_t)dim * es;
    for (int64_t c = 0; c < n;) {
        const int64_t m = fai_kv_run_len(pr, j + c, n - c);
        int64_t l;
        const char *src = fai_kv_rows(pr, r, b, hk, j + c, m, &l);
        for (int64_t x = 0; x < m; x++)
            memcpy((char *)stage + (size_t)(c + x) * row, src + (size_t)(x * l) * es, row);
        c += m;
    }
    *ld = dim;
    return stage;
}

/* The problem seen through each part of its mask (core/score.h, fai_mask_parts): pr with that
 * part's plain mask, in key order; returns their number (2 with sink tokens, else 1). Code
 * that loops over keys runs over the parts in turn, with one interval per row in each. */
static inline int fai_mask_part_problems(const fai_problem *pr, fai_problem part[2])
{
    fai_mask m[2];
    const int n = fai_mask_parts(&pr->mask, m);
    for (int p = 0; p < n; p++) {
        part[p] = *pr;
        part[p].mask = m[p];
    }
    return n;
}

/* ------------------------------------------------------------------ groups of a call */

/* The problems an op runs, each dense: the call's own, or one per sequence of a call of
 * sequences (varlen, paged, a cache). */
static inline int64_t fai_groups(const fai_problem *pr) { return pr->nseq > 0 ? pr->nseq : 1; }

/* Group g of the call: the problem itself, or sequence g with its dims, its mask and score
 * offset (aligned within the sequence), its rows' bases, its dropout stream and page-table row. */
static inline fai_problem fai_group(const fai_problem *pr, int64_t g)
{
    fai_problem s = *pr;
    if (pr->nseq == 0)
        return s;
    const fai_mask_spec *m = &pr->mask_spec;
    s.nseq = 0;
    s.b = 1;
    s.seq0 = g;
    if (pr->cu_q.data) {
        s.q0 = fai_index_at(pr->cu_q, g);
        s.sq = fai_index_at(pr->cu_q, g + 1) - s.q0;
    } else {
        s.qb0 = g;
    }
    if (pr->cu_k.data) {
        s.k0 = fai_index_at(pr->cu_k, g);
        s.sk = fai_index_at(pr->cu_k, g + 1) - s.k0;
    }
    if (pr->seqused.data) {
        s.sk = fai_index_at(pr->seqused, g) + pr->s_new;
        s.kb0 = pr->page_size ? 0 : g; /* a contiguous cache: batch g */
    }
    s.mask = fai_mask_make(s.sq, s.sk, m->causal, m->left, m->right, m->top_left, m->sink_tokens);
    s.score.off = s.mask.off;
    return s;
}

/* A group with no (query, key) pair: its results are defined without computing
 * (fai_write_empty). */
static inline int fai_group_empty(const fai_problem *s) { return s->sq == 0 || s->sk == 0; }

/* A task space cut into parts (a call's groups, say), part i holding tasks [first[i],
 * first[i + 1]) (first[0] = 0, ascending, first[n] the number of tasks): the part of task t. */
static inline int64_t fai_task_part(const int64_t *first, int64_t n, int64_t t)
{
    int64_t lo = 0, hi = n; /* first[lo] <= t < first[hi] */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (first[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/*
 * What one run allocates before anything is written: `per` bytes for each thread and one
 * `shared` block. fai_run_groups (backends/groups.c) runs an op's groups on one allocation,
 * the largest any group needs: it asks need() of every group, allocates, writes the groups
 * that have nothing to compute (docs/DESIGN.md §1's empty results) and hands the others to
 * run() in order. fai_run_call does the same with one need() and one run() for the whole
 * call, which then skips the empty groups itself: for a backend that shares its threads out
 * over all of a call's groups at once. So a call fails, if it does, before its first write.
 */
typedef struct {
    size_t per, shared;
} fai_need;
typedef struct {
    char *base;  /* thread t's bytes: base + t per */
    size_t per;
    void *shared;
} fai_scratch;
typedef fa_status (*fai_need_fn)(const fa_context *ctx, const fai_problem *pr, fai_need *need);
typedef void (*fai_run_fn)(fa_context *ctx, const fai_problem *pr, const fai_scratch *s);
fa_status fai_run_groups(fa_context *ctx, const fai_problem *pr, int backward, const char *who,
                         fai_need_fn need, fai_run_fn run);
fa_status fai_run_call(fa_context *ctx, const fai_problem *pr, int backward, const char *who,
                       fai_need_fn need, fai_run_fn run);

/* Writes what a problem with no (query, key) pair gives (host tensors): the forward's O = 0
 * and LSE = the sink (-inf without one) for each row; the backward's dQ, dK, dV = 0 and the
 * bias gradient 0. */
void fai_write_empty(const fai_problem *pr, int backward);
/* Zeroes the bias gradient (host memory): the gradient of a call with no (query, key) pair. */
void fai_zero_bias_grad(const fai_problem *pr);

/* Copies k_new and v_new into the cache, sequence s's rows to its keys [seqused[s],
 * seqused[s] + s_new) (host tensors; the API layer checked the room and the pages). */
void fai_append_new_keys(const fai_problem *pr);

/* ------------------------------------------------------------------ backends */

/*
 * A backend: its name, and one slot per op (fai_op). A NULL slot is an op the backend does not
 * have: fai_backend_op answers FA_ERR_UNSUPPORTED for it. An op is called only with a
 * validated, non-empty problem and may fail only with FA_ERR_NO_MEMORY (checked before any
 * output is written), FA_ERR_UNSUPPORTED, FA_ERR_INVALID_ARGUMENT (checks only the backend can
 * make, before anything is written: the CUDA one's device pointers) or FA_ERR_DEVICE (a device
 * runtime error, the CUDA backend's).
 */
typedef fa_status (*fai_op_fn)(fa_context *ctx, const fai_problem *pr);
/* FAI_OP_APPEND: fa_append_kv on a device cache (a host cache is the API layer's copy). */
typedef enum { FAI_OP_FORWARD, FAI_OP_BACKWARD, FAI_OP_APPEND, FAI_NOPS } fai_op;

typedef struct {
    const char *name;  /* as fa_backend_name */
    int device_memory; /* its tensors are device memory: the API layer never touches them, and
                          the backend writes even an empty problem's results itself */
    int sequences;     /* it takes calls of sequences (nseq > 0: varlen, paged, a cache) */
    fai_op_fn ops[FAI_NOPS]; /* by fai_op (designated: [FAI_OP_FORWARD] = ...) */
} fai_backend;

/* backends/registry.c: the table of b, or NULL for AUTO and for a value that is none; the
 * backend of a name (FA_BACKEND_AUTO if none); a backend's function for an op: *fn, or
 * FA_ERR_UNSUPPORTED (the detail naming the backend and `what`, the op) where its slot is
 * NULL. */
const fai_backend *fai_backend_of(fa_backend b);
fa_backend fai_backend_from_name(const char *name);
fa_status fai_backend_op(const fai_backend *be, fai_op op, const char *what, fai_op_fn *fn);

extern const fai_backend fai_backend_reference;
extern const fai_backend fai_backend_conventional;
extern const fai_backend fai_backend_tiled;
extern const fai_backend fai_backend_cuda; /* cuda/stub.c when CUDA is not built */

/* Whether the CUDA backend can run here (built, and a device present); on 0 the error detail
 * says why. Whether p is device (or managed) memory: always 0 without CUDA. */
int fai_cuda_available(void);
int fai_cuda_is_device_pointer(const void *p);

#endif
