/*
 * The tiled backend's plan: every tile size and every choice of loop its templates read, in one
 * place, each rule with the measurement behind it (the dated tables: docs/notes/tiles.md).
 *
 * The loop nest works on a query tile of Bq rows against a key tile of Bk keys: the scores
 * S = Q K^T, their probabilities P and the product P V are formed by the kernel set's GEMM
 * micro-kernel (simd/), which streams the packed K^T panel (Dqk x Bk) and V panel
 * (Bk x Dv) once per MR rows. The forward forms S and P a strip of Br rows at a time (Br x Bk
 * in L1); the backward holds whole Bq x Bk tiles. Each has its own rule below.
 */
#include "config.h"

#include "backends/empty.h"
#include "backends/groups.h"
#include "backends/tiled/plan.h"

static int64_t floor_pow2(int64_t x)
{
    int64_t p = 1;
    while (p * 2 <= x)
        p *= 2;
    return p;
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

/* The key-tile bound both directions start from: the two key panels, K^T and V, fill at most
 * 1/4 of L2 (256 KiB of a 1 MiB L2), a power of two in [16, 256]. */
static int64_t key_tile_max(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    return clamp64(floor_pow2((ci->l2 / 4) / ((dqk + dv) * (int64_t)es)), 16, 256);
}

/*
 * Rows per strip on the GEMM kernels: the largest multiple of q whose score strip (br x bk)
 * fills at most half of L1d, at least q, with q = lcm(MR, 24): a strip starts on a boundary of
 * the packed Q's MR-row panels, and 24 rows are as fast as 48 or 96 (measured on Emerald
 * Rapids, H=2 D=128; tiles.md), so no set takes fewer (every set's MR divides 24 today: the
 * AVX-512 12, NEON 8, AVX2 6, portable 4 and f64 8).
 */
static int64_t strip_rows(const fai_cache_info *ci, int64_t bk, size_t es, int64_t mr)
{
    const int64_t q = mr / gcd64(mr, 24) * 24;
    const int64_t br = (ci->l1d / 2) / (bk * (int64_t)es) / q * q;
    return br > q ? br : q;
}

/*
 * Rows per strip on the tile products (bf16 storage), which take a strip in blocks of
 * `rows` (16): the largest multiple of it whose f32 score strip fills at most 2/3 of L1d, at
 * least one block: 32 rows with 256-key tiles and 48 KiB (the GEMM rule's 24 left half of the
 * second block idle). On the GPU machine's Xeon (D=128 bf16, 1 thread, AMX), 32-row strips ran
 * at 263-293 GFLOP/s, 24-row ones at 195-211, 48-row ones at 189-239 (tiles.md). Measured on
 * AMX only: the AVX512_BF16 set takes the same rule unmeasured (it has run on no Zen 4/5).
 */
static int64_t strip_rows_tiles(const fai_cache_info *ci, int64_t bk, int64_t rows)
{
    const int64_t br = (ci->l1d * 2 / 3) / (bk * (int64_t)sizeof(float)) / rows * rows;
    return br > rows ? br : rows;
}

/*
 * Forward. A query tile packs each key tile it visits once (K^T by transposes, V by copies)
 * and takes it in strips of br rows, each strip's scores formed, exponentiated and multiplied
 * by V while they are in L1. So Bk is the panel bound, and Bq is what amortizes the packing,
 * whose reads are K and V rows at the tensor's sequence stride (4 KiB for H=8, D=128 f32: one
 * row per page, which the hardware prefetchers do not follow). Against that, each key tile
 * streams the query tile's Q panels and acc through L2, sequentially, which they do follow;
 * so Bq is the largest power of two up to 4096 whose Q and acc take at most twice L2 (4096 rows
 * at D=128 with 2 MiB of L2; the workspace stays a few MiB a thread). Measured on Emerald
 * Rapids, H=8 N=4096, 1 thread: 4096x256 the fastest of 14 tiles at D=128 and D=64 (2048x256
 * within 1%; 512x128, the best tile before strips, 9% slower); at H=2, where the packing's
 * stride is 1 KiB, 1024 to 4096 rows are alike (tiles.md).
 */
fai_tiles fai_plan_forward_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es,
                                 int64_t mr)
{
    const int64_t bk = key_tile_max(ci, dqk, dv, es);
    int64_t bq = 4096;
    while (bq > 16 && bq * (dqk + dv) * (int64_t)es > 2 * ci->l2)
        bq /= 2;
    const int64_t br = strip_rows(ci, bk, es, mr);
    return (fai_tiles){bq, bk, br < bq ? br : bq};
}

