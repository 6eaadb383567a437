/*
 * The arguments of the ops: fa_params and fa_tensor, their defaults and their checks, and the
 * validated problem a backend receives (backends/backend.h). Every check names the argument
 * and the reason in the error detail; nothing here writes an output.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

/* Largest accepted dimension. It keeps every index expression of the kernels (i + off + R,
 * products of two dims) far from int64 overflow; no real tensor comes near it. */
#define FAI_DIM_MAX ((int64_t)1 << 40)

void fa_params_init(fa_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->scale = 0;
    p->window_left = -1;
    p->window_right = -1;
    p->align = FA_ALIGN_BOTTOM_RIGHT;
}

void fa_tensor_init(fa_tensor *t, void *data, fa_dtype dtype, int64_t batch, int64_t seqlen,
                    int64_t heads, int64_t headdim, int bhsd)
{
    if (!t)
        return;
    t->data = data;
    t->dtype = dtype;
    t->batch = batch;
    t->seqlen = seqlen;
    t->heads = heads;
    t->headdim = headdim;
    t->headdim_stride = 1;
    t->batch_stride = seqlen * heads * headdim;
    if (bhsd) {
        t->head_stride = seqlen * headdim;
        t->seq_stride = headdim;
    } else {
        t->seq_stride = heads * headdim;
        t->head_stride = headdim;
    }
}


static int valid_dtype(fa_dtype d) { return (unsigned)d <= FA_E5M2; }

/* a * b + c for non-negative int64, 0 on overflow. */
static int mad64(int64_t a, int64_t b, int64_t c, int64_t *out)
{
    if (a != 0 && b > (INT64_MAX - c) / a)
        return 0;
    *out = a * b + c;
    return 1;
}

typedef struct {
    int64_t size, stride;
} dim_desc;

static void sort_by_stride(dim_desc *d, int n) /* insertion sort: n <= 4 */
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; j--) {
            dim_desc x = d[j];
            d[j] = d[j - 1];
            d[j - 1] = x;
        }
}

/*
 * Outputs must not have two index tuples on one address. Sufficient and the usual rule
 * (NumPy's): ordered by stride, each dimension's stride exceeds the largest offset reachable
 * with the dimensions before it.
 */
static int non_overlapping(const fa_tensor *t)
{
    dim_desc d[4] = {{t->batch, t->batch_stride},
                     {t->seqlen, t->seq_stride},
                     {t->heads, t->head_stride},
                     {t->headdim, 1}};
    sort_by_stride(d, 4);
    int64_t reach = 0; /* largest offset reachable with the dims so far */
    for (int i = 0; i < 4; i++) {
        if (d[i].size <= 1)
            continue;
        if (d[i].stride <= reach)
            return 0;
        reach += d[i].stride * (d[i].size - 1);
    }
    return 1;
}

