/*
 * Benchmark (docs/DESIGN.md §5): the tiled and conventional paths on the same inputs in one run.
 * Reports, per sequence length: time, GFLOP/s as a fraction of OpenBLAS SGEMM measured in the
 * same run on the same threads, fused vs conventional time, and each path's peak allocation
 * (fa_memory_stats). --tile-sweep times the tiled forward over a list of forced tiles
 * (FA_TILES) beside the plan's own choice. Head dims, dtypes and thread counts take lists,
 * --causal both runs either mask, and --matrix is the whole table (f32 and bf16,
 * D = 64 and 128, causal and not, 1 and all threads, N = 512 ... 8192, forward and
 * backward), one table per configuration. Tables on stdout, one CSV with --csv FILE.
 *
 * Run it through `make bench`, which clears OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE so that
 * OpenBLAS picks its kernels for this CPU; the core it chose is printed beside every figure.
 * An OpenBLAS older than the CPU may not know it and fall back to a generic core (0.3.21 calls
 * an Emerald Rapids Xeon "Prescott": SGEMM at a fifth of its speed); where the library runs
 * AVX-512 kernels and OpenBLAS chose a core without them, the benchmark restarts itself with
 * OPENBLAS_CORETYPE=SkylakeX, so that every ratio is against an AVX-512 SGEMM, and says so.
 *
 * The machines are shared and their speed drifts, so SGEMM is timed once before every
 * repetition of the attention calls, and each ratio is best against best of the same row.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "flashattn.h"

#ifdef HAVE_OPENBLAS_GET_CORENAME
char *openblas_get_corename(void);
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int n);
#endif

static const char *core_name(void)
{
#ifdef HAVE_OPENBLAS_GET_CORENAME
    return openblas_get_corename();
#else
    return "unknown";
#endif
}

/* OpenBLAS cores with AVX-512 SGEMM kernels (its x86 names, DYNAMIC_ARCH builds). */
static int core_has_avx512(const char *core)
{
    static const char *names[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    for (int k = 0; names[k]; k++)
        if (!strcmp(core, names[k]))
            return 1;
    return 0;
}

/* The SGEMM the attention is measured against: 2048^3 (the attention GEMMs' scale). */
enum { SGEMM_N = 2048 };
typedef struct {
    float *a, *b, *c;
    double best_s; /* the fastest call so far */
} sgemm_timer;

static int sgemm_init(sgemm_timer *g, int threads)
{
    const size_t nn = (size_t)SGEMM_N * SGEMM_N;
    g->a = malloc(sizeof(float) * nn), g->b = malloc(sizeof(float) * nn);
    g->c = calloc(nn, sizeof(float)); /* touched: the first timed call pays no page faults */
    if (!g->a || !g->b || !g->c)
        return 1;
    for (size_t i = 0; i < nn; i++)
        g->a[i] = g->b[i] = (float)(i % 7) * 0.1f;
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
    g->best_s = 1e30;
    return 0;
}

static void sgemm_time_once(sgemm_timer *g)
{
    const int n = SGEMM_N;
    double t = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, g->a, n, g->b, n, 0, g->c,
                n);
    t = now() - t;
    g->best_s = t < g->best_s ? t : g->best_s;
}

static double sgemm_gflops(const sgemm_timer *g)
{
    return 2.0 * SGEMM_N * SGEMM_N * (double)SGEMM_N / g->best_s * 1e-9;
}

/* One configuration's run (run_config); main goes over the lists below, threads outermost. */
typedef struct {
    long heads, dim, threads, reps;
    long conv_upto; /* the conventional path runs where N <= conv_upto (0: never) */
    int causal, backward, sweep;
    fa_dtype dtype;
    long seqlens[32];
    int nlens;
    FILE *csv;
    double *frac_fwd, *frac_bwd; /* out: each N's GFLOP/s over the SGEMM beside it (bwd: 0
                                    without --backward) */
} opts;

/* The values main goes over (--headdim 64,128 --dtype f32,bf16 --threads 1,0 --causal both;
 * --matrix sets the whole table). */
typedef struct {
    long dims[8], threads[8];
    fa_dtype dtypes[8];
    int causals[2];
    int ndims, nthreads, ndtypes, ncausals;
} lists;

typedef struct {
    double fwd_ms, bwd_ms;
    size_t fwd_peak, bwd_peak;
} timing;

static int fail(fa_status s, const char *what)
{
    fprintf(stderr, "bench: %s: %s (%s)\n", what, fa_status_string(s), fa_last_error());
    return 1;
}

