/*
 * Decode benchmark (issue 16's table): one query row per head against a long KV cache through
 * fa_forward, reported as KV bytes read per second against the streaming read bandwidth
 * measured in the same process on the same threads, the yardstick a memory-bound kernel is
 * held to. Each cell alternates the yardstick and the attention call and keeps the best of
 * each, so a drift of the shared machine touches both alike.
 *
 *   bench_decode [--threads 1,2] [--seqlens 4096,16384,65536] [--hq 32] [--hk 8] [--d 128]
 *                [--dtype f16] [--kv-dtype D[,D...]] [--batch 1] [--sq 1] [--sinks] [--reps 7]
 *                [--page P --lengths LO,HI] [--csv FILE]
 *
 * --page P --lengths LO,HI: a batched decode over a paged cache (fa_forward_paged): --batch
 * sequences of lengths drawn from [LO, HI] (seeded), in pages of P keys placed in a shuffled
 * order (one cell per thread count; --seqlens is not used).
 *
 * --sq N times N query rows per head (N > 1: prefill, bottom-right causal); --sinks gives every
 * head an attention sink (fa_params.sink_logits), for the with/without comparison; --kv-dtype
 * stores K and V apart from Q and O (f16, bf16, e4m3, e5m2, q8_0 or q4_0 under f32 or bf16 q:
 * ggml's f32 queries; K of the first format and V of the second where one is written a/b, as
 * q8_0/q4_0); a list times each cache in every cell, one after the other within each round,
 * and gives each one's time against the first's ("x first": tokens per second over the first
 * cache's).
 *
 * The streaming read sums a 1 GiB buffer (larger than any cache here) in 16-float vectors, the
 * threads taking equal contiguous parts. FA_DECODE=0 in the environment times the tiles' path
 * instead (the A/B of the decode path).
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "stream_read.h"

static fa_dtype parse_dtype(const char *s)
{
    static const fa_dtype all[] = {FA_F32, FA_F16, FA_BF16, FA_E4M3, FA_E5M2, FA_Q8_0, FA_Q4_0};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!strcmp(s, fa_dtype_name(all[i])))
            return all[i];
    return (fa_dtype)-1;
}

/* Bytes of n elements of dtype d (a block format: 32 elements a block). */
static double dtype_bytes(fa_dtype d, double n)
{
    switch (d) {
    case FA_F32: return 4 * n;
    case FA_F16:
    case FA_BF16: return 2 * n;
    case FA_Q8_0: return n / 32 * 34;
    case FA_Q4_0: return n / 32 * 18;
    default: return n; /* FP8 */
    }
}

/* A --kv-dtype list: "f16,q8_0,q8_0/q4_0": K's and V's dtype of each entry; the count, or 0. */
static int parse_kv(const char *v, fa_dtype kd[][2], int most)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == most)
            return 0;
        char *slash = strchr(t, '/');
        if (slash)
            *slash = 0;
        kd[n][0] = parse_dtype(t);
        kd[n][1] = slash ? parse_dtype(slash + 1) : kd[n][0];
        if (kd[n][0] == (fa_dtype)-1 || kd[n][1] == (fa_dtype)-1)
            return 0;
        n++;
    }
    return n;
}

