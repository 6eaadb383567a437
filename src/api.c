/*
 * The public entry points: argument checking, backend choice, the error-detail slot and the
 * memory counters. Backends receive only problems that passed every check here, so a failed
 * call never reaches code that writes an output.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/recurrence.h"
#include "internal.h"
#include "simd/kernels.h"

/* Largest accepted dimension. It keeps every index expression of the kernels (i + off + R,
 * products of two dims) far from int64 overflow; no real tensor comes near it. */
#define FAI_DIM_MAX ((int64_t)1 << 40)

/* ------------------------------------------------------------------ errors */

static _Thread_local char last_error[512];

fa_status fai_fail(fa_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *fa_last_error(void) { return last_error; }

const char *fa_status_string(fa_status s)
{
    switch (s) {
    case FA_OK: return "success";
    case FA_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERR_SHAPE: return "invalid or mismatched tensor shape";
    case FA_ERR_STRIDE: return "invalid tensor strides";
    case FA_ERR_DTYPE: return "invalid or mismatched dtype";
    case FA_ERR_UNSUPPORTED: return "not supported by this backend";
    case FA_ERR_OVERFLOW: return "size arithmetic overflows";
    case FA_ERR_NO_MEMORY: return "out of memory";
    case FA_ERR_BACKEND_UNAVAILABLE: return "backend or ISA unavailable";
    case FA_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

const char *fa_version_string(void) { return PACKAGE_VERSION; }

const char *fa_dtype_name(fa_dtype d)
{
    switch (d) {
    case FA_F32: return "f32";
    case FA_F64: return "f64";
    case FA_F16: return "f16";
    case FA_BF16: return "bf16";
    }
    return "invalid";
}

static const char *const backend_names[] = {"auto", "reference", "conventional", "tiled", "cuda"};
static const char *const isa_names[] = {"auto", "scalar", "avx2", "avx512", "neon", "amx"};

const char *fa_backend_name(fa_backend b)
{
    return (unsigned)b < sizeof backend_names / sizeof *backend_names ? backend_names[b]
                                                                       : "invalid";
}

const char *fa_isa_name(fa_isa i)
{
    return (unsigned)i < sizeof isa_names / sizeof *isa_names ? isa_names[i] : "invalid";
}

/* ------------------------------------------------------------------ sizes and memory */

int fai_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

void *fai_alloc(fa_context *ctx, size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || rounded == 0)
        return NULL;
    void *p = aligned_alloc(64, rounded);
    if (!p)
        return NULL;
    size_t now = atomic_fetch_add(&ctx->mem_current, bytes) + bytes;
    size_t peak = atomic_load(&ctx->mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&ctx->mem_peak, &peak, now)) {
    }
    return p;
}

void fai_free(fa_context *ctx, void *p, size_t bytes)
{
    if (!p)
        return;
    atomic_fetch_sub(&ctx->mem_current, bytes);
    free(p);
}

fa_status fai_thread_scratch(fa_context *ctx, const char *who, size_t *per, int nt, char **base,
                             size_t *bytes)
{
    *per = (*per + 63) & ~(size_t)63;
    if (!fai_mul_size(*per, (size_t)nt, bytes))
        return fai_fail(FA_ERR_OVERFLOW, "%s: workspace size overflows", who);
    *base = fai_alloc(ctx, *bytes);
    if (!*base)
        return fai_fail(FA_ERR_NO_MEMORY, "%s: %zu bytes of workspace for %d threads", who,
                        *bytes, nt);
    return FA_OK;
}

fa_status fa_memory_stats(const fa_context *ctx, size_t *current, size_t *peak)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_memory_stats: ctx is NULL");
    if (current)
        *current = atomic_load(&ctx->mem_current);
    if (peak)
        *peak = atomic_load(&ctx->mem_peak);
    return FA_OK;
}

fa_status fa_memory_stats_reset(fa_context *ctx)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_memory_stats_reset: ctx is NULL");
    atomic_store(&ctx->mem_peak, atomic_load(&ctx->mem_current));
    return FA_OK;
}

/* ------------------------------------------------------------------ defaults and context */

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

void fa_options_init(fa_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->backend = FA_BACKEND_AUTO;
    o->isa = FA_ISA_AUTO;
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

/*
 * The environment's override of an AUTO choice: `var` unset or empty leaves *choice alone;
 * otherwise it must be one of names[1..4] (names[0] is "auto", which it may not say).
 */
static fa_status env_choice(const char *var, const char *const names[5], int *choice)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return FA_OK;
    for (int i = 1; i < 5; i++)
        if (strcmp(v, names[i]) == 0) {
            *choice = i;
            return FA_OK;
        }
    return fai_fail(FA_ERR_INVALID_ARGUMENT, "%s=%s: expected %s, %s, %s or %s", var, v, names[1],
                    names[2], names[3], names[4]);
}

