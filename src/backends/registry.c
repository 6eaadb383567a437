/*
 * The backends by fa_backend, and the one place where an op a backend lacks (a NULL slot of
 * its table) becomes FA_ERR_UNSUPPORTED.
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
