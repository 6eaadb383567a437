/*
 * Benchmark of the tiled forward with masks and biases as tensors (issue 18's table), each
 * against the plain forward on the same inputs in the same run: an f16 additive bias broadcast
 * over heads, and a bool keep-mask, as ratios of GFLOP/s (the FLOPs are the same: a bias masks
 * no tile). Rounds alternate the variants and each takes its best, because these machines are
 * shared and their speed drifts. Tables on stdout, one CSV with --csv FILE.
 *
 *   bench_masks [--n N] [--d D] [--heads H] [--threads T] [--rounds R] [--csv FILE]
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "flashattn.h"

typedef struct {
    const char *name;
    fa_params p;
    double best; /* seconds */
} variant;

static void die(const char *what, fa_status st)
{
    fprintf(stderr, "bench_masks: %s: %s (%s)\n", what, fa_status_string(st), fa_last_error());
    exit(1);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float unif(void) /* [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1p-53 * 2 - 1);
}

int main(int argc, char **argv)
{
    long n = 4096, d = 128, heads = 8, threads = 1, rounds = 5;
    const char *csv = NULL;
    for (int a = 1; a < argc; a++) {
        long *dst = !strcmp(argv[a], "--n")         ? &n
                    : !strcmp(argv[a], "--d")       ? &d
                    : !strcmp(argv[a], "--heads")   ? &heads
                    : !strcmp(argv[a], "--threads") ? &threads
                    : !strcmp(argv[a], "--rounds")  ? &rounds
                                                    : NULL;
        if (dst && a + 1 < argc && parse_list(argv[a + 1], 1, 1 << 20, dst, 1)) {
            a++;
            continue;
        }
        if (!strcmp(argv[a], "--csv") && a + 1 < argc) {
            csv = argv[++a];
            continue;
        }
        fprintf(stderr, "usage: bench_masks [--n N] [--d D] [--heads H] [--threads T] "
                        "[--rounds R] [--csv FILE]\n");
        return 2;
    }
    const size_t qn = (size_t)(n * heads * d), bn = (size_t)(n * n);
    float *q = malloc(qn * 4), *k = malloc(qn * 4), *v = malloc(qn * 4), *o = malloc(qn * 4);
    uint16_t *bias = malloc(bn * 2);
    uint8_t *mask = malloc(bn);
    if (!q || !k || !v || !o || !bias || !mask) {
        fprintf(stderr, "bench_masks: out of memory\n");
        return 1;
    }
    for (size_t x = 0; x < qn; x++)
        q[x] = unif(), k[x] = unif(), v[x] = unif();
    float row[256];
    for (size_t x = 0; x < bn; x += 256) { /* a bias of [-2, 2), and a mask keeping 7 in 8 */
        for (int c = 0; c < 256; c++)
            row[c] = 2 * unif();
        fa_convert(row, FA_F32, bias + x, FA_F16, bn - x < 256 ? bn - x : 256);
    }
    for (size_t x = 0; x < bn; x++)
        mask[x] = (x * 2654435761u >> 7) % 8 != 0 || x % (size_t)(n + 1) == 0;
    fa_tensor tq, tk, tv, to, tb, tm;
    fa_tensor_init(&tq, q, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&tk, k, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&tv, v, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&to, o, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&tb, bias, FA_F16, 1, n, 1, n, 0); /* (1, Sq, 1, Sk): every head's */
    fa_tensor_init(&tm, mask, FA_BOOL, 1, n, 1, n, 0);

    variant var[3];
    const char *names[3] = {"plain", "f16 bias, heads 1", "bool mask, heads 1"};
    for (int x = 0; x < 3; x++) {
        var[x].name = names[x];
        fa_params_init(&var[x].p);
        var[x].best = INFINITY;
    }
    var[1].p.bias = &tb;
    var[2].p.bias = &tm;
    fa_options opt;
    fa_options_init(&opt);
    opt.backend = FA_BACKEND_TILED;
    opt.num_threads = (int)threads;
    fa_context *ctx;
    fa_status st = fa_context_create(&opt, &ctx);
    if (st != FA_OK)
        die("context", st);
    char desc[512];
    fa_context_describe(ctx, desc, sizeof desc);
    printf("# %s\n# f32 forward, B=1 H=%ld N=%ld D=%ld, %ld thread(s), best of %ld alternated "
           "rounds\n", desc, heads, n, d, threads, rounds);
    for (long r = 0; r < rounds; r++)
        for (int x = 0; x < 3; x++) {
            if (getenv("BENCH_MASKS_ONLY") && atoi(getenv("BENCH_MASKS_ONLY")) != x)
                continue;
            const double t0 = now();
            st = fa_forward(ctx, &var[x].p, &tq, &tk, &tv, &to, NULL);
            const double t = now() - t0;
            if (st != FA_OK)
                die(var[x].name, st);
            if (t < var[x].best)
                var[x].best = t;
        }
    const double flops = 4.0 * (double)heads * (double)n * (double)n * (double)d;
    FILE *f = csv ? fopen(csv, "w") : NULL;
    if (f)
        fprintf(f, "variant,n,d,heads,threads,seconds,gflops,ratio_to_plain\n");
    printf("%-22s %10s %10s %8s\n", "variant", "ms", "GFLOP/s", "/plain");
    for (int x = 0; x < 3; x++) {
        const double g = flops / var[x].best * 1e-9, ratio = var[0].best / var[x].best;
        printf("%-22s %10.1f %10.1f %8.3f\n", var[x].name, var[x].best * 1e3, g, ratio);
        if (f)
            fprintf(f, "%s,%ld,%ld,%ld,%ld,%.6f,%.2f,%.4f\n", var[x].name, n, d, heads, threads,
                    var[x].best, g, ratio);
    }
    if (f)
        fclose(f);
    fa_context_destroy(ctx);
    free(q), free(k), free(v), free(o), free(bias), free(mask);
    return 0;
}
