/* The tile plan: cache sizes in, tile sizes out. ALL tile-size policy lives in plan.c. */
#ifndef FAI_CORE_PLAN_H
#define FAI_CORE_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t l1d, l2;      /* bytes, per core */
    const char *source;   /* where the sizes came from: "sysconf", "sysfs", "default" */
} fai_cache_info;

typedef struct {
    int64_t bq; /* query rows per tile */
    int64_t bk; /* keys per tile       */
    int64_t br; /* forward: query rows whose scores are formed and consumed at once */
} fai_tiles;

void fai_cache_detect(fai_cache_info *ci);
/* Tiles of the forward and of the backward's two passes (their trade-offs differ: plan.c). */
fai_tiles fai_plan_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t elem_size);
/* The forward's rows per strip for key tiles of bk (also for tiles forced by FA_TILES); with
 * the tile products of bf16 storage (AMX), fai_plan_strip_tiles. */
int64_t fai_plan_strip(const fai_cache_info *ci, int64_t bk, size_t elem_size);
int64_t fai_plan_strip_tiles(const fai_cache_info *ci, int64_t bk);
/* The query rows a forward task takes for `heads` (batch x head) pairs of sq rows on `threads`
 * threads: tl.bq, or less where there are too few tasks to share out. */
int64_t fai_plan_forward_rows(fai_tiles tl, int64_t heads, int64_t sq, int threads);
fai_tiles fai_plan_tiles_backward(const fai_cache_info *ci, int64_t dqk, int64_t dv,
                                  size_t elem_size);
/* Whether the backward runs as one pass: `tasks` (b, kv head) pairs on `threads` threads, with
 * dq_bytes of dQ per task held by each thread. */
int fai_plan_backward_single_pass(int64_t tasks, int threads, int64_t dq_bytes);

#endif
