#include "config.h"

#include "harness.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"              /* fai_problem_make */
#include "backends/tiled/plan.h" /* fai_tiled_tiles, fai_tiled_decode_keys */
#include "core/philox.h"
#include "base/dtype.h"
#include "simd/kernels.h"          /* fai_kernels_for: the sets the ISA loops compare */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s) { return ((double)(splitmix(s) >> 11) + 0.5) * 0x1p-53; }

/* Every storage buffer sits between two guard zones of HT_GUARD bytes of HT_GUARD_BYTE:
 * ht_is_poisoned and ht_free check them, so a write outside a tensor fails the test that
 * made it (ASan would see it too, but only a byte past the allocation). */
#define HT_GUARD 256
#define HT_GUARD_BYTE 0x5A

static void *guarded_alloc(size_t n)
{
    unsigned char *p = malloc(n + 2 * HT_GUARD);
    ck_assert_ptr_nonnull(p);
    memset(p, HT_GUARD_BYTE, HT_GUARD);
    memset(p + HT_GUARD, 0, n);
    memset(p + HT_GUARD + n, HT_GUARD_BYTE, HT_GUARD);
    return p + HT_GUARD;
}

int ht_guards_intact(const ht_tensor *x)
{
    const unsigned char *p = x->buf;
    if (!p)
        return 1;
    for (size_t i = 0; i < HT_GUARD; i++)
        if (p[-1 - (ptrdiff_t)i] != HT_GUARD_BYTE || p[x->nbytes + i] != HT_GUARD_BYTE)
            return 0;
    return 1;
}

uint32_t ht_dropout_draw(uint64_t seed, uint64_t offset, uint64_t head, uint64_t i, uint64_t j)
{
    fai_u32x4 hc = {{(uint32_t)head, (uint32_t)(head >> 32), (uint32_t)offset,
                     (uint32_t)(offset >> 32)}};
    fai_u32x4 key = fai_philox4x32_10(hc, (uint32_t)seed, (uint32_t)(seed >> 32));
    fai_u32x4 c = {{(uint32_t)(j / 4), (uint32_t)(j / 4 >> 32), (uint32_t)i, (uint32_t)(i >> 32)}};
    return fai_philox4x32_10(c, key.v[0], key.v[1]).v[j % 4];
}

void ht_alloc(ht_tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D,
              sw_layout layout)
{
    memset(x, 0, sizeof *x);
    size_t es = fai_dtype_size(dt);
    fa_tensor_init(&x->t, NULL, dt, B, S, H, D, layout == SW_BHSD);
    if (layout == SW_PADDED) { /* rows 3 elements apart beyond D, heads 1 more, batches 7 */
        x->t.head_stride = D + 3;
        x->t.seq_stride = H * (D + 3) + 1;
        x->t.batch_stride = S * x->t.seq_stride + 7;
    }
    int64_t n = B > 0 ? (B - 1) * x->t.batch_stride + S * x->t.seq_stride + H * x->t.head_stride
                      : 0;
    x->nbytes = (size_t)(n + D) * es + 8;
    x->buf = guarded_alloc(x->nbytes);
    x->t.data = x->buf;
    x->buf64 = calloc((size_t)(B * S * H * D) + 1, sizeof(double));
    fa_tensor_init(&x->t64, x->buf64, FA_F64, B, S, H, D, 0);
}

void ht_alloc_lse(ht_tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H)
{
    memset(x, 0, sizeof *x);
    size_t es = fai_dtype_size(dt);
    /* stored B x H x S, as FlashAttention returns it */
    x->t = (fa_tensor){NULL, dt, B, S, H, 1, H * S, 1, S, 1};
    x->nbytes = (size_t)(B * H * S) * es + 8;
    x->buf = guarded_alloc(x->nbytes);
    x->t.data = x->buf;
    x->buf64 = calloc((size_t)(B * H * S) + 1, sizeof(double));
    x->t64 = (fa_tensor){x->buf64, FA_F64, B, S, H, 1, H * S, 1, S, 1};
}

void ht_free(ht_tensor *x)
{
    ck_assert_msg(ht_guards_intact(x), "a write outside a tensor's storage (guard bytes changed)");
    if (x->buf)
        free((unsigned char *)x->buf - HT_GUARD);
    free(x->buf64);
    memset(x, 0, sizeof *x);
}

static double round_to(fa_dtype dt, double v)
{
    switch (dt) {
    case FA_F32: return (float)v;
    case FA_F16: return fai_f16_to_f64(fai_f64_to_f16(v));
    case FA_BF16: return fai_bf16_to_f64(fai_f64_to_bf16(v));
    case FA_E4M3: return fai_e4m3_to_f64(fai_f64_to_e4m3(v));
    case FA_E5M2: return fai_e5m2_to_f64(fai_f64_to_e5m2(v));
    default: return v;
    }
}

