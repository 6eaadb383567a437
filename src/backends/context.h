/*
 * The context a call runs with (struct fa_context, opaque in flashattn.h): what api/context.c
 * resolved from fa_options and the environment once, read by the API layer and the backends.
 */
#ifndef FAI_BACKENDS_CONTEXT_H
#define FAI_BACKENDS_CONTEXT_H

#include "flashattn.h"
#include "base/base.h"
#include "simd/kernels.h"

/* What the environment forces on the tiled backend, for tile sweeps: FA_TILES=BQxBK[xBR]
 * (bq = 0: not forced), FA_BACKWARD_PASSES=1|2 (0: planned) and FA_DECODE=0 (the forward's
 * decode path never taken; 1 or unset: where the plan takes it). */
typedef struct {
    int64_t bq, bk, br;
    int backward_passes;
    int decode_off;
} fai_tiled_forced;

struct fa_context {
    fai_mem mem;                    /* the bytes allocated for this context (fa_memory_stats) */
    fa_backend backend;             /* resolved: never AUTO */
    int backend_auto;               /* AUTO was asked: a call whose q is device memory runs on
                                       CUDA, when it is built */
    fa_isa isa;                     /* resolved: never AUTO */
    const char *isa_why;            /* AUTO's reason for it where a rule decided, else NULL */
    const fai_kernels_f32 *kernels; /* the ISA's kernel set */
    int num_threads;                /* > 0 */
    fai_cache_info cache;
    fai_tiled_forced tiled;
    struct {
        void *stream;      /* fa_options.cuda_stream */
        int deterministic; /* fa_options.deterministic */
    } cuda;
};

#endif