/* Best-of-reps forward (and backward) time and peak bytes of one backend; with gemm not NULL,
 * one SGEMM call is timed before every repetition. */
static int time_backend(const opts *o, fa_backend be, fa_tensor *t, timing *r, sgemm_timer *gemm)
{
    fa_options fo;
    fa_options_init(&fo);
    fo.backend = be;
    fo.num_threads = (int)o->threads;
    fa_context *ctx;
    fa_status s = fa_context_create(&fo, &ctx);
    if (s != FA_OK)
        return fail(s, "context");
    fa_params p;
    fa_params_init(&p);
    p.causal = o->causal;
    r->fwd_ms = r->bwd_ms = 1e30;
    r->fwd_peak = r->bwd_peak = 0;
    for (long rep = 0; rep < o->reps; rep++) {
        if (gemm)
            sgemm_time_once(gemm);
        fa_memory_stats_reset(ctx);
        double t0 = now();
        if ((s = fa_forward(ctx, &p, &t[0], &t[1], &t[2], &t[3], &t[4])) != FA_OK)
            return fail(s, "forward");
        double ms = 1e3 * (now() - t0);
        r->fwd_ms = ms < r->fwd_ms ? ms : r->fwd_ms;
        fa_memory_stats(ctx, NULL, &r->fwd_peak);
        if (!o->backward)
            continue;
        fa_memory_stats_reset(ctx);
        t0 = now();
        if ((s = fa_backward(ctx, &p, &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7],
                             &t[8])) != FA_OK)
            return fail(s, "backward");
        ms = 1e3 * (now() - t0);
        r->bwd_ms = ms < r->bwd_ms ? ms : r->bwd_ms;
        fa_memory_stats(ctx, NULL, &r->bwd_peak);
    }
    fa_context_destroy(ctx);
    return 0;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return 1;
    *out = v;
    return 0;
}

/* "a,b,c" into out (at most max values in [lo, hi], no empty fields): the count, 0 if
 * malformed. */
/* The usage on stderr for a bad command line (status 2), on stdout for --help (status 0). */
static int usage(FILE *to, int status)
{
    fprintf(to,
            "usage: bench_attention [--seqlens N1,N2,...] [--heads H] [--headdim D1,D2,...]\n"
            "       [--dtype f32|bf16|f16|f64[,...]] [--causal | --causal both]\n"
            "       [--threads T1,T2,... (0: all)] [--reps R] [--backward]\n"
            "       [--no-conventional | --conventional-upto N] [--tile-sweep] [--matrix]\n"
            "       [--csv FILE]\n"
            "--matrix: f32 and bf16, D = 64 and 128, causal and not, 1 and all threads,\n"
            "N = 512 ... 8192, forward and backward, the conventional path up to N = 4096;\n"
            "the options given explicitly win over these\n");
    return status;
}

/* One configuration (threads, dtype, head dim, mask) over the sequence lengths: a table
 * on stdout, rows appended to the CSV. */