void ht_set(ht_tensor *x, int64_t b, int64_t s, int64_t h, int64_t d, double v)
{
    v = round_to(x->t.dtype, v);
    fai_store_f64((char *)fai_row(&x->t, b, s, h) + d * (int64_t)fai_dtype_size(x->t.dtype),
                  x->t.dtype, 1, &v);
    *((double *)fai_row(&x->t64, b, s, h) + d) = v;
}

double ht_get(const ht_tensor *x, int64_t b, int64_t s, int64_t h, int64_t d)
{
    double v;
    fai_load_f64((const char *)fai_row(&x->t, b, s, h) + d * (int64_t)fai_dtype_size(x->t.dtype),
                 x->t.dtype, 1, &v);
    return v;
}

void ht_fill(ht_tensor *x, uint64_t seed, double lo, double hi)
{
    uint64_t st = seed * 0x2545F4914F6CDD1Dull + 1;
    for (int64_t b = 0; b < x->t.batch; b++)
        for (int64_t s = 0; s < x->t.seqlen; s++)
            for (int64_t h = 0; h < x->t.heads; h++)
                for (int64_t d = 0; d < x->t.headdim; d++) {
                    double v = lo <= hi ? lo + (hi - lo) * unif(&st)
                                        : sqrt(-2 * log(unif(&st))) * cos(6.283185307179586 * unif(&st));
                    ht_set(x, b, s, h, d, v);
                }
}

void ht_poison(ht_tensor *x) { memset(x->buf, 0xA5, x->nbytes); }

int ht_is_poisoned(const ht_tensor *x)
{
    if (!ht_guards_intact(x))
        return 0;
    const unsigned char *p = x->buf;
    for (size_t i = 0; i < x->nbytes; i++)
        if (p[i] != 0xA5)
            return 0;
    return 1;
}

fa_isa ht_isa = FA_ISA_AUTO;
const struct fai_kernels_f32_s *ht_kernels = NULL;

const fa_isa ht_isas[] = {
#define FAI_ISA(name, NAME) FA_ISA_##NAME,
#include "simd/isas.def"
#undef FAI_ISA
};
const int ht_nisas = (int)(sizeof ht_isas / sizeof *ht_isas);

/* Whether two kernel sets run the same functions for storage dtype dt: the tiled backend runs
 * f64 storage on the one f64 set whatever the ISA (backends/tiled/tiled.c), f32 and f16 on the
 * f32 slots (mr, nr and the functions, names included: the AMX and AVX512_BF16 sets keep the
 * AVX-512 set's), bf16 on those and the tile products. */
static int same_kernels(const fai_kernels_f32 *a, const fai_kernels_f32 *b, fa_dtype dt)
{
    if (dt == FA_F64)
        return 1;
    const size_t from = offsetof(fai_kernels_f32, mr), to = offsetof(fai_kernels_f32, bf16);
    return !memcmp((const char *)a + from, (const char *)b + from, to - from) &&
           (dt != FA_BF16 || a->bf16 == b->bf16);
}

int ht_isa_distinct(int i, fa_dtype dt)
{
    const fai_kernels_f32 *k = fai_kernels_for(ht_isas[i]);
    if (!k)
        return 0;
    for (int j = 0; j < i; j++) {
        const fai_kernels_f32 *e = fai_kernels_for(ht_isas[j]);
        if (e && same_kernels(e, k, dt))
            return 0;
    }
    return 1;
}

int ht_isa_tested(int i, fa_dtype dt)
{
    if (!ht_isa_distinct(i, dt))
        return 0;
    if (ht_isas[i] == FA_ISA_SCALAR && getenv("FA_CROSS_BUILD"))
        for (int j = 0; j < ht_nisas; j++)
            if (ht_isas[j] != FA_ISA_SCALAR && fai_kernels_for(ht_isas[j]))
                return 0;
    return 1;
}

/* The environment variables the library reads (docs/DESIGN.md §2, FLASHATTN_FAULT_ALLOC
 * aside: its tests set it in a child), and their values at the first ht_tcase_create. */
static const char *const env_names[] = {"FA_BACKEND", "FA_ISA", "FA_TILES", "FA_BACKWARD_PASSES",
                                        "FA_DECODE", "FA_CUDA_KERNEL"};
#define ENV_COUNT (sizeof env_names / sizeof *env_names)
static char *env_saved[ENV_COUNT];
static int env_taken;

static void state_restore(void)
{
    ht_isa = FA_ISA_AUTO;
    ht_kernels = NULL;
    for (size_t i = 0; i < ENV_COUNT; i++)
        if (env_saved[i])
            setenv(env_names[i], env_saved[i], 1);
        else
            unsetenv(env_names[i]);
}

