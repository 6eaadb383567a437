/*
 * Calls of sequences (docs/DESIGN.md §1): the problem made a variable-length batch (its
 * offsets), one over a paged K/V (its block table and used lengths), one over a contiguous
 * cache (its lengths), a cache's new keys and the pages they are written to, and the problem
 * of fa_append_kv. Every check names the argument; nothing here writes an output.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

/* x: B + 1 offsets, from 0, never decreasing, to `total` (tname's seqlen). */
static fa_status check_offsets(const fa_indices *x, const char *name, int64_t total,
                               const char *tname, fai_index *out)
{
    FAI_TRY(fai_check_index_array(x, name, "->", -1, "B + 1 offsets (1 to 2^40)", out));
    if (fai_index_at(*out, 0) != 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "%s[0] = %lld; the offsets start at 0", name,
                        (long long)fai_index_at(*out, 0));
    for (int64_t i = 1; i < x->count; i++)
        if (fai_index_at(*out, i) < fai_index_at(*out, i - 1))
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "%s[%lld] = %lld is below %s[%lld] = %lld; offsets never decrease",
                            name, (long long)i, (long long)fai_index_at(*out, i), name,
                            (long long)(i - 1), (long long)fai_index_at(*out, i - 1));
    const int64_t last = fai_index_at(*out, x->count - 1);
    if (last != total)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "%s[%lld] = %lld but %s->seqlen = %lld; the last offset is the total",
                        name, (long long)(x->count - 1), (long long)last, tname,
                        (long long)total);
    return FA_OK;
}

fa_status fai_problem_sequences(fai_problem *pr, const fa_indices *cu_q, const fa_indices *cu_k)
{
    if (pr->b != 1)
        return fai_fail(FA_ERR_SHAPE, "q->batch = %lld; a variable-length batch is packed along "
                                      "seqlen with batch 1", (long long)pr->b);
    FAI_TRY(check_offsets(cu_q, "cu_seqlens_q", pr->sq, "q", &pr->cu_q));
    if (cu_k && cu_k->count != cu_q->count)
        return fai_fail(FA_ERR_SHAPE, "cu_seqlens_k->count = %lld does not match "
                                      "cu_seqlens_q->count = %lld (B + 1 each)",
                        (long long)cu_k->count, (long long)cu_q->count);
    FAI_TRY(check_offsets(cu_k, "cu_seqlens_k", pr->sk, "k", &pr->cu_k));
    pr->nseq = cu_q->count - 1;
    return FA_OK;
}

fa_status fai_problem_pages(fai_problem *pr, const fa_paged_kv *pg, const fa_tensor *k,
                            int64_t s_new)
{
    if (!pg)
        return fai_fail(FA_ERR_NULL_POINTER, "pages is NULL");
    const int64_t page = k->seqlen, npages = k->batch;
    if (page < 1)
        return fai_fail(FA_ERR_SHAPE, "k->seqlen = %lld; a page holds at least 1 key (k is "
                                      "num_pages x page_size x Hk x D)", (long long)page);
    if (pg->max_pages < 0 || pg->max_pages > FAI_DIM_MAX)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "pages->max_pages = %lld; 0 to 2^40 pages a "
                                                 "sequence", (long long)pg->max_pages);
    int64_t entries;
    if (__builtin_mul_overflow(pr->b, pg->max_pages, &entries) || entries > FAI_DIM_MAX)
        return fai_fail(FA_ERR_OVERFLOW, "pages: B x max_pages exceeds the limit 2^40");
    char what[64];
    snprintf(what, sizeof what, "B x max_pages (%lld)", (long long)entries);
    FAI_TRY(fai_check_index_array(&pg->block_table, "pages->block_table", ".", entries, what,
                                  &pr->table));
    snprintf(what, sizeof what, "B (%lld)", (long long)pr->b);
    FAI_TRY(fai_check_index_array(&pg->seqused_k, "pages->seqused_k", ".", pr->b, what,
                                  &pr->seqused));
    int64_t most = 0;
    for (int64_t b = 0; b < pr->b; b++) {
        const int64_t used = fai_index_at(pr->seqused, b);
        if (used < 0)
            return fai_fail(FA_ERR_INVALID_ARGUMENT, "pages->seqused_k[%lld] = %lld is "
                                                     "negative", (long long)b, (long long)used);
        if (used > FAI_DIM_MAX)
            return fai_fail(FA_ERR_OVERFLOW, "pages->seqused_k[%lld] = %lld exceeds the limit "
                                             "2^40", (long long)b, (long long)used);
        /* used, s_new and page are at most 2^40: no overflow */
        const int64_t needed = (used + s_new + page - 1) / page;
        if (needed > pg->max_pages)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "pages->seqused_k[%lld] = %lld%s, but its row of the block table "
                            "holds %lld pages of %lld keys", (long long)b, (long long)used,
                            s_new ? " and the new keys" : "", (long long)pg->max_pages,
                            (long long)page);
        for (int64_t i = 0; i < needed; i++) {
            const int64_t id = fai_index_at(pr->table, b * pg->max_pages + i);
            if (id < 0 || id >= npages)
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "pages->block_table[%lld][%lld] = %lld is not a page of k "
                                "(k->batch = %lld pages)", (long long)b, (long long)i,
                                (long long)id, (long long)npages);
        }
        most = used + s_new > most ? used + s_new : most;
    }
    pr->nseq = pr->b;
    pr->page_size = page;
    pr->table_stride = pg->max_pages;
    pr->sk = most; /* the call's: what a sequence may reach */
    return FA_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The first index of key in the n sorted values of v, or -1. */