/*
 * The query rows a forward task takes: the plan's Bq, halved (down to one strip) while the
 * call's (group, batch, head, query tile) tasks number fewer than four per thread. Tasks are
 * whole tiles and threads take them dynamically, so four per thread bounds the imbalance by
 * about a quarter (the backward's single-pass rule below uses the same bound). The workspace
 * keeps the plan's size, and no row's result depends on its query tile, so results stay the
 * same at every thread count.
 */
static int64_t forward_task_rows(const fa_context *ctx, const fai_problem *call,
                                 const fai_tiled_plan *p)
{
    int64_t bq = p->tl.bq;
    for (; bq / 2 >= p->tl.br; bq /= 2) {
        double tasks = 0; /* a double: the count only meets a bound */
        for (int64_t g = 0; g < fai_groups(call); g++)
            if (fai_tiled_plan_path(p, g) == FAI_TILED_TILES) {
                const fai_problem s = fai_group(call, g);
                tasks += (double)fai_tiled_group_tasks(&s, bq);
            }
        if (tasks >= 4.0 * ctx->num_threads)
            break;
    }
    return bq;
}

int64_t fai_tiled_group_tasks(const fai_problem *group, int64_t bq)
{
    return group->b * group->hq * ((group->sq + bq - 1) / bq);
}

/*
 * Backward. Each pass holds five Bq x Bk tiles (S, dP, tanh, P~, dS) next to the key tile's
 * K, K^T, V, V^T and gradients and the query block's Q, dO, O, their transposes and dQ. Bk is
 * the panel bound; Bq the largest power of two up to 256 whose five tiles fit in 2/3 of L2.
 * Measured on Emerald Rapids (2 MiB L2, H=8 N=4096): the rule's 256x256 the fastest of five
 * tiles at D=128 and of four at D=64, by 1-4% over the next; on Zen 5 (1 MiB L2, D=128, H=4
 * N=2048) its 128x256 took 19% less time than 128x64 (tiles.md).
 */
fai_tiles fai_plan_backward_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    const int64_t bk = key_tile_max(ci, dqk, dv, es);
    const int64_t bq = floor_pow2((ci->l2 / 3 * 2) / (5 * bk * (int64_t)es));
    return (fai_tiles){clamp64(bq, 16, 256), bk, 0}; /* br: forward only */
}

/*
 * The backward in one pass (dQ accumulated per (b, kv head) as its key tiles go by) or in two
 * (dK/dV per key tile, then dQ per query tile, each recomputing S and dP): one pass does 5 tile
 * GEMMs per block pair where two do 7, and reads K and V once. It holds dQ of a kv head's
 * query heads (group x Sq x Dqk) per thread, so it is taken while that stays within 8 MiB and
 * while there are enough (b, kv head) tasks to share out: a multiple of the thread count, or
 * at least four per thread (the tasks are whole heads, so that bounds the imbalance by 1/4).
 * Measured on Emerald Rapids (H=8 N=4096 f32, 1 thread): one pass takes 30% less time than two
 * at D=128 (0.76 of SGEMM against 0.53) and 22% less at D=64 (tiles.md).
 */
static int backward_single_pass(int64_t tasks, int threads, int64_t dq_bytes)
{
    return dq_bytes <= ((int64_t)8 << 20) && (tasks % threads == 0 || tasks >= 4 * threads);
}

/* The set's tile products where they take a forward: bf16 storage, Dqk and Dv multiples of
 * their k and n steps; else NULL. */
static const fai_kernels_bf16 *tile_products(const fa_context *ctx, fa_dtype d, int64_t dqk,
                                             int64_t dv)
{
    const fai_kernels_bf16 *t = ctx->kernels->bf16;
    return t && d == FA_BF16 && dqk % t->dqk_step == 0 && dv % t->dv_step == 0 ? t : NULL;
}

