/*
 * The tiled forward's decode path: few query rows per kv head (a GQA group's heads times Sq,
 * at most the plan's bound), many keys. The tiles' loop nest would pack every key tile once per
 * query head and query tile and run MR-row GEMM panels for one row; here the R = group x Sq
 * rows of a kv head meet each K and V row once, read where it is stored and widened as it is
 * loaded (the kernel set's dot_rows and pv_rows), and the keys are split into fixed chunks
 * that are tasks of their own:
 *
 *   1. per chunk [j0, j0 + n) of the keys (on a grid of the plan's chunk size from key 0), the
 *      chunk's scores S = Q K^T for all R rows, then per row its block max m, P = exp(S - m)
 *      over the keys it may see and l = sum P: the chunk's state (m, l, acc = P V) relative to
 *      its own m, as core/recurrence.h defines a state; no rescale inside a chunk, whose
 *      scores stay in L1 (R x chunk floats);
 *   2. per row, the chunks' states folded into the first in key order (fai_online_merge),
 *      then ended as every CPU path ends a row (fai_online_end: the sink, the finalization).
 *
 * A chunk's state depends on the problem alone and the fold's order is fixed, so the result is
 * the same at every thread count, whichever thread computed which chunk. Chunks outside the
 * rows' key span are never visited; a row that sees none of a chunk's keys has the empty
 * state there (m = -inf, l = 0, acc = 0), which the fold leaves neutral. As in the tiles, a
 * row's allowed keys enter P V even where P is 0 (an inf in an allowed V row makes the row
 * NaN, as in the reference), and keys it may not see never do: rows of one query position
 * (consecutive here) share their interval, and each run of positions with the same interval
 * takes one pv_rows call over exactly those keys.
 *
 * One run takes every group of a call that the plan sends here (a dense problem's batches, or
 * the sequences of a variable-length, paged or cached call), so that a batch of short
 * sequences keeps every thread busy as one contiguous batch does: its units are *items*, a
 * batch of a group, whose tasks (a chunk of a run of kv heads) form one task space. Memory:
 * each thread's workspace (heads x R x (Dqk + chunk) floats) and the chunks' states, R x
 * (Dv + 2) floats a chunk (0.8% of an f16 K and V's bytes at Dqk = Dv = 128, R = 4, 512-key
 * chunks), bounded by taking the items in waves (one item's states at least).
 *
 * Row r of a kv head hk is query row r / group of head hk group + r % group.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "backends/context.h"
#include "backends/rows.h"
#include "backends/tiled/decode.h"
#include "core/recurrence.h"

#define STATE_BYTES ((size_t)32 << 20) /* at most this much of chunk states at once */
#define SCORE_BYTES ((size_t)128 << 10) /* a task's scores (its kv heads x R x chunk) */
#define WAVE_ITEMS ((int64_t)4096)     /* at most this many items in a wave (their records) */

/*
 * Memory order. K and V rows of one kv head lie a sequence stride apart (2 KiB for 8 kv heads
 * of 128 f16 dims in BSHD), and reading one head's rows alone runs far below the machine's
 * bandwidth: measured on Zen 4 (1 thread, 256 B rows 2 KiB apart), 5.8 GB/s head by head
 * against 23-24 GB/s for the same bytes in address order, 16 GB/s in blocks of 4 keys x 8
 * heads fetched 8-16 keys ahead into L2 (docs/notes/inference.md). So a task takes a chunk for
 * a run of kv heads and forms the scores of all its heads BLOCK keys at a time, and likewise
 * P V; before each head's kernel call over a block, that head's rows PREFETCH keys ahead are
 * fetched. Fetched in one burst per block for all heads instead, the core stalls on the
 * prefetches (its miss buffers full) and then computes while the memory idles: on Zen 5, 1
 * thread, Hq 32 / Hk 8, f16, 0.48-0.57 of stream against 0.65-1.05 per head (two alternated
 * rounds); blocks of 32 or 64 keys (longer bursts) 0.57-0.77, of 8 alike 16. 128- and
 * 256-key chunks were slower (0.33-0.44, Zen 4) than 512.
 */
#define BLOCK 16
#define PREFETCH 16

