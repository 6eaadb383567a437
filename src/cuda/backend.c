/*
 * The CUDA backend's host side: checks that every tensor is device memory of the current
 * device (where the kernels run), copies the ALiBi slopes (host memory, like every backend's)
 * to the device, takes stream-ordered device workspace counted in the context's memory
 * statistics, and hands the kernels (launch.h) a plain description of the problem. Launches
 * are asynchronous on fa_options.cuda_stream; a failed check launches nothing, so the outputs
 * are untouched.
 */
#include "config.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/blocks.h"
#include "backends/context.h"
#include "backends/empty.h"
#include "backends/groups.h"
#include "backends/table.h"
#include "cuda/launch.h"
#include "cuda/plan.h"

#ifndef FA_CUDA_MIN_ARCH
#error "configure defines FA_CUDA_MIN_ARCH (the lowest --with-cuda-arch) in --enable-cuda builds"
#endif

/* What a context tells the backend (its setup hook, from fa_options and the environment;
 * kept in the context's settings): the stream its calls run on, whether the backward must be
 * bitwise repeatable, and which kernels may run. */
typedef struct {
    void *stream;      /* fa_options.cuda_stream */
    int deterministic; /* fa_options.deterministic */
    int kernel;        /* fai_cuda_kernel: FA_CUDA_KERNEL as the context was made */
} cuda_settings;
_Static_assert(sizeof(cuda_settings) <= sizeof(fai_backend_settings),
               "the CUDA backend's settings fit a context's slot");

/* The kernel choice FA_CUDA_KERNEL names (unset or empty: AUTO); a value naming none refuses
 * the context, whichever backend it is for (the variable is read once, here). */
static const char *const kernel_names[] = {[FAI_CUDA_KERNEL_AUTO] = "auto",
                                           [FAI_CUDA_KERNEL_MMA] = "mma",
                                           [FAI_CUDA_KERNEL_GENERIC] = "generic"};

static fa_status cuda_setup(const fa_options *o, fai_backend_settings *mine)
{
    cuda_settings s = {o->cuda_stream, o->deterministic != 0, FAI_CUDA_KERNEL_AUTO};
    const char *k = getenv("FA_CUDA_KERNEL");
    if (k && *k) {
        if (strcmp(k, "generic") == 0)
            s.kernel = FAI_CUDA_KERNEL_GENERIC;
        else if (strcmp(k, "mma") == 0)
            s.kernel = FAI_CUDA_KERNEL_MMA;
        else
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "FA_CUDA_KERNEL=%s: expected generic or mma (or unset)", k);
    }
    memcpy(mine->bytes, &s, sizeof s);
    return FA_OK;
}

/* The context's part of fa_context_describe's line: the kernels its calls may take, and the
 * launch plan's choice for plain bf16 calls at each tensor-core head dim (cuda/plan.h). */
static void cuda_describe(const fa_context *ctx, char *buf, size_t n)
{
    cuda_settings s;
    fai_settings_get(ctx, FA_BACKEND_CUDA, &s, sizeof s);
    const int k = snprintf(buf, n, "cuda_kernels=%s ", kernel_names[s.kernel]);
    if (k > 0 && (size_t)k < n)
        fai_cuda_plan_describe(s.kernel, buf + k, n - (size_t)k);
}

/* Usable: a device, and the current one can run this build's code (SASS for the lowest arch
 * up, PTX of the last arch for newer ones). */
static int cuda_available(void)
{
    int n = 0, dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        fai_fail(FA_ERR_BACKEND_UNAVAILABLE, "backend cuda: no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        return 0;
    }
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) !=
            cudaSuccess ||
        (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) !=
            cudaSuccess) {
        (void)cudaGetLastError();
        fai_fail(FA_ERR_BACKEND_UNAVAILABLE, "backend cuda: the current device: %s",
                 cudaGetErrorString(e));
        return 0;
    }
    if (10 * major + minor < FA_CUDA_MIN_ARCH) {
        fai_fail(FA_ERR_BACKEND_UNAVAILABLE,
                 "backend cuda: device %d has compute capability %d.%d; this build's kernels "
                 "need sm_%d or newer (configure --with-cuda-arch)",
                 dev, major, minor, FA_CUDA_MIN_ARCH);
        return 0;
    }
    return 1;
}

