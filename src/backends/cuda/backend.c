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

#include "backends/backend.h"
#include "backends/cuda/launch.h"

#ifndef FA_CUDA_MIN_ARCH
#error "configure defines FA_CUDA_MIN_ARCH (the lowest --with-cuda-arch) in --enable-cuda builds"
#endif

/* Usable: a device, and the current one can run this build's code (SASS for the lowest arch
 * up, PTX of the last arch for newer ones). */
int fai_cuda_available(void)
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

int fai_cuda_is_device_pointer(const void *p)
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

static fa_status fill(fa_context *ctx, const fai_problem *pr, fai_cuda_args *a)
{
    if (pr->kv_dtype != pr->dtype) /* before anything is allocated or written */
        return fai_fail(FA_ERR_UNSUPPORTED, "backend cuda: k and v in a cache dtype apart from "
                                            "q's are not implemented on this backend yet");
    memset(a, 0, sizeof *a);
    a->dtype = (int)pr->dtype;
    a->lse_f64 = fai_io(pr, FAI_LSE) && fai_io(pr, FAI_LSE)->dtype == FA_F64;
    a->b = pr->b, a->hq = pr->hq, a->hk = pr->hk, a->sq = pr->sq, a->sk = pr->sk;
    a->dqk = pr->dqk, a->dv = pr->dv, a->group = pr->group;
    a->mask = pr->mask;
    a->score = pr->score;
    a->drop = pr->drop;
    a->keep_scale = pr->keep_scale;
    a->stream = ctx->cuda.stream;
    a->deterministic = ctx->cuda.deterministic;
    const char *k = getenv("FA_CUDA_KERNEL");
    if (k && *k) {
        if (strcmp(k, "generic") == 0)
            a->kernel = FAI_CUDA_KERNEL_GENERIC;
        else if (strcmp(k, "mma") == 0)
            a->kernel = FAI_CUDA_KERNEL_MMA;
        else
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "FA_CUDA_KERNEL=%s: expected generic or mma (or unset)", k);
    }
    if (pr->mask.sink_keys > 0) /* two key runs a row: the generic kernels visit the mask's
                                   parts in turn; the tensor-core ones take one run */
        a->kernel = FAI_CUDA_KERNEL_GENERIC;
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

static fa_status cuda_forward(fa_context *ctx, const fai_problem *pr)
{
    fai_cuda_args a;
    FAI_TRY(fill(ctx, pr, &a));
    cudaStream_t st = (cudaStream_t)a.stream;
    void *slopes, *sinks;
    size_t sb, kb;
    FAI_TRY(copy_head_floats(ctx, pr, pr->slopes, "ALiBi slopes", st, &slopes, &sb));
    fa_status s = copy_head_floats(ctx, pr, pr->sinks, "sink logits", st, &sinks, &kb);
    if (s != FA_OK) {
        dev_free(ctx, slopes, sb, st);
        return s;
    }
    a.slopes = (const float *)slopes;
    a.sinks = (const float *)sinks;
    char err[300] = "";
    fai_cuda_result r = fai_cuda_forward(&a, err, sizeof err);
    dev_free(ctx, sinks, kb, st);
    dev_free(ctx, slopes, sb, st);
    return result(r, err);
}

static fa_status cuda_backward(fa_context *ctx, const fai_problem *pr)
{
    fai_cuda_args a;
    FAI_TRY(fill(ctx, pr, &a));
    cudaStream_t st = (cudaStream_t)a.stream;
    const size_t wb = fai_cuda_backward_workspace(&a);
    a.work = dev_alloc(ctx, wb, st);
    if (wb && !a.work)
        return fai_fail(FA_ERR_NO_MEMORY, "backend cuda: %zu bytes of device workspace", wb);
    void *slopes; /* the backward reads P from the given LSE, which holds the sinks */
    size_t sb;
    fa_status s = copy_head_floats(ctx, pr, pr->slopes, "ALiBi slopes", st, &slopes, &sb);
    if (s != FA_OK) {
        dev_free(ctx, a.work, wb, st);
        return s;
    }
    a.slopes = (const float *)slopes;
    char err[300] = "";
    fai_cuda_result r = fai_cuda_backward(&a, err, sizeof err);
    dev_free(ctx, slopes, sb, st);
    dev_free(ctx, a.work, wb, st);
    return result(r, err);
}

const fai_backend fai_backend_cuda = {
    .name = "cuda",
    .device_memory = 1,
    .ops = {[FAI_OP_FORWARD] = cuda_forward, [FAI_OP_BACKWARD] = cuda_backward},
};
