/* The tiled forward's decode path (backends/tiled/decode.c), taken by the groups of a call
 * that the plan sends to it (fai_tiled_plan_path): few query rows per kv head, f32/f16/bf16
 * storage, no dropout. */
#ifndef FAI_TILED_DECODE_H
#define FAI_TILED_DECODE_H

#include "backends/groups.h"
#include "backends/problem.h"
#include "backends/tiled/plan.h"

/* What one run over every such group of a call allocates (nothing where none is: fai_need
 * zero), and the run on it (fai_run_call), which skips the other groups. */
fa_status fai_tiled_decode_need(const fa_context *ctx, const fai_problem *call,
                                const fai_tiled_plan *plan, fai_need *need);
void fai_tiled_decode(fa_context *ctx, const fai_problem *call, const fai_tiled_plan *plan,
                      const fai_kernels_f32 *kern, const fai_scratch *sc);

#endif