/* Whether p is device or managed memory; *at is filled when it is. */
static int device_memory(const void *p, struct cudaPointerAttributes *at)
{
    if (!p)
        return 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return 0;
    }
    if (cudaPointerGetAttributes(at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return at->type == cudaMemoryTypeDevice || at->type == cudaMemoryTypeManaged;
}

/* The table's holds: AUTO runs a call whose q is device memory here. */
static int cuda_holds(const void *p)
{
    struct cudaPointerAttributes at;
    return device_memory(p, &at);
}

/* A view of t for the kernels; a non-empty tensor must be device (or managed) memory, and
 * device memory must be the current device's (dev), where the kernels run. */
static fa_status view(const fa_tensor *t, const char *name, int dev, fai_cuda_view *v)
{
    memset(v, 0, sizeof *v);
    if (!t)
        return FA_OK;
    int64_t n = t->batch * t->seqlen * t->heads * t->headdim;
    if (n > 0) {
        struct cudaPointerAttributes at;
        if (!device_memory(t->data, &at))
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "backend cuda: %s->data = %p is not device memory; the CUDA "
                            "backend takes device (or managed) pointers", name, t->data);
        if (at.type == cudaMemoryTypeDevice && at.device != dev)
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "backend cuda: %s->data = %p is memory of device %d, but the "
                            "current device is %d (cudaSetDevice before the call)",
                            name, t->data, at.device, dev);
    }
    v->data = t->data;
    v->sb = t->batch_stride;
    v->ss = t->seq_stride;
    v->sh = t->head_stride;
    return FA_OK;
}

/* A tensor in the bias's shape (the bias, or its gradient) for the kernels: device memory as
 * view() checks it, its dims, and strides with the stride of a dim of 1 set to 0 (it is not
 * read: the kernels index such a dim with the problem's own index). */
static fa_status bias_view(const fa_tensor *t, const char *name, int dev, fai_cuda_bias_view *bv)
{
    memset(bv, 0, sizeof *bv);
    if (!t)
        return FA_OK;
    fai_cuda_view v;
    FAI_TRY(view(t, name, dev, &v));
    bv->data = v.data;
    bv->dtype = (int)t->dtype;
    bv->b = t->batch, bv->s = t->seqlen, bv->h = t->heads, bv->sk = t->headdim;
    bv->sb = t->batch == 1 ? 0 : v.sb;
    bv->ss = t->seqlen == 1 ? 0 : v.ss;
    bv->sh = t->heads == 1 ? 0 : v.sh;
    return FA_OK;
}

