/*
 * What the files of the API layer share. This layer defines every public fa_ function: it
 * checks the arguments and makes the validated problem (tensors.c, indices.c, params.c,
 * problem.c, sequences.c: their declarations below, in that order), turns options and the
 * environment into a context (context.c), runs an op on the chosen backend (ops.c), and holds
 * the public helpers that run on no backend (merge.c, compare.c, convert.c, names.c,
 * profiles.c).
 */
#ifndef FAI_API_API_H
#define FAI_API_API_H

#include "backends/blocks.h"
#include "backends/context.h"
#include "backends/problem.h"

/* Largest accepted dimension (and index array count, block size, pages a sequence). It keeps
 * every index expression of the kernels (i + off + R, products of two dims) far from int64
 * overflow; no real tensor comes near it. */
#define FAI_DIM_MAX ((int64_t)1 << 40)

/* ------------------------------------------------------------------ tensors (tensors.c) */

/* A tensor is an input or an output (an output must not overlap itself); an LSE tensor is f32
 * or f64 with headdim 1. `name` names it in the error. */
typedef enum { FAI_INPUT, FAI_OUTPUT } fai_tensor_use;
/* What a tensor holds: values (a storage dtype), an LSE (f32 or f64, headdim 1), or a bias or
 * keep-mask (bool too, and headdim Sk may be 0). Callers pass 0 and 1 for the first two. */
enum { FAI_TENSOR_VALUES = 0, FAI_TENSOR_LSE = 1, FAI_TENSOR_BIAS = 2 };
fa_status fai_check_tensor(const fa_tensor *t, const char *name, fai_tensor_use use, int kind);
/* FA_ERR_SHAPE where name->what (got) is not ref (want). */
fa_status fai_expect_dim(const char *name, const char *what, int64_t got, const char *ref,
                         int64_t want);
/* t is batch x seqlen x heads x headdim as given (headdim not checked when d < 0); `ref`
 * names where the dims come from. */
fa_status fai_check_shape(const fa_tensor *t, const char *name, int64_t b, int64_t s,
                          int64_t h, int64_t d, const char *ref);
fa_status fai_check_dtype(const fa_tensor *t, const char *name, fa_dtype want);
/* t's dtype is `ref`'s, want. */
fa_status fai_check_dtype_of(const fa_tensor *t, const char *name, fa_dtype want,
                             const char *ref);
/* The three in that order, for a tensor of the shared storage dtype. */
fa_status fai_check_operand(const fa_tensor *t, const char *name, fai_tensor_use use,
                            fa_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d,
                            const char *ref);
/* FA_ERR_STRIDE, naming both, where an output shares a byte with another tensor (tensors.c
 * says how strided views are compared); the second checks every output against every input
 * and every other output. */
fa_status fai_check_disjoint(const fa_tensor *out, const char *oname, const fa_tensor *other,
                             const char *name);
fa_status fai_check_outputs_disjoint(const fa_tensor *const *outs, const char *const *onames,
                                     int nout, const fa_tensor *const *ins,
                                     const char *const *inames, int nin);
/* The ALiBi slopes, the sink logits and the sink gradient (Hq floats each, or none) as
 * tensors, for the checks above. */
fa_tensor fai_slopes_view(const fa_params *p, int64_t hq);
fa_tensor fai_sinks_view(const fa_params *p, int64_t hq);
fa_tensor fai_sink_grad_view(const fa_params *p, int64_t hq);
/* An index array as a tensor of elements of its size (int32 as f32, int64 as f64), for the
 * same checks. */
fa_tensor fai_indices_view(const fa_indices *x);

/* ------------------------------------------------------------------ index arrays (indices.c) */

/* An index array of host memory, checked as indices.c says (`what`: the count it needs);
 * *out reads it. */
fa_status fai_check_index_array(const fa_indices *x, const char *name, const char *sep,
                                int64_t want_count, const char *what, fai_index *out);
/* Checks a block mask against the problem (NULL: none) and expands it into *m, its map of
 * *bytes bytes allocated on ctx (fai_free them after the call); sets pr->blocks. Call after
 * fai_problem_make, on a dense call. */
fa_status fai_problem_blocks(fa_context *ctx, fai_problem *pr, const fa_block_mask *bm,
                             fai_block_map *m, size_t *bytes);

/* ------------------------------------------------------------------ fa_params (params.c) */

/* Checks p against the problem's dims and dtypes (its scalars and enums, the slopes and sink
 * logits, the bias and its gradient, the descales, in that order) and sets what it makes of
 * the problem: the mask, the score pipeline, the dropout stream, the slopes, sinks, descales
 * and bias. fai_problem_make calls it once the dims, dtypes and q, k, v are set. */