typedef struct {
    float *q;      /* heads x R x dqk: the rows, widened        */
    float *s;      /* heads x R x keys: scores, then P in place */
    int64_t *cols; /* per query position: the chunk's columns it sees, [c0, c1) */
    const char **runs; /* per head: prefetch_keys' rows */
} decode_ws;

/* A group of the call that the decode path takes, as its chunks see it (from its problem
 * alone). */
typedef struct {
    fai_problem pr;          /* the group's dense problem (fai_group) */
    int64_t keys;            /* per chunk */
    int64_t rows;            /* R = group x Sq */
    fai_mask part[2];        /* the mask's parts, in key order (core/score.h) */
    int64_t c_lo[2], c_n[2]; /* part p's chunks: c_lo[p] .. c_lo[p] + c_n[p] - 1 */
    int64_t nc;              /* c_n[0] + c_n[1]: the chunks visited, part 0's first */
    int64_t heads_max;       /* kv heads a task may take: its scores within SCORE_BYTES */
    int scale_only;          /* the score pipeline is the scale alone: dot_rows applies it */
} decode_group;

/* An item of a wave: batch b of group g (nc chunks), its tasks each a chunk of `heads` kv
 * heads, its states from state0 (floats into the wave's states). */
typedef struct {
    int64_t g, b, nc, heads, state0;
} decode_item;

/* Group g of the call as the decode path sees it; 0 (dg unset) where the plan does not send
 * the group here. */
static int group_setup(const fai_problem *call, const fai_tiled_plan *plan, int64_t g,
                       decode_group *dg)
{
    if (fai_tiled_plan_path(plan, g) != FAI_TILED_DECODE)
        return 0;
    dg->pr = fai_group(call, g);
    const fai_problem *pr = &dg->pr;
    dg->keys = plan->decode_keys;
    dg->rows = pr->group * pr->sq;
    dg->scale_only = pr->score.softcap == 0 && !pr->slopes;
    /* each part's chunks on the grid of multiples of keys from key 0 */
    const int np = fai_mask_parts(&pr->mask, dg->part);
    dg->nc = 0;
    for (int p = 0; p < 2; p++) {
        int64_t jlo = 0, jhi = 0;
        if (p < np)
            fai_mask_key_span(&dg->part[p], 0, pr->sq, &jlo, &jhi);
        dg->c_lo[p] = jlo < jhi ? jlo / dg->keys : 0;
        dg->c_n[p] = jlo < jhi ? (jhi - 1) / dg->keys + 1 - dg->c_lo[p] : 0;
        dg->nc += dg->c_n[p];
    }
    if (dg->nc == 0) /* no row sees a key: one chunk, empty for every row */
        dg->c_n[0] = dg->nc = 1;
    dg->heads_max = (int64_t)(SCORE_BYTES / ((size_t)(dg->rows * dg->keys) * sizeof(float)));
    dg->heads_max = dg->heads_max < 1 ? 1 : dg->heads_max > pr->hk ? pr->hk : dg->heads_max;
    return 1;
}

static size_t ws_carve(const decode_group *dg, int64_t heads, char *base, decode_ws *w)
{
    fai_arena a = {base, 0};
    w->q = fai_carve(&a, (size_t)(heads * dg->rows * dg->pr.dqk) * sizeof(float));
    w->s = fai_carve(&a, (size_t)(heads * dg->rows * dg->keys) * sizeof(float));
    w->cols = fai_carve(&a, (size_t)(2 * dg->pr.sq) * sizeof(int64_t));
    w->runs = fai_carve(&a, (size_t)heads * sizeof(const char *));
    return a.used;
}

/* A chunk's state: m[R], l[R], then acc (R x Dv). */
static int64_t state_floats(const decode_group *dg) { return dg->rows * (dg->pr.dv + 2); }

/* The floats of one item's states (its kv heads x chunks), or 0 if their bytes pass half the
 * address space: a K and V of broadcast strides can declare more keys and heads than memory
 * holds. A wave holds one such item at most beside WAVE_ITEMS records, so its bytes
 * (wave_carve) cannot wrap. */
static size_t item_floats(const decode_group *dg)
{
    size_t n;
    if (!fai_mul_size((size_t)dg->pr.hk, (size_t)dg->nc, &n) ||
        !fai_mul_size(n, (size_t)state_floats(dg), &n) || n > SIZE_MAX / 2 / sizeof(float))
        return 0;
    return n;
}

