/*
 * `flashattn demo`: the article's comparison on this machine — the conventional path against
 * the tiled one, same inputs: wall time, peak allocation, max error against float64.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform01(void) /* splitmix64 -> (0, 1) */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) * 0x1p-53;
}

static double normal(void) /* Box-Muller */
{
    return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01());
}

/* Progress on stderr, only when a person is watching it. */
static void progress(long long n, const char *what)
{
    if (isatty(2))
        fprintf(stderr, "\rN=%lld: %-24s", n, what);
}

static int usage(FILE *f, int code)
{
    fprintf(f, "usage: flashattn demo [--seqlens N1,N2,..] [--heads H] [--headdim D]\n"
               "       [--dtype f32|f64|f16|bf16] [--causal] [--threads T]\n"
               "Conventional vs tiled attention on the same N(0,1) inputs: wall time, peak\n"
               "allocation (fa_memory_stats), max |out - float64 reference|. Defaults: seqlens\n"
               "512,1024,2048, 8 heads, head dim 64, f32, all threads.\n");
    return code;
}

static int check(fa_status s, const char *what)
{
    return s == FA_OK ? 0 : cli_fail(s, what);
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "flashattn: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo, hi);
        return 1;
    }
    *out = v;
    return 0;
}

typedef struct {
    double ms, err;
    size_t peak;
} run_result;

/* One backend's forward: wall time, the context's peak bytes, max |out - ref|. */
static int run_backend(fa_backend be, int threads, const fa_params *p, const fa_tensor *q,
                       const fa_tensor *k, const fa_tensor *v, fa_tensor *out,
                       const double *ref, run_result *r)
{
    fa_options o;
    fa_options_init(&o);
    o.backend = be;
    o.num_threads = threads;
    fa_context *ctx;
    if (check(fa_context_create(&o, &ctx), fa_backend_name(be)))
        return 1;
    double t0 = now();
    fa_status st = fa_forward(ctx, p, q, k, v, out, NULL);
    r->ms = 1e3 * (now() - t0);
    fa_memory_stats(ctx, NULL, &r->peak);
    fa_context_destroy(ctx);
    if (check(st, fa_backend_name(be)))
        return 1;
    size_t n = (size_t)(out->batch * out->seqlen * out->heads * out->headdim);
    double *got = malloc(n * sizeof(double));
    if (!got || check(fa_convert(out->data, out->dtype, got, FA_F64, n), "convert"))
        return free(got), 1;
    r->err = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        r->err = e > r->err || isnan(e) ? e : r->err;
    }
    free(got);
    return 0;
}

