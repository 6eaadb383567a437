/*
 * The tiled backend: the article's algorithm (query tiles, a running (m, l, acc) per row, score
 * and probability tiles that never leave the thread's working set). The loop nest is in
 * tiled_tpl.h, instantiated here for float (f32, f16, bf16 storage: f32 accumulation, the
 * ISA's kernels from src/simd/; with AMX, the forward's two products of bf16 storage on tile
 * registers) and double (f64 storage, portable). Tile sizes: core/plan.c.
 *
 * Extra memory: one workspace per thread, O(Bq x D + Bk x D + Br x Bk) for the forward (the
 * backward's holds five Bq x Bk tiles), independent of sequence length; the backward's single
 * pass adds dQ of a kv head's query heads, group x Sq x Dqk, up to 8 MiB a thread
 * (core/plan.c).
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/recurrence.h"
#include "internal.h"
#include "simd/kernels.h"

/* The block operations: the context's kernel set for float, portable code for double. */
#define FT_GEMM_F32(kern, m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)                         \
    fai_gemm_f32(kern, m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)
#define FT_GEMM_AT_F32(kern, m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)                      \
    fai_gemm_at_f32(kern, m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)
#define FT_GEMM_AT_F64(kern, m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)                      \
    fai_gemm_at_f64(m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)
#define FT_EXPSUM_F32(kern, n, x, m, y) (kern)->expsum(n, x, m, y)
#define FT_TRANSPOSE_F32(kern, rows, cols, src, lds, dst, ldd)                                  \
    (kern)->transpose(rows, cols, src, lds, dst, ldd)
#define FT_GEMM_F64(kern, m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)                         \
    fai_gemm_f64(m, n, k, a, lda, b, ldb, c, ldc, acc, cscale)
#define FT_TRANSPOSE_F64(kern, rows, cols, src, lds, dst, ldd)                                  \
    fai_transpose_f64(rows, cols, src, lds, dst, ldd)
#define FT_COLDOT_F32(kern, n, k, a, lda, b, ldb, out) (kern)->coldot(n, k, a, lda, b, ldb, out)
#define FT_COLDOT_F64(kern, n, k, a, lda, b, ldb, out) fai_coldot_f64(n, k, a, lda, b, ldb, out)
#define FT_DSOFTMAX_F32(kern, n, s, lse, dp, di, scale, p, ds)                                  \
    (kern)->dsoftmax(n, s, lse, dp, di, scale, p, ds)
#define FT_FINITE_F32(kern, n, x) (kern)->finite(n, x)
#define FT_FINITE_F64(kern, n, x) fai_finite_f64(n, x)
/* Rows per panel of the packed query tile: the GEMM kernel's MR (f32); any for f64's portable
 * GEMM. */
#define FT_PANEL_F32(kern) ((kern)->mr)
#define FT_PANEL_F64(kern) ((void)(kern), (int64_t)8)
/* The kernel set's tile products (AMX) where they take a forward: bf16 storage, Dqk a multiple
 * of 32 and Dv of 16 (their k and n steps); else NULL. f64 never has them (its calls compile
 * to nothing). */
static const fai_kernels_bf16 *tile_products(const fai_kernels_f32 *kern, fa_dtype dt,
                                             int64_t dqk, int64_t dv)
{
    const fai_kernels_bf16 *t = kern->bf16;
    return t && dt == FA_BF16 && dqk % 32 == 0 && dv % 16 == 0 ? t : NULL;
}
#define FT_TILES_F32(pr, kern) tile_products(kern, (pr)->dtype, (pr)->dqk, (pr)->dv)
#define FT_TILES_F64(pr, kern) ((void)(pr), (void)(kern), (const fai_kernels_bf16 *)NULL)
#define FT_TILES_QK_F32(t, m, c0, c1, d, q, ldq, kt, ldt, s, lds, scale)                       \
    (t)->qk(m, c0, c1, d, q, ldq, kt, ldt, s, lds, scale)
#define FT_TILES_QK_F64(t, m, c0, c1, d, q, ldq, kt, ldt, s, lds, scale)                       \
    ((void)(t), (void)(scale))
#define FT_TILES_PV_F32(t, m, c0, c1, nk, dv, p, ldp, vt, acc, ldacc, a, scratch)              \
    (t)->pv(m, c0, c1, nk, dv, p, ldp, vt, acc, ldacc, a, scratch)
#define FT_TILES_PV_F64(t, m, c0, c1, nk, dv, p, ldp, vt, acc, ldacc, a, scratch) ((void)(t))

static void dsoftmax_f64(int64_t n, const double *s, double lse, const double *dp, double di,
                         double scale, double *p, double *ds)
{
    for (int64_t c = 0; c < n; c++) {
        p[c] = fai_exp(s[c] - lse);
        ds[c] = scale * (p[c] * (dp[c] - di));
    }
}
#define FT_DSOFTMAX_F64(kern, n, s, lse, dp, di, scale, p, ds)                                  \
    dsoftmax_f64(n, s, lse, dp, di, scale, p, ds)

