/*
 * Tensors as the ops take them: fa_tensor_init, the checks of one tensor (its dtype, dims,
 * strides, extent and, for an output, that it does not overlap itself), of its shape and dtype
 * against the call's, of every output against every other tensor (aliasing), and the views
 * that let host arrays (ALiBi slopes, sinks, index arrays) go through the same checks. Every
 * check names the argument and the reason in the error detail; nothing here writes an output.
 */
#include "config.h"

#include <stdio.h>

#include "api/api.h"

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


static int valid_dtype(fa_dtype d) { return (unsigned)d <= FA_Q4_0; }

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
    if (fai_dtype_is_block(t->dtype) && kind != FAI_TENSOR_VALUES)
        return fai_fail(FA_ERR_DTYPE, "%s->dtype: %s; a block format is a K/V cache's only",
                        name, fa_dtype_name(t->dtype));
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
    if (fai_dtype_is_block(t->dtype)) { /* whole blocks: element e of a row in block e / 32 */
        if (t->headdim % FAI_QBLOCK != 0)
            return fai_fail(FA_ERR_SHAPE, "%s->headdim = %lld is not a multiple of 32, the "
                                          "block of %s", name, (long long)t->headdim,
                            fa_dtype_name(t->dtype));
        for (int i = 0; i < 3; i++)
            if (strides[i] % FAI_QBLOCK != 0)
                return fai_fail(FA_ERR_STRIDE, "%s->%s = %lld is not a multiple of 32, the "
                                               "block of %s", name, sn[i],
                                (long long)strides[i], fa_dtype_name(t->dtype));
    }

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
        (uint64_t)last + 1 > (uint64_t)PTRDIFF_MAX / (fai_dtype_is_block(t->dtype)
                                                          ? 2 /* > 34 / 32 bytes */
                                                          : fai_dtype_size(t->dtype)))
        return fai_fail(FA_ERR_OVERFLOW, "%s: its byte extent overflows the address space", name);
    if (nelem > 0 && !t->data)
        return fai_fail(FA_ERR_NULL_POINTER, "%s->data is NULL", name);
    if (use == FAI_OUTPUT && nelem > 0 && !non_overlapping(t))
        return fai_fail(FA_ERR_STRIDE,
                        "%s: its strides map two elements to one address; an output must not "
                        "overlap itself", name);
    return FA_OK;
}

fa_status fai_expect_dim(const char *name, const char *what, int64_t got, const char *ref,
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
    FAI_TRY(fai_expect_dim(name, "batch", t->batch, r, b));
    snprintf(r, sizeof r, "%s->seqlen", ref);
    FAI_TRY(fai_expect_dim(name, "seqlen", t->seqlen, r, s));
    snprintf(r, sizeof r, "%s->heads", ref);
    FAI_TRY(fai_expect_dim(name, "heads", t->heads, r, h));
    if (d >= 0) {
        snprintf(r, sizeof r, "%s->headdim", ref);
        FAI_TRY(fai_expect_dim(name, "headdim", t->headdim, r, d));
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

/* Only for tensors that passed fai_check_tensor (the products fit int64). 0 if empty. The unit
 * is the element, or the block of a block format (32 elements: its dims and strides are whole
 * blocks), of es bytes. */
static int extent_of(const fa_tensor *t, extent *e)
{
    const int64_t u = fai_dtype_is_block(t->dtype) ? FAI_QBLOCK : 1;
    const int64_t dims[3] = {t->batch, t->seqlen, t->heads};
    const int64_t strides[3] = {t->batch_stride / u, t->seq_stride / u, t->head_stride / u};
    int64_t last = t->headdim / u - 1;
    for (int i = 0; i < 3; i++) {
        if (dims[i] == 0)
            return 0;
        last += (dims[i] - 1) * strides[i];
    }
    if (t->headdim == 0)
        return 0;
    e->es = (size_t)fai_dtype_bytes(t->dtype, u);
    e->lo = (uintptr_t)t->data;
    e->hi = e->lo + (uintptr_t)(last + 1) * e->es;
    dim_desc d[3];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (dims[i] > 1)
            d[n++] = (dim_desc){dims[i], strides[i]};
    sort_by_stride(d, n);
    e->run = t->headdim / u;
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
