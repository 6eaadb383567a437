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
 * Row r of a kv head hk is query row r / group of head hk group + r % group. Memory: each
 * thread's workspace (heads x R x (Dqk + chunk) floats) and the chunks' states, R x (Dv + 2)
 * floats a chunk (0.8% of an f16 K and V's bytes at Dqk = Dv = 128, R = 4, 512-key chunks),
 * bounded by taking the batches in waves (one batch's states at least).
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "backends/tiled/decode.h"
#include "core/recurrence.h"

#define STATE_BYTES ((size_t)32 << 20) /* at most this much of chunk states at once */
#define SCORE_BYTES ((size_t)128 << 10) /* a task's scores (its kv heads x R x chunk) */

/*
 * Memory order. K and V rows of one kv head lie a sequence stride apart (2 KiB for 8 kv heads
 * of 128 f16 dims in BSHD), and reading one head's rows alone runs far below the machine's
 * bandwidth: measured on Zen 4 (1 thread, 256 B rows 2 KiB apart), 5.8 GB/s head by head
 * against 23-24 GB/s for the same bytes in address order, 10 GB/s in blocks of 4 keys x 8
 * heads, 16 GB/s with those blocks fetched 8-16 keys ahead into L2 in address order
 * (docs/notes/inference.md). So a task takes a chunk for a run of kv heads, forms the
 * scores of all its heads BLOCK keys at a time, each block's rows of every head fetched
 * PREFETCH keys ahead in address order (key by key, head by head), and likewise P V.
 * Measured alike (within the host's noise, 0.42-0.51 of stream): blocks of 16 to 64 keys,
 * distances of 16 or 32, V fetched during the score pass instead; 128- and 256-key chunks
 * were slower (0.33-0.44) than 512.
 */
#define BLOCK 16
#define PREFETCH 16

typedef struct {
    float *q;      /* heads x R x dqk: the rows, widened        */
    float *s;      /* heads x R x keys: scores, then P in place */
    int64_t *cols; /* per query position: the chunk's columns it sees, [c0, c1) */
    const char **runs; /* per head: prefetch_keys' rows */
} decode_ws;

typedef struct {
    const fai_problem *pr;
    const fai_kernels_f32 *kern;
    int64_t keys;     /* per chunk */
    int64_t rows;     /* R = group x Sq */
    fai_mask part[2];        /* the mask's parts, in key order (core/score.h) */
    int64_t c_lo[2], c_n[2]; /* part p's chunks: c_lo[p] .. c_lo[p] + c_n[p] - 1 */
    int64_t nc;              /* c_n[0] + c_n[1]: the chunks visited, part 0's first */
    int64_t heads;    /* kv heads per task (at most) */
    int scale_only;   /* the score pipeline is the scale alone: dot_rows applies it */
} decode_call;

static size_t ws_carve(const decode_call *dc, char *base, decode_ws *w)
{
    fai_arena a = {base, 0};
    w->q = fai_carve(&a, (size_t)(dc->heads * dc->rows * dc->pr->dqk) * sizeof(float));
    w->s = fai_carve(&a, (size_t)(dc->heads * dc->rows * dc->keys) * sizeof(float));
    w->cols = fai_carve(&a, (size_t)(2 * dc->pr->sq) * sizeof(int64_t));
    w->runs = fai_carve(&a, (size_t)dc->heads * sizeof(const char *));
    return a.used;
}

/* A chunk's state: m[R], l[R], then acc (R x Dv). */
static int64_t state_floats(const decode_call *dc) { return dc->rows * (dc->pr->dv + 2); }

/* Fetches (into L2) the rows of keys [j0, j1) of kv heads [h0, h1) of role r, key by key, head
 * by head: every line of each row (run by run of the layout: a page at a time). runs holds one
 * pointer per head. */
static void prefetch_keys(const fai_problem *pr, fai_role r, int64_t b, int64_t h0, int64_t h1,
                          int64_t j0, int64_t j1, int64_t dim, const char **runs)
{
    const int64_t es = (int64_t)fai_dtype_size(pr->kv_dtype), bytes = dim * es;
    for (int64_t j = j0; j < j1;) {
        const int64_t m = fai_kv_run_len(pr, j, j1 - j);
        int64_t ld = 0;
        for (int64_t h = h0; h < h1; h++)
            runs[h - h0] = fai_kv_rows(pr, r, b, h, j, m, &ld);
        for (int64_t x = 0; x < m; x++)
            for (int64_t h = 0; h < h1 - h0; h++) {
                const uintptr_t row = (uintptr_t)(runs[h] + x * ld * es);
                for (uintptr_t a = row & ~(uintptr_t)63; a < row + (uintptr_t)bytes; a += 64)
                    __builtin_prefetch((const void *)a, 0, 2);
            }
        j += m;
    }
}

/* Chunk c of the call (0 .. nc - 1): its part's mask and its first key. */
static const fai_mask *chunk_at(const decode_call *dc, int64_t c, int64_t *j0)
{
    const int p = c >= dc->c_n[0];
    *j0 = (dc->c_lo[p] + c - (p ? dc->c_n[0] : 0)) * dc->keys;
    return &dc->part[p];
}

/*
 * Step 1 for the chunk [j0, j0 + n) of kv heads [h0, h1) of batch b under one part of the
 * mask (a plain one), head h's state at st + (h - h0) sf. Each head's state is what it would be alone: its scores do not depend on
 * which keys or rows share a dot_rows call, its P V sums keys in order however they are split.
 */
static void decode_chunk(const decode_call *dc, const fai_mask *mask, int64_t b, int64_t h0,
                         int64_t h1, int64_t j0, int64_t n, decode_ws *w, float *st, int64_t sf)
{
    const fai_problem *pr = dc->pr;
    const fai_kernels_f32 *kern = dc->kern;
    const int64_t G = pr->group, R = dc->rows, dqk = pr->dqk, dv = pr->dv, ld = dc->keys;
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
            kern->widen(fai_q_row(pr, FAI_Q, b, h * G + r % G, r / G), pr->dtype, dqk,
                        w->q + ((h - h0) * R + r) * dqk);
    const float scale = (float)pr->score.scale;
    const int64_t first = cs1 - cs0 < PREFETCH ? cs1 : cs0 + PREFETCH; /* fetched up front */
    prefetch_keys(pr, FAI_K, b, h0, h1, j0 + cs0, j0 + first, dqk, w->runs);
    for (int64_t c = cs0; c < cs1; c += BLOCK) {
        const int64_t e = cs1 - c < BLOCK ? cs1 : c + BLOCK;
        const int64_t f0 = c + PREFETCH, f1 = e + PREFETCH < cs1 ? e + PREFETCH : cs1;
        prefetch_keys(pr, FAI_K, b, h0, h1, j0 + f0, j0 + f1, dqk, w->runs);
        for (int64_t h = h0; h < h1; h++)
            for (int64_t x = c; x < e;) { /* run by run (a page at a time) */
                const int64_t nx = fai_kv_run_len(pr, j0 + x, e - x);
                int64_t ldk;
                const void *k = fai_kv_rows(pr, FAI_K, b, h, j0 + x, nx, &ldk);
                kern->dot_rows(R, nx, dqk, w->q + (h - h0) * R * dqk, dqk, k, ldk,
                               pr->kv_dtype, w->s + (h - h0) * R * ld + x, ld,
                               dc->scale_only ? &scale : NULL);
                x += nx;
            }
    }
    prefetch_keys(pr, FAI_V, b, h0, h1, j0 + cs0, j0 + first, dv, w->runs);

    for (int64_t h = h0; h < h1; h++) {
        float *m = st + (h - h0) * sf, *l = m + R;
        for (int64_t r = 0; r < R; r++) {
            const int64_t i = r / G, c0 = w->cols[2 * i], c1 = w->cols[2 * i + 1];
            float *s = w->s + ((h - h0) * R + r) * ld;
            if (c0 >= c1) /* sees nothing here: the empty state */
                continue;
            if (!dc->scale_only) {
                const float slope = fai_slope(pr, h * G + r % G);
                for (int64_t c = c0; c < c1; c++)
                    s[c] = fai_score_f32(&pr->score, s[c], slope, i, j0 + c, NULL);
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
        prefetch_keys(pr, FAI_V, b, h0, h1, j0 + f0, j0 + f1, dv, w->runs);
        for (int64_t h = h0; h < h1; h++) {
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
                                  ld, v, ldv, pr->kv_dtype, acc + i * G * dv, dv);
                    y += ny;
                }
                i = x;
            }
        }
    }
}

/* Step 2 for row r of (b, hk): its chunks' states (the first at st, the next every sf floats)
 * folded into the first, finalized, written. */
static void decode_finish(const decode_call *dc, int64_t b, int64_t hk, int64_t r, float *st,
                          int64_t sf)
{
    const fai_problem *pr = dc->pr;
    const int64_t R = dc->rows, dv = pr->dv;
    float *m = st + r, *l = st + R + r, *acc = st + 2 * R + r * dv;
    for (int64_t c = 1; c < dc->nc; c++) {
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
    else
#pragma omp simd
        for (int64_t d = 0; d < dv; d++)
            acc[d] = fai_online_out_f32(acc[d], f);
    dc->kern->narrow(fai_q_row(pr, FAI_OUT, b, h, i), pr->dtype, dv, acc);
    if (fai_io(pr, FAI_LSE))
        fai_lse_write(pr, b, h, i, lse);
}

/* The call's chunking and task shape (from the problem, the plan and the thread count alone),
 * and how many batches' states one wave holds: *batch_bytes each; 0 if those overflow. */
static int decode_setup(const fa_context *ctx, const fai_problem *pr, const fai_kernels_f32 *kern,
                        const fai_tiled_plan *plan, decode_call *dc, int64_t *wave,
                        size_t *batch_bytes)
{
    *dc = (decode_call){.pr = pr, .kern = kern, .keys = plan->decode_keys,
                        .rows = pr->group * pr->sq};
    dc->scale_only = pr->score.softcap == 0 && !pr->slopes;
    /* each part's chunks on the grid of multiples of keys from key 0 */
    const int np = fai_mask_parts(&pr->mask, dc->part);
    dc->nc = 0;
    for (int p = 0; p < 2; p++) {
        int64_t jlo = 0, jhi = 0;
        if (p < np)
            fai_mask_key_span(&dc->part[p], 0, pr->sq, &jlo, &jhi);
        dc->c_lo[p] = jlo < jhi ? jlo / dc->keys : 0;
        dc->c_n[p] = jlo < jhi ? (jhi - 1) / dc->keys + 1 - dc->c_lo[p] : 0;
        dc->nc += dc->c_n[p];
    }
    if (dc->nc == 0) /* no row sees a key: one chunk, empty for every row */
        dc->c_n[0] = dc->nc = 1;

    const int nt = ctx->num_threads;
    dc->heads = (int64_t)(SCORE_BYTES / ((size_t)(dc->rows * dc->keys) * sizeof(float)));
    dc->heads = dc->heads < 1 ? 1 : dc->heads > pr->hk ? pr->hk : dc->heads;
    /* enough tasks to share out (four per thread): fewer heads per task, whatever the
     * states' bits (a head's state does not depend on its task) */
    while (dc->heads > 1 &&
           (double)pr->b * (double)dc->nc * (double)((pr->hk + dc->heads - 1) / dc->heads) <
               4.0 * nt)
        dc->heads = (dc->heads + 1) / 2;
    /* one batch's states; a K and V of broadcast strides can declare more keys and heads than
     * memory holds, so the product is checked */
    if (!fai_mul_size((size_t)pr->hk, (size_t)dc->nc, batch_bytes) ||
        !fai_mul_size(*batch_bytes, (size_t)state_floats(dc) * sizeof(float), batch_bytes))
        return 0;
    *wave = (int64_t)(STATE_BYTES / *batch_bytes); /* batches at once */
    *wave = *wave < 1 ? 1 : *wave > pr->b ? pr->b : *wave;
    return 1;
}

fa_status fai_tiled_decode_need(const fa_context *ctx, const fai_problem *pr,
                                const fai_tiled_plan *plan, fai_need *need)
{
    decode_call dc;
    int64_t wave;
    size_t batch_bytes;
    if (!decode_setup(ctx, pr, NULL, plan, &dc, &wave, &batch_bytes))
        return fai_fail(FA_ERR_NO_MEMORY, "tiled decode: the chunk states of one batch (%lld "
                                          "kv heads x %lld chunks) exceed the address space",
                        (long long)pr->hk, (long long)dc.nc);
    decode_ws w;
    need->per = ws_carve(&dc, NULL, &w);
    need->shared = (size_t)wave * batch_bytes;
    return FA_OK;
}

void fai_tiled_decode(fa_context *ctx, const fai_problem *pr, const fai_kernels_f32 *kern,
                      const fai_tiled_plan *plan, const fai_scratch *sc)
{
    decode_call dc;
    int64_t wave;
    size_t batch_bytes;
    decode_setup(ctx, pr, kern, plan, &dc, &wave, &batch_bytes); /* as fai_tiled_decode_need */
    const int64_t hgroups = (pr->hk + dc.heads - 1) / dc.heads, sf = state_floats(&dc);
    float *states = sc->shared;
    /* states of a wave: [batch][kv head][chunk] */
    for (int64_t b0 = 0; b0 < pr->b; b0 += wave) {
        const int64_t nb = pr->b - b0 < wave ? pr->b - b0 : wave;
#pragma omp parallel num_threads(ctx->num_threads)
        {
            decode_ws mine;
            ws_carve(&dc, sc->base + (size_t)omp_get_thread_num() * sc->per, &mine);
            /* chunk-major: neighbouring tasks read neighbouring keys */
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < nb * hgroups * dc.nc; t++) {
                const int64_t c = t / (nb * hgroups), g = t % hgroups, bl = (t / hgroups) % nb;
                const int64_t h0 = g * dc.heads;
                const int64_t h1 = h0 + dc.heads < pr->hk ? h0 + dc.heads : pr->hk;
                int64_t j0;
                const fai_mask *mask = chunk_at(&dc, c, &j0);
                const int64_t n = pr->sk - j0 < dc.keys ? pr->sk - j0 : dc.keys;
                decode_chunk(&dc, mask, b0 + bl, h0, h1, j0, n, &mine,
                             states + ((bl * pr->hk + h0) * dc.nc + c) * sf, dc.nc * sf);
            }
#pragma omp for schedule(static)
            for (int64_t t = 0; t < nb * pr->hk * dc.rows; t++) {
                const int64_t pl = t / dc.rows; /* (batch, kv head) of the wave */
                decode_finish(&dc, b0 + pl / pr->hk, pl % pr->hk, t % dc.rows,
                              states + pl * dc.nc * sf, sf);
            }
        }
    }
}