static fa_status fill(fa_context *ctx, const fai_problem *pr, fai_cuda_args *a)
{
    memset(a, 0, sizeof *a);
    if (fai_dtype_is_block(pr->k_dtype) || fai_dtype_is_block(pr->v_dtype))
        return fai_fail(FA_ERR_UNSUPPORTED, "%s->dtype is a block format (q8_0 or q4_0): the "
                                            "CUDA backend does not read block-format caches yet "
                                            "(the CPU backends do)",
                        fai_dtype_is_block(pr->k_dtype) ? "k" : "v");
    a->dtype = (int)pr->dtype;
    a->q_dtype = (int)pr->q_dtype;
    a->kv_dtype = (int)pr->k_dtype; /* v's too: only block formats differ */
    a->lse_f64 = fai_io(pr, FAI_LSE) && fai_io(pr, FAI_LSE)->dtype == FA_F64;
    a->b = pr->b, a->hq = pr->hq, a->hk = pr->hk, a->sq = pr->sq, a->sk = pr->sk;
    a->dqk = pr->dqk, a->dv = pr->dv, a->group = pr->group;
    a->mask = pr->mask;
    a->score = pr->score;
    a->drop = pr->drop;
    a->keep_scale = pr->keep_scale;
    cuda_settings set;
    fai_settings_get(ctx, FA_BACKEND_CUDA, &set, sizeof set);
    a->stream = set.stream;
    a->deterministic = set.deterministic;
    a->kernel = set.kernel; /* which kernels run: the launch plan's (cuda/plan.h) */
    if (pr->blocks) { /* the block map's dims (copy_blocks copies the map) */
        const fai_block_map *m = pr->blocks;
        a->blocks.batch = m->batch, a->blocks.heads = m->heads;
        a->blocks.q_block = m->q_block, a->blocks.kv_block = m->kv_block;
        a->blocks.q_blocks = m->q_blocks, a->blocks.kv_blocks = m->kv_blocks;
    }
    a->descale_per_head = pr->descale_per_head;
    a->descale_n = pr->descale_per_head ? pr->b * pr->hk : 1;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fai_fail(FA_ERR_DEVICE, "backend cuda: the current device: %s",
                        cudaGetErrorString(e));
    }
    /* device memory: the kernels address rows through these views (launch.h) */
    FAI_TRY(view(fai_io(pr, FAI_Q), "q", dev, &a->tq));
    FAI_TRY(view(fai_io(pr, FAI_K), "k", dev, &a->tk));
    FAI_TRY(view(fai_io(pr, FAI_V), "v", dev, &a->tv));
    FAI_TRY(view(fai_io(pr, FAI_OUT), "out", dev, &a->tout));
    FAI_TRY(view(fai_io(pr, FAI_LSE), "lse", dev, &a->tlse));
    FAI_TRY(view(fai_io(pr, FAI_DOUT), "dout", dev, &a->tdout));
    FAI_TRY(view(fai_io(pr, FAI_DQ), "dq", dev, &a->tdq));
    FAI_TRY(view(fai_io(pr, FAI_DK), "dk", dev, &a->tdk));
    FAI_TRY(view(fai_io(pr, FAI_DV), "dv", dev, &a->tdv));
    FAI_TRY(view(pr->k_new, "k_new", dev, &a->tkn));
    FAI_TRY(view(pr->v_new, "v_new", dev, &a->tvn));
    FAI_TRY(bias_view(pr->bias, "params->bias", dev, &a->bias));
    FAI_TRY(bias_view(pr->bias_grad, "params->bias_grad", dev, &a->bias_grad));
    return FA_OK;
}

/* Stream-ordered device memory, counted with the host allocations (fa_memory_stats). */
static void *dev_alloc(fa_context *ctx, size_t bytes, cudaStream_t st)
{
    void *p = NULL;
    if (bytes == 0 || fai_fault_now())
        return NULL;
    if (cudaMallocAsync(&p, bytes, st) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    fai_mem_add(&ctx->mem, bytes);
    return p;
}

static void dev_free(fa_context *ctx, void *p, size_t bytes, cudaStream_t st)
{
    if (!p)
        return;
    cudaFreeAsync(p, st);
    fai_mem_sub(&ctx->mem, bytes);
}

static fa_status result(fai_cuda_result r, const char *err)
{
    switch (r) {
    case FAI_CUDA_OK: return FA_OK;
    case FAI_CUDA_UNSUPPORTED: return fai_fail(FA_ERR_UNSUPPORTED, "%s", err);
    default: return fai_fail(FA_ERR_DEVICE, "%s", err);
    }
}

/* Hq floats of host memory (the ALiBi slopes, the sink logits: `what`) on the device, or NULL
 * where src is. */
static fa_status copy_head_floats(fa_context *ctx, const fai_problem *pr, const float *src,
                                  const char *what, cudaStream_t st, void **dev, size_t *bytes)
{
    *dev = NULL;
    *bytes = 0;
    if (!src)
        return FA_OK;
    *bytes = (size_t)pr->hq * sizeof(float);
    *dev = dev_alloc(ctx, *bytes, st);
    if (!*dev)
        return fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes of device memory for the "
                                          "%s", *bytes, what);
    /* from pageable memory: the copy is staged before the call returns, so the caller may
     * free the host copy at once */
    cudaError_t e = cudaMemcpyAsync(*dev, src, *bytes, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        dev_free(ctx, *dev, *bytes, st);
        return fai_fail(FA_ERR_DEVICE, "backend cuda: copying the %s: %s", what,
                        cudaGetErrorString(e));
    }
    return FA_OK;
}

