/* Counted allocations: every byte the library allocates for a context enters its fai_mem, which
 * is how fa_memory_stats measures peak memory (docs/DESIGN.md §5). */
#include "config.h"

#include <stdlib.h>

#include "base/base.h"

int fai_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

void fai_mem_add(fai_mem *m, size_t bytes)
{
    size_t now = atomic_fetch_add(&m->current, bytes) + bytes;
    size_t peak = atomic_load(&m->peak);
    while (now > peak && !atomic_compare_exchange_weak(&m->peak, &peak, now)) {
    }
}

void fai_mem_sub(fai_mem *m, size_t bytes) { atomic_fetch_sub(&m->current, bytes); }

static atomic_long fault_countdown; /* > 0: allocations until the one that fails */
static atomic_int fault_fired;

void fai_fault_arm(long n)
{
    atomic_store(&fault_fired, 0);
    atomic_store(&fault_countdown, n);
}

int fai_fault_fired(void) { return atomic_load(&fault_fired); }

int fai_fault_now(void)
{
    if (atomic_load_explicit(&fault_countdown, memory_order_relaxed) <= 0)
        return 0; /* disarmed, or fired: one relaxed load per allocation */
    if (atomic_fetch_sub(&fault_countdown, 1) != 1)
        return 0;
    atomic_store(&fault_fired, 1);
    return 1;
}

void *fai_alloc(fai_mem *m, size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || rounded == 0 || fai_fault_now())
        return NULL;
    void *p = aligned_alloc(64, rounded);
    if (!p)
        return NULL;
    fai_mem_add(m, bytes);
    return p;
}

void fai_free(fai_mem *m, void *p, size_t bytes)
{
    if (!p)
        return;
    fai_mem_sub(m, bytes);
    free(p);
}

fa_status fai_thread_scratch(fai_mem *m, const char *who, size_t *per, int nt, char **base,
                             size_t *bytes)
{
    *per = (*per + 63) & ~(size_t)63;
    if (!fai_mul_size(*per, (size_t)nt, bytes))
        return fai_fail(FA_ERR_OVERFLOW, "%s: workspace size overflows", who);
    *base = fai_alloc(m, *bytes);
    if (!*base)
        return fai_fail(FA_ERR_NO_MEMORY, "%s: %zu bytes of workspace for %d threads", who,
                        *bytes, nt);
    return FA_OK;
}
