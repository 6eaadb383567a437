/*
 * The backends by fa_backend, the one place where an op a backend lacks (a NULL slot of its
 * table) becomes FA_ERR_UNSUPPORTED, and the hooks of every backend asked in turn: its setup
 * of a context, its part of a context's description, whether a pointer is its device's memory.
 */
#include "config.h"

#include <string.h>

#include "base/base.h"
#include "backends/table.h"

static const fai_backend *const backends[] = {
    [FA_BACKEND_REFERENCE] = &fai_backend_reference,
    [FA_BACKEND_CONVENTIONAL] = &fai_backend_conventional,
    [FA_BACKEND_TILED] = &fai_backend_tiled,
    [FA_BACKEND_CUDA] = &fai_backend_cuda,
};
#define NBACKENDS ((int)(sizeof backends / sizeof *backends))
_Static_assert(NBACKENDS <= FAI_BACKEND_SLOTS, "a context has a settings slot per backend");

const fai_backend *fai_backend_of(fa_backend b)
{
    return (unsigned)b < (unsigned)NBACKENDS ? backends[b] : NULL;
}

fa_backend fai_backend_from_name(const char *name)
{
    for (int b = 0; b < NBACKENDS; b++)
        if (backends[b] && strcmp(backends[b]->name, name) == 0)
            return (fa_backend)b;
    return FA_BACKEND_AUTO;
}

fa_status fai_backend_op(const fai_backend *be, fai_op op, const char *what, fai_op_fn *fn)
{
    *fn = be->ops[op];
    if (*fn)
        return FA_OK;
    return fai_fail(FA_ERR_UNSUPPORTED, "backend %s has no %s", be->name, what);
}

fa_status fai_backends_setup(const fa_options *o, fai_backend_settings *settings)
{
    memset(settings, 0, FAI_BACKEND_SLOTS * sizeof *settings);
    for (int b = 0; b < NBACKENDS; b++)
        if (backends[b] && backends[b]->setup)
            FAI_TRY(backends[b]->setup(o, &settings[b]));
    return FA_OK;
}

void fai_backends_describe(const fa_context *ctx, char *buf, size_t n)
{
    size_t used = 0;
    if (n > 0)
        buf[0] = 0;
    for (int b = 0; b < NBACKENDS; b++)
        if (backends[b] && backends[b]->describe && used + 1 < n) {
            buf[used++] = ' ';
            backends[b]->describe(ctx, buf + used, n - used);
            used += strlen(buf + used);
        }
}

const fai_backend *fai_backend_holding(const void *p)
{
    for (int b = 0; b < NBACKENDS; b++)
        if (backends[b] && backends[b]->holds && backends[b]->holds(p))
            return backends[b];
    return NULL;
}
