/* The tiled forward's decode path (backends/tiled/decode.c), taken where the plan's
 * decode_keys is set: few query rows per kv head, f32/f16/bf16 storage, no dropout. */
#ifndef FAI_TILED_DECODE_H
#define FAI_TILED_DECODE_H

#include "backends/backend.h"
#include "backends/tiled/plan.h"

/* What a run allocates (fai_run_groups), and the run on it. */
fa_status fai_tiled_decode_need(const fa_context *ctx, const fai_problem *pr,
                                const fai_tiled_plan *plan, fai_need *need);
void fai_tiled_decode(fa_context *ctx, const fai_problem *pr, const fai_kernels_f32 *kern,
                      const fai_tiled_plan *plan, const fai_scratch *sc);

#endif