fa_status fai_problem_params(fai_problem *pr, const fa_params *p);
/* FA_ERR_UNSUPPORTED, naming op, where the problem has what only a dense call takes: a bias
 * tensor, or descale factors per (batch, kv head). For calls of sequences (varlen, paged, a
 * cache). */
fa_status fai_refuse_dense_only(const fai_problem *pr, const fa_params *p, const char *op);

/* Where a call's rows lie in a longer sequence: its q row 0 is row q_pos of a sequence of sq
 * query rows, its key 0 key k_pos of sk keys (context parallelism, src/mpi/, cuts one problem
 * into such calls). The call is then the global problem's rows and keys: its mask and ALiBi at
 * the global offset, the first sink_tokens keys of the global sequence, the dropout draws of
 * the global (row, key). */
typedef struct {
    int64_t q_pos, k_pos;
    int64_t sq, sk;
} fai_place;
/* Checks the place against the problem (a dense call's rows inside the sequence) and remakes
 * the mask, ALiBi's offset and the dropout stream's origin from it. After fai_problem_params. */
fa_status fai_problem_place(fai_problem *pr, const fai_place *pl);

/* ------------------------------------------------------------------ the problem (problem.c) */

/* Checks q, k, v and params and fills the problem's dims, mask, score and dropout (its
 * tensors: q, k and v; the op sets the others). paged: k and v are pages (their batch is not
 * q's). */
fa_status fai_problem_make(fai_problem *pr, const fa_params *p, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, int paged);

/* ------------------------------------------------------------------ sequences (sequences.c) */

/* Makes the problem a variable-length batch (fa_forward_varlen): checks the offsets against the
 * packed q and k and sets nseq, cu_q and cu_k. */
fa_status fai_problem_sequences(fai_problem *pr, const fa_indices *cu_q, const fa_indices *cu_k);
/* Makes the problem one over a paged K/V (fa_forward_paged, fa_forward_kvcache): checks the
 * block table and the used lengths against k's pages (every page a sequence uses, s_new new
 * keys included, must be one of k's) and sets nseq, the page size, the table and the used
 * lengths. */
fa_status fai_problem_pages(fai_problem *pr, const fa_paged_kv *pages, const fa_tensor *k,
                            int64_t s_new);
/* Makes the problem one over a contiguous cache k (B x S_cache) with used lengths, s_new new
 * keys each to fit. */
fa_status fai_problem_cache(fai_problem *pr, const fa_indices *cache_seqlens,
                            const fa_tensor *k, int64_t s_new);
/* A paged cache's appended pages (those its new keys go to) each appear once among the pages
 * the sequences use: not shared, not repeated in a row (ctx: for the check's memory). */
fa_status fai_check_written_pages(fa_context *ctx, const fai_problem *pr);
/* The problem of fa_append_kv: the cache k, v (paged: pages) that k_new's batch appends to;
 * no queries. */
fa_status fai_problem_for_cache(fai_problem *pr, const fa_tensor *k_new, const fa_tensor *k,
                                const fa_tensor *v, int paged);
/* The new keys of a cache (both NULL: none): (B, S_new, Hk, D) in the cache's dtype; the
 * cache then is written (an output). Sets k_new, v_new, s_new. */
fa_status fai_problem_new_keys(fai_problem *pr, const fa_tensor *k_new, const fa_tensor *v_new,
                               const fa_tensor *k, const fa_tensor *v);

/* ------------------------------------------------------------------ the ops' helpers (ops.c) */

/* One row's term of d loss / d sink (core/gradient.h: fai_dsink_term_f64), in float64 from
 * its O and dO rows (dv elements of dtype) and its LSE: what the sink gradient sums. */
double fai_sink_row_term(const void *orow, const void *grow, fa_dtype dtype, int64_t dv,
                         double sink, double lse);

/* fa_forward and fa_backward of a call placed in a longer sequence (fai_place), on a host
 * backend (a device backend: FA_ERR_UNSUPPORTED). Every check of the public calls, and the
 * place's; check_only stops there (a dry run: the status the call would have before it runs,
 * nothing written). */
fa_status fai_forward_placed(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v, const fai_place *pl,
                             fa_tensor *out, fa_tensor *lse, int check_only);
fa_status fai_backward_placed(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                              const fa_tensor *k, const fa_tensor *v, const fai_place *pl,
                              const fa_tensor *out, const fa_tensor *lse, const fa_tensor *dout,
                              fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, int check_only);

#endif