int cmd_demo(int argc, char **argv)
{
    long heads = 8, dim = 64, threads = 0, seqlens[16] = {512, 1024, 2048};
    int nlens = 3, causal = 0;
    fa_dtype dt = FA_F32;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout, 0);
        if (!strcmp(a, "--causal")) {
            causal = 1;
            continue;
        }
        if (!val) {
            fprintf(stderr, "flashattn demo: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--dtype")) {
            if (cli_dtype_from_name(val, &dt)) {
                fprintf(stderr, "flashattn demo: --dtype: '%s' is not f32, f64, f16 or bf16\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--heads")) {
            if (parse_int(a, val, 1, 256, &heads))
                return 2;
        } else if (!strcmp(a, "--headdim")) {
            if (parse_int(a, val, 1, 1024, &dim))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (parse_int(a, val, 0, 4096, &threads))
                return 2;
        } else if (!strcmp(a, "--seqlens")) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", val);
            nlens = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (nlens == 16 || parse_int("--seqlens", tok, 1, 1 << 20, &seqlens[nlens++]))
                    return 2;
            }
        } else {
            fprintf(stderr, "flashattn demo: unknown option %s\n", a);
            return usage(stderr, 2);
        }
    }

    fa_options o;
    fa_options_init(&o);
    o.num_threads = (int)threads;
    fa_context *info;
    char line[4096];
    if (check(fa_context_create(&o, &info), "context"))
        return 1;
    fa_context_describe(info, line, sizeof line);
    fa_context_destroy(info);
    printf("%s\nOpenBLAS core: %s\n", line, cli_blas_core());
    printf("forward, %s, B=1 H=%ld D=%ld%s; error = max |out - float64 reference|, inputs N(0,1)"
           " rounded to %s\n\n", fa_dtype_name(dt), heads, dim, causal ? " causal" : "",
           fa_dtype_name(dt));
    printf("%7s | %12s %12s %10s | %12s %12s %10s | %7s %7s\n", "N", "conv ms", "conv peak",
           "conv err", "tiled ms", "tiled peak", "tiled err", "speedup", "mem x");

    for (int s = 0; s < nlens; s++) {
        const int64_t N = seqlens[s], H = heads, D = dim, n = N * H * D;
        const size_t es = dt == FA_F64 ? 8 : dt == FA_F32 ? 4 : 2;
        void *q = malloc((size_t)n * es), *k = malloc((size_t)n * es), *v = malloc((size_t)n * es),
             *out = malloc((size_t)n * es);
        double *q64 = malloc((size_t)n * 8), *k64 = malloc((size_t)n * 8),
               *v64 = malloc((size_t)n * 8), *ref = malloc((size_t)n * 8);
        if (!q || !k || !v || !out || !q64 || !k64 || !v64 || !ref) {
            fprintf(stderr, "flashattn demo: out of memory at N=%lld\n", (long long)N);
            return 1;
        }
        /* draw in f64, round to the storage dtype, and give the reference exactly those values */
        double *in64[3] = {q64, k64, v64};
        void *in[3] = {q, k, v};
        for (int t = 0; t < 3; t++) {
            for (int64_t i = 0; i < n; i++)
                in64[t][i] = normal();
            fa_convert(in64[t], FA_F64, in[t], dt, (size_t)n);
            fa_convert(in[t], dt, in64[t], FA_F64, (size_t)n);
        }
        fa_tensor tq, tk, tv, to, rq, rk, rv, ro;
        fa_tensor_init(&tq, q, dt, 1, N, H, D, 0);
        fa_tensor_init(&tk, k, dt, 1, N, H, D, 0);
        fa_tensor_init(&tv, v, dt, 1, N, H, D, 0);
        fa_tensor_init(&to, out, dt, 1, N, H, D, 0);
        fa_tensor_init(&rq, q64, FA_F64, 1, N, H, D, 0);
        fa_tensor_init(&rk, k64, FA_F64, 1, N, H, D, 0);
        fa_tensor_init(&rv, v64, FA_F64, 1, N, H, D, 0);
        fa_tensor_init(&ro, ref, FA_F64, 1, N, H, D, 0);
        fa_params p;
        fa_params_init(&p);
        p.causal = causal;

        progress((long long)N, "float64 reference...");
        o.backend = FA_BACKEND_REFERENCE;
        fa_context *rc;
        if (check(fa_context_create(&o, &rc), "reference") ||
            check(fa_forward(rc, &p, &rq, &rk, &rv, &ro, NULL), "reference"))
            return 1;
        fa_context_destroy(rc);
        run_result conv, tiled;
        progress((long long)N, "conventional...");
        if (run_backend(FA_BACKEND_CONVENTIONAL, (int)threads, &p, &tq, &tk, &tv, &to, ref, &conv))
            return 1;
        progress((long long)N, "tiled...");
        if (run_backend(FA_BACKEND_TILED, (int)threads, &p, &tq, &tk, &tv, &to, ref, &tiled))
            return 1;
        if (isatty(2))
            fprintf(stderr, "\r%40s\r", "");
        printf("%7lld | %12.2f %10.2fMB %10.2e | %12.2f %10.2fMB %10.2e | %7.2f %7.1f\n",
               (long long)N, conv.ms, conv.peak / 1048576.0, conv.err, tiled.ms,
               tiled.peak / 1048576.0, tiled.err, conv.ms / tiled.ms,
               (double)conv.peak / (double)tiled.peak);
        fflush(stdout);
        free(q), free(k), free(v), free(out), free(q64), free(k64), free(v64), free(ref);
    }
    printf("\npeak = bytes the library allocated (fa_memory_stats). The tiled path's peak is "
           "flat in N;\nthe conventional path's grows as N^2 (S and P materialized).\n");
    return 0;
}