fa_status fai_check_tensor(const fa_tensor *t, const char *name, fai_tensor_use use, int kind)
{
    const int is_lse = kind == FAI_TENSOR_LSE;
    if (!t)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", name);
    if (!valid_dtype(t->dtype))
        return fai_fail(FA_ERR_DTYPE, "%s->dtype: %d is not a fa_dtype", name, (int)t->dtype);
    if (t->dtype == FA_BOOL && kind != FAI_TENSOR_BIAS)
        return fai_fail(FA_ERR_DTYPE, "%s->dtype: bool; only a keep-mask (params->bias) has it",
                        name);
    if (is_lse && t->dtype != FA_F32 && t->dtype != FA_F64)
        return fai_fail(FA_ERR_DTYPE, "%s->dtype: %s; an LSE tensor is f32 or f64", name,
                        fa_dtype_name(t->dtype));
    const int64_t dims[4] = {t->batch, t->seqlen, t->heads, t->headdim};
    const char *const dn[4] = {"batch", "seqlen", "heads", "headdim"};
    for (int i = 0; i < 4; i++) {
        if (dims[i] < 0)
            return fai_fail(FA_ERR_SHAPE, "%s->%s = %lld is negative", name, dn[i],
                            (long long)dims[i]);
        if (dims[i] > FAI_DIM_MAX)
            return fai_fail(FA_ERR_OVERFLOW, "%s->%s = %lld exceeds the limit 2^40", name, dn[i],
                            (long long)dims[i]);
    }
    if (t->heads < 1)
        return fai_fail(FA_ERR_SHAPE, "%s->heads = %lld; at least 1 head is needed", name,
                        (long long)t->heads);
    if (is_lse && t->headdim != 1)
        return fai_fail(FA_ERR_SHAPE, "%s->headdim = %lld; an LSE tensor has headdim 1", name,
                        (long long)t->headdim);
    if (t->headdim < 1 && kind != FAI_TENSOR_BIAS) /* a bias's headdim is Sk: may be 0 */
        return fai_fail(FA_ERR_SHAPE, "%s->headdim = %lld; at least 1 is needed", name,
                        (long long)t->headdim);
    if (t->headdim_stride != 0 && t->headdim_stride != 1)
        return fai_fail(FA_ERR_STRIDE,
                        "%s->headdim_stride = %lld; headdim must be contiguous (0 or 1)", name,
                        (long long)t->headdim_stride);
    const int64_t strides[3] = {t->batch_stride, t->seq_stride, t->head_stride};
    const char *const sn[3] = {"batch_stride", "seq_stride", "head_stride"};
    for (int i = 0; i < 3; i++)
        if (strides[i] < 0)
            return fai_fail(FA_ERR_STRIDE, "%s->%s = %lld is negative", name, sn[i],
                            (long long)strides[i]);

    int64_t nelem = 1, last = t->headdim - 1; /* largest element offset */
    for (int i = 0; i < 3; i++) {
        int64_t n;
        if (!mad64(dims[i], i == 0 ? 1 : nelem, 0, &n) ||
            (dims[i] > 0 && !mad64(dims[i] - 1, strides[i], last, &last)))
            return fai_fail(FA_ERR_OVERFLOW,
                            "%s: the extent overflows int64 (its element count or its last "
                            "element's offset, at %s; dims %lld x %lld x %lld x %lld, strides "
                            "%lld, %lld, %lld)", name, dn[i],
                            (long long)t->batch, (long long)t->seqlen, (long long)t->heads,
                            (long long)t->headdim, (long long)strides[0], (long long)strides[1],
                            (long long)strides[2]);
        nelem = n;
    }
    if (!mad64(nelem, t->headdim, 0, &nelem) ||
        (uint64_t)last + 1 > (uint64_t)PTRDIFF_MAX / fai_dtype_size(t->dtype))
        return fai_fail(FA_ERR_OVERFLOW, "%s: its byte extent overflows the address space", name);
    if (nelem > 0 && !t->data)
        return fai_fail(FA_ERR_NULL_POINTER, "%s->data is NULL", name);
    if (use == FAI_OUTPUT && nelem > 0 && !non_overlapping(t))
        return fai_fail(FA_ERR_STRIDE,
                        "%s: its strides map two elements to one address; an output must not "
                        "overlap itself", name);
    return FA_OK;
}

static fa_status expect_dim(const char *name, const char *what, int64_t got, const char *ref,
                            int64_t want)
{
    if (got == want)
        return FA_OK;
    return fai_fail(FA_ERR_SHAPE, "%s->%s = %lld does not match %s = %lld", name, what,
                    (long long)got, ref, (long long)want);
}