/*
 * The next wave, from item (*g, *b) on: as many items as STATE_BYTES of states and WAVE_ITEMS
 * hold (one at least), written to items[] where items is not NULL, with their heads per task
 * (up to each group's bound, fewer while the wave has under four tasks a thread: a head's state
 * does not depend on its task) and their first tasks in first[0 .. n] (first[n]: all of
 * them). Advances (*g, *b) past them; returns their number (0: none left) and the states'
 * floats in *floats, or -1 where one item's states overflow the address space.
 */
static int64_t next_wave(const fa_context *ctx, const fai_problem *call,
                         const fai_tiled_plan *plan, int64_t *g, int64_t *b, decode_item *items,
                         int64_t *first, size_t *floats)
{
    const int64_t ng = fai_groups(call);
    int64_t n = 0, chunks = 0, hmax = 1;
    size_t total = 0;
    for (; *g < ng; (*g)++, *b = 0) {
        decode_group dg;
        if (!group_setup(call, plan, *g, &dg))
            continue;
        const size_t f = item_floats(&dg);
        if (f == 0)
            return -1;
        for (; *b < dg.pr.b; (*b)++) {
            if (n == WAVE_ITEMS || (n > 0 && total + f > STATE_BYTES / sizeof(float)))
                goto full;
            if (items)
                items[n] = (decode_item){.g = *g, .b = *b, .nc = dg.nc, .heads = dg.heads_max,
                                         .state0 = (int64_t)total};
            total += f;
            chunks += dg.nc;
            hmax = dg.heads_max > hmax ? dg.heads_max : hmax;
            n++;
        }
    }
full:
    *floats = total;
    if (items && n > 0) {
        const int64_t hk = call->hk;
        int64_t cap = hmax;
        while (cap > 1 && (double)chunks * (double)((hk + cap - 1) / cap) < 4.0 * ctx->num_threads)
            cap = (cap + 1) / 2;
        int64_t t = 0;
        for (int64_t i = 0; i < n; i++) {
            items[i].heads = items[i].heads < cap ? items[i].heads : cap;
            first[i] = t;
            t += items[i].nc * ((hk + items[i].heads - 1) / items[i].heads);
        }
        first[n] = t;
    }
    return n;
}

/* Fetches (into L2) the rows of keys [j0, j1) of kv heads [h0, h1) of role r, key by key, head
 * by head: every line of each row (run by run of the layout: a page at a time). runs holds one
 * pointer per head. */
static void prefetch_keys(const fai_problem *pr, fai_role r, int64_t b, int64_t h0, int64_t h1,
                          int64_t j0, int64_t j1, int64_t dim, const char **runs)
{
    const fa_dtype dt = fai_role_dtype(pr, r);
    const int64_t bytes = fai_dtype_bytes(dt, dim);
    for (int64_t j = j0; j < j1;) {
        const int64_t m = fai_kv_run_len(pr, j, j1 - j);
        int64_t ld = 0;
        for (int64_t h = h0; h < h1; h++)
            runs[h - h0] = fai_kv_rows(pr, r, b, h, j, m, &ld);
        const int64_t step = fai_dtype_bytes(dt, ld); /* from a row to the next, in bytes */
        for (int64_t x = 0; x < m; x++)
            for (int64_t h = 0; h < h1 - h0; h++) {
                const uintptr_t row = (uintptr_t)(runs[h] + x * step);
                for (uintptr_t a = row & ~(uintptr_t)63; a < row + (uintptr_t)bytes; a += 64)
                    __builtin_prefetch((const void *)a, 0, 2);
            }
        j += m;
    }
}

/* Chunk c of a group (0 .. nc - 1): its part's mask and its first key. */
static const fai_mask *chunk_at(const decode_group *dg, int64_t c, int64_t *j0)
{
    const int p = c >= dg->c_n[0];
    *j0 = (dg->c_lo[p] + c - (p ? dg->c_n[0] : 0)) * dg->keys;
    return &dg->part[p];
}

/*
 * Step 1 for the chunk [j0, j0 + n) of kv heads [h0, h1) of batch b of a group, under one part
 * of its mask (a plain one), head h's state at st + (h - h0) sf. Each head's state is what it
 * would be alone: its scores do not depend on which keys or rows share a dot_rows call, its
 * P V sums keys in order however they are split.
 */
