/*
 * The tiled backend: the article's algorithm (query tiles, a running (m, l, acc) per row, score
 * and probability tiles that never leave the thread's working set). Its loop nest is written
 * once (rows_tpl.h, forward_tpl.h, backward_tpl.h) and instantiated here for float (f32, f16,
 * bf16 storage: f32 accumulation on the context's kernel set; with AMX or AVX512_BF16, the
 * products of bf16 storage on its tile products) and double (f64 storage, on the portable f64
 * set). Every tiling decision comes from the plan (plan.c), made once per call.
 *
 * Extra memory: one workspace per thread, O(Bq x D + Bk x D + Br x Bk) for the forward (the
 * backward's holds five Bq x Bk tiles), independent of sequence length; the backward's single
 * pass adds dQ of a kv head's query heads, group x Sq x Dqk, up to 8 MiB a thread.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "backends/blocks.h"
#include "backends/context.h"
#include "backends/groups.h"
#include "backends/rows.h"
#include "backends/table.h"
#include "backends/tiled/decode.h"
#include "backends/tiled/plan.h"
#include "core/gradient.h"
#include "core/recurrence.h"
#include "simd/kernels.h"

#define FT float
#define FAI_T(name) name##_f32
#define FT_DTYPE FA_F32
#define FT_UINT uint32_t
#define FT_TILE_PRODUCTS 1
#include "backends/tiled/rows_tpl.h"
#include "backends/tiled/forward_tpl.h"
#include "backends/tiled/backward_tpl.h"
#undef FT
#undef FAI_T
#undef FT_DTYPE
#undef FT_UINT
#undef FT_TILE_PRODUCTS

#define FT double
#define FAI_T(name) name##_f64
#define FT_DTYPE FA_F64
#define FT_UINT uint64_t
#define FT_TILE_PRODUCTS 0
#include "backends/tiled/rows_tpl.h"
#include "backends/tiled/forward_tpl.h"
#include "backends/tiled/backward_tpl.h"

/* The groups that the plan sends to the tiles, in order, into g[0 .. n - 1] and their first
 * tasks into first[0 .. n] (first[n]: all their tasks), where g is not NULL; returns n. */
static int64_t tile_groups(const fai_problem *call, const fai_tiled_plan *plan, int64_t *g,
                           int64_t *first)
{
    int64_t n = 0, t = 0;
    for (int64_t x = 0; x < fai_groups(call); x++) {
        if (fai_tiled_plan_path(plan, x) != FAI_TILED_TILES)
            continue;
        if (g) {
            g[n] = x;
            first[n] = t;
        }
        const fai_problem s = fai_group(call, x);
        t += fai_tiled_group_tasks(&s, plan->task_rows);
        n++;
    }
    if (g)
        first[n] = t;
    return n;
}

/* Carves g (n) and first (n + 1) from the shared block (base NULL: measures). */
static size_t tile_groups_carve(int64_t n, void *base, int64_t **g, int64_t **first)
{
    fai_arena a = {base, 0};
    *g = fai_carve(&a, (size_t)n * sizeof(int64_t));
    *first = fai_carve(&a, (size_t)(n + 1) * sizeof(int64_t));
    return a.used;
}

/*
 * The forward of a call (fai_run_call, on the plan made once for it: arg): the decode path
 * over every group it takes, in one run, then the tiles over every other group, in one task
 * space: a batch of short sequences shares the threads out as one dense batch does. The
 * tiles' groups and their first tasks lie in the shared block (the decode path's, before).
 */
static fa_status forward_need(const fa_context *ctx, const fai_problem *call, const void *arg,
                              fai_need *need)
{
    const fai_tiled_plan *plan = arg;
    FAI_TRY(fai_tiled_decode_need(ctx, call, plan, need));
    const int64_t n = tile_groups(call, plan, NULL, NULL);
    if (n == 0)
        return FA_OK;
    const size_t per = call->dtype == FA_F64
                           ? forward_need_f64(call, fai_kernels_f64_portable(), plan)
                           : forward_need_f32(call, ctx->kernels, plan);
    int64_t *g, *first;
    const size_t shared = tile_groups_carve(n, NULL, &g, &first);
    need->per = per > need->per ? per : need->per;
    need->shared = shared > need->shared ? shared : need->shared;
    return FA_OK;
}

static void forward_run(fa_context *ctx, const fai_problem *call, const void *arg,
                        const fai_scratch *sc)
{
    const fai_tiled_plan *plan = arg;
    fai_tiled_decode(ctx, call, plan, ctx->kernels, sc);
    const int64_t n = tile_groups(call, plan, NULL, NULL);
    if (n == 0)
        return;
    int64_t *g, *first;
    tile_groups_carve(n, sc->shared, &g, &first);
    tile_groups(call, plan, g, first);
    if (call->dtype == FA_F64)
        forward_f64(ctx, call, fai_kernels_f64_portable(), plan, g, first, n, sc);
    else
        forward_f32(ctx, call, ctx->kernels, plan, g, first, n, sc);
}

static fa_status backward_need(const fa_context *ctx, const fai_problem *pr, fai_need *need)
{
    const fai_tiled_plan plan = fai_tiled_plan_backward(ctx, pr);
    need->per = pr->dtype == FA_F64 ? backward_need_f64(pr, &plan) : backward_need_f32(pr, &plan);
    return FA_OK;
}

static void backward_run(fa_context *ctx, const fai_problem *pr, const fai_scratch *sc)
{
    const fai_tiled_plan plan = fai_tiled_plan_backward(ctx, pr);
    if (pr->dtype == FA_F64)
        backward_f64(ctx, pr, fai_kernels_f64_portable(), &plan, sc);
    else
        backward_f32(ctx, pr, ctx->kernels, &plan, sc);
}

static fa_status tiled_forward(fa_context *ctx, const fai_problem *pr)
{
    fai_tiled_plan plan;
    FAI_TRY(fai_tiled_plan_forward(ctx, pr, &plan));
    const fa_status st = fai_run_call(ctx, pr, 0, "tiled", &plan, forward_need, forward_run);
    fai_tiled_plan_release(ctx, &plan);
    return st;
}

static fa_status tiled_backward(fa_context *ctx, const fai_problem *pr)
{
    return fai_run_groups(ctx, pr, 1, "tiled", backward_need, backward_run);
}

const fai_backend fai_backend_tiled = {
    .name = "tiled",
    .sequences = 1,
    .backward_reads_lse = 1,
    .ops = {[FAI_OP_FORWARD] = tiled_forward, [FAI_OP_BACKWARD] = tiled_backward},
    .setup = fai_tiled_setup,
    .describe = fai_tiled_describe,
};