/* bytes of host memory (src) on the device, counted in the context's memory; `what` names it
 * in errors. From pageable memory: the copy is staged before the call returns, so the caller
 * may free src at once. */
static fa_status upload(fa_context *ctx, const void *src, size_t bytes, const char *what,
                        cudaStream_t st, void **dev)
{
    if (!(*dev = dev_alloc(ctx, bytes, st)))
        return fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes of device memory for the %s",
                        bytes, what);
    const cudaError_t e = cudaMemcpyAsync(*dev, src, bytes, cudaMemcpyHostToDevice, st);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        dev_free(ctx, *dev, bytes, st);
        *dev = NULL;
        return fai_fail(FA_ERR_DEVICE, "backend cuda: copying the %s: %s", what,
                        cudaGetErrorString(e));
    }
    return FA_OK;
}

/* The block mask's map (fai_block_map: host bytes, expanded by the API layer) on the device,
 * once a call, into a->blocks.listed (NULL without a block mask or with an empty map). */
static fa_status copy_blocks(fa_context *ctx, const fai_problem *pr, fai_cuda_args *a,
                             cudaStream_t st, void **dev, size_t *bytes)
{
    *dev = NULL;
    *bytes = 0;
    const fai_block_map *m = pr->blocks;
    if (!m)
        return FA_OK;
    *bytes = (size_t)(m->batch * m->heads * m->q_blocks * m->kv_blocks);
    if (*bytes == 0) /* (no query or no key block: no pair to mask) */
        return FA_OK;
    FAI_TRY(upload(ctx, m->listed, *bytes, "block mask's map", st, dev));
    a->blocks.listed = (const unsigned char *)*dev;
    return FA_OK;
}

/* The FP8 descales on the device, into a->descale (NULL without any): descale_n products
 * descale_q descale_k (fai_descale_qk, exact in double) and descale_n descale_v, one each per
 * (batch, kv head) with FA_DESCALE_PER_KV_HEAD, else one. */
static fa_status copy_descales(fa_context *ctx, const fai_problem *pr, fai_cuda_args *a,
                               cudaStream_t st, void **dev, size_t *bytes)
{
    *dev = NULL;
    *bytes = 0;
    if (!pr->descale_q && !pr->descale_k && !pr->descale_v)
        return FA_OK;
    const int64_t n = a->descale_n;
    *bytes = (size_t)(2 * n) * sizeof(double);
    double *host = fai_alloc(&ctx->mem, *bytes);
    if (!host)
        return fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes for the FP8 descales", *bytes);
    for (int64_t x = 0; x < n; x++) {
        const int64_t b = pr->descale_per_head ? x / pr->hk : 0,
                      hk = pr->descale_per_head ? x % pr->hk : 0;
        host[x] = fai_descale_qk(pr, b, hk);
        host[n + x] = fai_descale_v(pr, b, hk);
    }
    const fa_status s = upload(ctx, host, *bytes, "FP8 descales", st, dev);
    fai_free(&ctx->mem, host, *bytes);
    if (s == FA_OK)
        a->descale = (const double *)*dev;
    return s;
}

