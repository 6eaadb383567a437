/*
 * The peer of bench/bench_decode.c: ggml's CPU flash_attn_ext on the same decode shapes, timed
 * the same way (best of N, each attention call after a 1 GiB streaming read that is the
 * yardstick). Not part of the build: it links a ggml built from its public source
 * (docs/notes/inference.md has the commands). K and V are views of one (Sk, Hk x D) f16 buffer
 * each, token-major like llama.cpp's cache and like bench_decode's BSHD tensors; Q is f32
 * (ggml's CPU kernel takes f32 queries), one row per head; no mask (Sq = 1 sees every key, as
 * bench_decode's bottom-right causal row does).
 *
 *   ggml_decode THREADS HQ HK D SK [REPS]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "../stream_read.h"

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: ggml_decode THREADS HQ HK D SK [REPS]\n");
        return 2;
    }
    const int nt = atoi(argv[1]), reps = argc > 6 ? atoi(argv[6]) : 7;
    const long hq = atol(argv[2]), hk = atol(argv[3]), d = atol(argv[4]), sk = atol(argv[5]);
    const size_t kv_bytes = 2 * (size_t)sk * (size_t)hk * (size_t)d * 2;
    struct ggml_init_params ip = {kv_bytes + ((size_t)64 << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, 1, hq);
    struct ggml_tensor *kb = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, d * hk, sk);
    struct ggml_tensor *vb = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, d * hk, sk);
    struct ggml_tensor *k = ggml_view_3d(ctx, kb, d, sk, hk, kb->nb[1], (size_t)d * 2, 0);
    struct ggml_tensor *v = ggml_view_3d(ctx, vb, d, sk, hk, vb->nb[1], (size_t)d * 2, 0);
    unsigned s = 12345;
    ggml_fp16_t *kp = kb->data, *vp = vb->data;
    for (size_t i = 0; i < (size_t)sk * (size_t)hk * (size_t)d; i++) {
        s = s * 1103515245u + 12345u;
        const float x = ((float)(s >> 8) / 16777216.0f - 0.5f) * 2.0f;
        kp[i] = ggml_fp32_to_fp16(x);
        vp[i] = ggml_fp32_to_fp16(-x * 0.5f);
    }
    float *qp = q->data;
    for (long i = 0; i < hq * d; i++)
        qp[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    struct ggml_tensor *out = ggml_flash_attn_ext(ctx, q, k, v, NULL, 1.0f / sqrtf((float)d), 0, 0);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    float *big = malloc(STREAM_BYTES), sink = 0;
    for (size_t i = 0; i < STREAM_BYTES / sizeof(float); i++)
        big[i] = (float)(i & 1023) * 1e-3f;
    double best = INFINITY, best_stream = INFINITY;
    for (int r = 0; r < reps; r++) {
        const double ts = stream_read(big, STREAM_BYTES / sizeof(float), nt, &sink);
        best_stream = ts < best_stream ? ts : best_stream;
        const double t0 = now();
        ggml_graph_compute_with_ctx(ctx, gf, nt);
        const double t = now() - t0;
        best = t < best ? t : best;
    }
    const double gbs = (double)kv_bytes / best * 1e-9;
    const double sgbs = (double)STREAM_BYTES / best_stream * 1e-9;
    printf("ggml threads %d Hq %ld Hk %ld D %ld Sk %ld: %.3f ms, KV %.2f GB/s, stream %.2f GB/s, "
           "ratio %.3f, %.2f GFLOP/s (out[0] %g)\n",
           nt, hq, hk, d, sk, best * 1e3, gbs, sgbs, gbs / sgbs,
           4.0 * (double)hq * (double)sk * (double)d / best * 1e-9, ((float *)out->data)[0]);
    free(big);
    ggml_free(ctx);
    return sink == 12345.678f;
}