static double expsum_f64(int64_t n, const double *x, double m, double *y)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += y[i] = fai_exp(x[i] - m);
    return sum;
}
#define FT_EXPSUM_F64(kern, n, x, m, y) expsum_f64(n, x, m, y)
#define FT_MAX_F32(kern, n, x) (kern)->max(n, x)

static double max_f64(int64_t n, const double *x)
{
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = x[i] > m || x[i] != x[i] ? x[i] : m;
    return m;
}
#define FT_MAX_F64(kern, n, x) max_f64(n, x)

#define FT float
#define FAI_T(name) name##_f32
#define FT_DTYPE FA_F32
#define FT_GEMM FT_GEMM_F32
#define FT_GEMM_AT FT_GEMM_AT_F32
#define FT_EXPSUM FT_EXPSUM_F32
#define FT_MAX FT_MAX_F32
#define FT_TRANSPOSE FT_TRANSPOSE_F32
#define FT_COLDOT FT_COLDOT_F32
#define FT_DSOFTMAX FT_DSOFTMAX_F32
#define FT_FINITE FT_FINITE_F32
#define FT_PANEL FT_PANEL_F32
#define FT_TILES FT_TILES_F32
#define FT_TILES_QK FT_TILES_QK_F32
#define FT_TILES_PV FT_TILES_PV_F32
#define FT_LOAD(kern, src, dt, n, dst) (kern)->widen(src, dt, n, dst)
#define FT_STORE(kern, dst, dt, n, src) (kern)->narrow(dst, dt, n, src)
#define FT_SCORE fai_score_f32
#define FT_MOVE fai_online_move_f32
#define FT_FINALIZE fai_online_finalize_f32
#include "tiled_tpl.h"
#undef FT
#undef FAI_T
#undef FT_DTYPE
#undef FT_LOAD
#undef FT_STORE
#undef FT_SCORE
#undef FT_MOVE
#undef FT_FINALIZE
#undef FT_GEMM
#undef FT_GEMM_AT
#undef FT_EXPSUM
#undef FT_MAX
#undef FT_TRANSPOSE
#undef FT_COLDOT
#undef FT_DSOFTMAX
#undef FT_FINITE
#undef FT_PANEL
#undef FT_TILES
#undef FT_TILES_QK
#undef FT_TILES_PV

#define FT double
#define FAI_T(name) name##_f64
#define FT_DTYPE FA_F64
#define FT_GEMM FT_GEMM_F64
#define FT_GEMM_AT FT_GEMM_AT_F64
#define FT_EXPSUM FT_EXPSUM_F64
#define FT_MAX FT_MAX_F64
#define FT_TRANSPOSE FT_TRANSPOSE_F64
#define FT_COLDOT FT_COLDOT_F64
#define FT_DSOFTMAX FT_DSOFTMAX_F64
#define FT_FINITE FT_FINITE_F64
#define FT_PANEL FT_PANEL_F64
#define FT_TILES FT_TILES_F64
#define FT_TILES_QK FT_TILES_QK_F64
#define FT_TILES_PV FT_TILES_PV_F64
#define FT_LOAD(kern, src, dt, n, dst) fai_load_f64(src, dt, n, dst)
#define FT_STORE(kern, dst, dt, n, src) fai_store_f64(dst, dt, n, src)
#define FT_SCORE fai_score_f64
#define FT_MOVE fai_online_move_f64
#define FT_FINALIZE fai_online_finalize_f64
#include "tiled_tpl.h"

fai_tiles fai_tiled_tiles(const fa_context *ctx, int64_t dqk, int64_t dv, fa_dtype d,
                          int backward)
{
    const size_t es = d == FA_F64 ? sizeof(double) : sizeof(float);
    const int strip_tiles = !backward && tile_products(ctx->kernels, d, dqk, dv);
    if (ctx->forced_tiles.bq > 0) {
        fai_tiles t = ctx->forced_tiles;
        if (t.br == 0) {
            const int64_t br = strip_tiles ? fai_plan_strip_tiles(&ctx->cache, t.bk)
                                           : fai_plan_strip(&ctx->cache, t.bk, es);
            t.br = br < t.bq ? br : t.bq;
        }
        return t;
    }
    if (backward)
        return fai_plan_tiles_backward(&ctx->cache, dqk, dv, es);
    fai_tiles t = fai_plan_tiles(&ctx->cache, dqk, dv, es);
    if (strip_tiles) {
        const int64_t br = fai_plan_strip_tiles(&ctx->cache, t.bk);
        t.br = br < t.bq ? br : t.bq;
    }
    return t;
}

static fa_status tiled_forward(fa_context *ctx, const fai_problem *pr)
{
    fai_tiles tl = fai_tiled_tiles(ctx, pr->dqk, pr->dv, pr->dtype, 0);
    return pr->dtype == FA_F64 ? forward_f64(ctx, pr, tl) : forward_f32(ctx, pr, tl);
}

static fa_status tiled_backward(fa_context *ctx, const fai_problem *pr)
{
    fai_tiles tl = fai_tiled_tiles(ctx, pr->dqk, pr->dv, pr->dtype, 1);
    return pr->dtype == FA_F64 ? backward_f64(ctx, pr, tl) : backward_f32(ctx, pr, tl);
}

const fai_backend fai_backend_tiled = {tiled_forward, tiled_backward};