TCase *ht_tcase_create(const char *name)
{
    if (!env_taken) {
        for (size_t i = 0; i < ENV_COUNT; i++) {
            const char *v = getenv(env_names[i]);
            env_saved[i] = v ? strdup(v) : NULL;
        }
        env_taken = 1;
    }
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, NULL, state_restore);
    return tc;
}

fa_context *ht_context(fa_backend be, int threads)
{
    fa_options o;
    fa_options_init(&o);
    o.backend = be;
    o.num_threads = threads;
    o.isa = ht_isa;
    fa_context *ctx = NULL;
    fa_status s = fa_context_create(&o, &ctx);
    ck_assert_msg(s == FA_OK, "context %s: %s", fa_backend_name(be), fa_last_error());
    if (ht_kernels)
        ctx->kernels = ht_kernels;
    return ctx;
}

fa_status ht_forward(fa_backend be, int threads, const fa_params *p, const fa_tensor *q,
                     const fa_tensor *k, const fa_tensor *v, fa_tensor *out, fa_tensor *lse)
{
    fa_context *ctx = ht_context(be, threads);
    fa_status s = fa_forward(ctx, p, q, k, v, out, lse);
    fa_context_destroy(ctx);
    return s;
}

fa_status ht_backward(fa_backend be, int threads, const fa_params *p, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                      fa_tensor *dk, fa_tensor *dv)
{
    fa_context *ctx = ht_context(be, threads);
    fa_status s = fa_backward(ctx, p, q, k, v, out, lse, dout, dq, dk, dv);
    fa_context_destroy(ctx);
    return s;
}

/* Elements [d, d + min(left, HT_CHUNK)) of row (b, s, h) of x, through float64: the max
 * functions below read rows in chunks (element by element, as ht_get, they took a large share
 * of the sweep's time under qemu). */
enum { HT_CHUNK = 64 };
static void row_chunk(const ht_tensor *x, int64_t b, int64_t s, int64_t h, int64_t d,
                      int64_t left, double *out)
{
    fai_load_f64((const char *)fai_row(&x->t, b, s, h) + d * (int64_t)fai_dtype_size(x->t.dtype),
                 x->t.dtype, left < HT_CHUNK ? left : HT_CHUNK, out);
}

const char *ht_stats(const fa_comparison *c)
{
    static _Thread_local char buf[400];
    snprintf(buf, sizeof buf,
             "bias %.3g (<= %.3g)%s, scale %.9g (1 +- %.3g)%s, rms %.3g (<= %.3g)%s, "
             "decorr %.3g (<= %.3g)%s",
             c->bias, c->bias_bound, c->failed & FA_CMP_BIAS ? " FAILED" : "", c->scale,
             c->scale_bound, c->failed & FA_CMP_SCALE ? " FAILED" : "", c->rms, c->rms_bound,
             c->failed & FA_CMP_RMS ? " FAILED" : "", c->decorr, c->decorr_bound,
             c->failed & FA_CMP_DECORR ? " FAILED" : "");
    return buf;
}

double ht_max_err(const ht_tensor *got, const ht_tensor *ref)
{
    double m = 0, gs[HT_CHUNK], rs[HT_CHUNK];
    const int64_t dim = got->t.headdim;
    for (int64_t b = 0; b < got->t.batch; b++)
        for (int64_t s = 0; s < got->t.seqlen; s++)
            for (int64_t h = 0; h < got->t.heads; h++)
                for (int64_t d = 0; d < dim; d++) {
                    const int64_t i = d % HT_CHUNK;
                    if (i == 0) {
                        row_chunk(got, b, s, h, d, dim - d, gs);
                        row_chunk(ref, b, s, h, d, dim - d, rs);
                    }
                    const double g = gs[i], r = rs[i];
                    double e;
                    if (isnan(g) || isnan(r))
                        e = isnan(g) && isnan(r) ? 0 : INFINITY;
                    else if (g == r) /* also equal infinities */
                        e = 0;
                    else
                        e = fabs(g - r);
                    if (e > m)
                        m = e;
                }
    return m;
}

double ht_max_abs(const ht_tensor *x)
{
    double m = 0, xs[HT_CHUNK];
    const int64_t dim = x->t.headdim;
    for (int64_t b = 0; b < x->t.batch; b++)
        for (int64_t s = 0; s < x->t.seqlen; s++)
            for (int64_t h = 0; h < x->t.heads; h++)
                for (int64_t d = 0; d < dim; d++) {
                    if (d % HT_CHUNK == 0)
                        row_chunk(x, b, s, h, d, dim - d, xs);
                    const double a = fabs(xs[d % HT_CHUNK]);
                    if (a > m && isfinite(a))
                        m = a;
                }
    return m;
}