fa_status fai_check_shape(const fa_tensor *t, const char *name, int64_t b, int64_t s,
                          int64_t h, int64_t d, const char *ref)
{
    char r[64];
    snprintf(r, sizeof r, "%s->batch", ref);
    FAI_TRY(expect_dim(name, "batch", t->batch, r, b));
    snprintf(r, sizeof r, "%s->seqlen", ref);
    FAI_TRY(expect_dim(name, "seqlen", t->seqlen, r, s));
    snprintf(r, sizeof r, "%s->heads", ref);
    FAI_TRY(expect_dim(name, "heads", t->heads, r, h));
    if (d >= 0) {
        snprintf(r, sizeof r, "%s->headdim", ref);
        FAI_TRY(expect_dim(name, "headdim", t->headdim, r, d));
    }
    return FA_OK;
}

fa_status fai_check_dtype_of(const fa_tensor *t, const char *name, fa_dtype want,
                             const char *ref)
{
    if (t->dtype == want)
        return FA_OK;
    return fai_fail(FA_ERR_DTYPE, "%s->dtype = %s but %s->dtype = %s", name,
                    fa_dtype_name(t->dtype), ref, fa_dtype_name(want));
}

fa_status fai_check_dtype(const fa_tensor *t, const char *name, fa_dtype want)
{
    if (t->dtype == want)
        return FA_OK;
    return fai_fail(FA_ERR_DTYPE, "%s->dtype = %s but q->dtype = %s; q, k, v, out and the "
                                  "gradients share one storage dtype",
                    name, fa_dtype_name(t->dtype), fa_dtype_name(want));
}

fa_status fai_check_operand(const fa_tensor *t, const char *name, fai_tensor_use use,
                            fa_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d,
                            const char *ref)
{
    FAI_TRY(fai_check_tensor(t, name, use, 0));
    FAI_TRY(fai_check_dtype(t, name, dtype));
    return fai_check_shape(t, name, b, s, h, d, ref);
}

/* ------------------------------------------------------------------ aliasing */

/*
 * Where a tensor's elements lie: the byte range [lo, hi) from its first to past its last
 * element, and its layout as one contiguous run of `run` elements repeated over outer
 * dimensions (size > 1, by ascending stride): headdim, with every dimension merged into the
 * run whose stride is the run's length so far (the heads of a BSHD row, say).
 */
typedef struct {
    uintptr_t lo, hi;
    size_t es;
    int64_t run;
    int n;
    dim_desc outer[3];
} extent;

/* Only for tensors that passed fai_check_tensor (the products fit int64). 0 if empty. */
static int extent_of(const fa_tensor *t, extent *e)
{
    const int64_t dims[3] = {t->batch, t->seqlen, t->heads};
    const int64_t strides[3] = {t->batch_stride, t->seq_stride, t->head_stride};
    int64_t last = t->headdim - 1;
    for (int i = 0; i < 3; i++) {
        if (dims[i] == 0)
            return 0;
        last += (dims[i] - 1) * strides[i];
    }
    if (t->headdim == 0)
        return 0;
    e->es = fai_dtype_size(t->dtype);
    e->lo = (uintptr_t)t->data;
    e->hi = e->lo + (uintptr_t)(last + 1) * e->es;
    dim_desc d[3];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (dims[i] > 1)
            d[n++] = (dim_desc){dims[i], strides[i]};
    sort_by_stride(d, n);
    e->run = t->headdim;
    e->n = 0;
    for (int i = 0; i < n; i++) {
        if (e->n == 0 && d[i].stride == e->run)
            e->run *= d[i].size; /* contiguous with the run: one longer run */
        else
            e->outer[e->n++] = d[i];
    }
    return 1;
}

/*
 * Whether two tensors share a byte. Their ranges are compared; where those intersect, two
 * views that interleave without touching (Q, K and V of one packed QKV buffer, a packed dQKV)
 * are told apart exactly when both have the same element size and the same outer dimensions
 * and strides: then one's runs sit in the gaps of the other's, and they are disjoint iff the
 * offset d between them (in elements, d >= 0 from the lower one) has run_low <= d,
 * d + run_high <= the smallest outer stride s, and every outer stride a multiple of s (two
 * elements then differ by a multiple of s, which no offset in [1, s) is). Any other
 * intersecting pair counts as overlapping (a conservative refusal, docs/DESIGN.md §2).
 */
