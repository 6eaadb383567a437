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
 *                [--page P [--chunk C]]
 *
 * --page P adds the paged prefill (fa_forward_paged): the same sequences' keys in pages of P
 * keys placed in a shuffled order, and a chunk of prefill of C query rows each (default 512,
 * at most --min: each sequence's last C positions, bottom-right causal). Its rate is set
 * against a dense batch of the same shape at the mean length (C rows against `mean` keys), and
 * its time against the same call over the keys stored contiguously (fa_forward_kvcache with
 * the lengths), whose output it must equal bit for bit (checked: exit status 4 otherwise).
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

/* Allowed pairs of the last c rows of a bottom-right causal sequence of n keys. */
static double chunk_pairs(long c, long n) { return causal_pairs(n) - causal_pairs(n - c); }

/*
 * The paged prefill (--page): each sequence's keys (rows cu[b] .. cu[b + 1] of k and v, BSHD)
 * copied into pages of `page` keys in a shuffled order, and a contiguous cache of lmax keys a
 * sequence; the last `chunk` query rows of each sequence against them, through
 * fa_forward_paged and through fa_forward_kvcache on the contiguous cache, alternated, against
 * a dense batch of `chunk` rows and `mean` keys (the first `mean` keys of each sequence,
 * repeated where it is shorter). Prints one line per thread count.
 */
static int paged_prefill(const long *threads, int nthreads, int reps, long batch, long lmax,
                         long page, long chunk, long hq, long hk, long d, fa_dtype dt,
                         const int64_t *cu, const void *q, const void *k, const void *v)
{
    const size_t es = dt == FA_F32 ? 4 : 2, krow = (size_t)(hk * d) * es,
                 qrow = (size_t)(hq * d) * es;
    const long max_pages = (lmax + page - 1) / page;
    long npages = 0;
    double pairs = 0, total = 0;
    for (long b = 0; b < batch; b++) {
        const long n = (long)(cu[b + 1] - cu[b]);
        npages += (n + page - 1) / page;
        pairs += chunk_pairs(chunk, n);
        total += (double)n;
    }
    const long mean = (long)(total / (double)batch);
    int64_t *table = calloc((size_t)(batch * max_pages), sizeof(int64_t));
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)npages), *used = malloc(sizeof(int64_t) * (size_t)batch);
    char *kp = malloc((size_t)(npages * page) * krow), *vp = malloc((size_t)(npages * page) * krow);
    char *kc = malloc((size_t)(batch * lmax) * krow), *vc = malloc((size_t)(batch * lmax) * krow);
    char *qc = malloc((size_t)(batch * chunk) * qrow), *oc = malloc((size_t)(batch * chunk) * qrow);
    char *oc2 = malloc((size_t)(batch * chunk) * qrow);
    char *dk = malloc((size_t)(batch * mean) * krow), *dv = malloc((size_t)(batch * mean) * krow);
    int status = 0;
    if (!table || !perm || !used || !kp || !vp || !kc || !vc || !qc || !oc || !oc2 || !dk || !dv) {
        fprintf(stderr, "bench_varlen: out of memory for the paged prefill\n");
        status = 3;
        goto done;
    }
    unsigned r = 4242;
    for (long n = 0; n < npages; n++)
        perm[n] = n;
    for (long n = npages - 1; n > 0; n--) { /* Fisher-Yates */
        r = r * 1103515245u + 12345u;
        const long m = (long)((r >> 4) % (unsigned)(n + 1));
        const int64_t t = perm[n];
        perm[n] = perm[m], perm[m] = t;
    }
    for (long b = 0, x = 0; b < batch; b++) {
        const long n = (long)(cu[b + 1] - cu[b]);
        used[b] = n;
        const char *ks = (const char *)k + (size_t)cu[b] * krow, *vs = (const char *)v + (size_t)cu[b] * krow;
        for (long j = 0; j < n; j++) {
            if (j % page == 0)
                table[b * max_pages + j / page] = perm[x++];
            const size_t at = (size_t)(table[b * max_pages + j / page] * page + j % page) * krow;
            memcpy(kp + at, ks + (size_t)j * krow, krow);
            memcpy(vp + at, vs + (size_t)j * krow, krow);
        }
        memcpy(kc + (size_t)(b * lmax) * krow, ks, (size_t)n * krow);
        memcpy(vc + (size_t)(b * lmax) * krow, vs, (size_t)n * krow);
        memcpy(qc + (size_t)(b * chunk) * qrow, (const char *)q + (size_t)(cu[b + 1] - chunk) * qrow,
               (size_t)chunk * qrow);
        for (long j = 0; j < mean; j++) { /* a shorter sequence's keys repeated */
            memcpy(dk + (size_t)(b * mean + j) * krow, ks + (size_t)(j % n) * krow, krow);
            memcpy(dv + (size_t)(b * mean + j) * krow, vs + (size_t)(j % n) * krow, krow);
        }
    }
    const fa_paged_kv pages = {{table, FA_INDEX_INT64, batch * max_pages}, max_pages,
                               {used, FA_INDEX_INT64, batch}};
    const fa_indices lens = {used, FA_INDEX_INT64, batch};
    printf("paged prefill: pages of %ld keys, shuffled; the last %ld rows of each sequence\n",
           page, chunk);
    printf("%7s %11s %9s %11s %9s %11s %12s %10s\n", "threads", "paged ms", "GFLOP/s",
           "dense ms", "GFLOP/s", "rate ratio", "contig. ms", "paged/cont");
    const double flops_paged = 4.0 * (double)d * (double)hq * pairs;
    const double flops_dense = 4.0 * (double)d * (double)hq * (double)batch * chunk_pairs(chunk, mean);
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
        fa_tensor tq, to, to2, tkp, tvp, tkc, tvc, tdk, tdv;
        fa_tensor_init(&tq, qc, dt, batch, chunk, hq, d, 0);
        fa_tensor_init(&to, oc, dt, batch, chunk, hq, d, 0);
        fa_tensor_init(&to2, oc2, dt, batch, chunk, hq, d, 0);
        fa_tensor_init(&tkp, kp, dt, npages, page, hk, d, 0);
        fa_tensor_init(&tvp, vp, dt, npages, page, hk, d, 0);
        fa_tensor_init(&tkc, kc, dt, batch, lmax, hk, d, 0);
        fa_tensor_init(&tvc, vc, dt, batch, lmax, hk, d, 0);
        fa_tensor_init(&tdk, dk, dt, batch, mean, hk, d, 0);
        fa_tensor_init(&tdv, dv, dt, batch, mean, hk, d, 0);
        double best_paged = INFINITY, best_dense = INFINITY, best_cont = INFINITY;
        for (int rep = 0; rep < reps; rep++) {
            double t0 = now();
            if (fa_forward_paged(ctx, &p, &tq, &tkp, &tvp, &pages, &to, NULL) != FA_OK)
                return fail("paged");
            double t = now() - t0;
            best_paged = t < best_paged ? t : best_paged;
            t0 = now();
            if (fa_forward(ctx, &p, &tq, &tdk, &tdv, &to2, NULL) != FA_OK)
                return fail("dense");
            t = now() - t0;
            best_dense = t < best_dense ? t : best_dense;
            t0 = now();
            if (fa_forward_kvcache(ctx, &p, &tq, &tkc, &tvc, NULL, NULL, &lens, NULL, &to2,
                                   NULL) != FA_OK)
                return fail("contiguous");
            t = now() - t0;
            best_cont = t < best_cont ? t : best_cont;
            if (memcmp(oc, oc2, (size_t)(batch * chunk) * qrow)) {
                fprintf(stderr, "bench_varlen: the paged output differs from the contiguous\n");
                status = 4;
            }
        }
        const double gp = flops_paged / best_paged * 1e-9, gd = flops_dense / best_dense * 1e-9;
        printf("%7ld %11.2f %9.1f %11.2f %9.1f %11.3f %12.2f %10.3f\n", threads[ti],
               best_paged * 1e3, gp, best_dense * 1e3, gd, gp / gd, best_cont * 1e3,
               best_paged / best_cont);
        fa_context_destroy(ctx);
    }
done:
    free(table), free(perm), free(used), free(kp), free(vp), free(kc), free(vc), free(qc);
    free(oc), free(oc2), free(dk), free(dv);
    return status;
}

int main(int argc, char **argv)
{
    long threads[8] = {1, 2};
    int nthreads = 2, reps = 3;
    long batch = 8, lmin = 512, lmax = 2048, hq = 32, hk = 8, d = 128, seed = 1, page = 0,
         chunk = 512;
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
                    : !strcmp(argv[a], "--page") ? &page
                    : !strcmp(argv[a], "--chunk") ? &chunk
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
        d < 1 || reps < 1 || page < 0 || (page > 0 && (chunk < 1 || chunk > lmin))) {
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
    const int status = page > 0 ? paged_prefill(threads, nthreads, reps, batch, lmax, page, chunk,
                                                hq, hk, d, dt, cu, q, k, v)
                                : 0;
    free(cu), free(q), free(k), free(v), free(o);
    return status;
}