static int run_config(const opts *o)
{
    fa_options fo;
    fa_options_init(&fo);
    fo.num_threads = (int)o->threads;
    fa_context *ctx;
    char line[512];
    fa_status s = fa_context_create(&fo, &ctx);
    if (s != FA_OK)
        return fail(s, "context");
    fa_context_describe(ctx, line, sizeof line);
    int threads = 0;
    sscanf(strstr(line, "threads=") + 8, "%d", &threads);
    fa_context_destroy(ctx);
    printf("%s\nOpenBLAS core %s: SGEMM %dx%dx%d on %d threads, timed before each repetition\n",
           line, core_name(), SGEMM_N, SGEMM_N, SGEMM_N, threads);
    printf("B=1 H=%ld D=%ld %s%s; FLOPs per docs/DESIGN.md §5; best of %ld\n\n", o->heads, o->dim,
           fa_dtype_name(o->dtype), o->causal ? " causal" : "", o->reps);
    printf("%7s %8s %10s %8s %8s %12s %12s %12s %9s %9s %9s %8s %8s\n", "N", "SGEMM GF", "tiled ms",
           "GFLOP/s", "/SGEMM", "tiled peak", "conv ms", "conv peak", "conv/til", "mem x", "bwd ms",
           "bwd GF/s", "/SGEMM");

    const size_t es = o->dtype == FA_F64 ? 8 : o->dtype == FA_F32 ? 4 : 2;
    for (int si = 0; si < o->nlens; si++) {
        const long N = o->seqlens[si];
        const size_t n = (size_t)N * (size_t)o->heads * (size_t)o->dim;
        void *buf[9];
        fa_tensor t[9];
        /* t[4] is the LSE: f32, but f64 for f64 storage (the f64 backward needs it) */
        const fa_dtype lse_dt = o->dtype == FA_F64 ? FA_F64 : FA_F32;
        for (int k = 0; k < 9; k++) {
            buf[k] = calloc(k == 4 ? (size_t)N * (size_t)o->heads : n,
                            k == 4 ? (lse_dt == FA_F64 ? 8 : 4) : es);
            if (!buf[k]) {
                fprintf(stderr, "bench: out of memory at N=%ld\n", N);
                return 1;
            }
            fa_tensor_init(&t[k], buf[k], k == 4 ? lse_dt : o->dtype, 1, N, o->heads,
                           k == 4 ? 1 : o->dim, 0);
        }
        /* inputs: N(0,1)-like values; bf16/f16 get their bit patterns from a small range */
        unsigned seed = 1;
        for (int k = 0; k < 9; k++) {
            if (k == 3 || k == 4)
                continue;
            for (size_t i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                double x = ((seed >> 8) & 0xffff) / 32768.0 - 1.0;
                if (o->dtype == FA_F32)
                    ((float *)buf[k])[i] = (float)x;
                else if (o->dtype == FA_F64)
                    ((double *)buf[k])[i] = x;
                else if (o->dtype == FA_BF16) {
                    float f = (float)x;
                    uint32_t u;
                    memcpy(&u, &f, 4);
                    ((uint16_t *)buf[k])[i] = (uint16_t)(u >> 16);
                } else /* f16: sign, exponent 14 or 15, random mantissa: values in +-[0.5, 2) */
                    ((uint16_t *)buf[k])[i] = (uint16_t)(((seed >> 3) & 0x8000u) |
                                                         (((seed >> 5) & 1u) ? 0x3800u : 0x3c00u) |
                                                         ((seed >> 9) & 0x3ffu));
            }
        }
        double flops = 4.0 * (double)o->heads * (double)N * (double)N * (double)o->dim;
        if (o->causal)
            flops /= 2;
        timing tl, cv = {0, 0, 0, 0};
        sgemm_timer sg;
        if (sgemm_init(&sg, threads)) {
            fprintf(stderr, "bench: out of memory for the SGEMM\n");
            return 1;
        }
        if (time_backend(o, FA_BACKEND_TILED, t, &tl, &sg))
            return 1;
        const int conv = N <= o->conv_upto;
        if (conv && time_backend(o, FA_BACKEND_CONVENTIONAL, t, &cv, NULL))
            return 1;
        const double gemm = sgemm_gflops(&sg);
        free(sg.a), free(sg.b), free(sg.c);
        const double gf = flops / (tl.fwd_ms * 1e-3) * 1e-9;
        const double bgf = o->backward ? 2.5 * flops / (tl.bwd_ms * 1e-3) * 1e-9 : 0.0;
        printf("%7ld %8.1f %10.1f %8.2f %8.3f %10.2fMB %10.1f %10.2fMB %9.2f %9.1f %9.1f %8.2f "
               "%8.3f\n",
               N, gemm, tl.fwd_ms, gf, gf / gemm, tl.fwd_peak / 1048576.0, cv.fwd_ms,
               cv.fwd_peak / 1048576.0, conv ? cv.fwd_ms / tl.fwd_ms : 0.0,
               conv ? (double)cv.fwd_peak / (double)tl.fwd_peak : 0.0,
               o->backward ? tl.bwd_ms : 0.0, bgf, bgf / gemm);
        fflush(stdout);
        o->frac_fwd[si] = gf / gemm;
        o->frac_bwd[si] = bgf / gemm;
        if (o->csv)
            fprintf(o->csv,
                    "%ld,%ld,%ld,%s,%d,%d,%s,%.3f,%.3f,%.3f,%zu,%.3f,%zu,%.3f,%.3f,%zu,%.3f,%zu\n",
                    N, o->heads, o->dim, fa_dtype_name(o->dtype), o->causal, threads, core_name(),
                    gemm, tl.fwd_ms, gf, tl.fwd_peak, cv.fwd_ms, cv.fwd_peak,
                    o->backward ? tl.bwd_ms : 0.0, bgf, tl.bwd_peak, o->backward ? cv.bwd_ms : 0.0,
                    cv.bwd_peak);
        if (o->sweep) {
            /* BQxBK, or BQxBKxBR with the forward's rows per strip */
            static const char *tiles[] = {"64x64",       "128x128",     "256x128",   "256x256",
                                          "512x128",     "512x256",     "1024x64",   "1024x128",
                                          "1024x256",    "2048x128",    "2048x256",  "4096x256",
                                          "1024x256x48", "1024x256x96", NULL};
            opts so = *o;
            so.backward = 0;
            printf("  tile sweep (forward ms, best of %ld):", o->reps);
            for (int k = 0; tiles[k]; k++) {
                timing ts;
                setenv("FA_TILES", tiles[k], 1);
                if (time_backend(&so, FA_BACKEND_TILED, t, &ts, NULL))
                    return 1;
                printf(" %s=%.1f", tiles[k], ts.fwd_ms);
            }
            unsetenv("FA_TILES");
            printf("  (plan's choice above: %.1f)\n", tl.fwd_ms);
        }
        for (int k = 0; k < 9; k++)
            free(buf[k]);
    }
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (!core_has_avx512(core_name()) && strcmp(core_name(), "unknown") &&
        !getenv("OPENBLAS_CORETYPE")) {
        fa_context *probe;
        char desc[512] = "";
        if (fa_context_create(NULL, &probe) == FA_OK) {
            fa_context_describe(probe, desc, sizeof desc);
            fa_context_destroy(probe);
        }
        if (strstr(desc, " isa=avx512") || strstr(desc, " isa=amx")) { /* AVX-512 kernels */
            fprintf(stderr, "bench: OpenBLAS chose core %s on an AVX-512 CPU; restarting with "
                            "OPENBLAS_CORETYPE=SkylakeX\n", core_name());
            setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
            execv("/proc/self/exe", argv);
            perror("bench: execv /proc/self/exe"); /* go on against the generic core */
            unsetenv("OPENBLAS_CORETYPE");
        }
    }
    opts o = {.heads = 8, .dim = 128, .reps = 2, .conv_upto = 1 << 22, .dtype = FA_F32,
              .seqlens = {512, 1024, 2048}, .nlens = 3};
    lists l = {0}; /* filled by the options, then by --matrix or the defaults below */
    int matrix = 0, seqlens_given = 0, conv_given = 0; /* explicit options win over --matrix */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout, 0);
        else if (!strcmp(a, "--causal") && !strcmp(v, "both")) {
            l.causals[0] = 0, l.causals[1] = 1, l.ncausals = 2;
            i++;
        } else if (!strcmp(a, "--causal"))
            l.causals[0] = 1, l.ncausals = 1;
        else if (!strcmp(a, "--backward"))
            o.backward = 1;
        else if (!strcmp(a, "--no-conventional"))
            o.conv_upto = 0, conv_given = 1;
        else if (!strcmp(a, "--conventional-upto") && !parse_long(v, 0, 1 << 22, &o.conv_upto))
            conv_given = 1, i++;
        else if (!strcmp(a, "--tile-sweep"))
            o.sweep = 1;
        else if (!strcmp(a, "--matrix"))
            matrix = 1;
        else if (!strcmp(a, "--heads") && !parse_long(v, 1, 1024, &o.heads))
            i++;
        else if (!strcmp(a, "--headdim") && !(l.ndims = parse_list(v, 1, 4096, l.dims, 8)))
            return usage(stderr, 2);
        else if (!strcmp(a, "--headdim"))
            i++;
        else if (!strcmp(a, "--threads") && !(l.nthreads = parse_list(v, 0, 4096, l.threads, 8)))
            return usage(stderr, 2);
        else if (!strcmp(a, "--threads"))
            i++;
        else if (!strcmp(a, "--reps") && !parse_long(v, 1, 1000, &o.reps))
            i++;
        else if (!strcmp(a, "--dtype")) {
            char buf[128];
            if (snprintf(buf, sizeof buf, "%s", v) >= (int)sizeof buf || strstr(v, ",,") ||
                v[0] == ',' || (v[0] && v[strlen(v) - 1] == ','))
                return usage(stderr, 2);
            l.ndtypes = 0;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                int k = FA_F32; /* the library's own names */
                while (k <= FA_BF16 && strcmp(tok, fa_dtype_name((fa_dtype)k)))
                    k++;
                if (k > FA_BF16 || l.ndtypes == 8)
                    return usage(stderr, 2);
                l.dtypes[l.ndtypes++] = (fa_dtype)k;
            }
            if (!l.ndtypes)
                return usage(stderr, 2);
            i++;
        } else if (!strcmp(a, "--csv")) {
            if (!(o.csv = fopen(v, "w"))) {
                fprintf(stderr, "bench: cannot write %s\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--seqlens")) {
            if (!(o.nlens = parse_list(v, 1, 1 << 22, o.seqlens, 32)))
                return usage(stderr, 2);
            seqlens_given = 1;
            i++;
        } else
            return usage(stderr, 2);
    }

    if (matrix) {
        static const long n[] = {512, 1024, 2048, 4096, 8192}, dims[] = {64, 128}, th[] = {1, 0};
        if (!seqlens_given)
            memcpy(o.seqlens, n, sizeof n), o.nlens = 5;
        if (!conv_given) /* its time at N = 8192 would be most of the run's */
            o.conv_upto = 4096;
        if (!l.ndims)
            memcpy(l.dims, dims, sizeof dims), l.ndims = 2;
        if (!l.nthreads)
            memcpy(l.threads, th, sizeof th), l.nthreads = 2;
        if (!l.ndtypes)
            l.dtypes[0] = FA_F32, l.dtypes[1] = FA_BF16, l.ndtypes = 2;
        if (!l.ncausals)
            l.causals[0] = 0, l.causals[1] = 1, l.ncausals = 2;
        o.backward = 1;
    }
    if (!l.ndims) /* the defaults of a single run */
        l.dims[0] = 128, l.ndims = 1;
    if (!l.nthreads)
        l.threads[0] = 0, l.nthreads = 1;
    if (!l.ndtypes)
        l.dtypes[0] = FA_F32, l.ndtypes = 1;
    if (!l.ncausals)
        l.causals[0] = 0, l.ncausals = 1;
    if (o.csv)
        fprintf(o.csv, "N,heads,headdim,dtype,causal,threads,openblas_core,sgemm_gflops,"
                       "tiled_fwd_ms,tiled_fwd_gflops,tiled_fwd_peak_bytes,conv_fwd_ms,"
                       "conv_fwd_peak_bytes,tiled_bwd_ms,tiled_bwd_gflops,tiled_bwd_peak_bytes,"
                       "conv_bwd_ms,conv_bwd_peak_bytes\n");
    /* each configuration's fractions of SGEMM, for the ratios between dtypes at the end */
    static double frac[8][8][8][2][2][32];
    for (int ti = 0; ti < l.nthreads; ti++)
        for (int di = 0; di < l.ndtypes; di++)
            for (int hi = 0; hi < l.ndims; hi++)
                for (int ci = 0; ci < l.ncausals; ci++) {
                    o.threads = l.threads[ti], o.dtype = l.dtypes[di], o.dim = l.dims[hi];
                    o.causal = l.causals[ci];
                    o.frac_fwd = frac[ti][di][hi][ci][0];
                    o.frac_bwd = frac[ti][di][hi][ci][1];
                    if (run_config(&o))
                        return 1;
                }
    /* each dtype against f32 where both ran: the ratio of their fractions of the SGEMM timed
     * beside each (so a machine that drifts between the two tables moves both) */
    int f32 = -1;
    for (int di = 0; di < l.ndtypes; di++)
        f32 = l.dtypes[di] == FA_F32 ? di : f32;
    for (int di = 0; f32 >= 0 && di < l.ndtypes; di++) {
        if (di == f32)
            continue;
        printf("%s / f32 (GFLOP/s over GFLOP/s, each against the SGEMM beside it):\n",
               fa_dtype_name(l.dtypes[di]));
        for (int ti = 0; ti < l.nthreads; ti++)
            for (int hi = 0; hi < l.ndims; hi++)
                for (int ci = 0; ci < l.ncausals; ci++)
                    for (int si = 0; si < o.nlens; si++) {
                        const double *a = frac[ti][di][hi][ci][0], *b = frac[ti][f32][hi][ci][0];
                        const double *ab = frac[ti][di][hi][ci][1], *bb = frac[ti][f32][hi][ci][1];
                        printf("  threads=%ld D=%ld%s N=%ld: forward %.2f", l.threads[ti],
                               l.dims[hi], l.causals[ci] ? " causal" : "", o.seqlens[si],
                               a[si] / b[si]);
                        if (o.backward)
                            printf(", backward %.2f", ab[si] / bb[si]);
                        printf("\n");
                    }
    }
    if (o.csv)
        fclose(o.csv);
    return 0;
}