static int overlapping(const fa_tensor *a, const fa_tensor *b)
{
    extent x, y;
    if (!extent_of(a, &x) || !extent_of(b, &y) || x.hi <= y.lo || y.hi <= x.lo)
        return 0;
    if (x.es != y.es || x.n != y.n || x.n == 0)
        return 1;
    for (int i = 0; i < x.n; i++)
        if (x.outer[i].size != y.outer[i].size || x.outer[i].stride != y.outer[i].stride)
            return 1;
    const extent *low = x.lo <= y.lo ? &x : &y, *high = x.lo <= y.lo ? &y : &x;
    if ((high->lo - low->lo) % x.es != 0)
        return 1;
    const int64_t d = (int64_t)((high->lo - low->lo) / x.es), s = x.outer[0].stride;
    if (s <= 0)
        return 1; /* a broadcast dimension (an input's stride 0): no gaps to tell apart */
    for (int i = 1; i < x.n; i++)
        if (x.outer[i].stride % s != 0)
            return 1;
    return !(low->run <= d && d + high->run <= s);
}

fa_status fai_check_disjoint(const fa_tensor *out, const char *oname, const fa_tensor *other,
                             const char *name)
{
    if (!overlapping(out, other))
        return FA_OK;
    return fai_fail(FA_ERR_STRIDE,
                    "%s overlaps %s (%p and %p): an output must share no byte with an input or "
                    "another output", oname, name, out->data, other->data);
}

fa_status fai_check_outputs_disjoint(const fa_tensor *const *outs, const char *const *onames,
                                     int nout, const fa_tensor *const *ins,
                                     const char *const *inames, int nin)
{
    for (int o = 0; o < nout; o++) {
        for (int i = 0; i < nin; i++)
            FAI_TRY(fai_check_disjoint(outs[o], onames[o], ins[i], inames[i]));
        for (int p = 0; p < o; p++)
            FAI_TRY(fai_check_disjoint(outs[o], onames[o], outs[p], onames[p]));
    }
    return FA_OK;
}

fa_tensor fai_slopes_view(const fa_params *p, int64_t hq)
{
    fa_tensor t;
    fa_tensor_init(&t, (void *)p->alibi_slopes, FA_F32, 1, 1, 1, p->alibi_slopes ? hq : 0, 0);
    return t;
}

fa_tensor fai_sinks_view(const fa_params *p, int64_t hq)
{
    fa_tensor t;
    fa_tensor_init(&t, (void *)p->sink_logits, FA_F32, 1, 1, 1, p->sink_logits ? hq : 0, 0);
    return t;
}

fa_tensor fai_sink_grad_view(const fa_params *p, int64_t hq)
{
    fa_tensor t;
    fa_tensor_init(&t, p->sink_grad, FA_F32, 1, 1, 1, p->sink_grad ? hq : 0, 0);
    return t;
}

fa_tensor fai_indices_view(const fa_indices *x)
{
    fa_tensor t;
    fa_tensor_init(&t, (void *)x->data, x->type == FA_INDEX_INT64 ? FA_F64 : FA_F32, 1, 1, 1,
                   x->count, 0);
    return t;
}

/* ------------------------------------------------------------------ variable-length batches */

/*
 * An index array x of host memory (`name`, whose fields are named with `sep`: "->" for a
 * pointer argument, "." for a member of one): not NULL, a fa_index_type, `count` entries (the
 * count: when want_count >= 0; else from 1 to 2^40), data where there are entries. *out reads
 * it.
 */
