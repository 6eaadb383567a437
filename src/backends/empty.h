/*
 * docs/DESIGN.md §1's empty results, decided in one place: which problems (a call, or one
 * group of a call) have nothing to compute (fai_empty_of) and what they give (fai_write_empty).
 * Every level asks here: the API layer whether a call's backend is asked at all (api/ops.c),
 * fai_run_groups and fai_run_call which groups they write instead of running
 * (backends/groups.c), the tiled plan which groups take no path, and the CUDA backend which
 * groups it launches (its kernels write a device call's empty rows themselves: a row without a
 * key ends empty there, as here). New keys are the call's (a group has none: fai_group): a call
 * that appends has work even with no query row.
 */
#ifndef FAI_BACKENDS_EMPTY_H
#define FAI_BACKENDS_EMPTY_H

#include "backends/problem.h"

typedef enum {
    FAI_NOT_EMPTY,    /* some (query, key) pair: the backend computes it */
    FAI_EMPTY,        /* no (query, key) pair (Sq = 0 or Sk = 0), but rows to write: the results
                         are fai_write_empty's (a device backend writes the same itself) */
    FAI_EMPTY_NO_ROW, /* nothing to compute or append and no row to write: B = 0, or a forward
                         with Sq = 0 and no new keys. No backend is asked; what such a call
                         writes is a backward's sums over no rows, 0 (fai_write_empty: a host
                         bias gradient; the API layer: the sink gradient) */
} fai_empty;

/* Which of the three pr is, in a forward or a backward. */
static inline fai_empty fai_empty_of(const fai_problem *pr, int backward)
{
    if (pr->b == 0 || (!backward && pr->sq == 0 && !pr->k_new))
        return FAI_EMPTY_NO_ROW;
    return pr->sq == 0 || pr->sk == 0 ? FAI_EMPTY : FAI_NOT_EMPTY;
}

/* Writes what a problem that is not FAI_NOT_EMPTY gives (host tensors): the forward's O = 0
 * and LSE = the sink (-inf without one) for each row; the backward's dQ, dK, dV = 0 and the
 * bias gradient 0. */
void fai_write_empty(const fai_problem *pr, int backward);

#endif
