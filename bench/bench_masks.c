/*
 * Benchmark of the tiled forward with masks, biases and FP8 inputs (issue 18's table), each
 * against the plain f32 forward on the same inputs in the same run: an f16 additive bias
 * broadcast over heads, a bool keep-mask, a block mask keeping half of the 128 x 128 blocks of
 * each head (its ratio is of times: the FLOPs it skips are the point), and e4m3 q, k, v with
 * descales (the same values' codes; ratio of GFLOP/s). Rounds alternate the variants and each
 * takes its best, because these machines are shared and their speed drifts. Tables on stdout,
 * one CSV with --csv FILE.
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
    uint8_t *mask = malloc(bn), *q8 = malloc(qn), *k8 = malloc(qn), *v8 = malloc(qn);
    const int64_t nb = (n + 127) / 128; /* the block mask: 128 x 128 blocks, half of each row */
    int32_t *num = malloc((size_t)(heads * nb) * 4), *idx = malloc((size_t)(heads * nb * nb) * 4);
    if (!q || !k || !v || !o || !bias || !mask || !q8 || !k8 || !v8 || !num || !idx) {
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
    fa_convert(q, FA_F32, q8, FA_E4M3, qn); /* codes of the f32 inputs x 1 (descale 1) */
    fa_convert(k, FA_F32, k8, FA_E4M3, qn);
    fa_convert(v, FA_F32, v8, FA_E4M3, qn);
    for (int64_t r = 0; r < heads * nb; r++) { /* every other key block, shifted by row */
        num[r] = 0;
        for (int64_t c = r % 2; c < nb; c += 2)
            idx[r * nb + num[r]++] = (int32_t)c;
    }
    const fa_block_mask bm = {1, heads, 128, 128, {num, FA_INDEX_INT32, heads * nb},
                              {idx, FA_INDEX_INT32, heads * nb * nb}, {NULL, FA_INDEX_INT32, 0},
                              {NULL, FA_INDEX_INT32, 0}};
    const float descale = 1.0f;
    fa_tensor tq, tk, tv, to, tb, tm, tq8, tk8, tv8;
    fa_tensor_init(&tq, q, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&tk, k, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&tv, v, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&to, o, FA_F32, 1, n, heads, d, 0);
    fa_tensor_init(&tb, bias, FA_F16, 1, n, 1, n, 0); /* (1, Sq, 1, Sk): every head's */
    fa_tensor_init(&tm, mask, FA_BOOL, 1, n, 1, n, 0);
    fa_tensor_init(&tq8, q8, FA_E4M3, 1, n, heads, d, 0);
    fa_tensor_init(&tk8, k8, FA_E4M3, 1, n, heads, d, 0);
    fa_tensor_init(&tv8, v8, FA_E4M3, 1, n, heads, d, 0);

    enum { NVAR = 5, SPARSE = 3, FP8 = 4 };
    variant var[NVAR];
    const char *names[NVAR] = {"plain", "f16 bias, heads 1", "bool mask, heads 1",
                               "block mask, 50%", "e4m3 q, k, v"};
    for (int x = 0; x < NVAR; x++) {
        var[x].name = names[x];
        fa_params_init(&var[x].p);
        var[x].best = INFINITY;
    }
    var[1].p.bias = &tb;
    var[2].p.bias = &tm;
    var[SPARSE].p.block_mask = &bm;
    var[FP8].p.descale_q = var[FP8].p.descale_k = var[FP8].p.descale_v = &descale;
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
        for (int x = 0; x < NVAR; x++) {
            const double t0 = now();
            st = x == FP8 ? fa_forward(ctx, &var[x].p, &tq8, &tk8, &tv8, &to, NULL)
                          : fa_forward(ctx, &var[x].p, &tq, &tk, &tv, &to, NULL);
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
    printf("%-22s %10s %10s %8s   (block mask: time / plain time; others: GFLOP/s / plain's)\n",
           "variant", "ms", "GFLOP/s", "ratio");
    for (int x = 0; x < NVAR; x++) {
        const double g = flops / var[x].best * 1e-9,
                     ratio = x == SPARSE ? var[x].best / var[0].best : var[0].best / var[x].best;
        printf("%-22s %10.1f %10.1f %8.3f\n", var[x].name, var[x].best * 1e3, g, ratio);
        if (f)
            fprintf(f, "%s,%ld,%ld,%ld,%ld,%.6f,%.2f,%.4f\n", var[x].name, n, d, heads, threads,
                    var[x].best, g, ratio);
    }
    if (f)
        fclose(f);
    fa_context_destroy(ctx);
    free(q), free(k), free(v), free(o), free(bias), free(mask), free(q8), free(k8), free(v8);
    free(num), free(idx);
    return 0;
}
