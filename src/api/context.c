/*
 * Contexts: fa_options and the environment turned into a resolved backend, ISA and kernel set,
 * thread count and cache sizes, and each backend's own settings (its setup hook, through the
 * backend table: the tiled backend's forced plan, say); its memory counters and its one-line
 * description. The environment variables (docs/DESIGN.md §2): FA_BACKEND and FA_ISA override
 * an AUTO option; a backend reads its own (backends/table.h: fai_backend.setup).
 */
#include "config.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "backends/table.h"
#include "simd/kernels.h"

void fa_options_init(fa_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->backend = FA_BACKEND_AUTO;
    o->isa = FA_ISA_AUTO;
}

/* "a, b or c": the names of values 1 .. of an enum, from its name function (which answers
 * "invalid" past the last), for the error of a bad environment variable. */
static const char *names_list(const char *(*name)(int), char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 1; strcmp(name(i), "invalid") != 0; i++) {
        const char *sep = i == 1 ? "" : strcmp(name(i + 1), "invalid") == 0 ? " or " : ", ";
        int w = snprintf(buf + used, n - used, "%s%s", sep, name(i));
        if (w < 0 || (size_t)w >= n - used)
            break;
        used += (size_t)w;
    }
    return buf;
}

static const char *backend_name(int i) { return fa_backend_name((fa_backend)i); }
static const char *isa_name(int i) { return fa_isa_name((fa_isa)i); }

/* FA_BACKEND, FA_ISA or FA_CP_SCHEDULE (var): unset or empty leaves *value alone; else one of
 * the names of name(1), name(2), ... ("auto" is none of them), whose value from_name gives (0
 * if none). */
static fa_status env_enum(const char *var, const char *(*name)(int),
                          int (*from_name)(const char *), int *value)
{
    const char *v = getenv(var);
    if (!v || !*v)
        return FA_OK;
    const int x = from_name(v);
    char list[200];
    if (x == 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "%s=%s: expected %s", var, v,
                        names_list(name, list, sizeof list));
    *value = x;
    return FA_OK;
}

static int backend_from_name(const char *v) { return (int)fai_backend_from_name(v); }
static int isa_from_name(const char *v) { return (int)fai_isa_from_name(v); }

/* FA_CP_SCHEDULE's names (context parallelism, src/mpi/cp.c), by fai_cp_schedule. */
static const char *cp_name(int i)
{
    return i == FAI_CP_RING ? "ring" : i == FAI_CP_ALLGATHER ? "allgather" : "invalid";
}
static int cp_from_name(const char *v)
{
    return strcmp(v, "ring") == 0        ? FAI_CP_RING
           : strcmp(v, "allgather") == 0 ? FAI_CP_ALLGATHER
                                         : 0;
}

fa_status fa_context_create(const fa_options *o, fa_context **out)
{
    if (!out)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_context_create: ctx (the output pointer) is NULL");
    fa_options opt;
    if (o)
        opt = *o;
    else
        fa_options_init(&opt);

    if (opt.backend != FA_BACKEND_AUTO && !fai_backend_of(opt.backend))
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "options->backend: %d is not a fa_backend",
                        (int)opt.backend);
    if (opt.isa != FA_ISA_AUTO && strcmp(fai_isa_name(opt.isa), "invalid") == 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "options->isa: %d is not a fa_isa", (int)opt.isa);
    if (opt.num_threads < 0)
        return fai_fail(FA_ERR_INVALID_ARGUMENT,
                        "options->num_threads: %d is negative (0 means OpenMP's default)",
                        opt.num_threads);

    int choice = (int)opt.backend;
    if (opt.backend == FA_BACKEND_AUTO)
        FAI_TRY(env_enum("FA_BACKEND", backend_name, backend_from_name, &choice));
    opt.backend = (fa_backend)choice;
    const int backend_auto = opt.backend == FA_BACKEND_AUTO;
    if (opt.backend == FA_BACKEND_AUTO)
        opt.backend = FA_BACKEND_TILED;
    const fai_backend *be = fai_backend_of(opt.backend);
    if (be->available && !be->available())
        return FA_ERR_BACKEND_UNAVAILABLE; /* the detail is set */
    choice = (int)opt.isa;
    if (opt.isa == FA_ISA_AUTO)
        FAI_TRY(env_enum("FA_ISA", isa_name, isa_from_name, &choice));
    opt.isa = (fa_isa)choice;
    const char *isa_why = NULL;
    if (opt.isa == FA_ISA_AUTO)
        opt.isa = fai_isa_best(&isa_why);
    const fai_kernels_f32 *kernels = fai_kernels_for(opt.isa);
    if (!kernels)
        return fai_fail(FA_ERR_BACKEND_UNAVAILABLE,
                        "ISA %s: %s", fa_isa_name(opt.isa),
                        fai_cpu_supports(opt.isa) ? "this build carries no kernels for it"
                                                  : "this CPU (or its OS) does not support it");
    fai_backend_settings settings[FAI_BACKEND_SLOTS];
    FAI_TRY(fai_backends_setup(&opt, settings));
    int cp = FAI_CP_AUTO; /* read in every build: a context describes what it would run */
    FAI_TRY(env_enum("FA_CP_SCHEDULE", cp_name, cp_from_name, &cp));

    fa_context *ctx = fai_fault_now() ? NULL : calloc(1, sizeof *ctx);
    if (!ctx)
        return fai_fail(FA_ERR_NO_MEMORY, "fa_context_create: out of memory");
    atomic_init(&ctx->mem.current, 0);
    atomic_init(&ctx->mem.peak, 0);
    ctx->backend = opt.backend;
    ctx->backend_auto = backend_auto;
    ctx->isa = opt.isa;
    ctx->isa_why = isa_why;
    ctx->kernels = kernels;
    ctx->num_threads = opt.num_threads > 0 ? opt.num_threads : omp_get_max_threads();
    fai_cache_detect(&ctx->cache);
    memcpy(ctx->settings, settings, sizeof settings);
    ctx->cp_schedule = (fai_cp_schedule)cp;
    atomic_init(&ctx->cp_plan, NULL);
    atomic_init(&ctx->cp_waited_ns, 0);
    atomic_init(&ctx->cp_synced_ns, 0);
    atomic_init(&ctx->cp_took_ns, 0);
    *out = ctx;
    return FA_OK;
}