/* A paged call's page table on the device, widened to int64 (NULL without pages). */
static fa_status copy_table(fa_context *ctx, const fai_problem *pr, cudaStream_t st,
                            int64_t **dev, size_t *bytes)
{
    *dev = NULL;
    *bytes = 0;
    const size_t n = (size_t)(pr->nseq * pr->table_stride);
    if (!pr->page_size || n == 0) /* (no page, so no key is read or written) */
        return FA_OK;
    *bytes = n * sizeof(int64_t);
    int64_t *host = fai_alloc(&ctx->mem, *bytes);
    if (!host)
        return fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes for the page table", *bytes);
    for (size_t i = 0; i < n; i++)
        host[i] = fai_index_at(pr->table, (int64_t)i);
    fa_status s = FA_OK;
    if (!(*dev = dev_alloc(ctx, *bytes, st))) {
        s = fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes of device memory for the page "
                                       "table", *bytes);
    } else if (cudaMemcpyAsync(*dev, host, *bytes, cudaMemcpyHostToDevice, st) != cudaSuccess) {
        /* (from pageable memory: staged before the call returns, so host may go at once) */
        const cudaError_t e = cudaGetLastError();
        dev_free(ctx, *dev, *bytes, st);
        *dev = NULL;
        s = fai_fail(FA_ERR_DEVICE, "backend cuda: copying the page table: %s",
                     cudaGetErrorString(e));
    }
    fai_free(&ctx->mem, host, *bytes);
    return s;
}

/* v's base moved to row s of batch b (elements of es bytes). */
static void shift(fai_cuda_view *v, int64_t b, int64_t s, size_t es)
{
    if (v->data)
        v->data = (char *)v->data + (size_t)(b * v->sb + s * v->ss) * es;
}

/* Group g of the call (s = fai_group(pr, g); the call itself when it is dense) as kernel
 * arguments: the call's, with the group's dims, mask, score offset and dropout stream, its
 * views' bases at its rows, and a paged K/V's table at its row. */
static fai_cuda_args group_args(const fai_problem *pr, int64_t g, const fai_problem *s,
                                const fai_cuda_args *call)
{
    fai_cuda_args a = *call;
    a.b = s->b, a.sq = s->sq, a.sk = s->sk, a.seq0 = s->seq0;
    a.mask = s->mask;
    a.score = s->score;
    const size_t qe = fai_dtype_size(pr->dtype), ke = fai_dtype_size(pr->k_dtype);
    shift(&a.tq, s->qb0, s->q0, fai_dtype_size(pr->q_dtype)); /* FP8 q: 1-byte rows */
    fai_cuda_view *qside[3] = {&a.tout, &a.tdout, &a.tdq};
    for (int x = 0; x < 3; x++)
        shift(qside[x], s->qb0, s->q0, qe);
    shift(&a.tlse, s->qb0, s->q0, call->lse_f64 ? sizeof(double) : sizeof(float));
    shift(&a.tkn, g, 0, ke); /* a cache's new keys: batch g */
    shift(&a.tvn, g, 0, ke);
    if (call->table) {
        a.table = call->table + g * pr->table_stride;
        return a;
    }
    fai_cuda_view *kside[4] = {&a.tk, &a.tv, &a.tdk, &a.tdv};
    for (int x = 0; x < 4; x++)
        shift(kside[x], s->kb0, s->k0, ke);
    return a;
}

/* A cache's new keys, sequence by sequence, to its keys [seqused, seqused + s_new). */
static fai_cuda_result append_new_keys(const fai_problem *pr, const fai_cuda_args *call,
                                       char *err, size_t n)
{
    fai_cuda_result r = FAI_CUDA_OK;
    for (int64_t g = 0; r == FAI_CUDA_OK && g < pr->nseq; g++) {
        const fai_problem s = fai_group(pr, g);
        const fai_cuda_args a = group_args(pr, g, &s, call);
        r = fai_cuda_append(&a, pr->s_new, a.sk - pr->s_new, err, n);
    }
    return r;
}

/* The forward: every group (a dense call is one) launched in order, after the inputs the
 * kernels read from the host are on the device and a cache's new keys are in it; but a group
 * with no row to write (backends/empty.h: a sequence without queries). A group without a
 * (query, key) pair is launched: the kernels end its rows empty (O = 0, LSE the sink's), as
 * fai_write_empty does on the host. A bias (dense calls only, the API layer says) goes to the
 * generic kernels (fill). */