fa_status fa_context_create(const fa_options *o, fa_context **out)
{
    if (!out)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_context_create: ctx (the output pointer) is NULL");
    fa_options opt;
    if (o)
        opt = *o;
    else
        fa_options_init(&opt);

    if ((unsigned)opt.backend > FA_BACKEND_CUDA)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "options->backend: %d is not a fa_backend",
                        (int)opt.backend);
    if ((unsigned)opt.isa > FA_ISA_AMX)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "options->isa: %d is not a fa_isa", (int)opt.isa);
    if (opt.num_threads < 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "options->num_threads: %d is negative (0 means OpenMP's default)",
                        opt.num_threads);

    fa_status st;
    int choice = (int)opt.backend;
    if (opt.backend == FA_BACKEND_AUTO &&
        (st = env_choice("FA_BACKEND", backend_names, &choice)) != FA_OK)
        return st;
    opt.backend = (fa_backend)choice;
    const int backend_auto = opt.backend == FA_BACKEND_AUTO;
    if (opt.backend == FA_BACKEND_AUTO)
        opt.backend = FA_BACKEND_TILED;
    if (opt.backend == FA_BACKEND_CUDA && !fai_cuda_available())
        return FA_ERR_BACKEND_UNAVAILABLE; /* the detail is set */
    choice = (int)opt.isa;
    if (opt.isa == FA_ISA_AUTO && (st = env_choice("FA_ISA", isa_names, &choice)) != FA_OK)
        return st;
    opt.isa = (fa_isa)choice;
    if (opt.isa == FA_ISA_AUTO)
        opt.isa = fai_isa_best();
    const fai_kernels_f32 *kernels = fai_kernels_f32_for(opt.isa);
    if (!kernels)
        return fai_fail(FA_ERR_BACKEND_UNAVAILABLE,
                        "ISA %s: %s", fa_isa_name(opt.isa),
                        fai_cpu_supports(opt.isa) ? "this build carries no kernels for it"
                                                  : "this CPU (or its OS) does not support it");

    fai_tiles forced = {0, 0, 0};
    const char *env = getenv("FA_TILES");
    if (env && *env) {
        int64_t size[3] = {0, 0, 0}; /* BQ, BK, BR (0: the plan's strip for BK) */
        const char *at = env;
        int fields = 0, ok = 1;
        while (ok && fields < 3) {
            ok = *at >= '1' && *at <= '9';
            int64_t v = 0;
            for (; ok && *at >= '0' && *at <= '9'; at++)
                v = v > 4096 ? v : v * 10 + (*at - '0'); /* saturates above the bound */
            size[fields++] = v;
            ok = ok && v <= 4096;
            if (!ok || *at != 'x')
                break;
            at++;
        }
        if (!ok || *at != 0 || fields < 2 || (fields == 3 && size[2] > size[0]))
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "FA_TILES=%s: expected BQxBK or BQxBKxBR, e.g. 64x32 or 64x32x8, "
                            "each in [1, 4096], BR <= BQ", env);
        forced = (fai_tiles){size[0], size[1], size[2]};
    }
    int passes = 0;
    env = getenv("FA_BACKWARD_PASSES");
    if (env && *env) {
        if (strcmp(env, "1") && strcmp(env, "2"))
            return fai_fail(FA_ERR_INVALID_ARGUMENT, "FA_BACKWARD_PASSES=%s: expected 1 or 2", env);
        passes = env[0] - '0';
    }

    fa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return fai_fail(FA_ERR_NO_MEMORY, "fa_context_create: out of memory");
    ctx->backend = opt.backend;
    ctx->isa = opt.isa;
    ctx->kernels = kernels;
    ctx->num_threads = opt.num_threads > 0 ? opt.num_threads : omp_get_max_threads();
    fai_cache_detect(&ctx->cache);
    ctx->forced_tiles = forced;
    ctx->forced_backward_passes = passes;
    ctx->cuda_stream = opt.cuda_stream;
    ctx->deterministic = opt.deterministic != 0;
    ctx->backend_auto = backend_auto;
    atomic_init(&ctx->mem_current, 0);
    atomic_init(&ctx->mem_peak, 0);
    *out = ctx;
    return FA_OK;
}

void fa_context_destroy(fa_context *ctx) { free(ctx); }