void ht_tiles(int64_t dqk, int64_t dv, fa_dtype dt, int64_t *bq, int64_t *bk)
{
    fa_context *ctx = ht_context(FA_BACKEND_TILED, 1);
    /* Keys: the larger of the forward's and the backward's Bk (powers of two: a multiple of the
     * other). Query rows: the backward's tile only; the forward's results do not depend on its query
     * tile (check_semantics.c: forward_bits_independent_of_query_grouping), and its 1024 rows
     * would double the sizes (and ALiBi's reach) of the cases built on it */
    fai_tiles f = fai_tiled_tiles(ctx, dqk, dv, dt, 0), b = fai_tiled_tiles(ctx, dqk, dv, dt, 1);
    fa_context_destroy(ctx);
    *bq = b.bq;
    *bk = f.bk > b.bk ? f.bk : b.bk;
}

int64_t ht_decode_keys(int threads, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                       const fa_tensor *v)
{
    fa_context *ctx = ht_context(FA_BACKEND_TILED, threads);
    fai_problem pr;
    int64_t keys = -1;
    if (fai_problem_make(&pr, p, q, k, v, 0) == FA_OK)
        keys = fai_tiled_decode_keys(ctx, &pr);
    fa_context_destroy(ctx);
    return keys;
}

void ht_bundle_alloc(ht_bundle *x, fa_dtype dt, const sw_dims *d, sw_layout lay, fa_dtype lse_dt)
{
    ht_tensor *const t[SW_NTENSORS] = {
        [SW_Q] = &x->q,     [SW_K] = &x->k,   [SW_V] = &x->v,   [SW_DOUT] = &x->dout,
        [SW_OUT] = &x->out, [SW_DQ] = &x->dq, [SW_DK] = &x->dk, [SW_DV] = &x->dv,
        [SW_LSE] = &x->lse};
    for (int i = 0; i < SW_NTENSORS; i++) {
        int64_t s[4];
        sw_shape(d, (sw_tensor)i, s);
        if (i == SW_LSE)
            ht_alloc_lse(t[i], lse_dt, s[0], s[1], s[2]);
        else
            ht_alloc(t[i], dt, s[0], s[1], s[2], s[3], lay);
    }
}

void ht_bundle_free(ht_bundle *x)
{
    ht_free(&x->q), ht_free(&x->k), ht_free(&x->v), ht_free(&x->dout), ht_free(&x->out);
    ht_free(&x->lse), ht_free(&x->dq), ht_free(&x->dk), ht_free(&x->dv);
}

void ht_bundle_draw(ht_bundle *x, const sw_case *c)
{
    ht_tensor *const in[4] = {[SW_Q] = &x->q, [SW_K] = &x->k, [SW_V] = &x->v,
                              [SW_DOUT] = &x->dout};
    for (int i = 0; i < 4; i++) {
        uint64_t seed;
        double lo, hi;
        sw_draw(c, (sw_tensor)i, &seed, &lo, &hi);
        ht_fill(in[i], seed, lo, hi);
    }
}

int ht_lse_yardstick(const fa_params *p, const ht_bundle *x, fa_dtype dt, ht_tensor *lse,
                     fa_tolerance *tol)
{
    fa_dtype ydt;
    ck_assert_int_eq(fa_lse_rule(NULL, dt, x->lse.t.dtype, 0, &ydt, tol), FA_OK);
    if (ydt == dt)
        return 0;
    ck_assert_int_eq(ydt, FA_F32);
    const ht_tensor *const src[3] = {&x->q, &x->k, &x->v};
    ht_tensor in[3], out;
    for (int i = 0; i < 3; i++) { /* from the float64 twin: the same values, BSHD */
        const fa_tensor *t = &src[i]->t;
        const size_t n = (size_t)(t->batch * t->seqlen * t->heads * t->headdim);
        ht_alloc(&in[i], FA_F32, t->batch, t->seqlen, t->heads, t->headdim, SW_BSHD);
        ck_assert_int_eq(fa_convert(src[i]->buf64, FA_F64, in[i].buf, FA_F32, n), FA_OK);
        memcpy(in[i].buf64, src[i]->buf64, n * sizeof(double));
    }
    const fa_tensor *q = &x->q.t;
    ht_alloc(&out, FA_F32, q->batch, q->seqlen, q->heads, x->v.t.headdim, SW_BSHD);
    ht_alloc_lse(lse, x->lse.t.dtype, q->batch, q->seqlen, q->heads);
    const fa_status s = ht_forward(FA_BACKEND_CONVENTIONAL, 2, p, &in[0].t, &in[1].t, &in[2].t,
                                   &out.t, &lse->t);
    ck_assert_msg(s == FA_OK, "the LSE's f32 yardstick: %s", fa_last_error());
    ht_free(&in[0]), ht_free(&in[1]), ht_free(&in[2]), ht_free(&out);
    return 1;
}