static void decode_chunk(const decode_group *dg, const fai_kernels_f32 *kern,
                         const fai_mask *mask, int64_t b, int64_t h0, int64_t h1, int64_t j0,
                         int64_t n, decode_ws *w, float *st, int64_t sf)
{
    const fai_problem *pr = &dg->pr;
    const int64_t G = pr->group, R = dg->rows, dqk = pr->dqk, dv = pr->dv, ld = dg->keys;
    for (int64_t h = h0; h < h1; h++) {
        float *m = st + (h - h0) * sf, *l = m + R;
        for (int64_t r = 0; r < R; r++) {
            m[r] = -INFINITY;
            l[r] = 0;
        }
        memset(l + R, 0, (size_t)(R * dv) * sizeof(float));
    }

    int64_t cs0 = n, cs1 = 0; /* the columns some row sees */
    for (int64_t i = 0; i < pr->sq; i++) {
        int64_t lo, hi, *c = w->cols + 2 * i;
        fai_mask_row(mask, i, &lo, &hi);
        c[0] = lo > j0 ? lo - j0 : 0;
        c[1] = hi < j0 + n ? hi - j0 : n;
        if (c[0] < c[1]) {
            cs0 = c[0] < cs0 ? c[0] : cs0;
            cs1 = c[1] > cs1 ? c[1] : cs1;
        }
    }
    if (cs0 >= cs1)
        return;

    for (int64_t h = h0; h < h1; h++)
        for (int64_t r = 0; r < R; r++)
            kern->widen(fai_q_row(pr, FAI_Q, b, h * G + r % G, r / G), pr->q_dtype, dqk,
                        w->q + ((h - h0) * R + r) * dqk);
    /* the first PREFETCH keys are fetched up front for every head at once (1/32 of a whole
     * chunk's rows): nothing is in flight yet, and the first calls need them at once */
    const int64_t first = cs1 - cs0 < PREFETCH ? cs1 : cs0 + PREFETCH;
    prefetch_keys(pr, FAI_K, b, h0, h1, j0 + cs0, j0 + first, dqk, w->runs);
    for (int64_t c = cs0; c < cs1; c += BLOCK) {
        const int64_t e = cs1 - c < BLOCK ? cs1 : c + BLOCK;
        const int64_t f0 = c + PREFETCH, f1 = e + PREFETCH < cs1 ? e + PREFETCH : cs1;
        for (int64_t h = h0; h < h1; h++) {
            if (f0 < f1)
                prefetch_keys(pr, FAI_K, b, h, h + 1, j0 + f0, j0 + f1, dqk, w->runs);
            /* FP8 descales fold into the score scale, per kv head, as in the tiles */
            const float scale = (float)(pr->score.scale * fai_descale_qk(pr, b, h));
            for (int64_t x = c; x < e;) { /* run by run (a page at a time) */
                const int64_t nx = fai_kv_run_len(pr, j0 + x, e - x);
                int64_t ldk;
                const void *k = fai_kv_rows(pr, FAI_K, b, h, j0 + x, nx, &ldk);
                kern->dot_rows(R, nx, dqk, w->q + (h - h0) * R * dqk, dqk, k, ldk,
                               pr->k_dtype, w->s + (h - h0) * R * ld + x, ld,
                               dg->scale_only ? &scale : NULL);
                x += nx;
            }
        }
    }
    prefetch_keys(pr, FAI_V, b, h0, h1, j0 + cs0, j0 + first, dv, w->runs);

    for (int64_t h = h0; h < h1; h++) {
        float *m = st + (h - h0) * sf, *l = m + R;
        fai_score score = pr->score; /* with the descales folded, as for dot_rows */
        score.scale *= fai_descale_qk(pr, b, h);
        for (int64_t r = 0; r < R; r++) {
            const int64_t i = r / G, c0 = w->cols[2 * i], c1 = w->cols[2 * i + 1];
            float *s = w->s + ((h - h0) * R + r) * ld;
            if (c0 >= c1) /* sees nothing here: the empty state */
                continue;
            if (!dg->scale_only) {
                const float slope = fai_slope(pr, h * G + r % G);
                for (int64_t c = c0; c < c1; c++)
                    s[c] = fai_score_f32(&score, s[c], slope, i, j0 + c, NULL);
            }
            m[r] = kern->max(c1 - c0, s + c0);
            if (m[r] == -INFINITY) /* only -inf scores: P = 0, whose terms 0 v still enter */
                memset(s + c0, 0, (size_t)(c1 - c0) * sizeof(float));
            else
                l[r] = kern->expsum(c1 - c0, s + c0, m[r], s + c0);
        }
    }

    /* acc = P V by blocks of keys; in each, one call per head and run of query positions that
     * see the same columns, over exactly those columns */
    for (int64_t c = cs0; c < cs1; c += BLOCK) {
        const int64_t e = cs1 - c < BLOCK ? cs1 : c + BLOCK;
        const int64_t f0 = c + PREFETCH, f1 = e + PREFETCH < cs1 ? e + PREFETCH : cs1;
        for (int64_t h = h0; h < h1; h++) {
            if (f0 < f1)
                prefetch_keys(pr, FAI_V, b, h, h + 1, j0 + f0, j0 + f1, dv, w->runs);
            float *acc = st + (h - h0) * sf + 2 * R;
            for (int64_t i = 0; i < pr->sq;) {
                const int64_t c0 = w->cols[2 * i], c1 = w->cols[2 * i + 1];
                int64_t x = i + 1;
                while (x < pr->sq && w->cols[2 * x] == c0 && w->cols[2 * x + 1] == c1)
                    x++;
                const int64_t lo = c0 > c ? c0 : c, hi = c1 < e ? c1 : e;
                for (int64_t y = lo; y < hi;) { /* run by run */
                    const int64_t ny = fai_kv_run_len(pr, j0 + y, hi - y);
                    int64_t ldv;
                    const void *v = fai_kv_rows(pr, FAI_V, b, h, j0 + y, ny, &ldv);
                    kern->pv_rows((x - i) * G, ny, dv, w->s + ((h - h0) * R + i * G) * ld + y,
                                  ld, v, ldv, pr->v_dtype, acc + i * G * dv, dv);
                    y += ny;
                }
                i = x;
            }
        }
    }
}

