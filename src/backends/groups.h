/*
 * A call as groups of dense problems (fai_groups, fai_group: itself, or one per sequence of a
 * varlen, paged or cache call), and the machinery that runs an op over them on one allocation
 * made before anything is written (fai_run_groups, fai_run_call: backends/groups.c).
 */
#ifndef FAI_BACKENDS_GROUPS_H
#define FAI_BACKENDS_GROUPS_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "backends/problem.h"

/* The problems an op runs, each dense: the call's own, or one per sequence of a call of
 * sequences (varlen, paged, a cache). */
static inline int64_t fai_groups(const fai_problem *pr) { return pr->nseq > 0 ? pr->nseq : 1; }

/* Group g of the call: the problem itself, or sequence g with its dims, its mask and score
 * offset (aligned within the sequence), its rows' bases, its dropout stream and page-table row.
 * No group has new keys: the call appends them before any group runs (fai_append_new_keys, the
 * CUDA backend's append), and its groups read them in the cache; so a group without query rows
 * is one without rows to write (fai_empty_of), whether or not its sequence appended. */
static inline fai_problem fai_group(const fai_problem *pr, int64_t g)
{
    fai_problem s = *pr;
    s.k_new = s.v_new = NULL;
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
 * that have nothing to compute (backends/empty.h) and hands the others to run() in order.
 * fai_run_call does the same with one need() and one run() for the whole call, which then
 * skips the empty groups itself: for a backend that shares its threads out over all of a
 * call's groups at once. So a call fails, if it does, before its first write.
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
/* fai_run_call's need and run take the whole call and `arg`: what the backend decided for the
 * call before it (the tiled forward's plan, with each group's path). */
typedef fa_status (*fai_call_need_fn)(const fa_context *ctx, const fai_problem *call,
                                      const void *arg, fai_need *need);
typedef void (*fai_call_run_fn)(fa_context *ctx, const fai_problem *call, const void *arg,
                                const fai_scratch *s);
fa_status fai_run_call(fa_context *ctx, const fai_problem *call, int backward, const char *who,
                       const void *arg, fai_call_need_fn need, fai_call_run_fn run);

/* Copies k_new and v_new into the cache, sequence s's rows to its keys [seqused[s],
 * seqused[s] + s_new) (host tensors; the API layer checked the room and the pages). */
void fai_append_new_keys(const fai_problem *pr);

#endif
