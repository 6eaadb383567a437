/*
 * The backend table (fai_backend): a backend's name, its memory, one slot per op, and the
 * hooks through which the API layer sets a context up, describes it and picks a backend for
 * AUTO; the registry of backends by fa_backend (backends/registry.c). The API layer reaches a
 * backend only through it, never by name.
 */
#ifndef FAI_BACKENDS_TABLE_H
#define FAI_BACKENDS_TABLE_H

#include <stddef.h>

#include "flashattn.h"
#include "backends/context.h"
#include "backends/problem.h"

/*
 * A backend: its name, and one slot per op (fai_op). A NULL slot is an op the backend does not
 * have: fai_backend_op answers FA_ERR_UNSUPPORTED for it. An op is called only with a
 * validated problem that has rows to write (backends/empty.h: not FAI_EMPTY_NO_ROW), whose
 * groups without a (query, key) pair it writes as fai_write_empty does (a host backend
 * through fai_run_groups or fai_run_call), and may fail only with FA_ERR_NO_MEMORY (checked
 * before any output is written), FA_ERR_UNSUPPORTED, FA_ERR_INVALID_ARGUMENT (checks only the
 * backend can make, before anything is written: the CUDA one's device pointers) or
 * FA_ERR_DEVICE (a device runtime error, the CUDA backend's).
 */
typedef fa_status (*fai_op_fn)(fa_context *ctx, const fai_problem *pr);
/* FAI_OP_APPEND: fa_append_kv on a device cache (a host cache is the API layer's copy). */
typedef enum { FAI_OP_FORWARD, FAI_OP_BACKWARD, FAI_OP_APPEND, FAI_NOPS } fai_op;

typedef struct {
    const char *name;  /* as fa_backend_name */
    int device_memory; /* its tensors are device memory: the API layer never touches them, and
                          the backend writes even an empty problem's results itself */
    int sequences;     /* it takes calls of sequences (nseq > 0: varlen, paged, a cache) */
    int backward_reads_lse; /* its backward takes P from the caller's lse and D from out, so a
                               placed call (api.h: fai_place) over some of a row's keys gets
                               those keys' terms of the whole row's gradients; the float64
                               reference and the conventional path recompute the softmax over
                               the call's keys instead, and take placed calls over all the keys
                               only (row shards) */
    fai_op_fn ops[FAI_NOPS]; /* by fai_op (designated: [FAI_OP_FORWARD] = ...) */
    /* What the API layer asks of a backend besides its ops, each NULL where it has none: */
    /* Once per context, for every backend (any context may describe it or, AUTO, run on it):
     * what it takes of the options (AUTO resolved) and of its environment variables, into its
     * settings (fai_settings_get reads them); an error keeps the context from being made. */
    fa_status (*setup)(const fa_options *o, fai_backend_settings *mine);
    /* Its part of fa_context_describe's line, into buf (n bytes, terminated, as snprintf). */
    void (*describe)(const fa_context *ctx, char *buf, size_t n);
    /* Whether it can run here (NULL: always); on 0 the error detail says why. */
    int (*available)(void);
    /* Whether p is memory of its device (NULL: a host backend, whose memory is the host's):
     * AUTO runs a call whose q it holds on it, and the host reads no array that it holds. */
    int (*holds)(const void *p);
} fai_backend;

/* backends/registry.c: the table of b, or NULL for AUTO and for a value that is none; the
 * backend of a name (FA_BACKEND_AUTO if none); a backend's function for an op: *fn, or
 * FA_ERR_UNSUPPORTED (the detail naming the backend and `what`, the op) where its slot is
 * NULL. */
const fai_backend *fai_backend_of(fa_backend b);
fa_backend fai_backend_from_name(const char *name);
fa_status fai_backend_op(const fai_backend *be, fai_op op, const char *what, fai_op_fn *fn);
/* Every backend's setup, in fa_backend order, into settings[b] (the first error stops them);
 * every backend's describe, each after a space, into buf (n bytes, terminated); the backend
 * whose device memory p is, or NULL (host memory, and every p in a build without CUDA). */
fa_status fai_backends_setup(const fa_options *o, fai_backend_settings *settings);
void fai_backends_describe(const fa_context *ctx, char *buf, size_t n);
const fai_backend *fai_backend_holding(const void *p);

extern const fai_backend fai_backend_reference;
extern const fai_backend fai_backend_conventional;
extern const fai_backend fai_backend_tiled;
extern const fai_backend fai_backend_cuda; /* cuda/stub.c when CUDA is not built */

#endif