static int64_t find_i64(const int64_t *v, int64_t n, int64_t key)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (v[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && v[lo] == key ? lo : -1;
}

fa_status fai_check_written_pages(fa_context *ctx, const fai_problem *pr)
{
    if (pr->page_size == 0 || pr->s_new == 0)
        return FA_OK;
    const int64_t P = pr->page_size;
    int64_t nw = 0; /* the pages the new keys go to: each sequence's from its length on */
    for (int64_t b = 0; b < pr->nseq; b++) {
        const int64_t used = fai_index_at(pr->seqused, b);
        nw += (used + pr->s_new - 1) / P - used / P + 1;
    }
    const size_t bytes = (size_t)nw * 2 * sizeof(int64_t);
    int64_t *w = fai_alloc(&ctx->mem, bytes), *count = w + nw;
    if (!w)
        return fai_fail(FA_ERR_NO_MEMORY, "pages: %zu bytes to check the pages written", bytes);
    int64_t n = 0;
    for (int64_t b = 0; b < pr->nseq; b++) {
        const int64_t used = fai_index_at(pr->seqused, b);
        for (int64_t i = used / P; i <= (used + pr->s_new - 1) / P; i++)
            w[n++] = fai_index_at(pr->table, b * pr->table_stride + i);
    }
    qsort(w, (size_t)nw, sizeof *w, cmp_i64);
    memset(count, 0, (size_t)nw * sizeof *count);
    fa_status st = FA_OK;
    for (int64_t b = 0; b < pr->nseq && st == FA_OK; b++) { /* every page each sequence reads */
        const int64_t used = fai_index_at(pr->seqused, b);
        for (int64_t i = 0; i < (used + pr->s_new + P - 1) / P && st == FA_OK; i++) {
            const int64_t id = fai_index_at(pr->table, b * pr->table_stride + i);
            const int64_t at = find_i64(w, nw, id);
            if (at >= 0 && ++count[at] > 1)
                st = fai_fail(FA_ERR_INVALID_ARGUMENT,
                              "pages->block_table[%lld][%lld] = %lld: new keys are written to "
                              "that page, so it must appear once among the pages the sequences "
                              "use (a shared or repeated page would change another's keys)",
                              (long long)b, (long long)i, (long long)id);
        }
    }
    fai_free(&ctx->mem, w, bytes);
    return st;
}

fa_status fai_problem_cache(fai_problem *pr, const fa_indices *cache_seqlens,
                            const fa_tensor *k, int64_t s_new)
{
    char what[32];
    snprintf(what, sizeof what, "B (%lld)", (long long)pr->b);
    FAI_TRY(fai_check_index_array(cache_seqlens, "cache_seqlens", "->", pr->b, what,
                                  &pr->seqused));
    int64_t most = 0;
    for (int64_t b = 0; b < pr->b; b++) {
        const int64_t used = fai_index_at(pr->seqused, b);
        if (used < 0)
            return fai_fail(FA_ERR_INVALID_ARGUMENT, "cache_seqlens[%lld] = %lld is negative",
                            (long long)b, (long long)used);
        if (used > k->seqlen - s_new)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "cache_seqlens[%lld] = %lld%s, but the cache holds k->seqlen = %lld "
                            "keys", (long long)b, (long long)used,
                            s_new ? " and the new keys" : "", (long long)k->seqlen);
        most = used + s_new > most ? used + s_new : most;
    }
    pr->nseq = pr->b;
    pr->sk = most;
    return FA_OK;
}

