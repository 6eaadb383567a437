/*
 * The bottom layer: what every other part of the library uses and nothing here calls back up.
 * The thread's error detail (status.c), counted allocations and workspaces (memory.c), the
 * machine's cache sizes (cache.c). Storage dtypes and tensor addressing: base/dtype.h.
 */
#ifndef FAI_BASE_H
#define FAI_BASE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"

/* ------------------------------------------------------------------ errors (status.c) */

/* Records the detail that fa_last_error() returns and returns s, so that checks read
 * `return fai_fail(...)`. The detail is per thread. */
fa_status fai_fail(fa_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* This thread's detail of its last failure. */
const char *fai_last_error_text(void);

/* Returns from the calling function with x's status unless it is FA_OK. */
#define FAI_TRY(x)                                                                              \
    do {                                                                                        \
        fa_status s_ = (x);                                                                     \
        if (s_ != FA_OK)                                                                        \
            return s_;                                                                          \
    } while (0)

/* ------------------------------------------------------------------ sizes and memory (memory.c) */

/* a * b for sizes; 0 on overflow, with *out untouched. */
int fai_mul_size(size_t a, size_t b, size_t *out);

/* The bytes a context has allocated, now and at most (fa_memory_stats). */
typedef struct {
    _Atomic size_t current, peak;
} fai_mem;

/* Allocation counted in m; 64-byte aligned; NULL on failure or when the size does not fit.
 * fai_free takes the size it was allocated with. */
void *fai_alloc(fai_mem *m, size_t bytes);
void fai_free(fai_mem *m, void *p, size_t bytes);
/*
 * Allocation-failure injection, for the tests (tests/check_faults.c; SQLite's way): after
 * fai_fault_arm(n), the n-th allocation from then on fails -- host (fai_alloc, the context,
 * fa_merge_states' scratch) or device (the CUDA backend) -- and only that one; n = 0 disarms.
 * fai_fault_fired says whether it has. Every allocation site calls fai_fault_now() first:
 * it counts the allocation and returns 1 if this is the one to fail.
 * (Allocations inside OpenBLAS and the OpenMP runtime are theirs, not counted here.)
 */
void fai_fault_arm(long n);
int fai_fault_fired(void);
int fai_fault_now(void);

/* Counts memory allocated elsewhere (the CUDA backend's device memory) in m, or uncounts it. */
void fai_mem_add(fai_mem *m, size_t bytes);
void fai_mem_sub(fai_mem *m, size_t bytes);

/* One workspace of `per` bytes (rounded up to 64) for each of nt threads in one counted block,
 * allocated before any output is written so that running out of memory fails the call
 * cleanly. Thread t's workspace starts at *base + t * *per. `who` names the caller. */
fa_status fai_thread_scratch(fai_mem *m, const char *who, size_t *per, int nt, char **base,
                             size_t *bytes);

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

/* ------------------------------------------------------------------ the machine (cache.c) */

typedef struct {
    int64_t l1d, l2;    /* bytes, per core */
    const char *source; /* where the sizes came from: "sysconf", "sysfs", "default" */
} fai_cache_info;

void fai_cache_detect(fai_cache_info *ci);

#endif