static fa_status check_index_array(const fa_indices *x, const char *name, const char *sep,
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
    if (x->count > 0 && fai_cuda_is_device_pointer(x->data))
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
    FAI_TRY(check_index_array(num_x, name, ".", rows,
                              "batch x heads x ceil(Sq / q_block) counts", &num));
    snprintf(name, sizeof name, "params->block_mask->%s", in);
    FAI_TRY(check_index_array(idx_x, name, ".", rows * m->kv_blocks,
                              "batch x heads x ceil(Sq / q_block) x ceil(Sk / kv_block) indices",
                              &idx));
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

/* x: B + 1 offsets, from 0, never decreasing, to `total` (tname's seqlen). */
static fa_status check_offsets(const fa_indices *x, const char *name, int64_t total,
                               const char *tname, fai_index *out)
{
    FAI_TRY(check_index_array(x, name, "->", -1, "B + 1 offsets (1 to 2^40)", out));
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
    FAI_TRY(check_index_array(&pg->block_table, "pages->block_table", ".", entries, what,
                              &pr->table));
    snprintf(what, sizeof what, "B (%lld)", (long long)pr->b);
    FAI_TRY(check_index_array(&pg->seqused_k, "pages->seqused_k", ".", pr->b, what,
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
    FAI_TRY(check_index_array(cache_seqlens, "cache_seqlens", "->", pr->b, what, &pr->seqused));
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
    FAI_TRY(fai_check_dtype_of(v, "v", k->dtype, "k"));
    FAI_TRY(fai_check_shape(v, "v", k->batch, k->seqlen, k->heads, -1, "k"));
    if (!paged)
        FAI_TRY(expect_dim("k", "batch", k->batch, "k_new->batch", k_new->batch));
    memset(pr, 0, sizeof *pr);
    pr->b = k_new->batch;
    pr->hq = pr->hk = k->heads;
    pr->group = 1;
    pr->dqk = k->headdim;
    pr->dv = v->headdim;
    pr->dtype = pr->kv_dtype = k->dtype;
    pr->io[FAI_K] = k;
    pr->io[FAI_V] = v;
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
    FAI_TRY(fai_check_dtype_of(k_new, "k_new", k->dtype, "k"));
    FAI_TRY(fai_check_dtype_of(v_new, "v_new", k->dtype, "k"));
    FAI_TRY(expect_dim("k_new", "batch", k_new->batch, "q->batch", pr->b));
    FAI_TRY(expect_dim("k_new", "heads", k_new->heads, "k->heads", pr->hk));
    FAI_TRY(expect_dim("k_new", "headdim", k_new->headdim, "k->headdim", pr->dqk));
    FAI_TRY(expect_dim("v_new", "batch", v_new->batch, "q->batch", pr->b));
    FAI_TRY(expect_dim("v_new", "seqlen", v_new->seqlen, "k_new->seqlen", k_new->seqlen));
    FAI_TRY(expect_dim("v_new", "heads", v_new->heads, "k->heads", pr->hk));
    FAI_TRY(expect_dim("v_new", "headdim", v_new->headdim, "v->headdim", pr->dv));
    FAI_TRY(fai_check_tensor(k, "k", FAI_OUTPUT, 0)); /* written: no two keys at one address */
    FAI_TRY(fai_check_tensor(v, "v", FAI_OUTPUT, 0));
    FAI_TRY(fai_check_disjoint(k, "k", v, "v"));
    pr->k_new = k_new;
    pr->v_new = v_new;
    pr->s_new = k_new->seqlen;
    return FA_OK;
}

static fa_status check_params(const fa_params *p, int64_t hq)
{
    if (!p)
        return fai_fail(FA_ERR_NULL_POINTER, "params is NULL");
    if (!(p->scale >= 0) || isinf(p->scale))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->scale = %g; it must be finite and >= 0 (0: 1/sqrt(Dqk))",
                        p->scale);
    if (p->window_left < -1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->window_left = %lld; it must be >= -1 (-1: unbounded)",
                        (long long)p->window_left);
    if (p->window_right < -1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->window_right = %lld; it must be >= -1 (-1: unbounded)",
                        (long long)p->window_right);
    if (p->sink_tokens < 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->sink_tokens = %lld; it must be >= 0 (0: none)",
                        (long long)p->sink_tokens);
    if (p->causal && p->window_right > 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->window_right = %lld with causal set; causal means "
                        "window_right = 0",
                        (long long)p->window_right);
    if (p->align != FA_ALIGN_BOTTOM_RIGHT && p->align != FA_ALIGN_TOP_LEFT)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->align = %d is not a fa_align",
                        (int)p->align);
    if (p->score_order != FA_SOFTCAP_THEN_ALIBI && p->score_order != FA_ALIBI_THEN_SOFTCAP)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->score_order = %d is not a fa_score_order",
                        (int)p->score_order);
    if (!(p->softcap >= 0) || isinf(p->softcap))
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->softcap = %g; it must be finite and >= 0 (0: off)", p->softcap);
    if (!(p->dropout_p >= 0 && p->dropout_p < 1))
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->dropout_p = %g is outside [0, 1)",
                        p->dropout_p);
    if (p->alibi_slopes)
        for (int64_t h = 0; h < hq; h++)
            if (!isfinite(p->alibi_slopes[h]))
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->alibi_slopes[%lld] = %g is not finite", (long long)h,
                                (double)p->alibi_slopes[h]);
    if (p->sink_logits)
        for (int64_t h = 0; h < hq; h++)
            if (isnan(p->sink_logits[h]) || p->sink_logits[h] == INFINITY)
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->sink_logits[%lld] = %g; a sink is finite or -inf "
                                "(no sink)", (long long)h, (double)p->sink_logits[h]);
    return FA_OK;
}

