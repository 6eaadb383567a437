/*
 * flashattn over MPI: context-parallel attention, one sequence sharded over the ranks of a
 * communicator (docs/DESIGN.md §2, "Context parallelism"). Built and installed by
 * `./configure --with-mpi`; the library links the MPI it was configured with.
 *
 * Each rank passes its shard of the sequence as ordinary tensors: q, out, lse, dout, dq hold
 * the rank's query rows, k, v, dk, dv its keys, batch, heads and head dims whole. The layout
 * says which global rows a rank holds (fa_cp_local_size); the global lengths are the sums of
 * the ranks' seqlens. The results are the global problem's rows, as one fa_forward /
 * fa_backward over the whole sequence would give them (every fa_params feature defined on
 * global positions: causal in both alignments, windows, sink tokens, ALiBi, softcap, sink
 * logits, GQA, dropout drawn from the same Philox stream), within the FlashAttention rule of
 * the float64 reference, and bitwise the same across runs and thread counts for a given rank
 * count and schedule.
 *
 * Every call is collective over comm (it is duplicated inside; messages never touch the
 * caller's). A bad argument on any rank, or a disagreement between ranks (shapes, dtypes,
 * params, layout, a shard that is not the layout's), makes every rank return the same status
 * before any attention data moves, with fa_last_error naming the rank and the argument; nothing
 * is written on failure. The one exception is the communicator itself: a rank that passes
 * MPI_COMM_NULL, or calls before MPI_Init, is refused on its own (there is nothing to agree
 * over), and the others wait for it in MPI as any collective would.
 */
#ifndef FLASHATTN_MPI_H
#define FLASHATTN_MPI_H

#include <mpi.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the global sequence of S rows is cut among W ranks. */
typedef enum {
    FA_CP_CONTIGUOUS, /* rank r holds rows [floor(r S / W), floor((r + 1) S / W)) */
    FA_CP_ZIGZAG      /* 2W chunks c = [floor(c S / 2W), floor((c + 1) S / 2W)); rank r holds
                         chunk r, then chunk 2W - 1 - r (causal balance, as TransformerEngine
                         and PyTorch's context_parallel cut it) */
} fa_cp_layout;

/* The rows of one rank: parts (1 contiguous, 2 zigzag) of count[i] global rows from first[i],
 * stored one after the other in the rank's tensors; local = the sum of the counts. */
typedef struct {
    int64_t seqlen; /* the global length */
    int     parts;
    int64_t first[2], count[2];
    int64_t local;
} fa_cp_shard;

/* The shard of rank `rank` of `ranks` for a global length seqlen (FFTW-MPI's local_size):
 * FA_ERR_INVALID_ARGUMENT for an unknown layout or a rank outside [0, ranks), FA_ERR_SHAPE for
 * a negative length. Needs no communicator. */
FA_API fa_status fa_cp_local_size(fa_cp_layout layout, int64_t seqlen, int ranks, int rank,
                                  fa_cp_shard *shard);

/*
 * The schedules, chosen per call by a rule over the ranks (the context's fa_context_describe
 * says which and why); FA_CP_SCHEDULE=ring|allgather in the environment forces one (read when
 * the context is made: every rank's must agree).
 *   ring:      K/V shards travel rank to rank with nonblocking messages while the local block
 *              computes (W - 1 hops); blocks that the mask leaves empty are skipped; the
 *              backward sends each step's dK/dV terms for a shard straight to its owner.
 *   allgather: every rank gathers the whole K/V (W times a shard's memory), attends its rows to
 *              it, and the backward returns each rank's dK/dV partials to their owner.
 * Partial states (O, LSE) and dK/dV partials are f32 (f64 for f64 tensors), summed by their
 * owner in a fixed order; 16-bit tensors are widened to f32 once, and the results rounded once.
 */

/* fa_forward of the global sequence; lse may be NULL. q, k, v, out: f32, f16, bf16 or f64,
 * one dtype (FA_ERR_DTYPE otherwise). Not taken (FA_ERR_UNSUPPORTED): a bias tensor, a block
 * mask, FP8 descales, a device backend. */
FA_API fa_status fa_cp_forward(fa_context *ctx, MPI_Comm comm, fa_cp_layout layout,
                               const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                               const fa_tensor *v, fa_tensor *out, fa_tensor *lse);

/* fa_backward of the global sequence, from fa_cp_forward's out and lse (the rank's rows).
 * params->sink_grad, where set, receives the whole sequence's sum on every rank. The reference
 * and conventional backends' backwards recompute the softmax over their call's keys, so they
 * run under the allgather (the rule chooses it; FA_CP_SCHEDULE=ring is FA_ERR_UNSUPPORTED):
 * with a reference context and f64 tensors, the float64 oracle distributed by query rows. */
FA_API fa_status fa_cp_backward(fa_context *ctx, MPI_Comm comm, fa_cp_layout layout,
                                const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                                const fa_tensor *v, const fa_tensor *out, const fa_tensor *lse,
                                const fa_tensor *dout, fa_tensor *dq, fa_tensor *dk,
                                fa_tensor *dv);

#ifdef __cplusplus
}
#endif

#endif
