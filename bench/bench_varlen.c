/*
 * Variable-length prefill benchmark (issue 16's "varlen prefill vs dense tiled at the same
 * total tokens"): B sequences of lengths drawn from [min, max], causal, through
 * fa_forward_varlen, against a dense batch of B sequences of the mean length (the same total
 * tokens) through fa_forward, in one process, alternated, best of each. Work differs between
 * the two (sum L^2 against B mean^2), so the yardstick is the rate: allowed (query, key) pairs
 * times 4 D flops per second. Also timed: the sequences as separate fa_forward calls, which is
 * what the varlen call is defined to equal.
 *
 *   bench_varlen [--threads 1,2] [--batch 8] [--min 512] [--max 2048] [--hq 32] [--hk 8]
 *                [--d 128] [--dtype f16] [--reps 3] [--seed 1] [--csv FILE]
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "flashattn.h"

/* Allowed pairs of a bottom-right causal sequence of n queries and keys. */
static double causal_pairs(long n) { return 0.5 * (double)n * (double)(n + 1); }

static int fail(const char *what)
{
    fprintf(stderr, "bench_varlen: %s: %s\n", what, fa_last_error());
    return 3;
}

int main(int argc, char **argv)
{
    long threads[8] = {1, 2};
    int nthreads = 2, reps = 3;
    long batch = 8, lmin = 512, lmax = 2048, hq = 32, hk = 8, d = 128, seed = 1;
    fa_dtype dt = FA_F16;
    const char *csv = NULL;
    for (int a = 1; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : "";
        long *opt = !strcmp(argv[a], "--batch") ? &batch
                    : !strcmp(argv[a], "--min") ? &lmin
                    : !strcmp(argv[a], "--max") ? &lmax
                    : !strcmp(argv[a], "--hq")  ? &hq
                    : !strcmp(argv[a], "--hk")  ? &hk
                    : !strcmp(argv[a], "--d")   ? &d
                    : !strcmp(argv[a], "--seed") ? &seed
                                                : NULL;
        if (opt) {
            *opt = atol(v), a++;
        } else if (!strcmp(argv[a], "--threads")) {
            nthreads = parse_list(v, 1, 4096, threads, 8), a++;
        } else if (!strcmp(argv[a], "--dtype")) {
            dt = !strcmp(v, "f32") ? FA_F32 : !strcmp(v, "bf16") ? FA_BF16 : FA_F16, a++;
        } else if (!strcmp(argv[a], "--reps")) {
            reps = atoi(v), a++;
        } else if (!strcmp(argv[a], "--csv")) {
            csv = v, a++;
        } else {
            fprintf(stderr, "bench_varlen: unknown argument %s\n", argv[a]);
            return 2;
        }
    }
    if (nthreads < 1 || batch < 1 || lmin < 1 || lmax < lmin || hq < 1 || hk < 1 || hq % hk ||
        d < 1 || reps < 1) {
        fprintf(stderr, "bench_varlen: bad arguments\n");
        return 2;
    }
    int64_t *cu = malloc(sizeof(int64_t) * (size_t)(batch + 1));
    if (!cu)
        return 3;
    cu[0] = 0;
    unsigned s = (unsigned)seed;
    double pairs = 0;
    for (long b = 0; b < batch; b++) {
        s = s * 1103515245u + 12345u;
        const long n = lmin + (long)((s >> 8) % (unsigned)(lmax - lmin + 1));
        cu[b + 1] = cu[b] + n;
        pairs += causal_pairs(n);
    }
    const long total = (long)cu[batch], mean = total / batch;
    const long dense_total = mean * batch; /* total rounded down to a multiple of B */
    const size_t es = dt == FA_F32 ? 4 : 2;
    const size_t qn = (size_t)total * (size_t)hq * (size_t)d, kn = (size_t)total * (size_t)hk * (size_t)d;
    void *q = malloc(qn * es), *k = malloc(kn * es), *v = malloc(kn * es), *o = malloc(qn * es);
    float *tmp = malloc((qn + 2) * sizeof(float)); /* K and V from offsets 1 and 2 of it */
    if (!q || !k || !v || !o || !tmp)
        return 3;
    for (size_t i = 0; i < qn + 2; i++) {
        s = s * 1103515245u + 12345u;
        tmp[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    fa_convert(tmp, FA_F32, q, dt, qn);
    fa_convert(tmp + 1, FA_F32, k, dt, kn);
    fa_convert(tmp + 2, FA_F32, v, dt, kn);
    free(tmp);
    const fa_indices iq = {cu, FA_INDEX_INT64, batch + 1};

    FILE *out = csv ? fopen(csv, "w") : NULL;
    if (out)
        fprintf(out, "threads,batch,total,hq,hk,d,dtype,varlen_ms,varlen_gflops,dense_ms,"
                     "dense_gflops,rate_ratio,separate_ms,time_ratio_separate\n");
    printf("varlen prefill: B=%ld lengths %ld..%ld (total %ld, mean %ld), Hq=%ld Hk=%ld D=%ld "
           "%s, causal, best of %d\n", batch, lmin, lmax, total, mean, hq, hk, d,
           fa_dtype_name(dt), reps);
    printf("%7s %11s %9s %11s %9s %11s %12s %10s\n", "threads", "varlen ms", "GFLOP/s",
           "dense ms", "GFLOP/s", "rate ratio", "separate ms", "varlen/sep");
    const double flops_var = 4.0 * (double)d * (double)hq * pairs;
    const double flops_dense = 4.0 * (double)d * (double)hq * (double)batch * causal_pairs(mean);
    for (int ti = 0; ti < nthreads; ti++) {
        fa_options opt;
        fa_options_init(&opt);
        opt.backend = FA_BACKEND_TILED;
        opt.num_threads = (int)threads[ti];
        fa_context *ctx;
        if (fa_context_create(&opt, &ctx) != FA_OK)
            return fail("context");
        fa_params p;
        fa_params_init(&p);
        p.causal = 1;
        fa_tensor tq, tk, tv, to, dense_q, dense_k, dense_v, dense_o;
        fa_tensor_init(&tq, q, dt, 1, total, hq, d, 0);
        fa_tensor_init(&tk, k, dt, 1, total, hk, d, 0);
        fa_tensor_init(&tv, v, dt, 1, total, hk, d, 0);
        fa_tensor_init(&to, o, dt, 1, total, hq, d, 0);
        fa_tensor_init(&dense_q, q, dt, batch, dense_total / batch, hq, d, 0);
        fa_tensor_init(&dense_k, k, dt, batch, dense_total / batch, hk, d, 0);
        fa_tensor_init(&dense_v, v, dt, batch, dense_total / batch, hk, d, 0);
        fa_tensor_init(&dense_o, o, dt, batch, dense_total / batch, hq, d, 0);
        double best_var = INFINITY, best_dense = INFINITY, best_sep = INFINITY;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            if (fa_forward_varlen(ctx, &p, &tq, &tk, &tv, &iq, &iq, &to, NULL) != FA_OK)
                return fail("varlen");
            double t = now() - t0;
            best_var = t < best_var ? t : best_var;
            t0 = now();
            if (fa_forward(ctx, &p, &dense_q, &dense_k, &dense_v, &dense_o, NULL) != FA_OK)
                return fail("dense");
            t = now() - t0;
            best_dense = t < best_dense ? t : best_dense;
            t0 = now();
            for (long b = 0; b < batch; b++) {
                const long r0 = (long)cu[b], n = (long)(cu[b + 1] - cu[b]);
                fa_tensor sq = tq, sk = tk, sv = tv, so = to;
                sq.data = (char *)q + (size_t)(r0 * hq * d) * es;
                so.data = (char *)o + (size_t)(r0 * hq * d) * es;
                sk.data = (char *)k + (size_t)(r0 * hk * d) * es;
                sv.data = (char *)v + (size_t)(r0 * hk * d) * es;
                sq.seqlen = so.seqlen = sk.seqlen = sv.seqlen = n;
                if (fa_forward(ctx, &p, &sq, &sk, &sv, &so, NULL) != FA_OK)
                    return fail("separate");
            }
            t = now() - t0;
            best_sep = t < best_sep ? t : best_sep;
        }
        const double gv = flops_var / best_var * 1e-9, gd = flops_dense / best_dense * 1e-9;
        printf("%7ld %11.2f %9.1f %11.2f %9.1f %11.3f %12.2f %10.3f\n", threads[ti],
               best_var * 1e3, gv, best_dense * 1e3, gd, gv / gd, best_sep * 1e3,
               best_var / best_sep);
        if (out)
            fprintf(out, "%ld,%ld,%ld,%ld,%ld,%ld,%s,%.3f,%.2f,%.3f,%.2f,%.4f,%.3f,%.4f\n",
                    threads[ti], batch, total, hq, hk, d, fa_dtype_name(dt), best_var * 1e3, gv,
                    best_dense * 1e3, gd, gv / gd, best_sep * 1e3, best_var / best_sep);
        fa_context_destroy(ctx);
    }
    if (out)
        fclose(out);
    free(cu), free(q), free(k), free(v), free(o);
    return 0;
}
