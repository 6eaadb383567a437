/* Internal interfaces shared by the library's files: fai_ prefix, never exported. */
#ifndef FAI_INTERNAL_H
#define FAI_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "core/philox.h"
#include "core/plan.h"
#include "core/score.h"

/* ------------------------------------------------------------------ errors */

/* Records the detail for fa_last_error() and returns s, so checks read `return fai_fail(...)`. */
fa_status fai_fail(fa_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Returns from the calling function with x's status unless it is FA_OK. */
#define FAI_TRY(x)                                                                              \
    do {                                                                                        \
        fa_status s_ = (x);                                                                     \
        if (s_ != FA_OK)                                                                        \
            return s_;                                                                          \
    } while (0)

/* ------------------------------------------------------------------ context */

struct fai_kernels_f32_s;

struct fa_context {
    fa_backend backend; /* resolved: never AUTO */
    fa_isa isa;         /* resolved: never AUTO */
    const struct fai_kernels_f32_s *kernels; /* the ISA's kernel set (simd/kernels.h) */
    int num_threads;    /* > 0 */
    fai_cache_info cache;
    fai_tiles forced_tiles; /* FA_TILES=BQxBK[xBR] (tile sweeps); all 0 when not set */
    int forced_backward_passes; /* FA_BACKWARD_PASSES=1|2 (the tiled backward); 0: planned */
    /* CUDA backend: the stream of fa_options, its deterministic flag, and whether the backend
     * was AUTO (then a call whose q is device memory runs on CUDA, when it is built) */
    void *cuda_stream;
    int deterministic;
    int backend_auto;
    _Atomic size_t mem_current, mem_peak;
};

/* Allocation counted in the context's statistics; 64-byte aligned; NULL on failure or when
 * the size does not fit. fai_free takes the size it was allocated with. */
void *fai_alloc(fa_context *ctx, size_t bytes);
void fai_free(fa_context *ctx, void *p, size_t bytes);

/* a * b for sizes; 0 on overflow, with *out untouched. */
int fai_mul_size(size_t a, size_t b, size_t *out);

/* Carves 64-byte-aligned pieces from one block; with base NULL it only measures (a.used). */
typedef struct {
    char *base;
    size_t used;
} fai_arena;

static inline void *fai_carve(fai_arena *a, size_t bytes)
{
    size_t off = (a->used + 63) & ~(size_t)63;
    a->used = off + bytes;
    return a->base ? a->base + off : NULL;
}

/* One workspace of `per` bytes (rounded up to 64) for each of nt threads in one counted block,
 * allocated before any output is written so that running out of memory fails the call
 * cleanly. Thread t's workspace starts at *base + t * *per. `who` names the caller. */
fa_status fai_thread_scratch(fa_context *ctx, const char *who, size_t *per, int nt, char **base,
                             size_t *bytes);

/* ------------------------------------------------------------------ dtypes */

size_t fai_dtype_size(fa_dtype d);
/* Row conversions: loads are exact; stores round to nearest even (f16/bf16 directly from the
 * source precision, never through a second rounding). */
void fai_load_f32(const void *src, fa_dtype d, int64_t n, float *dst);
void fai_load_f64(const void *src, fa_dtype d, int64_t n, double *dst);
void fai_store_f32(void *dst, fa_dtype d, int64_t n, const float *src);
void fai_store_f64(void *dst, fa_dtype d, int64_t n, const double *src);
uint16_t fai_f64_to_f16(double x);
uint16_t fai_f64_to_bf16(double x);
double fai_f16_to_f64(uint16_t h);
double fai_bf16_to_f64(uint16_t h);

/* ------------------------------------------------------------------ a validated problem */

/*
 * Everything a backend needs, checked and resolved by api.c: dims, mask, score parameters,
 * dropout, and element pointers. Backends read rows through fai_row().
 */
typedef struct {
    int64_t b, hq, hk, sq, sk, dqk, dv, group; /* group = Hq / Hk */
    fa_dtype dtype;
    fai_mask mask;
    fai_score score;
    const float *slopes; /* Hq, or NULL */
    double dropout_p;
    uint64_t seed, offset;
    uint32_t drop_threshold; /* 0: dropout off */
    /* forward: q k v in, out (+ lse) out; backward: q k v out lse dout in, dq dk dv out */
    struct {
        const fa_tensor *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    } io;
} fai_problem;

/* Address of row s of head h of batch b of t (the headdim elements are contiguous from it). */
static inline void *fai_row(const fa_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return (char *)t->data +
           (b * t->batch_stride + s * t->seq_stride + h * t->head_stride) *
               (int64_t)fai_dtype_size(t->dtype);
}

/* The LSE of (b, h, row i): stored as f32 or f64. */
static inline void fai_lse_store(const fa_tensor *t, int64_t b, int64_t h, int64_t i, double x)
{
    void *p = fai_row(t, b, i, h);
    if (t->dtype == FA_F64)
        *(double *)p = x;
    else
        *(float *)p = (float)x;
}

static inline double fai_lse_load(const fa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    const void *p = fai_row(t, b, i, h);
    return t->dtype == FA_F64 ? *(const double *)p : (double)*(const float *)p;
}

static inline float fai_slope(const fai_problem *pr, int64_t h)
{
    return pr->slopes ? pr->slopes[h] : 0.0f;
}

static inline fai_dropout fai_dropout_for(const fai_problem *pr, int64_t b, int64_t h)
{
    fai_dropout d;
    d.k0 = (uint32_t)pr->seed;
    d.k1 = (uint32_t)(pr->seed >> 32);
    d.head = (uint32_t)(b * pr->hq + h);
    d.offset = (uint32_t)pr->offset;
    d.threshold = pr->drop_threshold;
    return d;
}

/* ------------------------------------------------------------------ backends */

typedef struct {
    /* Called only with a validated problem; may fail only with FA_ERR_NO_MEMORY (checked
     * before any output is written), FA_ERR_UNSUPPORTED, FA_ERR_INVALID_ARGUMENT (checks only
     * the backend can make, before anything is written: the CUDA one's device pointers) or
     * FA_ERR_DEVICE (a device runtime error, the CUDA backend's). */
    fa_status (*forward)(fa_context *ctx, const fai_problem *pr);
    fa_status (*backward)(fa_context *ctx, const fai_problem *pr);
} fai_backend;

extern const fai_backend fai_backend_reference;
extern const fai_backend fai_backend_conventional;
extern const fai_backend fai_backend_tiled;
extern const fai_backend fai_backend_cuda; /* the stub when CUDA is not built */
/* Whether the CUDA backend can run here (built, and a device present); on 0 the error detail
 * says why. Whether p is device (or managed) memory: always 0 without CUDA. */
int fai_cuda_available(void);
int fai_cuda_is_device_pointer(const void *p);

/* BLAS (src/blas.c). C = alpha op(A) op(B) + beta C, row-major; f64 if wide, else f32. Call
 * only inside fai_with_serial_blas, and only when fai_blas_dims_fit. */
void fai_gemm(int wide, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
              const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
              int64_t ldc);
int fai_blas_dims_fit(const fai_problem *pr);
fa_status fai_with_serial_blas(fa_status (*run)(fa_context *, const fai_problem *),
                               fa_context *ctx, const fai_problem *pr);

/* The tiled backend's tiles for a problem's head dims and compute type. */
fai_tiles fai_tiled_tiles(const fa_context *ctx, int64_t dqk, int64_t dv, fa_dtype d,
                          int backward);

#endif