int main(int argc, char **argv)
{
    long threads[8] = {1, 2}, seqlens[16] = {4096, 16384, 65536};
    int nthreads = 2, nseq = 3, reps = 7;
    long hq = 32, hk = 8, d = 128, batch = 1, sq = 1, page = 0, lengths[2] = {0, 0};
    int sinks_on = 0;
    fa_dtype dt = FA_F16, kvts[8][2];
    int nkv = 0;
    const char *csv = NULL;
    for (int a = 1; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : "";
        if (!strcmp(argv[a], "--threads"))
            nthreads = parse_list(v, 1, 4096, threads, 8), a++;
        else if (!strcmp(argv[a], "--seqlens"))
            nseq = parse_list(v, 1, (long)1 << 40, seqlens, 16), a++;
        else if (!strcmp(argv[a], "--hq"))
            hq = atol(v), a++;
        else if (!strcmp(argv[a], "--hk"))
            hk = atol(v), a++;
        else if (!strcmp(argv[a], "--d"))
            d = atol(v), a++;
        else if (!strcmp(argv[a], "--batch"))
            batch = atol(v), a++;
        else if (!strcmp(argv[a], "--sq"))
            sq = atol(v), a++;
        else if (!strcmp(argv[a], "--page"))
            page = atol(v), a++;
        else if (!strcmp(argv[a], "--lengths")) {
            if (parse_list(v, 1, (long)1 << 40, lengths, 2) != 2)
                lengths[0] = 0;
            a++;
        } else if (!strcmp(argv[a], "--sinks"))
            sinks_on = 1;
        else if (!strcmp(argv[a], "--dtype"))
            dt = parse_dtype(v), a++;
        else if (!strcmp(argv[a], "--kv-dtype")) {
            nkv = parse_kv(v, kvts, 8);
            nkv = nkv ? nkv : -1; /* a bad list */
            a++;
        }
        else if (!strcmp(argv[a], "--reps"))
            reps = atoi(v), a++;
        else if (!strcmp(argv[a], "--csv"))
            csv = v, a++;
        else {
            fprintf(stderr, "bench_decode: unknown argument %s\n", argv[a]);
            return 2;
        }
    }
    if (nthreads < 1 || nseq < 1 || hq < 1 || hk < 1 || hq % hk || d < 1 || batch < 1 ||
        sq < 1 || reps < 1 || page < 0 || (page > 0) != (lengths[0] > 0) ||
        lengths[1] < lengths[0] || dt == (fa_dtype)-1 || nkv < 0) {
        fprintf(stderr, "bench_decode: bad arguments\n");
        return 2;
    }
    if (nkv == 0) { /* the cache in q's dtype */
        kvts[0][0] = kvts[0][1] = dt;
        nkv = 1;
    }
    const size_t qes = dt == FA_F32 ? 4 : 2;
    long skmax = 0;
    for (int i = 0; i < nseq; i++)
        skmax = seqlens[i] > skmax ? seqlens[i] : skmax;
    /* a paged cache: the lengths, and a table of pages in a shuffled order */
    int64_t *used = NULL, *table = NULL, max_pages = 0, npages = 0;
    double used_sum = 0;
    if (page > 0) {
        used = malloc(sizeof(int64_t) * (size_t)batch);
        unsigned r = 777;
        for (long b = 0; used && b < batch; b++) {
            r = r * 1103515245u + 12345u;
            used[b] = lengths[0] + (long)((r >> 8) % (unsigned)(lengths[1] - lengths[0] + 1));
            used_sum += (double)used[b];
            npages += (used[b] + page - 1) / page;
        }
        max_pages = (lengths[1] + page - 1) / page;
        table = malloc(sizeof(int64_t) * (size_t)(batch * max_pages));
        int64_t *perm = malloc(sizeof(int64_t) * (size_t)npages);
        for (int64_t n = 0; perm && n < npages; n++)
            perm[n] = n;
        for (int64_t n = npages - 1; perm && n > 0; n--) { /* Fisher-Yates */
            r = r * 1103515245u + 12345u;
            const int64_t m = (int64_t)((r >> 4) % (unsigned)(n + 1)), t = perm[n];
            perm[n] = perm[m], perm[m] = t;
        }
        for (long i = 0, n = 0; perm && table && i < batch; i++)
            for (int64_t x = 0; x < max_pages; x++)
                table[i * max_pages + x] = x * page < used[i] ? perm[n++] : 0;
        free(perm);
        skmax = npages * page / batch + 1; /* the pool's keys, as batch x skmax */
        nseq = 1;
    }

    float *big = malloc(STREAM_BYTES);
    const size_t kv_elems = (size_t)batch * (size_t)skmax * (size_t)hk * (size_t)d;
    void *k[8] = {0}, *v[8] = {0};
    int kv_ok = 1;
    for (int c = 0; c < nkv; c++) {
        k[c] = malloc((size_t)dtype_bytes(kvts[c][0], (double)kv_elems) + 64);
        v[c] = malloc((size_t)dtype_bytes(kvts[c][1], (double)kv_elems) + 64);
        kv_ok = kv_ok && k[c] && v[c];
    }
    const size_t q_elems = (size_t)batch * (size_t)sq * (size_t)hq * (size_t)d;
    float *sinks = malloc(sizeof(float) * (size_t)hq);
    void *q = malloc(q_elems * qes), *o = malloc(q_elems * qes);
    float *tmp = malloc((kv_elems > q_elems ? kv_elems : q_elems) * sizeof(float));
    for (long h = 0; sinks && h < hq; h++)
        sinks[h] = 0.25f * (float)(h % 5) - 0.5f;
    if (!big || !kv_ok || !q || !o || !tmp || !sinks) {
        fprintf(stderr, "bench_decode: out of memory\n");
        return 3;
    }
    for (size_t i = 0; i < STREAM_BYTES / sizeof(float); i++)
        big[i] = (float)(i & 1023) * 1e-3f;
    unsigned s = 12345;
    for (size_t i = 0; i < kv_elems; i++) {
        s = s * 1103515245u + 12345u;
        tmp[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 2.0f;
    }
    for (int c = 0; c < nkv; c++)
        fa_convert(tmp, FA_F32, k[c], kvts[c][0], kv_elems);
    for (size_t i = 0; i < kv_elems; i++)
        tmp[i] = -tmp[i] * 0.5f;
    for (int c = 0; c < nkv; c++)
        fa_convert(tmp, FA_F32, v[c], kvts[c][1], kv_elems);
    for (size_t i = 0; i < q_elems; i++)
        tmp[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    fa_convert(tmp, FA_F32, q, dt, q_elems);
    free(tmp);

    FILE *out = csv ? fopen(csv, "w") : NULL;
    if (out)
        fprintf(out, "threads,batch,sk,hq,hk,d,dtype,k_dtype,v_dtype,ms,kv_gbs,stream_gbs,ratio,"
                     "gflops,x_first\n");
    const char *decode_env = getenv("FA_DECODE");
    printf("decode: B=%ld Sq=%ld Hq=%ld Hk=%ld D=%ld q %s, causal%s, best of %d; FA_DECODE=%s\n",
           batch, sq, hq, hk, d, fa_dtype_name(dt), sinks_on ? ", sinks" : "", reps,
           decode_env ? decode_env : "(unset)");
    if (page > 0)
        printf("paged: pages of %ld keys (%lld in a shuffled order), lengths %ld..%ld, mean "
               "%.0f (the Sk column)\n", page, (long long)npages, lengths[0], lengths[1],
               used_sum / (double)batch);
    printf("%7s %7s %9s %9s %9s %11s %7s %8s %8s\n", "threads", "Sk", "k/v", "ms", "KV GB/s",
           "stream GB/s", "ratio", "GFLOP/s", "x first");
    float sink = 0;
    int rc = 0;
    for (int ti = 0; ti < nthreads; ti++) {
        fa_options opt;
        fa_options_init(&opt);
        opt.backend = FA_BACKEND_TILED;
        opt.num_threads = (int)threads[ti];
        fa_context *ctx;
        if (fa_context_create(&opt, &ctx) != FA_OK) {
            fprintf(stderr, "bench_decode: %s\n", fa_last_error());
            return 3;
        }
        for (int si = 0; si < nseq; si++) {
            const long sk = page > 0 ? (long)(used_sum / (double)batch) : seqlens[si];
            fa_tensor tq, to, tk[8], tv[8];
            fa_tensor_init(&tq, q, dt, batch, sq, hq, d, 0);
            fa_tensor_init(&to, o, dt, batch, sq, hq, d, 0);
            for (int c = 0; c < nkv; c++) {
                if (page > 0) { /* the pool: (pages, page, hk, d) */
                    fa_tensor_init(&tk[c], k[c], kvts[c][0], npages, page, hk, d, 0);
                    fa_tensor_init(&tv[c], v[c], kvts[c][1], npages, page, hk, d, 0);
                } else {
                    fa_tensor_init(&tk[c], k[c], kvts[c][0], batch, sk, hk, d, 0);
                    fa_tensor_init(&tv[c], v[c], kvts[c][1], batch, sk, hk, d, 0);
                }
            }
            const fa_paged_kv pages = {{table, FA_INDEX_INT64, batch * max_pages}, max_pages,
                                       {used, FA_INDEX_INT64, batch}};
            fa_params p;
            fa_params_init(&p);
            p.causal = 1;
            p.sink_logits = sinks_on ? sinks : NULL;
            /* each round: the yardstick, then every cache in turn */
            double best[8], best_stream = INFINITY;
            for (int c = 0; c < nkv; c++)
                best[c] = INFINITY;
            for (int r = 0; r < reps; r++) {
                const double ts = stream_read(big, STREAM_BYTES / sizeof(float), (int)threads[ti],
                                              &sink);
                best_stream = ts < best_stream ? ts : best_stream;
                for (int c = 0; c < nkv; c++) {
                    const double t0 = now();
                    if ((page > 0 ? fa_forward_paged(ctx, &p, &tq, &tk[c], &tv[c], &pages, &to, NULL)
                                  : fa_forward(ctx, &p, &tq, &tk[c], &tv[c], &to, NULL)) != FA_OK) {
                        fprintf(stderr, "bench_decode: %s\n", fa_last_error());
                        return 3;
                    }
                    const double t = now() - t0;
                    best[c] = t < best[c] ? t : best[c];
                }
            }
            const double keys = page > 0 ? used_sum : (double)batch * (double)sk;
            const double sgbs = (double)STREAM_BYTES / best_stream * 1e-9;
            const double flops = /* nominal: every (row, key) pair, as decode has */
                4.0 * keys * (double)sq * (double)hq * (double)d;
            for (int c = 0; c < nkv; c++) {
                const double kv_bytes = dtype_bytes(kvts[c][0], keys * (double)hk * (double)d) +
                                        dtype_bytes(kvts[c][1], keys * (double)hk * (double)d);
                const double gbs = kv_bytes / best[c] * 1e-9;
                char name[32];
                snprintf(name, sizeof name, "%s%s%s", fa_dtype_name(kvts[c][0]),
                         kvts[c][1] != kvts[c][0] ? "/" : "",
                         kvts[c][1] != kvts[c][0] ? fa_dtype_name(kvts[c][1]) : "");
                printf("%7ld %7ld %9s %9.3f %9.2f %11.2f %7.3f %8.2f %8.3f\n", threads[ti], sk,
                       name, best[c] * 1e3, gbs, sgbs, gbs / sgbs, flops / best[c] * 1e-9,
                       best[0] / best[c]);
                if (out)
                    fprintf(out, "%ld,%ld,%ld,%ld,%ld,%ld,%s,%s,%s,%.4f,%.3f,%.3f,%.4f,%.3f,%.4f\n",
                            threads[ti], batch, sk, hq, hk, d, fa_dtype_name(dt),
                            fa_dtype_name(kvts[c][0]), fa_dtype_name(kvts[c][1]), best[c] * 1e3,
                            gbs, sgbs, gbs / sgbs, flops / best[c] * 1e-9, best[0] / best[c]);
            }
        }
        fa_context_destroy(ctx);
    }
    if (out)
        fclose(out);
    if (sink == 12345.678f) /* never: keeps the stream's sums alive */
        rc = 1;
    for (int c = 0; c < nkv; c++)
        free(k[c]), free(v[c]);
    free(big), free(q), free(o), free(sinks), free(used), free(table);
    return rc;
}