static fa_status cuda_forward(fa_context *ctx, const fai_problem *pr)
{
    fai_cuda_args a;
    FAI_TRY(fill(ctx, pr, &a));
    char err[300] = "";
    fai_cuda_result r = fai_cuda_supported(&a, err, sizeof err);
    if (r != FAI_CUDA_OK)
        return result(r, err);
    cudaStream_t st = (cudaStream_t)a.stream;
    void *slopes = NULL, *sinks = NULL, *blocks = NULL, *descales = NULL;
    int64_t *table = NULL;
    size_t sb = 0, kb = 0, tb = 0, bb = 0, db = 0;
    fa_status s = copy_head_floats(ctx, pr, pr->slopes, "ALiBi slopes", st, &slopes, &sb);
    if (s == FA_OK)
        s = copy_head_floats(ctx, pr, pr->sinks, "sink logits", st, &sinks, &kb);
    if (s == FA_OK)
        s = copy_table(ctx, pr, st, &table, &tb);
    if (s == FA_OK)
        s = copy_blocks(ctx, pr, &a, st, &blocks, &bb);
    if (s == FA_OK)
        s = copy_descales(ctx, pr, &a, st, &descales, &db);
    if (s == FA_OK) {
        a.slopes = (const float *)slopes;
        a.sinks = (const float *)sinks;
        a.table = table;
        a.page_size = pr->page_size;
        a.table_stride = pr->table_stride;
        if (pr->k_new)
            r = append_new_keys(pr, &a, err, sizeof err);
        for (int64_t g = 0; r == FAI_CUDA_OK && g < fai_groups(pr); g++) {
            const fai_problem sg = fai_group(pr, g);
            if (fai_empty_of(&sg, 0) == FAI_EMPTY_NO_ROW)
                continue;
            const fai_cuda_args ga = group_args(pr, g, &sg, &a);
            r = fai_cuda_forward(&ga, err, sizeof err);
        }
        s = result(r, err);
    }
    dev_free(ctx, descales, db, st);
    dev_free(ctx, blocks, bb, st);
    dev_free(ctx, table, tb, st);
    dev_free(ctx, sinks, kb, st);
    dev_free(ctx, slopes, sb, st);
    return s;
}

/* fa_append_kv on a device cache: the forward's append alone. */
static fa_status cuda_append(fa_context *ctx, const fai_problem *pr)
{
    fai_cuda_args a;
    FAI_TRY(fill(ctx, pr, &a));
    cudaStream_t st = (cudaStream_t)a.stream;
    int64_t *table;
    size_t tb;
    FAI_TRY(copy_table(ctx, pr, st, &table, &tb));
    a.table = table;
    a.page_size = pr->page_size;
    a.table_stride = pr->table_stride;
    char err[300] = "";
    const fai_cuda_result r = append_new_keys(pr, &a, err, sizeof err);
    dev_free(ctx, table, tb, st);
    return result(r, err);
}

/* The sink gradient, from the device's sum (Hq doubles) to the caller's Hq floats: the one
 * copy back to the host, so the call waits for its stream here. */
static fa_status sink_grad_to_host(fa_context *ctx, const fai_problem *pr, const double *dev,
                                   cudaStream_t st)
{
    const size_t bytes = (size_t)pr->hq * sizeof(double);
    double *host = fai_alloc(&ctx->mem, bytes);
    if (!host)
        return fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes for the sink gradient", bytes);
    cudaError_t e = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(st);
    if (e == cudaSuccess)
        for (int64_t h = 0; h < pr->hq; h++)
            pr->sink_grad[h] = (float)host[h];
    else
        (void)cudaGetLastError();
    fai_free(&ctx->mem, host, bytes);
    return e == cudaSuccess ? FA_OK
                            : fai_fail(FA_ERR_DEVICE, "backend cuda: the sink gradient: %s",
                                       cudaGetErrorString(e));
}