/*
 * The bias tensor and its gradient (fa_params.bias, bias_grad) against the problem's dims:
 * batch B or 1, seqlen Sq or 1, heads Hq or 1, headdim Sk; the gradient in the bias's shape,
 * f32 or f64, and only for an additive bias.
 */
static fa_status check_bias(const fa_params *p, const fai_problem *pr)
{
    if (p->bias_place != FA_BIAS_AFTER_SCALE && p->bias_place != FA_BIAS_AFTER_SOFTCAP)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "params->bias_place = %d is not a fa_bias_place",
                        (int)p->bias_place);
    const fa_tensor *t = p->bias;
    if (!t) {
        if (p->bias_by_slope)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->bias_by_slope is set but params->bias is NULL (the slopes "
                            "would scale no bias)");
        if (p->bias_grad)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->bias_grad is set but params->bias is NULL (no bias has a "
                            "gradient)");
        return FA_OK;
    }
    FAI_TRY(fai_check_tensor(t, "params->bias", FAI_INPUT, FAI_TENSOR_BIAS));
    if (fai_dtype_is_fp8(t->dtype))
        return fai_fail(FA_ERR_DTYPE, "params->bias->dtype = %s; a bias is f32, f16, bf16 or f64, "
                                      "a keep-mask bool", fa_dtype_name(t->dtype));
    const struct {
        const char *dim, *ref;
        int64_t got, want;
    } d[4] = {{"batch", "q->batch", t->batch, pr->b},
              {"seqlen", "q->seqlen", t->seqlen, pr->sq},
              {"heads", "q->heads", t->heads, pr->hq},
              {"headdim", "k->seqlen (the keys)", t->headdim, pr->sk}};
    for (int i = 0; i < 4; i++)
        if (d[i].got != d[i].want && (i == 3 || d[i].got != 1))
            return fai_fail(FA_ERR_SHAPE,
                            "params->bias->%s = %lld; it must be %s = %lld%s", d[i].dim,
                            (long long)d[i].got, d[i].ref, (long long)d[i].want,
                            i == 3 ? "" : " or 1 (broadcast)");
    if (p->bias_by_slope && !p->alibi_slopes)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->bias_by_slope is set but params->alibi_slopes is NULL (no slope "
                        "to scale the bias)");
    fa_tensor *g = p->bias_grad;
    if (!g)
        return FA_OK;
    if (t->dtype == FA_BOOL)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->bias_grad is set but params->bias is a keep-mask (bool): a mask "
                        "has no gradient");
    FAI_TRY(fai_check_tensor(g, "params->bias_grad", FAI_OUTPUT, FAI_TENSOR_BIAS));
    FAI_TRY(fai_check_shape(g, "params->bias_grad", t->batch, t->seqlen, t->heads, t->headdim,
                            "params->bias"));
    if (g->dtype != FA_F32 && g->dtype != FA_F64)
        return fai_fail(FA_ERR_DTYPE, "params->bias_grad->dtype = %s; a bias gradient is f32 or "
                                      "f64", fa_dtype_name(g->dtype));
    return FA_OK;
}