/* The set's tile products where they take a backward: Q, K, V and dO in bf16, both head dims
 * multiples of the k step (dP = dO V^T sums over Dv), key tiles of whole key chunks (dQ's
 * sums run over a key tile in chunks); else NULL. */
static const fai_kernels_bf16 *backward_tile_products(const fa_context *ctx,
                                                      const fai_problem *pr, fai_tiles tl)
{
    const fai_kernels_bf16 *t = tile_products(ctx, pr->dtype, pr->dqk, pr->dv);
    return t && pr->q_dtype == FA_BF16 && pr->k_dtype == FA_BF16 && pr->v_dtype == FA_BF16 &&
                   pr->dv % t->dqk_step == 0 && tl.bk % t->keys == 0
               ? t
               : NULL;
}

/* The GEMM kernel's MR for storage dtype d: the context's set, or the f64 one. */
static int64_t kernel_mr(const fa_context *ctx, fa_dtype d)
{
    return d == FA_F64 ? fai_kernels_f64_portable()->mr : ctx->kernels->mr;
}

fai_tiles fai_tiled_tiles(const fa_context *ctx, int64_t dqk, int64_t dv, fa_dtype d,
                          int backward)
{
    const size_t es = d == FA_F64 ? sizeof(double) : sizeof(float);
    const fai_kernels_bf16 *tiles = backward ? NULL : tile_products(ctx, d, dqk, dv);
    const fai_tiled_forced forced = fai_tiled_forced_of(ctx);
    fai_tiles t;
    if (forced.bq > 0) { /* forced (FA_TILES): taken as given, but for a missing strip */
        t = (fai_tiles){forced.bq, forced.bk, forced.br};
        if (t.br == 0) {
            const int64_t br = tiles ? strip_rows_tiles(&ctx->cache, t.bk, tiles->rows)
                                     : strip_rows(&ctx->cache, t.bk, es, kernel_mr(ctx, d));
            t.br = br < t.bq ? br : t.bq;
        }
        return t;
    }
    if (backward)
        return fai_plan_backward_tiles(&ctx->cache, dqk, dv, es);
    t = fai_plan_forward_tiles(&ctx->cache, dqk, dv, es, kernel_mr(ctx, d));
    if (tiles) {
        const int64_t br = strip_rows_tiles(&ctx->cache, t.bk, tiles->rows);
        t.br = br < t.bq ? br : t.bq;
    }
    return t;
}

/*
 * Decode: where a kv head has few query rows (its GQA group's heads times Sq, at most
 * DECODE_ROWS), the forward reads each K and V row once for all of them, straight from
 * storage (kernels' dot_rows and pv_rows), instead of packing key tiles per query head: with
 * one query row per head the packing and the GEMM kernel's MR-row panels cost more than the
 * product. The keys are split into chunks of DECODE_KEYS, each its own task and partial
 * state, merged in key order: so one (b, kv head) keeps every thread busy, and the result
 * does not depend on the thread count (the chunks are the problem's, not the threads').
 * Measured on Zen 4 (B=1, Sq=1, Hq=32, Hk=8, D=128, f16 KV, causal; docs/notes/inference.md):
 * KV read at 7.5-8.1 GB/s on 1 thread (0.43-0.45 of stream reads), 13.6-14.6 on 2 (0.45-0.47),
 * where the tiles read 0.6-0.9 and 0.9-2.2 (0.03-0.07); on Zen 5, once each head's rows were
 * fetched just before its kernel call (decode.c), 0.94-1.05 on 1 thread and 0.70-0.76 on 2
 * (two vCPUs sharing one core's FMA units). 16 rows: a GQA group of 4 to 16
 * heads, or a few query positions (speculative decode); 512-key chunks: a 64k-key head is
 * 128 tasks, the merge costs 1/512 of the chunk's work.
 * Dropout keeps the tiles (its decisions and selection are theirs), f64 storage too, FP8 q
 * (the all-FP8 forward), and so do forced tiles (FA_TILES: a sweep of the tiles means them).
 * An FP8 cache's descales fold as the tiles fold them (decode.c).
 */
#define DECODE_ROWS 16
#define DECODE_KEYS 512

