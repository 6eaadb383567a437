/*
 * The tiled backend's plan: every tiling decision its loop nest reads, made once per call
 * (backends/tiled/plan.c has the rules and the measurements behind them). The templates only
 * read a fai_tiled_plan; nothing below it decides again.
 */
#ifndef FAI_TILED_PLAN_H
#define FAI_TILED_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "backends/context.h"
#include "backends/problem.h"

/* What the environment forces on the plan, for tile sweeps, read once per context
 * (backends/tiled/setup.c, the backend's setup hook): FA_TILES=BQxBK[xBR] (bq = 0: not
 * forced), FA_BACKWARD_PASSES=1|2 (0: planned) and FA_DECODE=0 (the forward's decode path
 * never taken; 1 or unset: where the plan takes it). */
typedef struct {
    int64_t bq, bk, br;
    int backward_passes;
    int decode_off;
} fai_tiled_forced;

/* The context's (its settings of the tiled backend). */
static inline fai_tiled_forced fai_tiled_forced_of(const fa_context *ctx)
{
    fai_tiled_forced f;
    fai_settings_get(ctx, FA_BACKEND_TILED, &f, sizeof f);
    return f;
}

/* The backend's hooks (fai_backend.setup and .describe): reads the variables above into its
 * settings; writes the tiles of fa_context_describe's line (f32 at D = 64 and 128, forward
 * and backward; bf16's forward at D = 128 where the kernel set has tile products). */
fa_status fai_tiled_setup(const fa_options *o, fai_backend_settings *mine);
void fai_tiled_describe(const fa_context *ctx, char *buf, size_t n);

typedef struct {
    int64_t bq; /* query rows per tile */
    int64_t bk; /* keys per tile       */
    int64_t br; /* forward: query rows whose scores are formed and consumed at once */
} fai_tiles;

/*
 * The forward of a call: each group takes one path, decided once per call by
 * fai_tiled_plan_forward and read from the plan (fai_tiled_plan_path). An empty group none
 * (backends/empty.h: its results are written without computing); the decode path
 * (backends/tiled/decode.c) where fai_tiled_decode_keys is > 0, its keys split into chunks of
 * decode_keys; else the tiles: every tile group's tasks (batch, head, query tile:
 * fai_tiled_group_tasks at task_rows rows a task) in one task space.
 */
typedef enum { FAI_TILED_NONE, FAI_TILED_DECODE, FAI_TILED_TILES } fai_tiled_path;

typedef struct {
    fai_tiles tl;      /* the tiles, which size each thread's workspace */
    int64_t task_rows; /* forward: the query rows a task takes: tl.bq, or tl.bq halved (not below
                          tl.br) while there are too few tasks to share out */
    const fai_kernels_bf16 *tile_products; /* the set's tile products, where they take the
                                              problem (bf16 storage), else NULL */
    int single_pass;   /* backward: dQ accumulated per kv head in one pass, else two passes */
    /* forward: each group's fai_tiled_path, one byte each: a call of sequences' in paths
     * (paths_bytes allocated on the context: fai_tiled_plan_release), a dense call's in path */
    unsigned char *paths;
    size_t paths_bytes;
    unsigned char path;
    int64_t decode_keys; /* forward: the decode path's keys per chunk */
} fai_tiled_plan;

/* The path of group g of the call a forward plan is for. */
static inline fai_tiled_path fai_tiled_plan_path(const fai_tiled_plan *p, int64_t g)
{
    return (fai_tiled_path)(p->paths ? p->paths[g] : p->path);
}

/* The plan of a forward (FA_ERR_NO_MEMORY where a call of sequences' paths find no room; its
 * bytes are released by fai_tiled_plan_release) and of a backward group. */
fa_status fai_tiled_plan_forward(fa_context *ctx, const fai_problem *call, fai_tiled_plan *p);
void fai_tiled_plan_release(fa_context *ctx, fai_tiled_plan *p);
fai_tiled_plan fai_tiled_plan_backward(const fa_context *ctx, const fai_problem *pr);
/* The rules the forward plan applies to each group: the decode path's keys per chunk where it
 * takes the group (else 0), and a tile group's tasks at bq rows a task. */
int64_t fai_tiled_decode_keys(const fa_context *ctx, const fai_problem *group);
int64_t fai_tiled_group_tasks(const fai_problem *group, int64_t bq);

/* The tiles of a forward or a backward with these head dims and storage dtype in ctx (forced
 * tiles included): what fa_context_describe prints and the tests size their cases by. */
fai_tiles fai_tiled_tiles(const fa_context *ctx, int64_t dqk, int64_t dv, fa_dtype d,
                          int backward);

/* The rules themselves, from cache sizes (tested on made-up caches): the forward's tiles for
 * element size es and a GEMM kernel of mr rows, and the backward's. */
fai_tiles fai_plan_forward_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es,
                                 int64_t mr);
fai_tiles fai_plan_backward_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es);

#endif