/* Step 2 for row r of (b, hk): its chunks' states (the first at st, the next every sf floats)
 * folded into the first, finalized, written. */
static void decode_finish(const decode_group *dg, const fai_kernels_f32 *kern, int64_t b,
                          int64_t hk, int64_t r, float *st, int64_t sf)
{
    const fai_problem *pr = &dg->pr;
    const int64_t R = dg->rows, dv = pr->dv;
    float *m = st + r, *l = st + R + r, *acc = st + 2 * R + r * dv;
    for (int64_t c = 1; c < dg->nc; c++) {
        const float *s2 = st + c * sf, *acc2 = s2 + 2 * R + r * dv;
        float a, a2;
        fai_online_merge_f32(m, s2[r], &a, &a2);
        *l = fai_online_merge_sum_f32(*l, a, s2[R + r], a2);
#pragma omp simd
        for (int64_t d = 0; d < dv; d++)
            acc[d] = fai_online_merge_sum_f32(acc[d], a, acc2[d], a2);
    }
    const int64_t h = hk * pr->group + r % pr->group, i = r / pr->group;
    double lse;
    float f;
    if (!fai_online_end_f32(*m, *l, fai_sink(pr, h), (float)pr->keep_scale, &lse, &f))
        memset(acc, 0, (size_t)dv * sizeof(float)); /* an empty row is exactly 0 */
    else {
        f *= (float)fai_descale_v(pr, b, hk); /* 1 but for an FP8 v */
#pragma omp simd
        for (int64_t d = 0; d < dv; d++)
            acc[d] = fai_online_out_f32(acc[d], f);
    }
    kern->narrow(fai_q_row(pr, FAI_OUT, b, h, i), pr->dtype, dv, acc);
    if (fai_io(pr, FAI_LSE))
        fai_lse_write(pr, b, h, i, lse);
}

/* The wave's items, their first tasks and their states, in the shared block (base NULL:
 * measures); returns the bytes. */
