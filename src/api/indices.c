/*
 * The index arrays a call reads on the host (int32 or int64: offsets, page tables, lengths,
 * block lists), checked by one function, and the block mask (fa_params.block_mask): its lists
 * checked against the problem and expanded into the map the backends query
 * (backends/blocks.h). Nothing here writes an output.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "backends/table.h"

/*
 * An index array x of host memory (`name`, whose fields are named with `sep`: "->" for a
 * pointer argument, "." for a member of one): not NULL, a fa_index_type, `count` entries (the
 * count: when want_count >= 0; else from 1 to 2^40), data where there are entries. *out reads
 * it.
 */
fa_status fai_check_index_array(const fa_indices *x, const char *name, const char *sep,
                                int64_t want_count, const char *what, fai_index *out)
{
    if (!x)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", name);
    if (x->type != FA_INDEX_INT32 && x->type != FA_INDEX_INT64)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "%s%stype = %d is not a fa_index_type", name,
                        sep, (int)x->type);
    if (want_count >= 0 ? x->count != want_count : x->count < 1 || x->count > FAI_DIM_MAX)
        return fai_fail(FA_ERR_SHAPE, "%s%scount = %lld; %s are needed", name, sep,
                        (long long)x->count, what);
    if (x->count > 0 && !x->data)
        return fai_fail(FA_ERR_NULL_POINTER, "%s%sdata is NULL", name, sep);
    if (x->count > 0 && fai_backend_holding(x->data))
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "%s%sdata is device memory; it is read on the "
                                                 "host", name, sep);
    *out = (fai_index){x->data, x->type == FA_INDEX_INT64};
    return FA_OK;
}

/* One list of a block mask (partial or full) into the map: row r's first num[r] entries of
 * idx, each a key block of [0, kv_blocks) not yet in row r. */
static fa_status mark_blocks(const fa_block_mask *bm, fai_block_map *m, unsigned char *listed,
                             int full)
{
    const char *const nn = full ? "full_kv_num_blocks" : "kv_num_blocks",
                      *const in = full ? "full_kv_indices" : "kv_indices";
    const fa_indices *const num_x = full ? &bm->full_kv_num_blocks : &bm->kv_num_blocks,
                            *const idx_x = full ? &bm->full_kv_indices : &bm->kv_indices;
    const int64_t rows = m->batch * m->heads * m->q_blocks;
    char name[64];
    fai_index num, idx;
    snprintf(name, sizeof name, "params->block_mask->%s", nn);
    FAI_TRY(fai_check_index_array(num_x, name, ".", rows,
                                  "batch x heads x ceil(Sq / q_block) counts", &num));
    snprintf(name, sizeof name, "params->block_mask->%s", in);
    FAI_TRY(fai_check_index_array(idx_x, name, ".", rows * m->kv_blocks,
                                  "batch x heads x ceil(Sq / q_block) x ceil(Sk / kv_block) "
                                  "indices", &idx));
    for (int64_t r = 0; r < rows; r++) {
        const int64_t n = fai_index_at(num, r);
        if (n < 0 || n > m->kv_blocks)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->block_mask->%s[%lld] = %lld is outside [0, %lld] (the key "
                            "blocks)", nn, (long long)r, (long long)n, (long long)m->kv_blocks);
        for (int64_t c = 0; c < n; c++) {
            const int64_t at = r * m->kv_blocks + c, kb = fai_index_at(idx, at);
            if (kb < 0 || kb >= m->kv_blocks)
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->block_mask->%s[%lld] = %lld is outside [0, %lld)", in,
                                (long long)at, (long long)kb, (long long)m->kv_blocks);
            if (listed[r * m->kv_blocks + kb])
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->block_mask->%s[%lld] = %lld: key block %lld is listed "
                                "twice for query block %lld", in, (long long)at, (long long)kb,
                                (long long)kb, (long long)(r % m->q_blocks));
            listed[r * m->kv_blocks + kb] = 1;
        }
    }
    return FA_OK;
}

fa_status fai_problem_blocks(fa_context *ctx, fai_problem *pr, const fa_block_mask *bm,
                             fai_block_map *m, size_t *bytes)
{
    *bytes = 0;
    m->listed = NULL;
    if (!bm)
        return FA_OK;
    if (bm->batch != pr->b && bm->batch != 1)
        return fai_fail(FA_ERR_SHAPE, "params->block_mask->batch = %lld; it must be q->batch = "
                                      "%lld or 1 (broadcast)", (long long)bm->batch,
                        (long long)pr->b);
    if (bm->heads != pr->hq && bm->heads != 1)
        return fai_fail(FA_ERR_SHAPE, "params->block_mask->heads = %lld; it must be q->heads = "
                                      "%lld or 1 (broadcast)", (long long)bm->heads,
                        (long long)pr->hq);
    if (bm->q_block < 1 || bm->kv_block < 1 || bm->q_block > FAI_DIM_MAX ||
        bm->kv_block > FAI_DIM_MAX)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->block_mask->q_block = %lld, kv_block = %lld; block sizes are "
                        ">= 1", (long long)bm->q_block, (long long)bm->kv_block);
    *m = (fai_block_map){NULL, bm->batch, bm->heads, bm->q_block, bm->kv_block,
                         (pr->sq + bm->q_block - 1) / bm->q_block,
                         (pr->sk + bm->kv_block - 1) / bm->kv_block};
    size_t n;
    if (!fai_mul_size((size_t)m->batch, (size_t)m->heads, &n) ||
        !fai_mul_size(n, (size_t)m->q_blocks, &n) || !fai_mul_size(n, (size_t)m->kv_blocks, &n))
        return fai_fail(FA_ERR_OVERFLOW, "params->block_mask: its map overflows size_t");
    unsigned char *listed = n ? fai_alloc(&ctx->mem, n) : NULL;
    if (n && !listed)
        return fai_fail(FA_ERR_NO_MEMORY, "params->block_mask: %zu bytes for its map", n);
    if (n)
        memset(listed, 0, n);
    fa_status st = mark_blocks(bm, m, listed, 0);
    const int full = bm->full_kv_num_blocks.count > 0 || bm->full_kv_indices.count > 0;
    if (st == FA_OK && full)
        st = mark_blocks(bm, m, listed, 1);
    if (st != FA_OK) {
        fai_free(&ctx->mem, listed, n);
        return st;
    }
    m->listed = listed;
    pr->blocks = m;
    *bytes = n;
    return FA_OK;
}