fa_status fai_refuse_dense_only(const fai_problem *pr, const fa_params *p, const char *op)
{
    if (p->block_mask)
        return fai_fail(FA_ERR_UNSUPPORTED,
                        "params->block_mask with %s: a block mask is one of a dense call; calls "
                        "of sequences do not take one", op);
    if (pr->bias)
        return fai_fail(FA_ERR_UNSUPPORTED,
                        "params->bias with %s: a bias tensor is (B, Sq, H, Sk) of a dense call; "
                        "calls of sequences do not take one", op);
    if (pr->descale_per_head)
        return fai_fail(FA_ERR_UNSUPPORTED,
                        "params->descale_layout = FA_DESCALE_PER_KV_HEAD with %s: descale "
                        "factors per (batch, kv head) are a dense call's; a call of sequences "
                        "takes them per tensor", op);
    return FA_OK;
}

/* k and v share a dtype: q's, or an f16 / bf16 / FP8 cache under f32 or bf16 q (a forward's;
 * the ops that cannot take it say so); FP8 q takes k and v of its own format. */
static fa_status check_kv_dtypes(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v)
{
    if (v->dtype != k->dtype)
        return fai_fail(FA_ERR_DTYPE, "v->dtype = %s but k->dtype = %s; k and v share one "
                                      "storage dtype", fa_dtype_name(v->dtype),
                        fa_dtype_name(k->dtype));
    if (k->dtype == q->dtype)
        return FA_OK;
    const int cache = k->dtype == FA_F16 || k->dtype == FA_BF16 || fai_dtype_is_fp8(k->dtype);
    if (cache && (q->dtype == FA_F32 || q->dtype == FA_BF16))
        return FA_OK;
    return fai_fail(FA_ERR_DTYPE, "k->dtype = %s but q->dtype = %s; k and v take q's dtype, or "
                                  "f16 / bf16 / e4m3 / e5m2 under f32 or bf16 q",
                    fa_dtype_name(k->dtype), fa_dtype_name(q->dtype));
}

/* The FP8 descale factors: each for an FP8 tensor only, one float or B x Hk (the layout), every
 * one finite and > 0. */
static fa_status check_descales(const fa_params *p, const fai_problem *pr)
{
    if (p->descale_layout != FA_DESCALE_PER_TENSOR && p->descale_layout != FA_DESCALE_PER_KV_HEAD)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "params->descale_layout = %d is not a fa_descale_layout",
                        (int)p->descale_layout);
    const float *const d[3] = {p->descale_q, p->descale_k, p->descale_v};
    const char *const name[3] = {"descale_q", "descale_k", "descale_v"};
    const fa_dtype dt[3] = {pr->q_dtype, pr->kv_dtype, pr->kv_dtype};
    const int64_t n = p->descale_layout == FA_DESCALE_PER_KV_HEAD ? pr->b * pr->hk : 1;
    for (int x = 0; x < 3; x++) {
        if (!d[x])
            continue;
        if (!fai_dtype_is_fp8(dt[x]))
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "params->%s is set but %c->dtype = %s; descale factors are for FP8 "
                            "tensors", name[x], "qkv"[x], fa_dtype_name(dt[x]));
        for (int64_t i = 0; i < n; i++)
            if (!(d[x][i] > 0) || isinf(d[x][i]))
                return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                "params->%s[%lld] = %g; a descale factor is finite and > 0",
                                name[x], (long long)i, (double)d[x][i]);
    }
    return FA_OK;
}

