/*
 * The validated problem a backend receives (fai_problem) and what a backend asks of it besides
 * its rows (backends/rows.h): a role's tensor and dtype, the score terms of a head (slope,
 * sink, bias factor, FP8 descales), the dropout stream of a head, the parts of its mask. The
 * API layer checks every argument and resolves every default before a backend sees the
 * problem, so a backend never has to validate, and a failed check never reaches code that
 * writes an output.
 */
#ifndef FAI_BACKENDS_PROBLEM_H
#define FAI_BACKENDS_PROBLEM_H

#include <math.h>
#include <stdint.h>

#include "flashattn.h"
#include "base/dtype.h"
#include "core/philox.h"
#include "core/score.h"

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
    fa_dtype k_dtype;  /* storage of k (and dk): dtype, or a forward's cache under f32, f16 or
                          bf16 q (f16 / bf16 / FP8, or a block format) */
    fa_dtype v_dtype;  /* storage of v (and dv): likewise; k's but where both are block
                          formats (K and V each its own, as llama.cpp's -ctk / -ctv) */
    fai_mask mask;
    fai_score score;
    const fa_tensor *bias;    /* the bias tensor (fa_params.bias: batch B or 1, seqlen Sq or 1,
                                 heads Hq or 1, headdim Sk), or NULL; score.bias says where it
                                 enters */
    const fa_tensor *bias_grad; /* the backward's d loss / d bias (the bias's shape), or NULL */
    /* a block-sparse mask, checked and expanded by the API layer (backends/blocks.h), or NULL */
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
 * dtype); rows go through backends/rows.h. */
static inline const fa_tensor *fai_io(const fai_problem *pr, fai_role r) { return pr->io[r]; }

/* The storage dtype of a role's rows. */
static inline fa_dtype fai_role_dtype(const fai_problem *pr, fai_role r)
{
    if (r == FAI_Q)
        return pr->q_dtype;
    return r == FAI_K || r == FAI_DK   ? pr->k_dtype
           : r == FAI_V || r == FAI_DV ? pr->v_dtype
                                       : pr->dtype;
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

static inline float fai_slope(const fai_problem *pr, int64_t h)
{
    return pr->slopes ? pr->slopes[h] : 0.0f;
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

#endif
