/*
 * The context a call runs with (struct fa_context, opaque in flashattn.h): what api/context.c
 * resolved from fa_options and the environment once, read by the API layer and the backends.
 */
#ifndef FAI_BACKENDS_CONTEXT_H
#define FAI_BACKENDS_CONTEXT_H

#include <stddef.h>
#include <string.h>

#include "flashattn.h"
#include "base/base.h"
#include "simd/kernels.h"

/* Room for what a backend keeps of a context: what its setup hook (fai_backend.setup,
 * backends/table.h) took from fa_options and the environment when the context was made, read
 * by its ops (the tiled backend's forced tiles, the CUDA backend's stream). Each backend
 * stores its own struct here and reads it back by memcpy (fai_settings_get), so no other
 * type ever aliases it; the struct must fit (the backend asserts it). */
typedef struct {
    unsigned char bytes[64];
} fai_backend_settings;

/* The schedules of context parallelism (flashattn_mpi.h). */
typedef enum { FAI_CP_AUTO, FAI_CP_RING, FAI_CP_ALLGATHER } fai_cp_schedule;

/* The settings' slots, by fa_backend: above every value (backends/registry.c asserts it). */
#define FAI_BACKEND_SLOTS 8

struct fa_context {
    fai_mem mem;                    /* the bytes allocated for this context (fa_memory_stats) */
    fa_backend backend;             /* resolved: never AUTO */
    int backend_auto;               /* AUTO was asked: a call whose q is the memory of a device
                                       backend runs on it (fai_backend_holding) */
    fa_isa isa;                     /* resolved: never AUTO */
    const char *isa_why;            /* AUTO's reason for it where a rule decided, else NULL */
    const fai_kernels_f32 *kernels; /* the ISA's kernel set */
    int num_threads;                /* > 0 */
    fai_cache_info cache;
    fai_backend_settings settings[FAI_BACKEND_SLOTS]; /* by fa_backend: each backend's own */
    fai_cp_schedule cp_schedule;    /* FA_CP_SCHEDULE: what context parallelism must run
                                       (src/mpi/cp.c), or FAI_CP_AUTO for its rule's choice */
    _Atomic(const char *) cp_plan;  /* the last context-parallel call's schedule and why (a
                                       static string of src/mpi/cp.c), or NULL */
    _Atomic int64_t cp_waited_ns, cp_synced_ns, cp_took_ns; /* its schedule's time blocked on
                                    K/V messages after the blocks' compute, on other ranks' dK/dV
                                    terms, and its whole time */
};

/* Backend b's settings into mine (n bytes: its struct). */
static inline void fai_settings_get(const fa_context *ctx, fa_backend b, void *mine, size_t n)
{
    memcpy(mine, ctx->settings[b].bytes, n);
}

#endif