static size_t wave_carve(int64_t n, size_t floats, void *base, decode_item **items,
                         int64_t **first, float **states)
{
    fai_arena a = {base, 0};
    *items = fai_carve(&a, (size_t)n * sizeof(decode_item));
    *first = fai_carve(&a, (size_t)(n + 1) * sizeof(int64_t));
    *states = fai_carve(&a, floats * sizeof(float));
    return a.used;
}

fa_status fai_tiled_decode_need(const fa_context *ctx, const fai_problem *call,
                                const fai_tiled_plan *plan, fai_need *need)
{
    *need = (fai_need){0, 0};
    for (int64_t g = 0; g < fai_groups(call); g++) { /* the largest workspace of a thread */
        decode_group dg;
        decode_ws w;
        if (!group_setup(call, plan, g, &dg))
            continue;
        const size_t per = ws_carve(&dg, dg.heads_max, NULL, &w);
        need->per = per > need->per ? per : need->per;
    }
    int64_t g = 0, b = 0, n; /* the largest wave */
    size_t floats;
    while ((n = next_wave(ctx, call, plan, &g, &b, NULL, NULL, &floats)) != 0) {
        if (n < 0)
            return fai_fail(FA_ERR_NO_MEMORY, "tiled decode: the chunk states of one batch (%lld "
                                              "kv heads) exceed the address space",
                            (long long)call->hk);
        decode_item *items;
        int64_t *first;
        float *states;
        const size_t bytes = wave_carve(n, floats, NULL, &items, &first, &states);
        need->shared = bytes > need->shared ? bytes : need->shared;
    }
    return FA_OK;
}

void fai_tiled_decode(fa_context *ctx, const fai_problem *call, const fai_tiled_plan *plan,
                      const fai_kernels_f32 *kern, const fai_scratch *sc)
{
    int64_t g = 0, b = 0, n;
    size_t floats;
    decode_item *items;
    int64_t *first;
    float *states;
    for (;;) {
        int64_t g0 = g, b0 = b; /* measure the wave, then write it */
        if ((n = next_wave(ctx, call, plan, &g0, &b0, NULL, NULL, &floats)) <= 0)
            return; /* none left (an overflow failed fai_tiled_decode_need) */
        wave_carve(n, floats, sc->shared, &items, &first, &states);
        next_wave(ctx, call, plan, &g, &b, items, first, &floats);
        const int64_t ntasks = first[n];
#pragma omp parallel num_threads(ctx->num_threads)
        {
            decode_ws mine;
            char *base = sc->base + (size_t)omp_get_thread_num() * sc->per;
            decode_group dg;
            int64_t at = -1; /* the group dg holds */
            /* item by item, chunk-major within one: neighbouring tasks read neighbouring keys */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < ntasks; t++) {
                const int64_t part = fai_task_part(first, n, t);
                const decode_item *it = &items[part];
                if (it->g != at) {
                    group_setup(call, plan, it->g, &dg);
                    at = it->g;
                }
                ws_carve(&dg, it->heads, base, &mine);
                const int64_t hg = (call->hk + it->heads - 1) / it->heads, u = t - first[part];
                const int64_t c = u / hg, h0 = u % hg * it->heads;
                const int64_t h1 = h0 + it->heads < call->hk ? h0 + it->heads : call->hk;
                int64_t j0;
                const fai_mask *mask = chunk_at(&dg, c, &j0);
                const int64_t len = dg.pr.sk - j0 < dg.keys ? dg.pr.sk - j0 : dg.keys;
                const int64_t sf = state_floats(&dg);
                decode_chunk(&dg, kern, mask, it->b, h0, h1, j0, len, &mine,
                             states + it->state0 + (h0 * dg.nc + c) * sf, dg.nc * sf);
            }
#pragma omp for schedule(dynamic, 1) /* items' chunk counts differ */
            for (int64_t t = 0; t < n * call->hk; t++) {
                const decode_item *it = &items[t / call->hk];
                const int64_t hk = t % call->hk;
                if (it->g != at) {
                    group_setup(call, plan, it->g, &dg);
                    at = it->g;
                }
                const int64_t sf = state_floats(&dg);
                for (int64_t r = 0; r < dg.rows; r++)
                    decode_finish(&dg, kern, it->b, hk, r,
                                  states + it->state0 + hk * dg.nc * sf, sf);
            }
        }
    }
}