fa_status fai_problem_make(fai_problem *pr, const fa_params *p, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v, int paged)
{
    FAI_TRY(fai_check_tensor(q, "q", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(k, "k", FAI_INPUT, 0));
    FAI_TRY(fai_check_tensor(v, "v", FAI_INPUT, 0));
    FAI_TRY(check_kv_dtypes(q, k, v));
    if (!paged) /* pages: k's batch is the number of pages */
        FAI_TRY(expect_dim("k", "batch", k->batch, "q->batch", q->batch));
    FAI_TRY(expect_dim("k", "headdim", k->headdim, "q->headdim", q->headdim));
    FAI_TRY(fai_check_shape(v, "v", k->batch, k->seqlen, k->heads, -1, "k"));
    if (q->heads % k->heads != 0)
        return fai_fail(FA_ERR_SHAPE,
                        "q->heads = %lld is not a multiple of k->heads = %lld (GQA groups must "
                        "be whole)", (long long)q->heads, (long long)k->heads);
    FAI_TRY(check_params(p, q->heads));

    memset(pr, 0, sizeof *pr);
    pr->b = q->batch;
    pr->hq = q->heads;
    pr->hk = k->heads;
    pr->group = q->heads / k->heads;
    pr->sq = q->seqlen;
    pr->sk = k->seqlen;
    pr->dqk = q->headdim;
    pr->dv = v->headdim;
    pr->dtype = q->dtype; /* FP8 q: the op sets out's */
    pr->q_dtype = q->dtype;
    pr->kv_dtype = k->dtype;
    pr->mask_spec = (fai_mask_spec){.causal = p->causal != 0,
                                    .top_left = p->align == FA_ALIGN_TOP_LEFT,
                                    .left = p->window_left,
                                    .right = p->window_right,
                                    .sink_tokens = p->sink_tokens};
    pr->mask = fai_mask_make(pr->sq, pr->sk, pr->mask_spec.causal, pr->mask_spec.left,
                             pr->mask_spec.right, pr->mask_spec.top_left,
                             pr->mask_spec.sink_tokens);
    pr->score.scale = p->scale > 0 ? p->scale : 1.0 / sqrt((double)pr->dqk);
    pr->score.softcap = p->softcap;
    pr->score.off = pr->mask.off;
    pr->score.alibi_first = p->score_order == FA_ALIBI_THEN_SOFTCAP;
    pr->slopes = p->alibi_slopes;
    pr->sinks = p->sink_logits;
    pr->drop.seed = p->dropout_seed;
    pr->drop.offset = p->dropout_offset;
    pr->drop.threshold = fai_dropout_threshold(p->dropout_p);
    pr->keep_scale = fai_dropout_keep_scale(p->dropout_p);
    pr->io[FAI_Q] = q;
    pr->io[FAI_K] = k;
    pr->io[FAI_V] = v;
    FAI_TRY(check_bias(p, pr));
    FAI_TRY(check_descales(p, pr));
    pr->descale_q = p->descale_q;
    pr->descale_k = p->descale_k;
    pr->descale_v = p->descale_v;
    pr->descale_per_head = p->descale_layout == FA_DESCALE_PER_KV_HEAD;
    if (p->bias) {
        pr->bias = p->bias;
        pr->score.bias = p->bias_place == FA_BIAS_AFTER_SOFTCAP ? FAI_BIAS_AFTER_CAP
                                                                : FAI_BIAS_BEFORE_CAP;
        pr->score.bias_by_slope = p->bias_by_slope != 0;
    }
    return FA_OK;
}