int64_t fai_tiled_decode_keys(const fa_context *ctx, const fai_problem *pr)
{
    const fai_tiled_forced forced = fai_tiled_forced_of(ctx);
    /* the decode kernels read every K/V dtype a forward takes under f32, f16 or bf16 q (FP8
     * caches under f32 or bf16 q); all-FP8 inputs keep the tiles, where their tests and the
     * oracle's FP8 yardstick hold them */
    const int applies = pr->dtype != FA_F64 && pr->drop.threshold == 0 && !fai_row_biased(pr) &&
                        !fai_dtype_is_fp8(pr->q_dtype) &&
                        pr->group * pr->sq <= DECODE_ROWS && !forced.decode_off &&
                        forced.bq == 0; /* forced tiles (FA_TILES) are for the tiles */
    return applies ? DECODE_KEYS : 0;
}

/* The path of a group of a forward (and the decode path's keys per chunk into *keys, else
 * 0). */
static fai_tiled_path group_path(const fa_context *ctx, const fai_problem *group, int64_t *keys)
{
    *keys = 0;
    if (fai_empty_of(group, 0) != FAI_NOT_EMPTY) /* its results are written, not computed */
        return FAI_TILED_NONE;
    *keys = fai_tiled_decode_keys(ctx, group);
    return *keys > 0 ? FAI_TILED_DECODE : FAI_TILED_TILES;
}

fa_status fai_tiled_plan_forward(fa_context *ctx, const fai_problem *call, fai_tiled_plan *plan)
{
    fai_tiled_plan p = {0};
    const fai_problem *pr = call; /* the dims and dtypes below are every group's */
    /* a cache dtype apart from q's takes the kernels' tiles, never the tile products' */
    /* the compute type's tiles: f64 storage (of out, under FP8 q too) computes in double */
    const int kv_as_q = pr->k_dtype == pr->dtype && pr->v_dtype == pr->dtype;
    const fa_dtype tiles_for = pr->dtype == FA_F64 || kv_as_q ? pr->dtype : FA_F32;
    p.tl = fai_tiled_tiles(ctx, pr->dqk, pr->dv, tiles_for, 0);
    /* the tile products take bf16 Q, K and V alike (a cache of another dtype: the kernels) */
    p.tile_products = kv_as_q ? tile_products(ctx, pr->dtype, pr->dqk, pr->dv) : NULL;
    /* each group's path, decided here once for the task rows below and the loop nests */
    const int64_t n = fai_groups(call);
    if (call->nseq > 0) {
        p.paths_bytes = (size_t)n;
        if (!(p.paths = fai_alloc(&ctx->mem, p.paths_bytes)))
            return fai_fail(FA_ERR_NO_MEMORY, "tiled: %zu bytes for the paths of %lld sequences",
                            p.paths_bytes, (long long)n);
    }
    for (int64_t g = 0; g < n; g++) {
        const fai_problem s = fai_group(call, g);
        int64_t keys;
        const unsigned char path = (unsigned char)group_path(ctx, &s, &keys);
        *(p.paths ? &p.paths[g] : &p.path) = path;
        p.decode_keys = keys > 0 ? keys : p.decode_keys; /* (alike for every decode group) */
    }
    /* forced tiles are taken as they are; the workspace is sized by p.tl either way */
    p.task_rows = fai_tiled_forced_of(ctx).bq > 0 ? p.tl.bq : forward_task_rows(ctx, call, &p);
    *plan = p;
    return FA_OK;
}

void fai_tiled_plan_release(fa_context *ctx, fai_tiled_plan *p)
{
    fai_free(&ctx->mem, p->paths, p->paths_bytes);
    p->paths = NULL;
}

fai_tiled_plan fai_tiled_plan_backward(const fa_context *ctx, const fai_problem *pr)
{
    fai_tiled_plan p = {0};
    p.tl = fai_tiled_tiles(ctx, pr->dqk, pr->dv, pr->dtype, 1);
    const int64_t es = pr->dtype == FA_F64 ? (int64_t)sizeof(double) : (int64_t)sizeof(float);
    p.tile_products = backward_tile_products(ctx, pr, p.tl);
    const int passes = fai_tiled_forced_of(ctx).backward_passes;
    p.single_pass = passes ? passes == 1
                           : backward_single_pass(pr->b * pr->hk, ctx->num_threads,
                                                  pr->group * pr->sq * pr->dqk * es);
    return p;
}
