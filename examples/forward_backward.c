/* The README's API example: causal GQA attention forward and backward on f32 BSHD tensors. */
#include <flashattn.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { B = 1, S = 256, HQ = 8, HK = 2, D = 64 };
    float *q = calloc(B * S * HQ * D, 4), *k = calloc(B * S * HK * D, 4),
          *v = calloc(B * S * HK * D, 4), *o = calloc(B * S * HQ * D, 4),
          *lse = calloc(B * HQ * S, 4), *dq = calloc(B * S * HQ * D, 4),
          *dk = calloc(B * S * HK * D, 4), *dv = calloc(B * S * HK * D, 4);
    for (int i = 0; i < B * S * HK * D; i++)
        k[i] = v[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    for (int i = 0; i < B * S * HQ * D; i++)
        q[i] = (float)((i * 53 % 97) - 48) / 48.0f;

    fa_tensor tq, tk, tv, to, tl, tdq, tdk, tdv;
    fa_tensor_init(&tq, q, FA_F32, B, S, HQ, D, 0); /* BSHD; pass 1 for BHSD */
    fa_tensor_init(&tk, k, FA_F32, B, S, HK, D, 0);
    fa_tensor_init(&tv, v, FA_F32, B, S, HK, D, 0);
    fa_tensor_init(&to, o, FA_F32, B, S, HQ, D, 0);
    fa_tensor_init(&tl, lse, FA_F32, B, S, HQ, 1, 1); /* LSE stored B x H x S */
    fa_tensor_init(&tdq, dq, FA_F32, B, S, HQ, D, 0);
    fa_tensor_init(&tdk, dk, FA_F32, B, S, HK, D, 0);
    fa_tensor_init(&tdv, dv, FA_F32, B, S, HK, D, 0);

    fa_params p;
    fa_params_init(&p); /* scale 1/sqrt(D), no mask, no dropout */
    p.causal = 1;

    fa_context *ctx;
    fa_status s = fa_context_create(NULL, &ctx); /* AUTO: the fastest CPU path */
    if (s == FA_OK)
        s = fa_forward(ctx, &p, &tq, &tk, &tv, &to, &tl);
    if (s == FA_OK) /* the cotangent dO: here the output itself, i.e. d(|O|^2 / 2) */
        s = fa_backward(ctx, &p, &tq, &tk, &tv, &to, &tl, &to, &tdq, &tdk, &tdv);
    if (s != FA_OK) {
        fprintf(stderr, "flashattn: %s: %s\n", fa_status_string(s), fa_last_error());
        return 1;
    }
    char info[4096];
    size_t peak;
    fa_context_describe(ctx, info, sizeof info);
    fa_memory_stats(ctx, NULL, &peak);
    printf("%s\nO[0] = %g, LSE[0] = %g, dQ[0] = %g, peak %zu bytes\n", info, o[0], lse[0], dq[0],
           peak);
    fa_context_destroy(ctx);
    free(q), free(k), free(v), free(o), free(lse), free(dq), free(dk), free(dv);
    return 0;
}
