/*
 * Decode benchmark (issue 16's table): one query row per head against a long KV cache through
 * fa_forward, reported as KV bytes read per second against the streaming read bandwidth
 * measured in the same process on the same threads, the yardstick a memory-bound kernel is
 * held to. Each cell alternates the yardstick and the attention call and keeps the best of
 * each, so a drift of the shared machine touches both alike.
 *
 *   bench_decode [--threads 1,2] [--seqlens 4096,16384,65536] [--hq 32] [--hk 8] [--d 128]
 *                [--dtype f16] [--kv-dtype D] [--batch 1] [--sq 1] [--sinks] [--reps 7]
 *                [--csv FILE]
 *
 * --sq N times N query rows per head (N > 1: prefill, bottom-right causal); --sinks gives every
 * head an attention sink (fa_params.sink_logits), for the with/without comparison; --kv-dtype
 * stores K and V apart from Q and O (f16 or bf16 under f32 or bf16 q: ggml's f32 queries).
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
    return !strcmp(s, "f32") ? FA_F32 : !strcmp(s, "bf16") ? FA_BF16 : FA_F16;
}

int main(int argc, char **argv)
{
    long threads[8] = {1, 2}, seqlens[16] = {4096, 16384, 65536};
    int nthreads = 2, nseq = 3, reps = 7;
    long hq = 32, hk = 8, d = 128, batch = 1, sq = 1;
    int sinks_on = 0;
    fa_dtype dt = FA_F16, kvt = (fa_dtype)-1;
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
        else if (!strcmp(argv[a], "--sinks"))
            sinks_on = 1;
        else if (!strcmp(argv[a], "--dtype"))
            dt = parse_dtype(v), a++;
        else if (!strcmp(argv[a], "--kv-dtype"))
            kvt = parse_dtype(v), a++;
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
        sq < 1 || reps < 1) {
        fprintf(stderr, "bench_decode: bad arguments\n");
        return 2;
    }
    if (kvt == (fa_dtype)-1)
        kvt = dt;
    const size_t es = kvt == FA_F32 ? 4 : 2, qes = dt == FA_F32 ? 4 : 2;
    long skmax = 0;
    for (int i = 0; i < nseq; i++)
        skmax = seqlens[i] > skmax ? seqlens[i] : skmax;

    float *big = malloc(STREAM_BYTES);
    const size_t kv_elems = (size_t)batch * (size_t)skmax * (size_t)hk * (size_t)d;
    void *k = malloc(kv_elems * es), *v = malloc(kv_elems * es);
    const size_t q_elems = (size_t)batch * (size_t)sq * (size_t)hq * (size_t)d;
    float *sinks = malloc(sizeof(float) * (size_t)hq);
    void *q = malloc(q_elems * qes), *o = malloc(q_elems * qes);
    float *tmp = malloc((kv_elems > q_elems ? kv_elems : q_elems) * sizeof(float));
    for (long h = 0; sinks && h < hq; h++)
        sinks[h] = 0.25f * (float)(h % 5) - 0.5f;
    if (!big || !k || !v || !q || !o || !tmp || !sinks) {
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
    fa_convert(tmp, FA_F32, k, kvt, kv_elems);
    for (size_t i = 0; i < kv_elems; i++)
        tmp[i] = -tmp[i] * 0.5f;
    fa_convert(tmp, FA_F32, v, kvt, kv_elems);
    for (size_t i = 0; i < q_elems; i++)
        tmp[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    fa_convert(tmp, FA_F32, q, dt, q_elems);
    free(tmp);

    FILE *out = csv ? fopen(csv, "w") : NULL;
    if (out)
        fprintf(out, "threads,batch,sk,hq,hk,d,dtype,ms,kv_gbs,stream_gbs,ratio,gflops\n");
    const char *decode_env = getenv("FA_DECODE");
    printf("decode: B=%ld Sq=%ld Hq=%ld Hk=%ld D=%ld q %s, k/v %s, causal%s, best of %d; "
           "FA_DECODE=%s\n", batch, sq, hq, hk, d, fa_dtype_name(dt), fa_dtype_name(kvt),
           sinks_on ? ", sinks" : "", reps, decode_env ? decode_env : "(unset)");
    printf("%7s %7s %9s %9s %11s %7s %8s\n", "threads", "Sk", "ms", "KV GB/s", "stream GB/s",
           "ratio", "GFLOP/s");
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
            const long sk = seqlens[si];
            fa_tensor tq, tk, tv, to;
            fa_tensor_init(&tq, q, dt, batch, sq, hq, d, 0);
            fa_tensor_init(&to, o, dt, batch, sq, hq, d, 0);
            fa_tensor_init(&tk, k, kvt, batch, sk, hk, d, 0);
            fa_tensor_init(&tv, v, kvt, batch, sk, hk, d, 0);
            fa_params p;
            fa_params_init(&p);
            p.causal = 1;
            p.sink_logits = sinks_on ? sinks : NULL;
            double best = INFINITY, best_stream = INFINITY;
            for (int r = 0; r < reps; r++) {
                const double ts = stream_read(big, STREAM_BYTES / sizeof(float), (int)threads[ti],
                                              &sink);
                best_stream = ts < best_stream ? ts : best_stream;
                const double t0 = now();
                if (fa_forward(ctx, &p, &tq, &tk, &tv, &to, NULL) != FA_OK) {
                    fprintf(stderr, "bench_decode: %s\n", fa_last_error());
                    return 3;
                }
                const double t = now() - t0;
                best = t < best ? t : best;
            }
            const double kv_bytes =
                2.0 * (double)batch * (double)sk * (double)hk * (double)d * (double)es;
            const double gbs = kv_bytes / best * 1e-9;
            const double sgbs = (double)STREAM_BYTES / best_stream * 1e-9;
            const double flops = /* nominal: every (row, key) pair, as decode has */
                4.0 * (double)batch * (double)sq * (double)hq * (double)sk * (double)d;
            printf("%7ld %7ld %9.3f %9.2f %11.2f %7.3f %8.2f\n", threads[ti], sk, best * 1e3, gbs,
                   sgbs, gbs / sgbs, flops / best * 1e-9);
            if (out)
                fprintf(out, "%ld,%ld,%ld,%ld,%ld,%ld,%s,%.4f,%.3f,%.3f,%.4f,%.3f\n", threads[ti],
                        batch, sk, hq, hk, d, fa_dtype_name(dt), best * 1e3, gbs, sgbs, gbs / sgbs,
                        flops / best * 1e-9);
        }
        fa_context_destroy(ctx);
    }
    if (out)
        fclose(out);
    if (sink == 12345.678f) /* never: keeps the stream's sums alive */
        rc = 1;
    free(big), free(k), free(v), free(q), free(o), free(sinks);
    return rc;
}