/* The backward: every group in order, on one workspace, the largest any group needs; with
 * sink_grad, each group's terms added to one device sum after its gradients; with bias_grad
 * (a dense call: one group), the bias gradient's kernel after the gradients, reading the D_i
 * that the generic backward left in the workspace. */
static fa_status cuda_backward(fa_context *ctx, const fai_problem *pr)
{
    fai_cuda_args a;
    FAI_TRY(fill(ctx, pr, &a));
    cudaStream_t st = (cudaStream_t)a.stream;
    size_t wb = 0;
    for (int64_t g = 0; g < fai_groups(pr); g++) {
        const fai_problem sg = fai_group(pr, g);
        const fai_cuda_args ga = group_args(pr, g, &sg, &a);
        const size_t one = fai_cuda_backward_workspace(&ga);
        wb = one > wb ? one : wb;
    }
    const size_t gb = pr->sink_grad ? (size_t)pr->hq * sizeof(double) : 0;
    void *slopes = NULL, *sinks = NULL; /* (P comes from the given LSE, which holds the sink) */
    void *blocks = NULL;
    size_t sb = 0, kb = 0, bb = 0;
    double *grad = NULL;
    fa_status s = FA_OK;
    a.work = dev_alloc(ctx, wb, st);
    if (wb && !a.work)
        s = fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes of device workspace", wb);
    if (s == FA_OK && gb && !(grad = dev_alloc(ctx, gb, st)))
        s = fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes of device memory for the sink "
                                       "gradient", gb);
    if (s == FA_OK)
        s = copy_head_floats(ctx, pr, pr->slopes, "ALiBi slopes", st, &slopes, &sb);
    if (s == FA_OK && gb)
        s = copy_head_floats(ctx, pr, pr->sinks, "sink logits", st, &sinks, &kb);
    if (s == FA_OK)
        s = copy_blocks(ctx, pr, &a, st, &blocks, &bb);
    if (s == FA_OK && gb && cudaMemsetAsync(grad, 0, gb, st) != cudaSuccess)
        s = fai_fail(FA_ERR_DEVICE, "backend cuda: clearing the sink gradient: %s",
                     cudaGetErrorString(cudaGetLastError()));
    if (s == FA_OK) {
        a.slopes = (const float *)slopes;
        a.sinks = (const float *)sinks;
        char err[300] = "";
        fai_cuda_result r = FAI_CUDA_OK;
        for (int64_t g = 0; r == FAI_CUDA_OK && g < fai_groups(pr); g++) {
            const fai_problem sg = fai_group(pr, g);
            const fai_cuda_args ga = group_args(pr, g, &sg, &a);
            r = fai_cuda_backward(&ga, err, sizeof err);
            if (r == FAI_CUDA_OK && grad)
                r = fai_cuda_sink_grad(&ga, grad, err, sizeof err);
            if (r == FAI_CUDA_OK && ga.bias_grad.data)
                r = fai_cuda_bias_grad(&ga, err, sizeof err);
        }
        s = result(r, err);
        if (s == FA_OK && grad)
            s = sink_grad_to_host(ctx, pr, grad, st);
    }
    dev_free(ctx, blocks, bb, st);
    dev_free(ctx, sinks, kb, st);
    dev_free(ctx, slopes, sb, st);
    dev_free(ctx, grad, gb, st);
    dev_free(ctx, a.work, wb, st);
    return s;
}

const fai_backend fai_backend_cuda = {
    .name = "cuda",
    .device_memory = 1,
    .sequences = 1,
    .ops = {[FAI_OP_FORWARD] = cuda_forward, [FAI_OP_BACKWARD] = cuda_backward,
            [FAI_OP_APPEND] = cuda_append},
    .setup = cuda_setup,
    .describe = cuda_describe,
    .available = cuda_available,
    .holds = cuda_holds,
};