fa_status fa_context_describe(const fa_context *ctx, char *buf, size_t n)
{
    if (!ctx || !buf)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_context_describe: %s is NULL",
                        ctx ? "buf" : "ctx");
    if (n == 0)
        return FA_OK;
    fai_tiles t[4];
    for (int k = 0; k < 4; k++) /* D = 64, 128; forward, backward */
        t[k] = fai_tiled_tiles(ctx, 64 << (k / 2), 64 << (k / 2), FA_F32, k % 2);
    snprintf(buf, n,
             "flashattn %s: backend=%s isa=%s kernels=%s,%s%s%s threads=%d L1d=%lldKiB "
             "L2=%lldKiB (%s) "
             "tiles f32 BqxBkxBr fwd/BqxBk bwd: D=64 %lldx%lldx%lld/%lldx%lld, "
             "D=128 %lldx%lldx%lld/%lldx%lld",
             PACKAGE_VERSION, fa_backend_name(ctx->backend), fa_isa_name(ctx->isa),
             ctx->kernels->gemm_name, ctx->kernels->exp_name, ctx->kernels->bf16 ? "," : "",
             ctx->kernels->bf16 ? ctx->kernels->bf16->name : "", ctx->num_threads,
             (long long)(ctx->cache.l1d / 1024), (long long)(ctx->cache.l2 / 1024),
             ctx->cache.source, (long long)t[0].bq, (long long)t[0].bk, (long long)t[0].br,
             (long long)t[1].bq, (long long)t[1].bk, (long long)t[2].bq, (long long)t[2].bk,
             (long long)t[2].br, (long long)t[3].bq, (long long)t[3].bk);
    return FA_OK;
}

/* ------------------------------------------------------------------ tensor checks */

static int valid_dtype(fa_dtype d) { return (unsigned)d <= FA_BF16; }

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
    for (int i = 1; i < 4; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; j--) {
            dim_desc x = d[j];
            d[j] = d[j - 1];
            d[j - 1] = x;
        }
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

typedef enum { T_INPUT, T_OUTPUT } tensor_role;

static fa_status check_tensor(const fa_tensor *t, const char *name, tensor_role role, int is_lse)
{
    if (!t)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", name);
    if (!valid_dtype(t->dtype))
        return fai_fail(FA_ERR_DTYPE, "%s->dtype: %d is not a fa_dtype", name, (int)t->dtype);
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
    if (t->headdim < 1)
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
            return fai_fail(FA_ERR_OVERFLOW, "%s: the extent along %s overflows int64", name,
                            dn[i]);
        nelem = n;
    }
    if (!mad64(nelem, t->headdim, 0, &nelem) ||
        (uint64_t)last + 1 > (uint64_t)PTRDIFF_MAX / fai_dtype_size(t->dtype))
        return fai_fail(FA_ERR_OVERFLOW, "%s: its byte extent overflows the address space", name);
    if (nelem > 0 && !t->data)
        return fai_fail(FA_ERR_NULL_POINTER, "%s->data is NULL", name);
    if (role == T_OUTPUT && nelem > 0 && !non_overlapping(t))
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

