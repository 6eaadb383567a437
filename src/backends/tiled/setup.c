/*
 * What a context tells the tiled backend, read once when the context is made (its setup hook)
 * and kept in the context's settings: the plan forced by the environment, for tile sweeps and
 * A/B runs (docs/DESIGN.md §2): FA_TILES, FA_BACKWARD_PASSES, FA_DECODE. And the backend's
 * part of fa_context_describe's line: the tiles the plan takes at D = 64 and 128.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/tiled/plan.h"

_Static_assert(sizeof(fai_tiled_forced) <= sizeof(fai_backend_settings),
               "the tiled backend's settings fit a context's slot");

/* FA_TILES=BQxBK[xBR], each in [1, 4096], BR <= BQ (BR 0: the plan's strip for BK); and
 * FA_BACKWARD_PASSES=1|2; FA_DECODE=0|1. */
static fa_status env_tiled(fai_tiled_forced *f)
{
    memset(f, 0, sizeof *f);
    const char *env = getenv("FA_TILES");
    if (env && *env) {
        int64_t size[3] = {0, 0, 0};
        const char *at = env;
        int fields = 0, ok = 1;
        while (ok && fields < 3) {
            ok = *at >= '1' && *at <= '9';
            int64_t v = 0;
            for (; ok && *at >= '0' && *at <= '9'; at++)
                v = v > 4096 ? v : v * 10 + (*at - '0'); /* saturates above the bound */
            size[fields++] = v;
            ok = ok && v <= 4096;
            if (!ok || *at != 'x')
                break;
            at++;
        }
        if (!ok || *at != 0 || fields < 2 || (fields == 3 && size[2] > size[0]))
            return fai_fail(FA_ERR_INVALID_ARGUMENT,
                            "FA_TILES=%s: expected BQxBK or BQxBKxBR, e.g. 64x32 or 64x32x8, "
                            "each in [1, 4096], BR <= BQ", env);
        f->bq = size[0], f->bk = size[1], f->br = size[2];
    }
    env = getenv("FA_BACKWARD_PASSES");
    if (env && *env) {
        if (strcmp(env, "1") && strcmp(env, "2"))
            return fai_fail(FA_ERR_INVALID_ARGUMENT, "FA_BACKWARD_PASSES=%s: expected 1 or 2", env);
        f->backward_passes = env[0] - '0';
    }
    env = getenv("FA_DECODE");
    if (env && *env) {
        if (strcmp(env, "0") && strcmp(env, "1"))
            return fai_fail(FA_ERR_INVALID_ARGUMENT, "FA_DECODE=%s: expected 0 or 1", env);
        f->decode_off = env[0] == '0';
    }
    return FA_OK;
}

fa_status fai_tiled_setup(const fa_options *o, fai_backend_settings *mine)
{
    (void)o;
    fai_tiled_forced f;
    FAI_TRY(env_tiled(&f));
    memcpy(mine->bytes, &f, sizeof f);
    return FA_OK;
}

void fai_tiled_describe(const fa_context *ctx, char *buf, size_t n)
{
    fai_tiles t[4];
    for (int k = 0; k < 4; k++) /* D = 64, 128; forward, backward */
        t[k] = fai_tiled_tiles(ctx, 64 << (k / 2), 64 << (k / 2), FA_F32, k % 2);
    char bf16_tiles[64] = ""; /* the bf16 forward's tiles on the set's tile products */
    if (ctx->kernels->bf16) {
        const fai_tiles b = fai_tiled_tiles(ctx, 128, 128, FA_BF16, 0);
        snprintf(bf16_tiles, sizeof bf16_tiles, "; bf16 fwd on tile products: D=128 %lldx%lldx%lld",
                 (long long)b.bq, (long long)b.bk, (long long)b.br);
    }
    snprintf(buf, n,
             "tiles f32 BqxBkxBr fwd/BqxBk bwd: D=64 %lldx%lldx%lld/%lldx%lld, "
             "D=128 %lldx%lldx%lld/%lldx%lld%s",
             (long long)t[0].bq, (long long)t[0].bk, (long long)t[0].br, (long long)t[1].bq,
             (long long)t[1].bk, (long long)t[2].bq, (long long)t[2].bk, (long long)t[2].br,
             (long long)t[3].bq, (long long)t[3].bk, bf16_tiles);
}