void fa_context_destroy(fa_context *ctx) { free(ctx); }

fa_status fa_context_describe(const fa_context *ctx, char *buf, size_t n)
{
    if (!ctx || !buf)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_context_describe: %s is NULL",
                        ctx ? "buf" : "ctx");
    if (n == 0)
        return FA_OK;
    const fai_kernels_f32 *ks = ctx->kernels;
    char products[160] = ""; /* the tile products, where the set has them */
    if (ks->bf16)
        snprintf(products, sizeof products, ",%s,%s,%s,%s", ks->bf16->qk_name,
                 ks->bf16->expsum_name, ks->bf16->pv_name, ks->bf16->gemm_name);
    const int used =
        snprintf(buf, n,
                 "flashattn %s: backend=%s isa=%s%s%s%s kernels=%s,%s%s threads=%d L1d=%lldKiB "
                 "L2=%lldKiB (%s)",
                 PACKAGE_VERSION, fa_backend_name(ctx->backend), fa_isa_name(ctx->isa),
                 ctx->isa_why ? " (auto: " : "", ctx->isa_why ? ctx->isa_why : "",
                 ctx->isa_why ? ")" : "", ks->gemm_name, ks->expsum_name, products,
                 ctx->num_threads, (long long)(ctx->cache.l1d / 1024),
                 (long long)(ctx->cache.l2 / 1024), ctx->cache.source);
    if (used > 0 && (size_t)used < n) /* then each backend's part (its describe) */
        fai_backends_describe(ctx, buf + used, n - (size_t)used);
    const char *cp = atomic_load(&ctx->cp_plan);
    const size_t len = strlen(buf);
    if (cp && len + 1 < n) /* the last context-parallel call's plan */
        snprintf(buf + len, n - len, " cp=%s waited=%.6fs synced=%.6fs of %.6fs", cp,
                 1e-9 * (double)atomic_load(&ctx->cp_waited_ns),
                 1e-9 * (double)atomic_load(&ctx->cp_synced_ns),
                 1e-9 * (double)atomic_load(&ctx->cp_took_ns));
    return FA_OK;
}

fa_status fa_memory_stats(const fa_context *ctx, size_t *current, size_t *peak)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_memory_stats: ctx is NULL");
    /* fai_mem_add raises current before peak: while another thread allocates, peak read
     * alone may still be below current. current first, then peak at least current (a value
     * the true peak has reached), so that a concurrent reader never sees current > peak. */
    const size_t cur = atomic_load(&ctx->mem.current);
    const size_t top = atomic_load(&ctx->mem.peak);
    if (current)
        *current = cur;
    if (peak)
        *peak = top > cur ? top : cur;
    return FA_OK;
}

fa_status fa_memory_stats_reset(fa_context *ctx)
{
    if (!ctx)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_memory_stats_reset: ctx is NULL");
    atomic_store(&ctx->mem.peak, atomic_load(&ctx->mem.current));
    return FA_OK;
}