/* t must be batch x seqlen x heads x headdim as given; `ref` names where the dims come from. */
static fa_status check_shape(const fa_tensor *t, const char *name, int64_t b, int64_t s,
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

static fa_status same_dtype(const fa_tensor *t, const char *name, fa_dtype want)
{
    if (t->dtype == want)
        return FA_OK;
    return fai_fail(FA_ERR_DTYPE, "%s->dtype = %s but q->dtype = %s; q, k, v, out and the "
                                  "gradients share one storage dtype",
                    name, fa_dtype_name(t->dtype), fa_dtype_name(want));
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
    return FA_OK;
}

/* AUTO runs a call on CUDA when its q is device memory (always no in a build without CUDA). */
static const fai_backend *backend_of(const fa_context *ctx, const fa_tensor *q)
{
    if (ctx->backend_auto && fai_cuda_is_device_pointer(q->data))
        return &fai_backend_cuda;
    switch (ctx->backend) {
    case FA_BACKEND_REFERENCE: return &fai_backend_reference;
    case FA_BACKEND_CONVENTIONAL: return &fai_backend_conventional;
    case FA_BACKEND_CUDA: return &fai_backend_cuda;
    default: return &fai_backend_tiled;
    }
}

/* Checks q, k, v and params, and fills the problem's dims, mask, score and dropout. */
static fa_status prepare(fai_problem *pr, const fa_params *p, const fa_tensor *q,
                         const fa_tensor *k, const fa_tensor *v)
{
    FAI_TRY(check_tensor(q, "q", T_INPUT, 0));
    FAI_TRY(check_tensor(k, "k", T_INPUT, 0));
    FAI_TRY(check_tensor(v, "v", T_INPUT, 0));
    FAI_TRY(same_dtype(k, "k", q->dtype));
    FAI_TRY(same_dtype(v, "v", q->dtype));
    FAI_TRY(expect_dim("k", "batch", k->batch, "q->batch", q->batch));
    FAI_TRY(expect_dim("k", "headdim", k->headdim, "q->headdim", q->headdim));
    FAI_TRY(check_shape(v, "v", k->batch, k->seqlen, k->heads, -1, "k"));
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
    pr->dtype = q->dtype;
    pr->mask = fai_mask_make(pr->sq, pr->sk, p->causal != 0, p->window_left, p->window_right,
                             p->align == FA_ALIGN_TOP_LEFT);
    pr->score.scale = p->scale > 0 ? p->scale : 1.0 / sqrt((double)pr->dqk);
    pr->score.softcap = p->softcap;
    pr->score.off = pr->mask.off;
    pr->score.alibi_first = p->score_order == FA_ALIBI_THEN_SOFTCAP;
    pr->slopes = p->alibi_slopes;
    pr->dropout_p = p->dropout_p;
    pr->seed = p->dropout_seed;
    pr->offset = p->dropout_offset;
    pr->drop_threshold = fai_dropout_threshold(p->dropout_p);
    pr->io.q = q;
    pr->io.k = k;
    pr->io.v = v;
    return FA_OK;
}

/* Zeroes the rows of t (used where §1 defines the result without computing anything). */
static void zero_tensor(const fa_tensor *t)
{
    size_t es = fai_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                memset(fai_row(t, b, s, h), 0, (size_t)t->headdim * es);
}

fa_status fa_forward(fa_context *ctx, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                     const fa_tensor *v, fa_tensor *out, fa_tensor *lse)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(prepare(&pr, p, q, k, v));
    FAI_TRY(check_tensor(out, "out", T_OUTPUT, 0));
    FAI_TRY(same_dtype(out, "out", q->dtype));
    FAI_TRY(check_shape(out, "out", pr.b, pr.sq, pr.hq, pr.dv, "q (headdim: v)"));
    if (lse) {
        FAI_TRY(check_tensor(lse, "lse", T_OUTPUT, 1));
        FAI_TRY(check_shape(lse, "lse", pr.b, pr.sq, pr.hq, 1, "q"));
    }
    pr.io.out = out;
    pr.io.lse = lse;
    if (pr.b == 0 || pr.sq == 0)
        return FA_OK;
    const fai_backend *be = backend_of(ctx, q);
    if (pr.sk == 0 && be != &fai_backend_cuda) { /* every row is empty (§1): O = 0, LSE = -inf;
                                                    CUDA writes its device memory itself */
        zero_tensor(out);
        if (lse)
            for (int64_t b = 0; b < pr.b; b++)
                for (int64_t h = 0; h < pr.hq; h++)
                    for (int64_t i = 0; i < pr.sq; i++)
                        fai_lse_store(lse, b, h, i, -INFINITY);
        return FA_OK;
    }
    return be->forward(ctx, &pr);
}