fa_status fai_problem_for_cache(fai_problem *pr, const fa_tensor *k_new, const fa_tensor *k,
                                const fa_tensor *v, int paged)
{
    FAI_TRY(fai_check_tensor(k_new, "k_new", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(k, "k", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(v, "v", FAI_INPUT, 0));
    if (!fai_dtype_is_block(k->dtype) || !fai_dtype_is_block(v->dtype)) /* else each its own */
        FAI_TRY(fai_check_dtype_of(v, "v", k->dtype, "k"));
    FAI_TRY(fai_check_shape(v, "v", k->batch, k->seqlen, k->heads, -1, "k"));
    if (!paged)
        FAI_TRY(fai_expect_dim("k", "batch", k->batch, "k_new->batch", k_new->batch));
    memset(pr, 0, sizeof *pr);
    pr->b = k_new->batch;
    pr->hq = pr->hk = k->heads;
    pr->group = 1;
    pr->dqk = k->headdim;
    pr->dv = v->headdim;
    pr->dtype = pr->k_dtype = k->dtype;
    pr->v_dtype = v->dtype;
    pr->io[FAI_K] = k;
    pr->io[FAI_V] = v;
    return FA_OK;
}

/* New keys take their cache's dtype; a block-format cache also takes f32, f16 or bf16 rows,
 * which the append quantizes (core/quant.h: ggml's rule). */
static fa_status new_keys_dtype(const fa_tensor *t, const char *name, const fa_tensor *cache,
                                const char *cname)
{
    if (t->dtype == cache->dtype ||
        (fai_dtype_is_block(cache->dtype) &&
         (t->dtype == FA_F32 || t->dtype == FA_F16 || t->dtype == FA_BF16)))
        return FA_OK;
    return fai_check_dtype_of(t, name, cache->dtype, cname);
}

/* Rows to be quantized (t's dtype apart from its block-format cache's) must be finite: checked
 * with the call's arguments, before anything is written. */
enum { ROW_PIECE = 256 }; /* elements of a row checked at a time */

static fa_status new_keys_finite(const fa_tensor *t, const char *name, const fa_tensor *cache,
                                 const char *cname)
{
    if (t->dtype == cache->dtype)
        return FA_OK;
    float row[ROW_PIECE];
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t e = 0; e < t->headdim; e += ROW_PIECE) {
                    const int64_t n = t->headdim - e < ROW_PIECE ? t->headdim - e : ROW_PIECE;
                    fai_load_f32((const char *)fai_row(t, b, s, h) + fai_dtype_bytes(t->dtype, e),
                                 t->dtype, n, row);
                    for (int64_t x = 0; x < n; x++)
                        if (!isfinite(row[x]))
                            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                            "%s[%lld][%lld][%lld][%lld] = %g; %s->dtype = %s "
                                            "quantizes finite values only", name, (long long)b,
                                            (long long)s, (long long)h, (long long)(e + x),
                                            (double)row[x], cname,
                                            fa_dtype_name(cache->dtype));
                }
    return FA_OK;
}

fa_status fai_problem_new_keys(fai_problem *pr, const fa_tensor *k_new, const fa_tensor *v_new,
                               const fa_tensor *k, const fa_tensor *v)
{
    if (!k_new && !v_new)
        return FA_OK;
    if (!k_new || !v_new)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL but %s is not: new keys come with "
                                             "their values", k_new ? "v_new" : "k_new",
                        k_new ? "k_new" : "v_new");
    FAI_TRY(fai_check_tensor(k_new, "k_new", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(v_new, "v_new", FAI_INPUT, 0));
    FAI_TRY(new_keys_dtype(k_new, "k_new", k, "k"));
    FAI_TRY(new_keys_dtype(v_new, "v_new", v, "v"));
    FAI_TRY(fai_expect_dim("k_new", "batch", k_new->batch, "q->batch", pr->b));
    FAI_TRY(fai_expect_dim("k_new", "heads", k_new->heads, "k->heads", pr->hk));
    FAI_TRY(fai_expect_dim("k_new", "headdim", k_new->headdim, "k->headdim", pr->dqk));
    FAI_TRY(fai_expect_dim("v_new", "batch", v_new->batch, "q->batch", pr->b));
    FAI_TRY(fai_expect_dim("v_new", "seqlen", v_new->seqlen, "k_new->seqlen",
                           k_new->seqlen));
    FAI_TRY(fai_expect_dim("v_new", "heads", v_new->heads, "k->heads", pr->hk));
    FAI_TRY(fai_expect_dim("v_new", "headdim", v_new->headdim, "v->headdim", pr->dv));
    FAI_TRY(fai_check_tensor(k, "k", FAI_OUTPUT, 0)); /* written: no two keys at one address */
    FAI_TRY(fai_check_tensor(v, "v", FAI_OUTPUT, 0));
    FAI_TRY(fai_check_disjoint(k, "k", v, "v"));
    FAI_TRY(new_keys_finite(k_new, "k_new", k, "k"));
    FAI_TRY(new_keys_finite(v_new, "v_new", v, "v"));
    pr->k_new = k_new;
    pr->v_new = v_new;
    pr->s_new = k_new->seqlen;
    return FA_OK;
}