fa_status fa_backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq, fa_tensor *dk,
                      fa_tensor *dv)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "ctx is NULL");
    fai_problem pr;
    FAI_TRY(prepare(&pr, p, q, k, v));
    FAI_TRY(check_tensor(out, "out", T_INPUT, 0));
    FAI_TRY(same_dtype(out, "out", q->dtype));
    FAI_TRY(check_shape(out, "out", pr.b, pr.sq, pr.hq, pr.dv, "q (headdim: v)"));
    FAI_TRY(check_tensor(lse, "lse", T_INPUT, 1));
    FAI_TRY(check_shape(lse, "lse", pr.b, pr.sq, pr.hq, 1, "q"));
    if (q->dtype == FA_F64 && lse->dtype != FA_F64) /* P = exp(s - LSE) is only as exact as LSE */
        return fai_fail(FA_ERR_DTYPE, "lse->dtype = %s with f64 storage; the backward needs an "
                                      "f64 LSE to keep f64 accuracy", fa_dtype_name(lse->dtype));
    FAI_TRY(check_tensor(dout, "dout", T_INPUT, 0));
    FAI_TRY(same_dtype(dout, "dout", q->dtype));
    FAI_TRY(check_shape(dout, "dout", pr.b, pr.sq, pr.hq, pr.dv, "out"));
    FAI_TRY(check_tensor(dq, "dq", T_OUTPUT, 0));
    FAI_TRY(check_tensor(dk, "dk", T_OUTPUT, 0));
    FAI_TRY(check_tensor(dv, "dv", T_OUTPUT, 0));
    FAI_TRY(same_dtype(dq, "dq", q->dtype));
    FAI_TRY(same_dtype(dk, "dk", q->dtype));
    FAI_TRY(same_dtype(dv, "dv", q->dtype));
    FAI_TRY(check_shape(dq, "dq", pr.b, pr.sq, pr.hq, pr.dqk, "q"));
    FAI_TRY(check_shape(dk, "dk", pr.b, pr.sk, pr.hk, pr.dqk, "k"));
    FAI_TRY(check_shape(dv, "dv", pr.b, pr.sk, pr.hk, pr.dv, "v"));
    pr.io.out = out;
    pr.io.lse = lse;
    pr.io.dout = dout;
    pr.io.dq = dq;
    pr.io.dk = dk;
    pr.io.dv = dv;
    if (pr.b == 0)
        return FA_OK;
    const fai_backend *be = backend_of(ctx, q);
    if ((pr.sq == 0 || pr.sk == 0) && be != &fai_backend_cuda) { /* no (query, key) pair:
                                                                    every gradient is 0 */
        zero_tensor(dq);
        zero_tensor(dk);
        zero_tensor(dv);
        return FA_OK;
    }
    return be->backward(ctx, &pr);
}

/* ------------------------------------------------------------------ merge */

fa_status fa_merge_states(int n, const fa_tensor *outs, const fa_tensor *lses, fa_tensor *out,
                          fa_tensor *lse)
{
    if (n < 1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "n = %d; at least one state is needed", n);
    if (!outs || !lses)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", outs ? "lses" : "outs");
    FAI_TRY(check_tensor(out, "out", T_OUTPUT, 0));
    FAI_TRY(check_tensor(lse, "lse", T_OUTPUT, 1));
    FAI_TRY(check_shape(lse, "lse", out->batch, out->seqlen, out->heads, 1, "out"));
    for (int k = 0; k < n; k++) {
        char name[40];
        snprintf(name, sizeof name, "outs[%d]", k);
        FAI_TRY(check_tensor(&outs[k], name, T_INPUT, 0));
        FAI_TRY(check_shape(&outs[k], name, out->batch, out->seqlen, out->heads, out->headdim,
                            "out"));
        snprintf(name, sizeof name, "lses[%d]", k);
        FAI_TRY(check_tensor(&lses[k], name, T_INPUT, 1));
        FAI_TRY(check_shape(&lses[k], name, out->batch, out->seqlen, out->heads, 1, "out"));
    }
    const int64_t D = out->headdim, rows = out->batch * out->seqlen * out->heads;
    const int nt = omp_get_max_threads();
    size_t per = 0, all = 0;
    if (!fai_mul_size((size_t)(2 * D + n), sizeof(double), &per) ||
        !fai_mul_size(per, (size_t)nt, &all))
        return fai_fail(FA_ERR_OVERFLOW, "fa_merge_states: scratch size overflows");
    double *scratch = malloc(all);
    if (!scratch)
        return fai_fail(FA_ERR_NO_MEMORY, "fa_merge_states: %zu bytes of scratch", all);

#pragma omp parallel num_threads(nt)
    {
        double *acc = scratch + (size_t)omp_get_thread_num() * (per / sizeof(double));
        double *row = acc + D, *l = row + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t h = r % out->heads, s = (r / out->heads) % out->seqlen,
                    b = r / (out->heads * out->seqlen);
            for (int k = 0; k < n; k++)
                l[k] = fai_lse_load(&lses[k], b, h, s);
            double L = fai_merge_lse_f64(l, n);
            for (int64_t d = 0; d < D; d++)
                acc[d] = 0;
            for (int k = 0; k < n; k++) {
                double w = fai_merge_weight_f64(l[k], L);
                if (w == 0) /* dropped by selection: a neutral state's O is never read */
                    continue;
                fai_load_f64(fai_row(&outs[k], b, s, h), outs[k].dtype, D, row);
                for (int64_t d = 0; d < D; d++)
                    acc[d] += w * row[d];
            }
            fai_store_f64(fai_row(out, b, s, h), out->dtype, D, acc);
            fai_lse_store(lse, b, h, s, L);
        }
    }
    free(scratch);
    return FA_OK;
}
