/*
 * The CUDA backend against the float64 reference: the sweep's cases (tests/sweep_cases.c:
 * check_backends.c's, every feature of docs/DESIGN.md §1, every storage dtype, sizes around
 * the kernels' tiles, primes, Sq != Sk both ways, head dims not multiple of 8; and the
 * tensor-core head dims 32..256),
 * under the same tolerance rule (fa_compare against the conventional path in the same dtype);
 * dropout decisions identical to the CPU reference's; empty rows exactly 0 with LSE -inf;
 * masked NaN/inf never reaching an output; host pointers refused with nothing written;
 * deterministic backward; device bytes in fa_memory_stats; bias and keep-mask tensors and the
 * bias gradient (test case "bias"); FP8 inputs and caches with descales, block masks (test case
 * "fp8_blocks").
 *
 * Its own program, because it needs a GPU: with no CUDA device it exits 77 (automake SKIP).
 * CHECK_CUDA_LIST=1 prints the sweep's runs instead, device or none.
 */
#include "config.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h" /* fai_fault_arm */
#include "harness.h"

/* ------------------------------------------------------------------ device twins */

/* A device copy of a harness tensor: same bytes, same strides. */
typedef struct {
    ht_tensor *host;
    void *dev;
    fa_tensor t;
} dtensor;

static void d_up(dtensor *d, ht_tensor *h)
{
    d->host = h;
    ck_assert_int_eq(cudaMalloc(&d->dev, h->nbytes), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d->dev, h->buf, h->nbytes, cudaMemcpyHostToDevice), cudaSuccess);
    d->t = h->t;
    d->t.data = (char *)d->dev + ((char *)h->t.data - (char *)h->buf);
}

static void d_down(dtensor *d)
{
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d->host->buf, d->dev, d->host->nbytes, cudaMemcpyDeviceToHost),
                     cudaSuccess);
}

static void d_free(dtensor *d) { cudaFree(d->dev); }

static fa_context *cuda_context(int deterministic)
{
    fa_options o;
    fa_options_init(&o);
    o.backend = FA_BACKEND_CUDA;
    o.deterministic = deterministic;
    fa_context *ctx = NULL;
    fa_status s = fa_context_create(&o, &ctx);
    ck_assert_msg(s == FA_OK, "cuda context: %s", fa_last_error());
    return ctx;
}

/* Forward and backward on the GPU: x's inputs uploaded, its outputs poisoned there first and
 * downloaded after, so an unwritten element shows. */
static void run_cuda(fa_context *ctx, const fa_params *p, ht_bundle *x, int backward)
{
    dtensor q, k, v, dout, out, lse, dq, dk, dv;
    ht_poison(&x->out), ht_poison(&x->lse), ht_poison(&x->dq), ht_poison(&x->dk),
        ht_poison(&x->dv);
    d_up(&q, &x->q), d_up(&k, &x->k), d_up(&v, &x->v), d_up(&dout, &x->dout);
    d_up(&out, &x->out), d_up(&lse, &x->lse), d_up(&dq, &x->dq), d_up(&dk, &x->dk);
    d_up(&dv, &x->dv);
    fa_status s = fa_forward(ctx, p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    ck_assert_msg(s == FA_OK, "cuda forward: %s", fa_last_error());
    if (backward) {
        s = fa_backward(ctx, p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
        ck_assert_msg(s == FA_OK, "cuda backward: %s", fa_last_error());
    }
    d_down(&out), d_down(&lse);
    if (backward)
        d_down(&dq), d_down(&dk), d_down(&dv);
    d_free(&q), d_free(&k), d_free(&v), d_free(&dout), d_free(&out), d_free(&lse), d_free(&dq);
    d_free(&dk), d_free(&dv);
}

static void run_cpu(fa_backend be, const fa_params *p, ht_bundle *in, ht_bundle *o, int f64_twin)
{
    const fa_tensor *q = f64_twin ? &in->q.t64 : &in->q.t, *k = f64_twin ? &in->k.t64 : &in->k.t,
                    *v = f64_twin ? &in->v.t64 : &in->v.t,
                    *g = f64_twin ? &in->dout.t64 : &in->dout.t;
    fa_status s = ht_forward(be, 2, p, q, k, v, &o->out.t, &o->lse.t);
    ck_assert_msg(s == FA_OK, "%s forward: %s", fa_backend_name(be), fa_last_error());
    s = ht_backward(be, 2, p, q, k, v, &o->out.t, &o->lse.t, g, &o->dq.t, &o->dk.t, &o->dv.t);
    ck_assert_msg(s == FA_OK, "%s backward: %s", fa_backend_name(be), fa_last_error());
}

/* The yardstick conv's rule, factor 3 for gradients, with the allowances of `allow` (an LSE
 * held to its own dtype: ht_lse_yardstick; NULL for none). */
static void compare_rule(const char *what, const char *label, const ht_tensor *conv,
                         const ht_tensor *cand, const ht_tensor *ref, int grad,
                         const fa_tolerance *allow)
{
    const fa_tolerance tol = {.factor = grad ? 3 : 2,
                              .allowance = allow ? allow->allowance : 0,
                              .allowance_rel = allow ? allow->allowance_rel : 0};
    fa_comparison c;
    ck_assert_int_eq(fa_compare(&cand->t, &ref->t, &conv->t, &tol, &c), FA_OK);
    ck_assert_msg(c.pass,
                  "%s %s: cuda error %.3g, %s (worst at b%lld s%lld h%lld d%lld: %g vs %g); %s",
                  label, what, c.max_abs, c.rule, (long long)c.worst[0], (long long)c.worst[1],
                  (long long)c.worst[2], (long long)c.worst[3], c.worst_cand, c.worst_ref,
                  ht_stats(&c));
}

static void compare(const char *what, const char *label, const ht_tensor *conv,
                    const ht_tensor *cand, const ht_tensor *ref, int grad)
{
    compare_rule(what, label, conv, cand, ref, grad, NULL);
}

/* ------------------------------------------------------------------ the sweep */

/*
 * The sweep's cases (tests/sweep_cases.c) on the device. Sizes relative to tiles are resolved
 * against 64 query rows and 64 keys: around the tensor-core forward's tiles (128 query rows x
 * 64 keys for D <= 128, 64 x 32 at D 256). Each test runs a plan: a list of runs (case, dtype,
 * kernel choice, backward mode, sinks) made once by plans_make from the cases' marks and
 * names, and printed by CHECK_CUDA_LIST=1 without a device.
 */
static const fa_dtype dtypes[4] = {FA_F64, FA_F32, FA_F16, FA_BF16};
enum { F64 = 1, F32 = 2, F16 = 4, BF16 = 8, HALF = F16 | BF16, ALL = 15 }; /* sets of dtypes[] */

typedef struct {
    sw_case c;          /* a copy: cuda_negative_logits_padding_keys makes its cases */
    fa_dtype dt;
    const char *kernel; /* FA_CUDA_KERNEL (NULL: unset) */
    int det;            /* the deterministic backward */
    const float *sinks; /* sink_logits (NULL: none) */
} cuda_run;

typedef struct {
    const char *test;
    int n;
    cuda_run runs[160];
} cuda_plan;

/* Run r's sizes: its case's, relative sizes resolved against 64 query rows and 64 keys. */
static sw_dims dims_of(const cuda_run *r) { return sw_dims_of(&r->c, 64, 64); }

/* The LSE's dtype (sw_lse_dtype) of run r. */
static fa_dtype lse_dtype(const cuda_run *r)
{
    const sw_dims d = dims_of(r);
    return sw_lse_dtype(&r->c, &d, r->dt);
}

/*
 * One run against the float64 reference, under the tolerance rule with the conventional path
 * in the same dtype as the yardstick; rows the reference finds empty must be exactly 0 with
 * LSE -inf.
 */
static void sweep_run(const cuda_run *r)
{
    const sw_case *c = &r->c;
    const sw_dims d = dims_of(r);
    const fa_dtype dt = r->dt, lse_dt = lse_dtype(r);
    fa_params p;
    sw_params(c, &p);
    p.sink_logits = r->sinks;
    ht_bundle conv, gpu, ref;
    ht_bundle_alloc(&conv, dt, &d, c->layout, lse_dt);
    ht_bundle_alloc(&gpu, dt, &d, c->layout, lse_dt);
    ht_bundle_alloc(&ref, FA_F64, &d, SW_BSHD, FA_F64);
    ht_bundle_draw(&conv, c);
    run_cpu(FA_BACKEND_CONVENTIONAL, &p, &conv, &conv, 0);
    run_cpu(FA_BACKEND_REFERENCE, &p, &conv, &ref, 1);
    ht_free(&gpu.q), ht_free(&gpu.k), ht_free(&gpu.v), ht_free(&gpu.dout);
    gpu.q = conv.q, gpu.k = conv.k, gpu.v = conv.v, gpu.dout = conv.dout; /* shared inputs */
    if (r->kernel)
        setenv("FA_CUDA_KERNEL", r->kernel, 1);
    fa_context *ctx = cuda_context(r->det);
    run_cuda(ctx, &p, &gpu, 1);
    fa_context_destroy(ctx);
    unsetenv("FA_CUDA_KERNEL");
    char label[200];
    snprintf(label, sizeof label, "%s %s%s%s%s%s (B%ld Sq%ld Sk%ld H%ld/%ld D%ld/%ld)", c->name,
             fa_dtype_name(dt), r->kernel ? " " : "", r->kernel ? r->kernel : "",
             r->det ? " deterministic" : "", r->sinks ? " sinks" : "", (long)d.b, (long)d.sq,
             (long)d.sk, (long)d.hq, (long)d.hk, (long)d.dqk, (long)d.dv);
    compare("out", label, &conv.out, &gpu.out, &ref.out, 0);
    ht_tensor lse_y; /* the LSE held to its own dtype: f32 for the 16-bit dtypes */
    fa_tolerance lse_tol;
    const int own_lse = ht_lse_yardstick(&p, &conv, dt, &lse_y, &lse_tol);
    compare_rule("lse", label, own_lse ? &lse_y : &conv.lse, &gpu.lse, &ref.lse, 0, &lse_tol);
    if (own_lse)
        ht_free(&lse_y);
    compare("dq", label, &conv.dq, &gpu.dq, &ref.dq, 1);
    compare("dk", label, &conv.dk, &gpu.dk, &ref.dk, 1);
    compare("dv", label, &conv.dv, &gpu.dv, &ref.dv, 1);
    /* empty rows: exactly 0 and LSE -inf */
    for (int64_t b = 0; b < d.b; b++)
        for (int64_t h = 0; h < d.hq; h++)
            for (int64_t i = 0; i < d.sq; i++) {
                if (ht_get(&ref.lse, b, i, h, 0) != -INFINITY)
                    continue;
                ck_assert_msg(ht_get(&gpu.lse, b, i, h, 0) == -INFINITY, "%s: empty row %ld LSE",
                              label, (long)i);
                for (int64_t e = 0; e < d.dv; e++)
                    ck_assert_msg(ht_get(&gpu.out, b, i, h, e) == 0, "%s: empty row %ld out",
                                  label, (long)i);
                for (int64_t e = 0; e < d.dqk; e++)
                    ck_assert_msg(ht_get(&gpu.dq, b, i, h, e) == 0, "%s: empty row %ld dq",
                                  label, (long)i);
            }
    ht_free(&gpu.out), ht_free(&gpu.lse), ht_free(&gpu.dq), ht_free(&gpu.dk), ht_free(&gpu.dv);
    ht_bundle_free(&conv), ht_bundle_free(&ref);
}

/* A plan and the test that runs it, under one name (NAME_plan, NAME). */
#define PLAN_TEST(name)                                                                           \
    static cuda_plan name##_plan = {.test = #name};                                               \
    START_TEST(name) { sweep_run(&name##_plan.runs[_i]); }                                        \
    END_TEST
#define ADD_PLAN_TEST(tc, name) tcase_add_loop_test(tc, name, 0, name##_plan.n)

PLAN_TEST(cuda_matches_reference)
PLAN_TEST(cuda_generic_matches_reference)
PLAN_TEST(cuda_mma_matches_reference)
PLAN_TEST(cuda_deterministic_matches_reference)
PLAN_TEST(cuda_large_logits)
PLAN_TEST(cuda_negative_logits_padding_keys)
PLAN_TEST(cuda_sinks_match_reference)
PLAN_TEST(cuda_sink_tokens_match_reference)
static cuda_plan *const plans[] = {
    &cuda_matches_reference_plan,     &cuda_generic_matches_reference_plan,
    &cuda_mma_matches_reference_plan, &cuda_deterministic_matches_reference_plan,
    &cuda_large_logits_plan,          &cuda_negative_logits_padding_keys_plan,
    &cuda_sinks_match_reference_plan, &cuda_sink_tokens_match_reference_plan,
};

/* Case c in each dtype of the set. */
static void plan_add(cuda_plan *pl, const sw_case *c, unsigned dts, const char *kernel, int det,
                     const float *sinks)
{
    for (int t = 0; t < 4; t++) {
        if (!(dts >> t & 1))
            continue;
        if (pl->n == (int)(sizeof pl->runs / sizeof *pl->runs)) {
            fprintf(stderr, "check_cuda: plan %s is full\n", pl->test);
            abort();
        }
        pl->runs[pl->n++] =
            (cuda_run){.c = *c, .dt = dtypes[t], .kernel = kernel, .det = det, .sinks = sinks};
    }
}

/* Every case marked `mark`, in table order. */
static void plan_marked(cuda_plan *pl, unsigned mark, unsigned dts, const char *kernel, int det)
{
    const sw_case *sel[64];
    const int n = sw_select(mark, sel, (int)(sizeof sel / sizeof *sel));
    for (int i = 0; i < n; i++)
        plan_add(pl, sel[i], dts, kernel, det, NULL);
}

/* Sinks: finite, -inf (none), one that outweighs the keys. */
static const float sinks8[8] = {0.5f, -INFINITY, 4.0f, -1.0f, 0.25f, 2.0f, -INFINITY, 1.0f};
static const float sinks4[4] = {0.5f, -INFINITY, 4.0f, -1.0f};

/* The plans: CHECK_CUDA_SMALL=1 (`small`) a short sweep for compute-sanitizer (every kernel,
 * small sizes). */
static void plans_make(int small)
{
    cuda_plan *const sweep = &cuda_matches_reference_plan,
                     *const generic = &cuda_generic_matches_reference_plan,
                     *const mma = &cuda_mma_matches_reference_plan,
                     *const det = &cuda_deterministic_matches_reference_plan,
                     *const large = &cuda_large_logits_plan,
                     *const negative = &cuda_negative_logits_padding_keys_plan,
                     *const sinks = &cuda_sinks_match_reference_plan,
                     *const tokens = &cuda_sink_tokens_match_reference_plan;
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++)
        plans[i]->n = 0;
    if (small) {
        static const struct {
            const char *name;
            unsigned dts;
        } short_sweep[] = {
            {"causal_key_tile_minus_1", ALL},       {"causal_key_tile_dropout", ALL},
            {"window_key_tile_plus_1", ALL},        {"query_tile_minus_1", ALL},
            {"query_tile_top_left_alibi", ALL},     {"query_tile_plus_1_softcap", ALL},
            {"odd_dims_window_softcap_alibi", ALL}, {"alibi_then_softcap", ALL},
            {"tc_d32_causal", ALL},                 {"tc_d64_top_left", ALL},
            {"tc_d256_causal", ALL},                {"tc_d256_everything", ALL},
            {"tc_d128_empty_rows", ALL},            {"wgmma_window", ALL},
            {"wgmma_backward_gqa", HALF},           {"wgmma_padding_keys", ALL},
            {"wgmma_d96_gqa", HALF},                {"wgmma_d256_causal", HALF},
            {"wgmma_d64_causal", HALF},             {"wgmma_d256_top_left", HALF},
        };
        for (size_t i = 0; i < sizeof short_sweep / sizeof *short_sweep; i++)
            plan_add(sweep, sw_case_named(short_sweep[i].name), short_sweep[i].dts, NULL, 0, NULL);
        plan_add(generic, sw_case_named("tc_d32_causal"), HALF, "generic", 0, NULL);
        plan_add(det, sw_case_named("tc_d32_causal"), HALF, NULL, 1, NULL);
        plan_add(det, sw_case_named("wgmma_window"), HALF, NULL, 1, NULL);
        plan_add(tokens, sw_case_named("sink_tokens_window_d64"), ALL, "mma", 0, NULL);
        return;
    }
    plan_marked(sweep, SW_CUDA, ALL, NULL, 0);
    /* the FMA path on the 16-bit dtypes too (the tensor-core shapes otherwise never reach it) */
    plan_marked(generic, SW_CUDA_TC, HALF, "generic", 0);
    /* the deterministic backward (ordered tensor-core dQ) on the tensor-core shapes */
    plan_marked(det, SW_CUDA_TC, HALF, NULL, 1);
    /* the mma.sync kernels on the shapes that the wgmma kernels take on Hopper (on other GPUs
     * the same kernels the plain sweep ran) */
    plan_marked(mma, SW_CUDA_MMA, HALF, "mma", 0);
    /* logits in [90, 100]: a kernel that skipped the max subtraction would overflow */
    plan_add(large, sw_case_named("large_logits"), ALL, NULL, 0, NULL);
    plan_add(large, sw_case_named("large_logits_causal_dropout_d64"), F64 | F32, NULL, 0, NULL);
    plan_add(large, sw_case_named("large_logits_causal_dropout_d64"), HALF, NULL, 1, NULL);
    /*
     * Logits in [-100, -90] (q in [a, b], k in [-b, -a]), so LSE is near -95, with Sk not a
     * multiple of 16 and no right bound: the tensor-core backward's last key block has padding
     * keys (zero K rows) in warp tiles classed FULL. Taken as allowed, such a key's
     * P = e^-LSE overflows, and inf times its zero K row made the whole dQ of the head NaN
     * (atomic mode). f16 and bf16, BSHD (the tensor-core path), both backward modes; D 64 and
     * 128, Sq 64 and 129, Sk 100 and 257; seeds 200 to 231 in that order (dtype fastest).
     */
    for (int i = 0; i < 32; i++) {
        const int64_t d = (i >> 2) & 1 ? 128 : 64;
        const sw_case c = {.name = "negative_logits", .seed = 200 + i,
                           .dims = {.b = 1, .sq = (i >> 3) & 1 ? 129 : 64,
                                    .sk = (i >> 4) & 1 ? 257 : 100, .hq = 2, .hk = 1, .dqk = d,
                                    .dv = d},
                           .logits = {-100, -90}};
        plan_add(negative, &c, i & 1 ? BF16 : F16, NULL, (i >> 1) & 1, NULL);
    }
    /*
     * Attention sinks on every forward kernel (FA_CUDA_KERNEL unset: the wgmma kernels on
     * Hopper; mma; generic) against the reference, forward and backward (the backward reads P
     * from the LSE, which holds the sink): a D = 128 shape whose first 200 rows have only their
     * sink (LSE = sink, O = 0), a wgmma shape, a generic-only head dim and padding keys; f16
     * and bf16 on each kernel, f32 on the default one.
     */
    static const char *const sink_cases[4] = {"tc_d128_empty_rows", "wgmma_top_left",
                                              "causal_top_left_more_queries",
                                              "wgmma_padding_keys"};
    static const char *const kernels[3] = {NULL, "mma", "generic"};
    for (int k = 0; k < 3; k++)
        for (int x = 0; x < 4; x++)
            plan_add(sinks, sw_case_named(sink_cases[x]), k ? HALF : HALF | F32, kernels[k], 0,
                     sinks8);
    /*
     * Sink tokens (StreamingLLM: the first keys beside a window) in every dtype: the generic
     * kernels take them, whatever FA_CUDA_KERNEL says (D = 128 f16 would take the tensor-core
     * kernels, which see one key run a row). Sinks over several key tiles, sinks that end
     * inside a tile the window starts in, with top-left alignment, softcap, ALiBi and dropout;
     * a decode shape with learnable sinks too.
     */
    plan_add(tokens, sw_case_named("sink_tokens_window_d64"), ALL, "mma", 0, NULL);
    plan_add(tokens, sw_case_named("sink_tokens_inside_tile"), ALL, NULL, 0, NULL);
    plan_add(tokens, sw_case_named("sink_tokens_decode_d128"), ALL, NULL, 0, sinks4);
}

/* Prints one line per run of every plan (CHECK_CUDA_LIST=1): the test, the case, and what the
 * run gives the library (fa_params as sw_params makes them, sizes, draws, kernel choice). */
static void plans_list(void)
{
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++)
        for (int j = 0; j < plans[i]->n; j++) {
            const cuda_run *r = &plans[i]->runs[j];
            const sw_dims d = dims_of(r);
            fa_params p;
            sw_params(&r->c, &p);
            double lo[2], hi[2];
            uint64_t seed;
            sw_draw(&r->c, SW_Q, &seed, &lo[0], &hi[0]);
            sw_draw(&r->c, SW_K, &seed, &lo[1], &hi[1]);
            printf("%s %s %s B%ld Sq%ld Sk%ld H%ld/%ld D%ld/%ld causal=%d window=%ld,%ld "
                   "top_left=%d softcap=%g alibi=%d dropout=%g layout=%d order=%d "
                   "sink_tokens=%ld seed=%d q=[%.17g,%.17g] k=[%.17g,%.17g] lse=%s kernel=%s "
                   "det=%d sinks=",
                   plans[i]->test, r->c.name, fa_dtype_name(r->dt), (long)d.b, (long)d.sq,
                   (long)d.sk, (long)d.hq, (long)d.hk, (long)d.dqk, (long)d.dv, p.causal,
                   (long)p.window_left, (long)p.window_right, p.align == FA_ALIGN_TOP_LEFT,
                   p.softcap, p.alibi_slopes != NULL, p.dropout_p, (int)r->c.layout,
                   (int)p.score_order, (long)p.sink_tokens, r->c.seed, lo[0], hi[0], lo[1],
                   hi[1], fa_dtype_name(lse_dtype(r)), r->kernel ? r->kernel : "-", r->det);
            for (int64_t h = 0; r->sinks && h < d.hq; h++)
                printf("%g,", (double)r->sinks[h]);
            printf("%s\n", r->sinks ? "" : "-");
        }
}

/* ------------------------------------------------------------------ dropout, exactly */

/*
 * V = identity (Dv = Sk, v_j = e_j) makes O_ij = P~_ij: zero exactly where key j was dropped
 * (the kept P are far from underflow with small logits). The GPU's zero pattern must equal
 * the float64 reference's, element for element, on the tensor-core path (bf16, D 128) and the
 * FMA path (f32).
 */
START_TEST(cuda_dropout_mask_exact)
{
    const fa_dtype dt = _i == 0 ? FA_BF16 : FA_F32;
    const sw_case c = {.name = "cuda_dropout_mask_exact", .seed = 77,
                       .dims = {.b = 2, .sq = 100, .sk = 128, .hq = 2, .hk = 1, .dqk = 128,
                                .dv = 128},
                       .dropout = 0.3};
    const sw_dims dims = c.dims;
    fa_params p;
    sw_params(&c, &p);
    p.dropout_seed = 0x0123456789abcdefull;
    p.dropout_offset = 0x100000055ull; /* high bits too (the stream is 64-bit) */
    ht_bundle gpu, ref;
    ht_bundle_alloc(&gpu, dt, &dims, SW_BSHD, FA_F32);
    ht_bundle_alloc(&ref, FA_F64, &dims, SW_BSHD, FA_F64);
    ht_fill(&gpu.q, 5, -0.1, 0.1);
    ht_fill(&gpu.k, 6, -0.1, 0.1);
    ht_fill(&gpu.dout, 7, -1, 1);
    for (int64_t b = 0; b < dims.b; b++)
        for (int64_t j = 0; j < dims.sk; j++)
            for (int64_t h = 0; h < dims.hk; h++)
                for (int64_t d = 0; d < dims.dv; d++)
                    ht_set(&gpu.v, b, j, h, d, d == j ? 1.0 : 0.0);
    run_cpu(FA_BACKEND_REFERENCE, &p, &gpu, &ref, 1);
    fa_context *ctx = cuda_context(0);
    run_cuda(ctx, &p, &gpu, 0);
    fa_context_destroy(ctx);
    int64_t dropped = 0, n = 0;
    for (int64_t b = 0; b < dims.b; b++)
        for (int64_t h = 0; h < dims.hq; h++)
            for (int64_t i = 0; i < dims.sq; i++)
                for (int64_t j = 0; j < dims.sk; j++) {
                    const double r = ht_get(&ref.out, b, i, h, j), g = ht_get(&gpu.out, b, i, h, j);
                    ck_assert_msg((r == 0) == (g == 0), "%s b%ld h%ld i%ld j%ld: ref %g gpu %g",
                                  fa_dtype_name(dt), (long)b, (long)h, (long)i, (long)j, r, g);
                    dropped += r == 0;
                    n++;
                }
    /* p = 0.3: the test would be vacuous if nothing (or everything) were dropped */
    ck_assert_msg(dropped > n / 5 && dropped < n * 2 / 5, "dropped %ld of %ld", (long)dropped,
                  (long)n);
    ht_bundle_free(&gpu), ht_bundle_free(&ref);
}
END_TEST

/* ------------------------------------------------------------------ masked non-finite values */

/*
 * NaN/inf in K/V rows that a row may not see leave that row's out, LSE and dq unchanged: once
 * for keys no row sees (top-left causal, Sk > Sq), once for one key in the middle of the causal
 * band, inside a tile that rows before and after it share. D 16 runs the FMA path, D 64 in
 * bf16 the tensor-core path (its V scan and exact re-add). out and LSE must match to the bit.
 * So must dq on the FMA path; on the tensor-core path the poisoned run's backward takes the
 * generic kernels (the device-side finiteness flag) while the clean run takes the tensor-core
 * ones, so there dq must be finite and agree to the two paths' rounding.
 */
START_TEST(cuda_masked_nonfinite_never_reaches_output)
{
    const int64_t D = _i < 2 ? 16 : 64;
    const fa_dtype dt = _i < 2 ? FA_F32 : FA_BF16;
    const int drop = _i & 1;
    for (int middle = 0; middle < 2; middle++) {
        const int64_t sq = middle ? 100 : 40, sk = 100, bad_lo = middle ? 50 : 40,
                      bad_hi = middle ? 51 : 100;
        const sw_dims dims = {.b = 1, .sq = sq, .sk = sk, .hq = 4, .hk = 2, .dqk = D, .dv = D};
        ht_bundle clean, dirty;
        ht_bundle_alloc(&clean, dt, &dims, SW_BSHD, FA_F32);
        ht_bundle_alloc(&dirty, dt, &dims, SW_BSHD, FA_F32);
        ht_fill(&clean.q, 11, 1, -1), ht_fill(&dirty.q, 11, 1, -1);
        ht_fill(&clean.k, 12, 1, -1), ht_fill(&dirty.k, 12, 1, -1);
        ht_fill(&clean.v, 13, 1, -1), ht_fill(&dirty.v, 13, 1, -1);
        ht_fill(&clean.dout, 14, 1, -1), ht_fill(&dirty.dout, 14, 1, -1);
        for (int64_t j = bad_lo; j < bad_hi; j++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t d = 0; d < D; d++) {
                    ht_set(&dirty.k, 0, j, h, d, (j & 1) ? NAN : INFINITY);
                    ht_set(&dirty.v, 0, j, h, d, (j & 1) ? -INFINITY : NAN);
                }
        fa_params p;
        fa_params_init(&p);
        p.causal = 1;
        p.align = FA_ALIGN_TOP_LEFT;
        p.dropout_p = drop ? 0.2 : 0;
        p.dropout_seed = 31;
        fa_context *ctx = cuda_context(1);
        run_cuda(ctx, &p, &clean, 1);
        run_cuda(ctx, &p, &dirty, 1);
        fa_context_destroy(ctx);
        for (int64_t i = 0; i < bad_lo && i < sq; i++)
            for (int64_t h = 0; h < 4; h++) {
                ck_assert(ht_get(&clean.lse, 0, i, h, 0) == ht_get(&dirty.lse, 0, i, h, 0));
                for (int64_t d = 0; d < D; d++) {
                    ck_assert_msg(ht_get(&clean.out, 0, i, h, d) == ht_get(&dirty.out, 0, i, h, d),
                                  "D%ld middle=%d row %ld h%ld d%ld: out %g -> %g", (long)D,
                                  middle, (long)i, (long)h, (long)d, ht_get(&clean.out, 0, i, h, d),
                                  ht_get(&dirty.out, 0, i, h, d));
                    const double u = ht_get(&clean.dq, 0, i, h, d), w = ht_get(&dirty.dq, 0, i, h, d);
                    if (D == 16)
                        ck_assert(u == w);
                    else
                        ck_assert_msg(isfinite(w) && fabs(u - w) <= 0.05 * (1 + fabs(u)),
                                      "D%ld middle=%d row %ld h%ld d%ld: dq %g -> %g", (long)D,
                                      middle, (long)i, (long)h, (long)d, u, w);
                }
            }
        /* and the rows that do see a poisoned key are NaN/inf there: no silent zeros */
        if (middle)
            ck_assert(!isfinite(ht_get(&dirty.out, 0, 60, 0, 0)) || drop);
        ht_bundle_free(&clean), ht_bundle_free(&dirty);
    }
}
END_TEST

/*
 * The other half of the V scan: an infinite V element of a key that rows do see, in a tile
 * that is not fully allowed (causal diagonal), is zeroed in shared memory for the MMA and must
 * come back exactly: O = +inf in that dim for every row that sees the key, finite everywhere
 * else, as in the reference. Both tensor-core forwards (FA_CUDA_KERNEL unset / mma), D 64 and
 * 128, bf16 and f16; _i: kernel, D, dtype.
 */
START_TEST(cuda_allowed_inf_v_reaches_output)
{
    const char *kernel = _i & 1 ? "mma" : NULL;
    const int64_t D = _i & 2 ? 128 : 64, bad = 150, bad_d = 3;
    const fa_dtype dt = _i & 4 ? FA_F16 : FA_BF16;
    const sw_dims dims = {.b = 1, .sq = 200, .sk = 200, .hq = 4, .hk = 2, .dqk = D, .dv = D};
    ht_bundle x;
    ht_bundle_alloc(&x, dt, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 21, 1, -1), ht_fill(&x.k, 22, 1, -1), ht_fill(&x.v, 23, 1, -1);
    ht_fill(&x.dout, 24, 1, -1);
    for (int64_t h = 0; h < dims.hk; h++)
        ht_set(&x.v, 0, bad, h, bad_d, INFINITY);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    if (kernel)
        setenv("FA_CUDA_KERNEL", kernel, 1);
    fa_context *ctx = cuda_context(0);
    run_cuda(ctx, &p, &x, 0);
    fa_context_destroy(ctx);
    unsetenv("FA_CUDA_KERNEL");
    for (int64_t i = 0; i < dims.sq; i++)
        for (int64_t h = 0; h < dims.hq; h++)
            for (int64_t d = 0; d < D; d++) {
                const double o = ht_get(&x.out, 0, i, h, d);
                const int inf_expected = i >= bad && d == bad_d;
                ck_assert_msg(inf_expected ? o == INFINITY : isfinite(o),
                              "%s D%ld %s row %ld h%ld d%ld: out %g", kernel ? kernel : "auto",
                              (long)D, fa_dtype_name(dt), (long)i, (long)h, (long)d, o);
            }
    ht_bundle_free(&x);
}
END_TEST

/* ------------------------------------------------------------------ API behaviour */

/* Host pointers are refused with FA_ERR_INVALID_ARGUMENT, and nothing is written. */
START_TEST(cuda_host_pointers_refused)
{
    const sw_dims dims = {.b = 1, .sq = 10, .sk = 10, .hq = 1, .hk = 1, .dqk = 32, .dv = 32};
    ht_bundle x;
    ht_bundle_alloc(&x, FA_BF16, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, 1, -1), ht_fill(&x.k, 2, 1, -1), ht_fill(&x.v, 3, 1, -1);
    ht_poison(&x.out), ht_poison(&x.lse);
    fa_params p;
    fa_params_init(&p);
    fa_context *ctx = cuda_context(0);
    fa_status s = fa_forward(ctx, &p, &x.q.t, &x.k.t, &x.v.t, &x.out.t, &x.lse.t);
    ck_assert_int_eq(s, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "device") != NULL, "%s", fa_last_error());
    ck_assert(ht_is_poisoned(&x.out) && ht_is_poisoned(&x.lse));
    /* one host tensor among device ones: still refused, by name */
    dtensor q, k, v;
    d_up(&q, &x.q), d_up(&k, &x.k), d_up(&v, &x.v);
    s = fa_forward(ctx, &p, &q.t, &k.t, &v.t, &x.out.t, &x.lse.t);
    ck_assert_int_eq(s, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "out->data") != NULL, "%s", fa_last_error());
    ck_assert(ht_is_poisoned(&x.out));
    d_free(&q), d_free(&k), d_free(&v);
    fa_context_destroy(ctx);
    ht_bundle_free(&x);
}
END_TEST

/* FA_CUDA_KERNEL is read as a context is made: a value that names no kernel choice refuses the
 * context by name, and a context made before keeps its choice and runs (nothing written on
 * the refusal: there is no context to call). */
START_TEST(cuda_bad_kernel_choice_refused)
{
    const sw_dims dims = {.b = 1, .sq = 10, .sk = 10, .hq = 1, .hk = 1, .dqk = 64, .dv = 64};
    ht_bundle x;
    ht_bundle_alloc(&x, FA_BF16, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, 1, -1), ht_fill(&x.k, 2, 1, -1), ht_fill(&x.v, 3, 1, -1);
    ht_poison(&x.out), ht_poison(&x.lse);
    dtensor q, k, v, out, lse;
    d_up(&q, &x.q), d_up(&k, &x.k), d_up(&v, &x.v), d_up(&out, &x.out), d_up(&lse, &x.lse);
    fa_params p;
    fa_params_init(&p);
    fa_context *ctx = cuda_context(0), *refused = NULL;
    setenv("FA_CUDA_KERNEL", "wgmma", 1);
    fa_options o;
    fa_options_init(&o);
    o.backend = FA_BACKEND_CUDA;
    const fa_status made = fa_context_create(&o, &refused);
    ck_assert_int_eq(made, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "FA_CUDA_KERNEL=wgmma") != NULL, "%s", fa_last_error());
    ck_assert(refused == NULL);
    const fa_status s = fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    unsetenv("FA_CUDA_KERNEL");
    ck_assert_msg(s == FA_OK, "%s", fa_last_error());
    d_down(&out), d_down(&lse);
    ck_assert(!ht_is_poisoned(&x.out) && !ht_is_poisoned(&x.lse));
    d_free(&q), d_free(&k), d_free(&v), d_free(&out), d_free(&lse);
    fa_context_destroy(ctx);
    ht_bundle_free(&x);
}
END_TEST

/* fa_context_describe prints the launch plan of plain bf16 calls at each tensor-core head dim:
 * the wgmma forward at D 64 to 256 on a Hopper device of a build with its image (128-key
 * tiles, 64 at D 256) and its backward (at D 64, the entry before D 96's, 128-key blocks; at
 * D 256 64-key blocks), the mma.sync kernels under FA_CUDA_KERNEL=mma or elsewhere (the FMA
 * kernels for D 256's backward), the FMA kernels under FA_CUDA_KERNEL=generic, each with its
 * reason. */
START_TEST(cuda_describe_prints_plan)
{
    int dev = 0, major = 0, minor = 0;
    ck_assert(cudaGetDevice(&dev) == cudaSuccess);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
#ifdef FA_CUDA_HAVE_SM90A
    const int hopper = major == 9 && minor == 0;
#else
    const int hopper = 0;
#endif
    static const struct {
        const char *kernel, *want[4];
    } runs[3] = {
        {NULL,
         {"cuda_plan_bf16_d64=fwd:wgmma q192 k128 x2 (",
          "cuda_plan_bf16_d96=fwd:wgmma q128 k128 x2 (",
          "cuda_plan_bf16_d256=fwd:wgmma q128 k64 x2 (wgmma: 16-bit, D 64/96/128/256, scale "
          "only, sm_90a),bwd:wgmma q64 k64 x2 (",
          "bwd:wgmma q64 k128 x2 (wgmma: 16-bit, D 64/96/128/256, scale only, sm_90a) "
          "cuda_plan_bf16_d96="}},
        {"mma",
         {"cuda_plan_bf16_d64=fwd:mma q128 k64 x0 (", "cuda_plan_bf16_d96=fwd:mma q128 k64 x0 (",
          "cuda_plan_bf16_d256=fwd:mma q64 k32 x0 (FA_CUDA_KERNEL=mma),bwd:generic "
          "(FA_CUDA_KERNEL=mma)",
          "bwd:mma q32 k64 x0 ("}},
        {"generic",
         {"cuda_plan_bf16_d64=fwd:generic (FA_CUDA_KERNEL=generic)",
          "cuda_plan_bf16_d128=fwd:generic (FA_CUDA_KERNEL=generic)",
          "cuda_plan_bf16_d256=fwd:generic (FA_CUDA_KERNEL=generic),bwd:generic (",
          "cuda_kernels=generic"}},
    };
    for (int r = hopper ? 0 : 1; r < 3; r++) {
        if (runs[r].kernel)
            setenv("FA_CUDA_KERNEL", runs[r].kernel, 1);
        fa_context *ctx = cuda_context(0);
        unsetenv("FA_CUDA_KERNEL");
        char line[4096];
        ck_assert_int_eq(fa_context_describe(ctx, line, sizeof line), FA_OK);
        for (int w = 0; w < 4; w++)
            ck_assert_msg(strstr(line, runs[r].want[w]) != NULL, "%s: no '%s' in %s",
                          runs[r].kernel ? runs[r].kernel : "auto", runs[r].want[w], line);
        fa_context_destroy(ctx);
    }
}
END_TEST

/* Device memory of a device other than the current one (where the kernels would run) is
 * refused by name, and nothing is written. Registered only where there are two devices. */
START_TEST(cuda_other_device_refused)
{
    const sw_dims dims = {.b = 1, .sq = 10, .sk = 10, .hq = 1, .hk = 1, .dqk = 32, .dv = 32};
    ht_bundle x;
    ht_bundle_alloc(&x, FA_BF16, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, 1, -1), ht_fill(&x.k, 2, 1, -1), ht_fill(&x.v, 3, 1, -1);
    ht_poison(&x.out), ht_poison(&x.lse);
    fa_params p;
    fa_params_init(&p);
    dtensor q, k, v, out, lse;
    ck_assert_int_eq(cudaSetDevice(1), cudaSuccess);
    d_up(&k, &x.k);
    ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    d_up(&q, &x.q), d_up(&v, &x.v), d_up(&out, &x.out), d_up(&lse, &x.lse);
    fa_context *ctx = cuda_context(0);
    fa_status s = fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    fa_context_destroy(ctx);
    ck_assert_int_eq(s, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "k->data") != NULL &&
                      strstr(fa_last_error(), "device 1") != NULL,
                  "%s", fa_last_error());
    d_down(&out), d_down(&lse);
    ck_assert(ht_is_poisoned(&x.out) && ht_is_poisoned(&x.lse));
    d_free(&q), d_free(&v), d_free(&out), d_free(&lse);
    ck_assert_int_eq(cudaSetDevice(1), cudaSuccess);
    d_free(&k);
    ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    ht_bundle_free(&x);
}
END_TEST

/* deterministic = 1: the backward is bitwise repeatable (dQ without atomics); device
 * workspace is counted and returned; AUTO sends device tensors to CUDA, where the atomic dQ
 * agrees with the ordered one to rounding and dK, dV (never atomic) to the bit. */
static double max_rel_diff(const ht_tensor *x, const ht_tensor *y)
{
    double m = 0, big = 0;
    for (int64_t b = 0; b < x->t.batch; b++)
        for (int64_t s = 0; s < x->t.seqlen; s++)
            for (int64_t h = 0; h < x->t.heads; h++)
                for (int64_t d = 0; d < x->t.headdim; d++) {
                    const double u = ht_get(x, b, s, h, d), v = ht_get(y, b, s, h, d);
                    m = fmax(m, fabs(u - v));
                    big = fmax(big, fabs(v));
                }
    return m / (big > 0 ? big : 1);
}

START_TEST(cuda_deterministic_memory_auto)
{
    const sw_case c = {.name = "cuda_deterministic_memory_auto", .seed = 5,
                       .dims = {.b = 2, .sq = 300, .sk = 300, .hq = 4, .hk = 2, .dqk = 128,
                                .dv = 128},
                       .causal = 1, .dropout = 0.1};
    const sw_dims dims = c.dims;
    fa_params p;
    sw_params(&c, &p);
    ht_bundle a, b, x;
    ht_bundle_alloc(&a, FA_BF16, &dims, SW_BSHD, FA_F32);
    ht_bundle_alloc(&b, FA_BF16, &dims, SW_BSHD, FA_F32);
    ht_bundle_alloc(&x, FA_BF16, &dims, SW_BSHD, FA_F32);
    ht_fill(&a.q, 1, 1, -1), ht_fill(&a.k, 2, 1, -1), ht_fill(&a.v, 3, 1, -1);
    ht_fill(&a.dout, 4, 1, -1);
    ht_free(&b.q), ht_free(&b.k), ht_free(&b.v), ht_free(&b.dout);
    ht_free(&x.q), ht_free(&x.k), ht_free(&x.v), ht_free(&x.dout);
    b.q = x.q = a.q, b.k = x.k = a.k, b.v = x.v = a.v, b.dout = x.dout = a.dout;
    fa_context *ctx = cuda_context(1);
    run_cuda(ctx, &p, &a, 1);
    /* deterministic: D_i and LSE log2(e), B Hq Sq floats each, and no f32 dQ accumulator */
    const size_t bhs = (size_t)(dims.b * dims.hq * dims.sq),
                 acc = bhs * (size_t)dims.dqk * sizeof(float);
    size_t cur = 1, peak = 0;
    ck_assert_int_eq(fa_memory_stats(ctx, &cur, &peak), FA_OK);
    ck_assert_msg(cur == 0 && peak >= 2 * bhs * sizeof(float) && peak < acc,
                  "device bytes: current %zu peak %zu", cur, peak);
    run_cuda(ctx, &p, &b, 1);
    fa_context_destroy(ctx);
    ck_assert(memcmp(a.dq.buf, b.dq.buf, a.dq.nbytes) == 0);
    ck_assert(memcmp(a.dk.buf, b.dk.buf, a.dk.nbytes) == 0);
    ck_assert(memcmp(a.dv.buf, b.dv.buf, a.dv.nbytes) == 0);
    /* AUTO */
    fa_context *ac = NULL;
    ck_assert_int_eq(fa_context_create(NULL, &ac), FA_OK);
    run_cuda(ac, &p, &x, 1);
    ck_assert_int_eq(fa_memory_stats(ac, &cur, &peak), FA_OK); /* atomic dQ: the accumulator */
    ck_assert_msg(cur == 0 && peak >= acc + 2 * bhs * sizeof(float),
                  "device bytes (atomic): current %zu peak %zu", cur, peak);
    fa_context_destroy(ac);
    ck_assert(memcmp(a.out.buf, x.out.buf, a.out.nbytes) == 0);
    ck_assert(memcmp(a.dk.buf, x.dk.buf, a.dk.nbytes) == 0);
    ck_assert(memcmp(a.dv.buf, x.dv.buf, a.dv.nbytes) == 0);
    const double e = max_rel_diff(&x.dq, &a.dq);
    ck_assert_msg(e < 2e-2, "atomic dQ vs ordered dQ: relative difference %g", e);
    ht_free(&b.out), ht_free(&b.lse), ht_free(&b.dq), ht_free(&b.dk), ht_free(&b.dv);
    ht_free(&x.out), ht_free(&x.lse), ht_free(&x.dq), ht_free(&x.dk), ht_free(&x.dv);
    ht_bundle_free(&a);
}
END_TEST

/* Head dims beyond the kernels (> 512) are refused with FA_ERR_UNSUPPORTED and a message, and
 * nothing is written. */
START_TEST(cuda_unsupported_head_dim)
{
    const sw_dims dims = {.b = 1, .sq = 4, .sk = 4, .hq = 1, .hk = 1, .dqk = 520, .dv = 520};
    ht_bundle x;
    ht_bundle_alloc(&x, FA_F32, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, 1, -1), ht_fill(&x.k, 2, 1, -1), ht_fill(&x.v, 3, 1, -1);
    ht_poison(&x.out), ht_poison(&x.lse);
    dtensor q, k, v, out, lse;
    d_up(&q, &x.q), d_up(&k, &x.k), d_up(&v, &x.v), d_up(&out, &x.out), d_up(&lse, &x.lse);
    fa_params p;
    fa_params_init(&p);
    fa_context *ctx = cuda_context(0);
    ck_assert_int_eq(fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t), FA_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(fa_last_error(), "512") != NULL, "%s", fa_last_error());
    fa_context_destroy(ctx);
    d_down(&out), d_down(&lse);
    ck_assert(ht_is_poisoned(&x.out) && ht_is_poisoned(&x.lse));
    d_free(&q), d_free(&k), d_free(&v), d_free(&out), d_free(&lse);
    ht_bundle_free(&x);
}
END_TEST

/* Sk = 0 or Sq = 0 on the device: empty rows and zero gradients, written by the backend. */
START_TEST(cuda_empty_sequences)
{
    for (int which = 0; which < 2; which++) {
        const sw_dims dims = {.b = 1, .sq = which ? 0 : 7, .sk = which ? 7 : 0, .hq = 2, .hk = 1,
                              .dqk = 32, .dv = 32};
        ht_bundle x;
        ht_bundle_alloc(&x, FA_F16, &dims, SW_BSHD, FA_F32);
        fa_params p;
        fa_params_init(&p);
        fa_context *ctx = cuda_context(0);
        run_cuda(ctx, &p, &x, 1);
        fa_context_destroy(ctx);
        for (int64_t i = 0; i < dims.sq; i++)
            for (int64_t h = 0; h < 2; h++) {
                ck_assert(ht_get(&x.lse, 0, i, h, 0) == -INFINITY);
                for (int64_t d = 0; d < 32; d++)
                    ck_assert(ht_get(&x.out, 0, i, h, d) == 0 && ht_get(&x.dq, 0, i, h, d) == 0);
            }
        for (int64_t j = 0; j < dims.sk; j++)
            for (int64_t d = 0; d < 32; d++)
                ck_assert(ht_get(&x.dk, 0, j, 0, d) == 0 && ht_get(&x.dv, 0, j, 0, d) == 0);
        ht_bundle_free(&x);
    }
}
END_TEST

/*
 * A failed device allocation (fai_fault_arm: the n-th allocation of the call, for n = 1, 2, ...
 * until it succeeds): FA_ERR_NO_MEMORY, no output byte written on the device, no device memory
 * kept. Forward with ALiBi (the slopes' copy) and backward (workspace, slopes), bf16 on the
 * tensor-core path and f32 on the FMA path.
 */
START_TEST(cuda_device_allocation_failure)
{
    const fa_dtype dt = _i == 0 ? FA_BF16 : FA_F32;
    const sw_case c = {.name = "cuda_device_allocation_failure", .seed = 5,
                       .dims = {.b = 1, .sq = 70, .sk = 90, .hq = 2, .hk = 1, .dqk = 64, .dv = 64},
                       .causal = 1, .alibi = 1, .dropout = 0.1};
    const sw_dims dims = c.dims;
    fa_params p;
    sw_params(&c, &p);
    ht_bundle x;
    ht_bundle_alloc(&x, dt, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, -1, 1), ht_fill(&x.k, 2, -1, 1), ht_fill(&x.v, 3, -1, 1);
    ht_fill(&x.dout, 4, -1, 1);
    fa_context *ctx = cuda_context(0);
    for (int backward = 0; backward < 2; backward++) {
        int n = 1;
        for (; n <= 50; n++) {
            ht_poison(&x.dq), ht_poison(&x.dk), ht_poison(&x.dv);
            if (!backward)
                ht_poison(&x.out), ht_poison(&x.lse);
            dtensor q, k, v, dout, out, lse, dq, dk, dv;
            d_up(&q, &x.q), d_up(&k, &x.k), d_up(&v, &x.v), d_up(&dout, &x.dout);
            d_up(&out, &x.out), d_up(&lse, &x.lse), d_up(&dq, &x.dq), d_up(&dk, &x.dk);
            d_up(&dv, &x.dv);
            fai_fault_arm(n);
            fa_status st =
                backward ? fa_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t,
                                       &dk.t, &dv.t)
                         : fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
            const int fired = fai_fault_fired();
            fai_fault_arm(0);
            size_t cur = 1, peak;
            ck_assert_int_eq(fa_memory_stats(ctx, &cur, &peak), FA_OK);
            ck_assert_uint_eq(cur, 0);
            if (!fired) {
                ck_assert_msg(st == FA_OK, "%s: %s", backward ? "backward" : "forward",
                              fa_last_error());
                d_down(&out), d_down(&lse); /* the backward's inputs from here on */
            } else {
                ck_assert_msg(st == FA_ERR_NO_MEMORY, "allocation %d: %s", n, fa_last_error());
                ck_assert(strstr(fa_last_error(), "device") != NULL);
                d_down(&out), d_down(&lse), d_down(&dq), d_down(&dk), d_down(&dv);
                ck_assert_msg(ht_is_poisoned(&x.dq) && ht_is_poisoned(&x.dk) &&
                                  ht_is_poisoned(&x.dv) &&
                                  (backward || (ht_is_poisoned(&x.out) && ht_is_poisoned(&x.lse))),
                              "%s: allocation %d failed, an output was written",
                              backward ? "backward" : "forward", n);
            }
            d_free(&q), d_free(&k), d_free(&v), d_free(&dout), d_free(&out), d_free(&lse);
            d_free(&dq), d_free(&dk), d_free(&dv);
            if (!fired)
                break;
        }
        ck_assert_msg(n >= (backward ? 3 : 2) && n <= 50, "%s: %d allocations",
                      backward ? "backward" : "forward", n - 1);
        printf("cuda_device_allocation_failure: %s %s: %d device allocations, each failed once\n",
               fa_dtype_name(dt), backward ? "backward" : "forward", n - 1);
    }
    fa_context_destroy(ctx);
    ht_bundle_free(&x);
}
END_TEST

/* The sink's gradient on the device against the host's formula on the same out, lse and dout
 * (the API layer's, for host tensors, in float64), f32 and f16, with a head without a sink;
 * twice on the device, the same bits (a fixed reduction order). */
START_TEST(cuda_sink_grad_matches_host)
{
    const fa_dtype dt = _i ? FA_F16 : FA_F32;
    const sw_case c = {.name = "cuda_sink_grad_matches_host", .seed = 6,
                       .dims = {.b = 2, .sq = 70, .sk = 90, .hq = 4, .hk = 2, .dqk = 64, .dv = 64},
                       .causal = 1};
    const sw_dims dims = c.dims;
    fa_params p;
    sw_params(&c, &p);
    static const float sinks[4] = {0.5f, -INFINITY, 3.0f, -1.0f};
    float dev_grad[2][4], host_grad[4];
    p.sink_logits = sinks;
    ht_bundle x;
    ht_bundle_alloc(&x, dt, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, -1, 1), ht_fill(&x.k, 2, -1, 1), ht_fill(&x.v, 3, -1, 1);
    ht_fill(&x.dout, 4, -1, 1);
    fa_context *ctx = cuda_context(0);
    dtensor q, k, v, out, lse, dout, dq, dk, dv;
    d_up(&q, &x.q), d_up(&k, &x.k), d_up(&v, &x.v), d_up(&out, &x.out), d_up(&lse, &x.lse);
    d_up(&dout, &x.dout), d_up(&dq, &x.dq), d_up(&dk, &x.dk), d_up(&dv, &x.dv);
    ck_assert(fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t) == FA_OK);
    for (int r = 0; r < 2; r++) {
        p.sink_grad = dev_grad[r];
        const fa_status st = fa_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t,
                                         &dq.t, &dk.t, &dv.t);
        ck_assert_msg(st == FA_OK, "%s: %s", fa_status_string(st), fa_last_error());
    }
    d_down(&out), d_down(&lse);
    p.sink_grad = host_grad;
    ck_assert(ht_backward(FA_BACKEND_TILED, 2, &p, &x.q.t, &x.k.t, &x.v.t, &x.out.t, &x.lse.t,
                          &x.dout.t, &x.dq.t, &x.dk.t, &x.dv.t) == FA_OK);
    for (int h = 0; h < 4; h++) {
        ck_assert_msg(fabsf(dev_grad[0][h] - host_grad[h]) <= 1e-5f * (1 + fabsf(host_grad[h])),
                      "%s head %d: device %.9g, host %.9g", fa_dtype_name(dt), h,
                      (double)dev_grad[0][h], (double)host_grad[h]);
        ck_assert_msg(!memcmp(&dev_grad[0][h], &dev_grad[1][h], sizeof(float)),
                      "head %d: two runs differ", h);
    }
    ck_assert(host_grad[1] == 0 && host_grad[0] != 0);
    size_t cur = 1, peak;
    ck_assert_int_eq(fa_memory_stats(ctx, &cur, &peak), FA_OK);
    ck_assert_uint_eq(cur, 0);
    d_free(&q), d_free(&k), d_free(&v), d_free(&out), d_free(&lse), d_free(&dout);
    d_free(&dq), d_free(&dk), d_free(&dv);
    fa_context_destroy(ctx);
    ht_bundle_free(&x);
}
END_TEST

/* Three equal tensors: the reference reads t[0]'s float64 twin, conventional t[1], cuda t[2]. */
static void triple_alloc(ht_tensor t[3], fa_dtype dt, int64_t B, int64_t S, int64_t H,
                         int64_t D, uint64_t seed)
{
    for (int c = 0; c < 3; c++) {
        ht_alloc(&t[c], dt, B, S, H, D, SW_BSHD);
        ht_fill(&t[c], seed, -1, 1);
    }
}

/* A cache dtype apart from q's (the generic forward) against the reference, with the
 * conventional path over the same storage as the yardstick: f32 q over f16 and bf16 K/V, bf16
 * q over f16; a decode shape (GQA 4, D 128) and a windowed prefill. */
START_TEST(cuda_kv_dtype_matches_reference)
{
    static const fa_dtype pairs[3][2] = {{FA_F32, FA_F16}, {FA_F32, FA_BF16}, {FA_BF16, FA_F16}};
    const fa_dtype qd = pairs[_i % 3][0], kd = pairs[_i % 3][1];
    const int prefill = _i / 3;
    const int64_t B = prefill ? 1 : 2, sq = prefill ? 70 : 1, sk = prefill ? 90 : 700;
    const int64_t hq = prefill ? 4 : 8, hk = 2, d = prefill ? 64 : 128;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.window_left = prefill ? 30 : -1;
    ht_tensor q[3], k[3], v[3], o[3], l[3];
    triple_alloc(q, qd, B, sq, hq, d, 21);
    triple_alloc(k, kd, B, sk, hk, d, 22);
    triple_alloc(v, kd, B, sk, hk, d, 23);
    for (int c = 0; c < 3; c++) {
        ht_alloc(&o[c], c ? qd : FA_F64, B, sq, hq, d, SW_BSHD);
        ht_alloc_lse(&l[c], c ? FA_F32 : FA_F64, B, sq, hq);
    }
    ck_assert(ht_forward(FA_BACKEND_REFERENCE, 2, &p, &q[0].t64, &k[0].t64, &v[0].t64, &o[0].t,
                         &l[0].t) == FA_OK);
    ck_assert_msg(ht_forward(FA_BACKEND_CONVENTIONAL, 2, &p, &q[1].t, &k[1].t, &v[1].t, &o[1].t,
                             &l[1].t) == FA_OK, "%s", fa_last_error());
    fa_context *ctx = cuda_context(0);
    dtensor dq, dk, dv, dout, dl;
    d_up(&dq, &q[2]), d_up(&dk, &k[2]), d_up(&dv, &v[2]), d_up(&dout, &o[2]), d_up(&dl, &l[2]);
    const fa_status st = fa_forward(ctx, &p, &dq.t, &dk.t, &dv.t, &dout.t, &dl.t);
    ck_assert_msg(st == FA_OK, "%s: %s", fa_status_string(st), fa_last_error());
    d_down(&dout), d_down(&dl);
    char label[60];
    snprintf(label, sizeof label, "q %s, k/v %s, %s", fa_dtype_name(qd), fa_dtype_name(kd),
             prefill ? "prefill" : "decode");
    compare("out", label, &o[1], &o[2], &o[0], 0);
    compare("lse", label, &l[1], &l[2], &l[0], 0);
    d_free(&dq), d_free(&dk), d_free(&dv), d_free(&dout), d_free(&dl);
    fa_context_destroy(ctx);
    for (int c = 0; c < 3; c++)
        ht_free(&q[c]), ht_free(&k[c]), ht_free(&v[c]), ht_free(&o[c]), ht_free(&l[c]);
}
END_TEST

/*
 * Calls of sequences on the device against the reference (on the float64 twins) with the
 * conventional path as the yardstick, per dtype: a variable-length batch forward and backward
 * (an empty sequence, GQA, causal per sequence, dropout: each sequence's own stream); a paged
 * K/V of 3-key pages in shuffled order with a shared page, decode rows, a window with sink
 * tokens; a contiguous and a paged cache that grow by fa_forward_kvcache (the caches compared
 * to the bit with the host's append), and fa_append_kv alone on a device cache.
 */
START_TEST(cuda_sequences_match_reference)
{
    const fa_dtype dt = dtypes[_i % 4];
    const int kind = _i / 4; /* 0 varlen, 1 paged, 2 contiguous cache, 3 paged cache */
    const int64_t hq = 4, hk = 2, d = 64;
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    if (kind == 0)
        p.dropout_p = 0.15, p.dropout_seed = 99;
    if (kind == 1)
        p.window_left = 9, p.sink_tokens = 2;
    /* sequences: q rows, keys (a cache's length before its new keys for kinds 2 and 3) */
    static const int32_t lq[3] = {7, 0, 130}, lk[3] = {12, 5, 150};
    static const int32_t used[3] = {10, 0, 40}, lens[2] = {5, 30};
    const int64_t nseq = kind == 0 ? 3 : kind == 1 ? 3 : 2, s_new = kind >= 2 ? 3 : 0;
    const int64_t sq = kind == 0 ? 137 : kind == 1 ? 2 : 3; /* packed total, or per sequence */
    const int64_t ps = kind == 1 ? 3 : 16, pages = kind == 1 ? 20 : 8, maxp = 14;
    int32_t cq[4] = {0}, ck[4] = {0}, table[3 * 14];
    for (int g = 0; g < 3; g++)
        cq[g + 1] = cq[g] + lq[g], ck[g + 1] = ck[g] + lk[g];
    for (int e = 0; e < 3 * maxp; e++) /* shuffled pages; sequences 0 and 2 share one */
        table[e] = (int32_t)((e * 7 + 3) % pages);
    table[2 * maxp] = table[0];
    if (kind == 3) { /* a cache's written pages are its own: 3 for sequence 0, 0 and 2 for 1 */
        const int32_t own[2][4] = {{3, 1, 6, 4}, {5, 0, 2, 7}};
        for (int r = 0; r < 2; r++)
            memcpy(table + r * maxp, own[r], sizeof own[r]);
    }
    const int paged = kind == 1 || kind == 3;
    const int64_t qb = kind == 0 ? 1 : nseq, kvb = kind == 0 ? 1 : paged ? pages : nseq;
    const int64_t kvs = kind == 0 ? ck[3] : paged ? ps : 64;
    ht_tensor q[3], k[3], v[3], kn[3], vn[3], o[3], l[3], g[3], dq[3], dk[3], dv[3];
    triple_alloc(q, dt, qb, sq, hq, d, 11);
    triple_alloc(k, dt, kvb, kvs, hk, d, 12);
    triple_alloc(v, dt, kvb, kvs, hk, d, 13);
    triple_alloc(g, dt, qb, sq, hq, d, 14);
    if (s_new)
        triple_alloc(kn, dt, nseq, s_new, hk, d, 15), triple_alloc(vn, dt, nseq, s_new, hk, d, 16);
    for (int c = 0; c < 3; c++) {
        const fa_dtype odt = c == 0 ? FA_F64 : dt, ldt = c == 0 || dt == FA_F64 ? FA_F64 : FA_F32;
        ht_alloc(&o[c], odt, qb, sq, hq, d, SW_BSHD), ht_alloc_lse(&l[c], ldt, qb, sq, hq);
        ht_alloc(&dq[c], odt, qb, sq, hq, d, SW_BSHD);
        ht_alloc(&dk[c], odt, kvb, kvs, hk, d, SW_BSHD);
        ht_alloc(&dv[c], odt, kvb, kvs, hk, d, SW_BSHD);
    }
    const fa_indices iq = {cq, FA_INDEX_INT32, 4}, ik = {ck, FA_INDEX_INT32, 4};
    const fa_indices cl = {lens, FA_INDEX_INT32, 2};
    const fa_paged_kv pg = {{table, FA_INDEX_INT32, nseq * maxp}, maxp,
                            {kind == 1 ? used : lens, FA_INDEX_INT32, nseq}};
    for (int c = 0; c < 3; c++) {
        fa_context *ctx = c == 2 ? cuda_context(0)
                                 : ht_context(c ? FA_BACKEND_CONVENTIONAL : FA_BACKEND_REFERENCE, 2);
        dtensor t[11];
        ht_tensor *h[11] = {&q[c], &k[c], &v[c], &g[c], &o[c], &l[c], &dq[c], &dk[c], &dv[c],
                            s_new ? &kn[c] : NULL, s_new ? &vn[c] : NULL};
        fa_tensor ft[11];
        for (int x = 0; x < 11; x++) {
            if (!h[x])
                continue;
            if (c == 2) {
                d_up(&t[x], h[x]);
                ft[x] = t[x].t;
            } else {
                ft[x] = c == 0 && (x < 4 || x > 8) ? h[x]->t64 : h[x]->t; /* 4-8: outputs */
            }
        }
        fa_status st;
        if (kind == 0) {
            st = fa_forward_varlen(ctx, &p, &ft[0], &ft[1], &ft[2], &iq, &ik, &ft[4], &ft[5]);
            ck_assert_msg(st == FA_OK, "varlen forward %d: %s", c, fa_last_error());
            st = fa_backward_varlen(ctx, &p, &ft[0], &ft[1], &ft[2], &iq, &ik, &ft[4], &ft[5],
                                    &ft[3], &ft[6], &ft[7], &ft[8]);
            ck_assert_msg(st == FA_OK, "varlen backward %d: %s", c, fa_last_error());
        } else if (kind == 1) {
            st = fa_forward_paged(ctx, &p, &ft[0], &ft[1], &ft[2], &pg, &ft[4], &ft[5]);
            ck_assert_msg(st == FA_OK, "paged %d: %s", c, fa_last_error());
        } else {
            st = fa_forward_kvcache(ctx, &p, &ft[0], &ft[1], &ft[2], &ft[9], &ft[10],
                                    kind == 2 ? &cl : NULL, kind == 3 ? &pg : NULL, &ft[4],
                                    &ft[5]);
            ck_assert_msg(st == FA_OK, "kvcache %d: %s", c, fa_last_error());
            /* and once more by fa_append_kv alone: the next 3 keys */
            int32_t after[2] = {lens[0] + 3, lens[1] + 3};
            const fa_indices ca = {after, FA_INDEX_INT32, 2};
            fa_paged_kv pa = pg;
            pa.seqused_k = ca;
            st = fa_append_kv(ctx, &ft[9], &ft[10], &ft[1], &ft[2], kind == 2 ? &ca : NULL,
                              kind == 3 ? &pa : NULL);
            ck_assert_msg(st == FA_OK, "append %d: %s", c, fa_last_error());
        }
        if (c == 2) {
            for (int x = 0; x < 11; x++)
                if (h[x]) {
                    if (x == 1 || x == 2 || (x >= 4 && x <= 8))
                        d_down(&t[x]);
                    d_free(&t[x]);
                }
        }
        fa_context_destroy(ctx);
    }
    char label[80];
    snprintf(label, sizeof label, "%s %s", kind == 0 ? "varlen" : kind == 1 ? "paged" : kind == 2
                                                                 ? "cache" : "paged cache",
             fa_dtype_name(dt));
    compare("out", label, &o[1], &o[2], &o[0], 0);
    compare("lse", label, &l[1], &l[2], &l[0], 0);
    if (kind == 0) {
        compare("dq", label, &dq[1], &dq[2], &dq[0], 1);
        compare("dk", label, &dk[1], &dk[2], &dk[0], 1);
        compare("dv", label, &dv[1], &dv[2], &dv[0], 1);
    }
    if (s_new) /* the device's appends are the host's, to the bit */
        ck_assert_msg(!memcmp(k[1].buf, k[2].buf, k[1].nbytes) &&
                          !memcmp(v[1].buf, v[2].buf, v[1].nbytes),
                      "%s: the device cache differs from the host's", label);
    for (int c = 0; c < 3; c++) {
        ht_free(&q[c]), ht_free(&k[c]), ht_free(&v[c]), ht_free(&g[c]), ht_free(&o[c]);
        ht_free(&l[c]), ht_free(&dq[c]), ht_free(&dk[c]), ht_free(&dv[c]);
        if (s_new)
            ht_free(&kn[c]), ht_free(&vn[c]);
    }
}
END_TEST

/* ------------------------------------------------------------------ bias tensors */

/*
 * A bias (or keep-mask) on the device (the generic kernels, whatever the shape and dtype)
 * against the float64 reference with the conventional path in the same storage as the
 * yardstick: out, LSE, dQ, dK, dV and, with `grad`, the bias gradient (f64 under f64 storage,
 * else f32; in the bias's shape, a broadcast dim summed). `bias` is a host tensor; the GPU
 * reads a device copy. Rows that the reference finds empty must be O = 0, LSE = -inf, dQ = 0.
 * With `twice`, a second GPU backward must give the bias gradient's bits again (one thread
 * per element, a fixed order, no atomics). p is the case's params with the bias's fields.
 */
static void bias_run(const sw_dims *dims, sw_layout lay, fa_dtype dt, int idx, fa_params *p,
                     ht_tensor *bias, int grad, int twice, const char *what)
{
    const fa_dtype lse_dt = dt == FA_F64 ? FA_F64 : FA_F32, gdt = dt == FA_F64 ? FA_F64 : FA_F32;
    const fa_tensor *bt = &bias->t;
    ht_bundle conv, gpu, ref;
    ht_bundle_alloc(&conv, dt, dims, lay, lse_dt);
    ht_bundle_alloc(&gpu, dt, dims, lay, lse_dt);
    ht_bundle_alloc(&ref, FA_F64, dims, SW_BSHD, FA_F64);
    ht_fill(&conv.q, 1000 + idx, 1, -1);
    ht_fill(&conv.k, 2000 + idx, 1, -1);
    ht_fill(&conv.v, 3000 + idx, -1, 1);
    ht_fill(&conv.dout, 4000 + idx, -1, 1);
    ht_tensor g[4]; /* the bias gradient: reference, conventional, GPU, GPU again */
    for (int x = 0; grad && x < 4; x++) {
        ht_alloc(&g[x], x ? gdt : FA_F64, bt->batch, bt->seqlen, bt->heads, bt->headdim,
                 SW_BSHD);
        ht_poison(&g[x]);
    }
    p->bias = bt;
    p->bias_grad = grad ? &g[1].t : NULL;
    run_cpu(FA_BACKEND_CONVENTIONAL, p, &conv, &conv, 0);
    p->bias_grad = grad ? &g[0].t : NULL;
    run_cpu(FA_BACKEND_REFERENCE, p, &conv, &ref, 1);
    ht_free(&gpu.q), ht_free(&gpu.k), ht_free(&gpu.v), ht_free(&gpu.dout);
    gpu.q = conv.q, gpu.k = conv.k, gpu.v = conv.v, gpu.dout = conv.dout; /* shared inputs */
    dtensor db, dg[2];
    d_up(&db, bias);
    fa_params pg = *p;
    pg.bias = &db.t;
    fa_context *ctx = cuda_context(0);
    for (int r = 0; r < (twice ? 2 : 1); r++) {
        if (grad) {
            d_up(&dg[r], &g[2 + r]);
            pg.bias_grad = &dg[r].t;
        }
        run_cuda(ctx, &pg, &gpu, 1);
        if (grad)
            d_down(&dg[r]), d_free(&dg[r]);
    }
    fa_context_destroy(ctx);
    d_free(&db);
    p->bias = NULL, p->bias_grad = NULL;
    char label[200];
    snprintf(label, sizeof label, "bias %s %d %s, bias %s (%lld %lld %lld %lld) %s (B%ld Sq%ld "
                                  "Sk%ld H%ld/%ld D%ld/%ld)",
             what, idx, fa_dtype_name(dt), fa_dtype_name(bt->dtype), (long long)bt->batch,
             (long long)bt->seqlen, (long long)bt->heads, (long long)bt->headdim,
             p->bias_place == FA_BIAS_AFTER_SOFTCAP ? "after cap" : "after scale", (long)dims->b,
             (long)dims->sq, (long)dims->sk, (long)dims->hq, (long)dims->hk, (long)dims->dqk,
             (long)dims->dv);
    compare("out", label, &conv.out, &gpu.out, &ref.out, 0);
    compare("lse", label, &conv.lse, &gpu.lse, &ref.lse, 0);
    compare("dq", label, &conv.dq, &gpu.dq, &ref.dq, 1);
    compare("dk", label, &conv.dk, &gpu.dk, &ref.dk, 1);
    compare("dv", label, &conv.dv, &gpu.dv, &ref.dv, 1);
    if (grad)
        compare("bias_grad", label, &g[1], &g[2], &g[0], 1);
    if (grad && twice)
        ck_assert_msg(!memcmp(g[2].buf, g[3].buf, g[2].nbytes), "%s: two runs' bias gradients "
                                                                "differ", label);
    for (int64_t b = 0; b < dims->b; b++)
        for (int64_t h = 0; h < dims->hq; h++)
            for (int64_t i = 0; i < dims->sq; i++) {
                if (ht_get(&ref.lse, b, i, h, 0) != -INFINITY)
                    continue;
                ck_assert_msg(ht_get(&gpu.lse, b, i, h, 0) == -INFINITY, "%s: empty row %ld LSE",
                              label, (long)i);
                for (int64_t d = 0; d < dims->dv; d++)
                    ck_assert_msg(ht_get(&gpu.out, b, i, h, d) == 0, "%s: empty row %ld out",
                                  label, (long)i);
                for (int64_t d = 0; d < dims->dqk; d++)
                    ck_assert_msg(ht_get(&gpu.dq, b, i, h, d) == 0, "%s: empty row %ld dq",
                                  label, (long)i);
            }
    for (int x = 0; grad && x < 4; x++)
        ht_free(&g[x]);
    ht_free(&gpu.out), ht_free(&gpu.lse), ht_free(&gpu.dq), ht_free(&gpu.dk), ht_free(&gpu.dv);
    ht_bundle_free(&conv), ht_bundle_free(&ref);
}

/* Row i's keep entry for key j of a bottom-right causal mask of Sq rows and Sk keys. */
static double causal_entry(int64_t sq, int64_t sk, int64_t i, int64_t j)
{
    return j <= i + (sk - sq) ? 0.0 : -INFINITY;
}

/*
 * A keep-mask (bool, (1, Sq, 1, Sk)) equal to the causal mask, without causal: the reference's
 * causal results within the tolerance rule, every dtype. D 64 with 16-byte rows in f16 / bf16
 * would take the tensor-core kernels, which read no bias: the mask must route it to the generic
 * ones (else the rows see every key). Sk < Sq too: the first rows are empty.
 */
START_TEST(cuda_keep_mask_equals_causal)
{
    const fa_dtype dt = dtypes[_i % 4];
    const int64_t sq = _i < 4 ? 150 : 170, sk = _i < 4 ? 170 : 150;
    const sw_dims dims = {.b = 2, .sq = sq, .sk = sk, .hq = 4, .hk = 2, .dqk = 64, .dv = 64};
    ht_tensor mask;
    ht_alloc(&mask, FA_BOOL, 1, sq, 1, sk, SW_BSHD);
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < sk; j++)
            ht_set(&mask, 0, i, 0, j, causal_entry(sq, sk, i, j));
    fa_params p;
    fa_params_init(&p);
    bias_run(&dims, SW_BSHD, dt, 300 + _i, &p, &mask, 0, 0, "keep-mask = causal");
    /* and the reference with the mask is the reference with causal (check_masks.c), so the
     * GPU's out agrees with a causal call on the device as well */
    ht_free(&mask);
}
END_TEST

/*
 * A float bias on the device against the reference, outputs and gradients, the bias's own
 * included, both placements (before and after the softcap of 5), every storage dtype; _i:
 * place, dtype, shape:
 *   0: (1, Sq, 1, Sk) f16, broadcast over batch and heads (its gradient sums B Hq rows), a row
 *      masked entirely (empty) and scattered -inf entries; run twice (the same bits);
 *   1: (B, 1, Hq, Sk) bf16, one row for every query (key padding), ALiBi slopes scaling the
 *      bias (ggml, bias_by_slope), GQA, a causal window;
 *   2: (B, Sq, Hq, Sk) f32 (f64 under f64 storage), BHSD, ALiBi by distance, dropout 0.2,
 *      padded q/k/v rows, a sliding window.
 */
START_TEST(cuda_bias_matches_reference)
{
    static const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    const int place = _i & 1, shape = _i / 8;
    const fa_dtype dt = dtypes[(_i >> 1) & 3];
    sw_dims dims = {.b = 2, .sq = 97, .sk = 131, .hq = 4, .hk = 2, .dqk = 64, .dv = 64};
    sw_layout lay = SW_BSHD;
    fa_params p;
    fa_params_init(&p);
    p.softcap = 5;
    p.bias_place = place ? FA_BIAS_AFTER_SOFTCAP : FA_BIAS_AFTER_SCALE;
    ht_tensor bias;
    if (shape == 0) {
        ht_alloc(&bias, FA_F16, 1, dims.sq, 1, dims.sk, SW_BSHD);
        ht_fill(&bias, 71 + _i, 3, -3);
        for (int64_t j = 0; j < dims.sk; j++)
            ht_set(&bias, 0, 5, 0, j, -INFINITY); /* row 5: empty */
        for (int64_t i = 0; i < dims.sq; i++)
            for (int64_t j = i % 7; j < dims.sk; j += 11)
                ht_set(&bias, 0, i, 0, j, -INFINITY);
    } else if (shape == 1) {
        dims.hk = 1;
        p.causal = 1;
        p.alibi_slopes = slopes;
        p.bias_by_slope = 1;
        ht_alloc(&bias, FA_BF16, dims.b, 1, dims.hq, dims.sk, SW_BSHD);
        ht_fill(&bias, 81 + _i, 4, -4);
        for (int64_t j = 3; j < dims.sk; j += 5)
            ht_set(&bias, 1, 0, 2, j, -INFINITY);
    } else {
        lay = SW_PADDED;
        p.window_left = 40, p.window_right = 7;
        p.alibi_slopes = slopes;
        p.dropout_p = 0.2;
        p.dropout_seed = 0x5eed0000ull + (uint64_t)_i;
        p.dropout_offset = 9;
        ht_alloc(&bias, dt == FA_F64 ? FA_F64 : FA_F32, dims.b, dims.sq, dims.hq, dims.sk,
                 SW_BHSD);
        ht_fill(&bias, 91 + _i, 2, -2);
        ht_set(&bias, 1, 50, 3, 52, -INFINITY);
    }
    bias_run(&dims, lay, dt, 310 + _i, &p, &bias, 1, shape == 0, "float");
    ht_free(&bias);
}
END_TEST

/*
 * NaN and inf in the K and V rows of keys that a keep-mask masks for every row (key padding,
 * (1, 1, 1, Sk)) never reach an output: out and LSE to the bit of a run with finite values
 * there, dQ, dK, dV finite, and dK, dV of the masked keys exactly 0. f32 D 16 and bf16 D 64
 * (a tensor-core shape without the mask).
 */
START_TEST(cuda_bias_masked_nonfinite_kv)
{
    const int64_t D = _i ? 64 : 16, sq = 50, sk = 80;
    const fa_dtype dt = _i ? FA_BF16 : FA_F32;
    const sw_dims dims = {.b = 1, .sq = sq, .sk = sk, .hq = 2, .hk = 1, .dqk = D, .dv = D};
    ht_tensor mask;
    ht_alloc(&mask, FA_BOOL, 1, 1, 1, sk, SW_BSHD);
    for (int64_t j = 0; j < sk; j++)
        ht_set(&mask, 0, 0, 0, j, j % 9 == 4 ? -INFINITY : 0);
    ht_bundle clean, dirty;
    ht_bundle_alloc(&clean, dt, &dims, SW_BSHD, FA_F32);
    ht_bundle_alloc(&dirty, dt, &dims, SW_BSHD, FA_F32);
    ht_bundle *xs[2] = {&clean, &dirty};
    for (int x = 0; x < 2; x++) {
        ht_fill(&xs[x]->q, 11, 1, -1), ht_fill(&xs[x]->k, 12, 1, -1);
        ht_fill(&xs[x]->v, 13, 1, -1), ht_fill(&xs[x]->dout, 14, 1, -1);
    }
    for (int64_t j = 4; j < sk; j += 9)
        for (int64_t d = 0; d < D; d++) {
            ht_set(&dirty.v, 0, j, 0, d, d & 1 ? NAN : -INFINITY);
            ht_set(&dirty.k, 0, j, 0, d, d & 1 ? INFINITY : NAN);
        }
    dtensor dm;
    d_up(&dm, &mask);
    fa_params p;
    fa_params_init(&p);
    p.bias = &dm.t;
    fa_context *ctx = cuda_context(0);
    run_cuda(ctx, &p, &clean, 1);
    run_cuda(ctx, &p, &dirty, 1);
    fa_context_destroy(ctx);
    d_free(&dm);
    ck_assert_msg(!memcmp(clean.out.buf, dirty.out.buf, clean.out.nbytes), "D%ld: out changed",
                  (long)D);
    ck_assert_msg(!memcmp(clean.lse.buf, dirty.lse.buf, clean.lse.nbytes), "D%ld: LSE changed",
                  (long)D);
    const ht_tensor *outs[4] = {&dirty.out, &dirty.dq, &dirty.dk, &dirty.dv};
    for (int t = 0; t < 4; t++)
        for (int64_t s = 0; s < outs[t]->t.seqlen; s++)
            for (int64_t h = 0; h < outs[t]->t.heads; h++)
                for (int64_t d = 0; d < D; d++) {
                    const double x = ht_get(outs[t], 0, s, h, d);
                    ck_assert_msg(isfinite(x), "D%ld tensor %d row %ld h%ld d%ld: %g", (long)D, t,
                                  (long)s, (long)h, (long)d, x);
                    if (t >= 2 && s % 9 == 4)
                        ck_assert_msg(x == 0, "D%ld masked key %ld: d%s = %g", (long)D, (long)s,
                                      t == 2 ? "k" : "v", x);
                }
    ht_free(&mask);
    ht_bundle_free(&clean), ht_bundle_free(&dirty);
}
END_TEST

/* A bias (or bias gradient) in host memory with device q is refused by name with
 * FA_ERR_INVALID_ARGUMENT, and nothing is written. */
START_TEST(cuda_bias_host_pointer_refused)
{
    const sw_dims dims = {.b = 1, .sq = 10, .sk = 12, .hq = 1, .hk = 1, .dqk = 32, .dv = 32};
    ht_bundle x;
    ht_bundle_alloc(&x, FA_F32, &dims, SW_BSHD, FA_F32);
    ht_fill(&x.q, 1, 1, -1), ht_fill(&x.k, 2, 1, -1), ht_fill(&x.v, 3, 1, -1);
    ht_fill(&x.dout, 4, 1, -1);
    ht_poison(&x.out), ht_poison(&x.lse), ht_poison(&x.dq);
    ht_tensor bias, grad;
    ht_alloc(&bias, FA_F32, 1, dims.sq, 1, dims.sk, SW_BSHD);
    ht_alloc(&grad, FA_F32, 1, dims.sq, 1, dims.sk, SW_BSHD);
    ht_fill(&bias, 5, 1, -1);
    dtensor q, k, v, out, lse, dout, dq, dk, dv, db;
    d_up(&q, &x.q), d_up(&k, &x.k), d_up(&v, &x.v), d_up(&out, &x.out), d_up(&lse, &x.lse);
    d_up(&dout, &x.dout), d_up(&dq, &x.dq), d_up(&dk, &x.dk), d_up(&dv, &x.dv);
    d_up(&db, &bias);
    fa_params p;
    fa_params_init(&p);
    p.bias = &bias.t; /* host */
    fa_context *ctx = cuda_context(0);
    fa_status s = fa_forward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t);
    ck_assert_int_eq(s, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "params->bias->data") != NULL, "%s", fa_last_error());
    p.bias = &db.t;
    ht_poison(&grad);
    p.bias_grad = &grad.t; /* host */
    s = fa_backward(ctx, &p, &q.t, &k.t, &v.t, &out.t, &lse.t, &dout.t, &dq.t, &dk.t, &dv.t);
    ck_assert_int_eq(s, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "params->bias_grad->data") != NULL, "%s",
                  fa_last_error());
    fa_context_destroy(ctx);
    d_down(&out), d_down(&lse), d_down(&dq);
    ck_assert(ht_is_poisoned(&x.out) && ht_is_poisoned(&x.lse) && ht_is_poisoned(&x.dq));
    ck_assert(ht_is_poisoned(&grad));
    d_free(&q), d_free(&k), d_free(&v), d_free(&out), d_free(&lse), d_free(&dout);
    d_free(&dq), d_free(&dk), d_free(&dv), d_free(&db);
    ht_free(&bias), ht_free(&grad);
    ht_bundle_free(&x);
}
END_TEST

/* ------------------------------------------------------------------ FP8 and block masks */

/* FP8 values for x: N(0, 1) scaled by `spread`, rounded to the format by ht_set's store (as
 * check_fp8.c). */
static void fill_fp8(ht_tensor *x, uint64_t seed, double spread)
{
    ht_fill(x, seed, 1, -1); /* lo > hi: normal draws */
    for (int64_t b = 0; b < x->t.batch; b++)
        for (int64_t s = 0; s < x->t.seqlen; s++)
            for (int64_t h = 0; h < x->t.heads; h++)
                for (int64_t d = 0; d < x->t.headdim; d++)
                    ht_set(x, b, s, h, d, spread * ht_get(x, b, s, h, d));
}

/* fa_memory_stats of ctx: nothing held now, at least `least` bytes at the peak. */
static void assert_memory(fa_context *ctx, size_t least, const char *label)
{
    size_t cur = 1, peak = 0;
    ck_assert_int_eq(fa_memory_stats(ctx, &cur, &peak), FA_OK);
    ck_assert_msg(cur == 0 && peak >= least, "%s: bytes now %zu, peak %zu (want >= %zu)", label,
                  cur, peak, least);
}

/*
 * FP8 q, k and v on the device (the generic forward, decoding the codes) against the float64
 * reference on the same FP8 inputs, with the conventional path on the same inputs and out
 * dtype as the yardstick (it rounds P to e4m3 before P V, as FlashAttention-3:
 * check_fp8.c, fp8_rule_passes_fused_fails_bugs); _i:
 *   0-3: e4m3 / e5m2 (bit 0) into bf16 / f32 out (bit 1), descales per (batch, kv head), GQA
 *        4 / 2, D 64 (a tensor-core shape, were it 16-bit), causal for f32 out;
 *   4:   e4m3 into f64 out (the f64 kernels), descales per tensor, a window, D 40 / 24;
 *   5:   e5m2 into f16 out, a variable-length batch (q's 1-byte rows at each sequence's base),
 *        descales per tensor, causal.
 * The descales differ per (batch, kv head), so a kernel that indexed them by q head, or forgot
 * v's, would be off by their ratio.
 */
START_TEST(cuda_fp8_matches_reference)
{
    const int varlen = _i == 5, f64 = _i == 4;
    const fa_dtype fmt = _i == 5 || (_i < 4 && (_i & 1)) ? FA_E5M2 : FA_E4M3;
    const fa_dtype odt = _i == 5 ? FA_F16 : f64 ? FA_F64 : (_i & 2) ? FA_F32 : FA_BF16;
    const int64_t B = varlen ? 1 : 2, hq = 4, hk = 2, dqk = f64 ? 40 : 64, dv = f64 ? 24 : 64;
    static const int32_t cq[4] = {0, 7, 7, 137}, ck[4] = {0, 12, 17, 167};
    const int64_t sq = varlen ? cq[3] : 130, sk = varlen ? ck[3] : 200;
    static const float dq[4] = {0.5f, 1.25f, 0.75f, 2.0f}, dk[4] = {0.75f, 0.25f, 1.5f, 0.625f},
                       dvs[4] = {2.0f, 0.625f, 0.3125f, 1.25f};
    fa_params p;
    fa_params_init(&p);
    p.causal = varlen || (_i < 4 && (_i & 2));
    if (f64)
        p.window_left = 30, p.window_right = 9;
    p.descale_q = dq, p.descale_k = dk, p.descale_v = dvs;
    p.descale_layout = _i < 4 ? FA_DESCALE_PER_KV_HEAD : FA_DESCALE_PER_TENSOR;
    ht_tensor q, k, v, o[3], l[3];
    ht_alloc(&q, fmt, B, sq, hq, dqk, SW_BSHD);
    ht_alloc(&k, fmt, B, sk, hk, dqk, SW_BSHD);
    ht_alloc(&v, fmt, B, sk, hk, dv, SW_BSHD);
    fill_fp8(&q, 31 + _i, 3), fill_fp8(&k, 32 + _i, 3), fill_fp8(&v, 33 + _i, 3);
    for (int c = 0; c < 3; c++) { /* reference (f64), conventional, GPU */
        ht_alloc(&o[c], c ? odt : FA_F64, B, sq, hq, dv, SW_BSHD);
        ht_alloc_lse(&l[c], c ? (f64 ? FA_F64 : FA_F32) : FA_F64, B, sq, hq);
    }
    const fa_indices iq = {cq, FA_INDEX_INT32, 4}, ik = {ck, FA_INDEX_INT32, 4};
    for (int c = 0; c < 3; c++) {
        fa_context *ctx = c == 2 ? cuda_context(0)
                                 : ht_context(c ? FA_BACKEND_CONVENTIONAL : FA_BACKEND_REFERENCE, 2);
        dtensor t[5];
        ht_tensor *h[5] = {&q, &k, &v, &o[c], &l[c]};
        fa_tensor ft[5];
        for (int x = 0; x < 5; x++) {
            if (c == 2) {
                if (x >= 3)
                    ht_poison(h[x]);
                d_up(&t[x], h[x]);
                ft[x] = t[x].t;
            } else {
                ft[x] = h[x]->t;
            }
        }
        const fa_status st =
            varlen ? fa_forward_varlen(ctx, &p, &ft[0], &ft[1], &ft[2], &iq, &ik, &ft[3], &ft[4])
                   : fa_forward(ctx, &p, &ft[0], &ft[1], &ft[2], &ft[3], &ft[4]);
        ck_assert_msg(st == FA_OK, "FP8 forward %d: %s", c, fa_last_error());
        if (c == 2) {
            d_down(&t[3]), d_down(&t[4]);
            for (int x = 0; x < 5; x++)
                d_free(&t[x]);
            /* the descales' device copy: 2 doubles per (batch, kv head), or 2 */
            assert_memory(ctx, (size_t)(_i < 4 ? 2 * B * hk : 2) * sizeof(double), "FP8");
        }
        fa_context_destroy(ctx);
    }
    char label[100];
    snprintf(label, sizeof label, "FP8 %s -> %s%s (B%ld Sq%ld Sk%ld H%ld/%ld D%ld/%ld)",
             fa_dtype_name(fmt), fa_dtype_name(odt), varlen ? " varlen" : "", (long)B, (long)sq,
             (long)sk, (long)hq, (long)hk, (long)dqk, (long)dv);
    compare("out", label, &o[1], &o[2], &o[0], 0);
    compare("lse", label, &l[1], &l[2], &l[0], 0);
    ht_free(&q), ht_free(&k), ht_free(&v);
    for (int c = 0; c < 3; c++)
        ht_free(&o[c]), ht_free(&l[c]);
}
END_TEST

/*
 * An FP8 K/V cache under f32 or bf16 q on the device against the float64 reference on the
 * values the codes stand for (f64 K/V holding descale x code, exact; no descales), with the
 * conventional path on the same storage as the yardstick; _i:
 *   0: f32 q over e4m3 K/V, descale_k, descale_v per tensor, a causal chunk (Sq 40, Sk 300);
 *   1: f32 q over e5m2, descales per (batch, kv head), decode (Sq 1, Sk 700, GQA 8 / 2, D 128);
 *   2: bf16 q over an e4m3 cache that grows by fa_forward_kvcache (3 new FP8 keys a sequence,
 *      appended by the 1-byte copy), descales per tensor: the device cache equal to the host's
 *      to the bit.
 */
START_TEST(cuda_fp8_cache_matches_reference)
{
    const fa_dtype qd = _i == 2 ? FA_BF16 : FA_F32, kd = _i == 1 ? FA_E5M2 : FA_E4M3;
    const int64_t B = 2, sq = _i == 0 ? 40 : _i == 1 ? 1 : 3, sk = _i == 0 ? 300 : _i == 1 ? 700 : 64;
    const int64_t hq = _i == 1 ? 8 : 4, hk = 2, d = _i == 1 ? 128 : 64, s_new = _i == 2 ? 3 : 0;
    static const float dk1 = 0.125f, dv1 = 0.375f;
    static const float dk4[4] = {0.25f, 1.5f, 0.75f, 0.125f}, dv4[4] = {0.5f, 2.5f, 1.25f, 0.3125f};
    static const int32_t lens[2] = {5, 30};
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.descale_k = _i == 1 ? dk4 : &dk1;
    p.descale_v = _i == 1 ? dv4 : &dv1;
    p.descale_layout = _i == 1 ? FA_DESCALE_PER_KV_HEAD : FA_DESCALE_PER_TENSOR;
    ht_tensor q, k[3], v[3], kn[3], vn[3], o[3], l[3];
    ht_alloc(&q, qd, B, sq, hq, d, SW_BSHD);
    ht_fill(&q, 41 + _i, 1, -1);
    for (int c = 0; c < 3; c++) { /* reference (f64), conventional, GPU: each its own cache */
        const fa_dtype st = c ? kd : FA_F64;
        ht_alloc(&k[c], st, B, sk, hk, d, SW_BSHD), ht_alloc(&v[c], st, B, sk, hk, d, SW_BSHD);
        ht_alloc(&o[c], c ? qd : FA_F64, B, sq, hq, d, SW_BSHD);
        ht_alloc_lse(&l[c], c ? FA_F32 : FA_F64, B, sq, hq);
        if (s_new)
            ht_alloc(&kn[c], st, B, s_new, hk, d, SW_BSHD),
                ht_alloc(&vn[c], st, B, s_new, hk, d, SW_BSHD);
    }
    for (int c = 1; c < 3; c++) {
        fill_fp8(&k[c], 42 + _i, 4), fill_fp8(&v[c], 43 + _i, 4);
        if (s_new)
            fill_fp8(&kn[c], 44, 4), fill_fp8(&vn[c], 45, 4);
    }
    /* the reference's K/V: descale x code, exact in f64 */
    ht_tensor *const r64[4] = {&k[0], &v[0], &kn[0], &vn[0]}, *const f8[4] = {&k[1], &v[1],
                                                                             &kn[1], &vn[1]};
    for (int t = 0; t < (s_new ? 4 : 2); t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < f8[t]->t.seqlen; s++)
                for (int64_t h = 0; h < hk; h++) {
                    const float *ds = t & 1 ? p.descale_v : p.descale_k;
                    const double x = _i == 1 ? ds[b * hk + h] : ds[0];
                    for (int64_t e = 0; e < d; e++)
                        ht_set(r64[t], b, s, h, e, x * ht_get(f8[t], b, s, h, e));
                }
    fa_params p0;
    fa_params_init(&p0);
    p0.causal = 1;
    const fa_indices cl = {lens, FA_INDEX_INT32, 2};
    for (int c = 0; c < 3; c++) {
        fa_context *ctx = c == 2 ? cuda_context(0)
                                 : ht_context(c ? FA_BACKEND_CONVENTIONAL : FA_BACKEND_REFERENCE, 2);
        dtensor t[7];
        ht_tensor *h[7] = {&q,     &k[c], &v[c], &o[c], &l[c], s_new ? &kn[c] : NULL,
                           s_new ? &vn[c] : NULL};
        fa_tensor ft[7];
        for (int x = 0; x < 7; x++) {
            if (!h[x])
                continue;
            if (c == 2) {
                if (x == 3 || x == 4)
                    ht_poison(h[x]);
                d_up(&t[x], h[x]);
                ft[x] = t[x].t;
            } else {
                ft[x] = c == 0 && x == 0 ? h[x]->t64 : h[x]->t;
            }
        }
        const fa_params *pc = c ? &p : &p0;
        const fa_status st =
            s_new ? fa_forward_kvcache(ctx, pc, &ft[0], &ft[1], &ft[2], &ft[5], &ft[6], &cl, NULL,
                                       &ft[3], &ft[4])
                  : fa_forward(ctx, pc, &ft[0], &ft[1], &ft[2], &ft[3], &ft[4]);
        ck_assert_msg(st == FA_OK, "FP8 cache forward %d: %s", c, fa_last_error());
        if (c == 2)
            for (int x = 0; x < 7; x++)
                if (h[x]) {
                    if (x >= 1 && x <= 4)
                        d_down(&t[x]);
                    d_free(&t[x]);
                }
        fa_context_destroy(ctx);
    }
    char label[80];
    snprintf(label, sizeof label, "q %s over an FP8 %s cache, case %d", fa_dtype_name(qd),
             fa_dtype_name(kd), _i);
    compare("out", label, &o[1], &o[2], &o[0], 0);
    compare("lse", label, &l[1], &l[2], &l[0], 0);
    if (s_new) /* the device's appends are the host's, to the bit */
        ck_assert_msg(!memcmp(k[1].buf, k[2].buf, k[1].nbytes) &&
                          !memcmp(v[1].buf, v[2].buf, v[1].nbytes),
                      "%s: the device cache differs from the host's", label);
    ht_free(&q);
    for (int c = 0; c < 3; c++) {
        ht_free(&k[c]), ht_free(&v[c]), ht_free(&o[c]), ht_free(&l[c]);
        if (s_new)
            ht_free(&kn[c]), ht_free(&vn[c]);
    }
}
END_TEST

/* FP8 q in host memory with device k and v: refused by name, nothing written. */
START_TEST(cuda_fp8_host_pointer_refused)
{
    ht_tensor q, k, v, o, l;
    ht_alloc(&q, FA_E4M3, 1, 10, 2, 32, SW_BSHD), ht_alloc(&k, FA_E4M3, 1, 12, 1, 32, SW_BSHD);
    ht_alloc(&v, FA_E4M3, 1, 12, 1, 32, SW_BSHD), ht_alloc(&o, FA_BF16, 1, 10, 2, 32, SW_BSHD);
    ht_alloc_lse(&l, FA_F32, 1, 10, 2);
    fill_fp8(&q, 1, 2), fill_fp8(&k, 2, 2), fill_fp8(&v, 3, 2);
    ht_poison(&o), ht_poison(&l);
    dtensor dk, dv, dout, dl;
    d_up(&dk, &k), d_up(&dv, &v), d_up(&dout, &o), d_up(&dl, &l);
    static const float ds = 0.5f;
    fa_params p;
    fa_params_init(&p);
    p.descale_q = &ds;
    fa_context *ctx = cuda_context(0);
    const fa_status s = fa_forward(ctx, &p, &q.t, &dk.t, &dv.t, &dout.t, &dl.t);
    ck_assert_int_eq(s, FA_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fa_last_error(), "q->data") != NULL, "%s", fa_last_error());
    assert_memory(ctx, 0, "refused FP8 call");
    fa_context_destroy(ctx);
    d_down(&dout), d_down(&dl);
    ck_assert(ht_is_poisoned(&o) && ht_is_poisoned(&l));
    d_free(&dk), d_free(&dv), d_free(&dout), d_free(&dl);
    ht_free(&q), ht_free(&k), ht_free(&v), ht_free(&o), ht_free(&l);
}
END_TEST

/* A random block mask of q_block x kv_block blocks (batch x heads of them) keeping each block
 * with probability `density`, split between the partial and the full lists (as
 * check_masks.c's). */
typedef struct {
    fa_block_mask bm;
    int32_t *num, *idx, *fnum, *fidx;
} cuda_blocks;

static void cuda_blocks_make(cuda_blocks *x, int64_t batch, int64_t heads, int64_t sq,
                             int64_t sk, int64_t qb, int64_t kb, double density, uint64_t seed)
{
    const int64_t nq = (sq + qb - 1) / qb, nk = (sk + kb - 1) / kb, rows = batch * heads * nq;
    x->num = calloc((size_t)rows, 4), x->fnum = calloc((size_t)rows, 4);
    x->idx = calloc((size_t)(rows * nk), 4), x->fidx = calloc((size_t)(rows * nk), 4);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = nk - 1; c >= 0; c--) { /* descending: any order goes */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(seed >> 11) * 0x1p-53;
            if (u >= density)
                continue;
            if (u < density / 2)
                x->idx[r * nk + x->num[r]++] = (int32_t)c;
            else
                x->fidx[r * nk + x->fnum[r]++] = (int32_t)c;
        }
    x->bm = (fa_block_mask){batch,
                            heads,
                            qb,
                            kb,
                            {x->num, FA_INDEX_INT32, rows},
                            {x->idx, FA_INDEX_INT32, rows * nk},
                            {x->fnum, FA_INDEX_INT32, rows},
                            {x->fidx, FA_INDEX_INT32, rows * nk}};
}

static void cuda_blocks_free(cuda_blocks *x)
{
    free(x->num), free(x->idx), free(x->fnum), free(x->fidx);
}

/*
 * A block mask (fa_params.block_mask) with causal on top, forward and backward on the device
 * against the reference, the conventional path in the same storage as the yardstick, as the
 * sweep; _i: density 0, 0.5, 1 (_i % 3) x dtype f64, f32, f16, bf16 (_i / 3). Blocks of 48
 * rows x 40 keys cut across every kernel tile; the map is per (batch, head) for f64 and f16,
 * broadcast over batch and heads for f32 and bf16. D 64 in f16 / bf16 is a tensor-core shape:
 * the mask must route it to the generic kernels. Density 0: every row empty (O = 0, LSE -inf,
 * every gradient 0). The map's device copy is counted in fa_memory_stats (with the API
 * layer's host map, at least twice its bytes at the peak).
 */
START_TEST(cuda_block_mask_matches_reference)
{
    static const double density[3] = {0, 0.5, 1};
    const fa_dtype dt = dtypes[_i / 3];
    const int per_head = dt == FA_F64 || dt == FA_F16;
    const sw_case c = {.name = "cuda_block_mask_matches_reference", .seed = 400 + _i,
                       .dims = {.b = 2, .sq = 200, .sk = 260, .hq = 4, .hk = 2, .dqk = 64,
                                .dv = 64},
                       .causal = 1};
    const sw_dims dims = c.dims;
    const int64_t mb = per_head ? dims.b : 1, mh = per_head ? dims.hq : 1;
    cuda_blocks x;
    cuda_blocks_make(&x, mb, mh, dims.sq, dims.sk, 48, 40, density[_i % 3], 171 + (uint64_t)_i);
    fa_params p;
    sw_params(&c, &p);
    p.block_mask = &x.bm;
    const fa_dtype lse_dt = dt == FA_F64 ? FA_F64 : FA_F32;
    ht_bundle conv, gpu, ref;
    ht_bundle_alloc(&conv, dt, &dims, c.layout, lse_dt);
    ht_bundle_alloc(&gpu, dt, &dims, c.layout, lse_dt);
    ht_bundle_alloc(&ref, FA_F64, &dims, SW_BSHD, FA_F64);
    ht_fill(&conv.q, 1400 + _i, 1, -1), ht_fill(&conv.k, 2400 + _i, 1, -1);
    ht_fill(&conv.v, 3400 + _i, -1, 1), ht_fill(&conv.dout, 4400 + _i, -1, 1);
    run_cpu(FA_BACKEND_CONVENTIONAL, &p, &conv, &conv, 0);
    run_cpu(FA_BACKEND_REFERENCE, &p, &conv, &ref, 1);
    ht_free(&gpu.q), ht_free(&gpu.k), ht_free(&gpu.v), ht_free(&gpu.dout);
    gpu.q = conv.q, gpu.k = conv.k, gpu.v = conv.v, gpu.dout = conv.dout; /* shared inputs */
    fa_context *ctx = cuda_context(0);
    run_cuda(ctx, &p, &gpu, 1);
    const size_t map = (size_t)(mb * mh * ((dims.sq + 47) / 48) * ((dims.sk + 39) / 40));
    char label[120];
    snprintf(label, sizeof label, "block mask density %g %s map (%ld, %ld)", density[_i % 3],
             fa_dtype_name(dt), (long)mb, (long)mh);
    assert_memory(ctx, 2 * map, label);
    fa_context_destroy(ctx);
    compare("out", label, &conv.out, &gpu.out, &ref.out, 0);
    compare("lse", label, &conv.lse, &gpu.lse, &ref.lse, 0);
    compare("dq", label, &conv.dq, &gpu.dq, &ref.dq, 1);
    compare("dk", label, &conv.dk, &gpu.dk, &ref.dk, 1);
    compare("dv", label, &conv.dv, &gpu.dv, &ref.dv, 1);
    int64_t empty = 0;
    for (int64_t b = 0; b < dims.b; b++)
        for (int64_t h = 0; h < dims.hq; h++)
            for (int64_t i = 0; i < dims.sq; i++) {
                if (ht_get(&ref.lse, b, i, h, 0) != -INFINITY)
                    continue;
                empty++;
                ck_assert_msg(ht_get(&gpu.lse, b, i, h, 0) == -INFINITY, "%s: empty row %ld LSE",
                              label, (long)i);
                for (int64_t d = 0; d < dims.dv; d++)
                    ck_assert_msg(ht_get(&gpu.out, b, i, h, d) == 0 &&
                                      ht_get(&gpu.dq, b, i, h, d) == 0,
                                  "%s: empty row %ld", label, (long)i);
            }
    if (density[_i % 3] == 0) { /* every row empty, every gradient 0 */
        ck_assert_int_eq(empty, dims.b * dims.hq * dims.sq);
        ck_assert(ht_max_abs(&gpu.dk) == 0 && ht_max_abs(&gpu.dv) == 0);
    }
    if (density[_i % 3] == 1)
        ck_assert_int_eq(empty, 0);
    ht_free(&gpu.out), ht_free(&gpu.lse), ht_free(&gpu.dq), ht_free(&gpu.dk), ht_free(&gpu.dv);
    ht_bundle_free(&conv), ht_bundle_free(&ref);
    cuda_blocks_free(&x);
}
END_TEST

/*
 * A block mask of density 0.5 beside a float bias (1, Sq, 1, Sk) with its gradient, causal:
 * the bias gradient's kernel skips the pairs the map does not list (their entries' gradients
 * 0, as the reference's), against the reference within the rule (bias_run); f32 and bf16.
 */
START_TEST(cuda_block_mask_bias_grad)
{
    const fa_dtype dt = _i ? FA_BF16 : FA_F32;
    const sw_dims dims = {.b = 2, .sq = 97, .sk = 131, .hq = 4, .hk = 2, .dqk = 64, .dv = 64};
    cuda_blocks x;
    cuda_blocks_make(&x, 1, dims.hq, dims.sq, dims.sk, 32, 24, 0.5, 913 + (uint64_t)_i);
    ht_tensor bias;
    ht_alloc(&bias, FA_F32, 1, dims.sq, 1, dims.sk, SW_BSHD);
    ht_fill(&bias, 97 + _i, 2, -2);
    fa_params p;
    fa_params_init(&p);
    p.causal = 1;
    p.block_mask = &x.bm;
    bias_run(&dims, SW_BSHD, dt, 420 + _i, &p, &bias, 1, 0, "with a block mask");
    ht_free(&bias);
    cuda_blocks_free(&x);
}
END_TEST

/* The FP8 and block-mask tests, a test case of their own (CK_RUN_CASE=fp8_blocks). */
static TCase *make_fp8_blocks_tcase(int small)
{
    TCase *tc = ht_tcase_create("fp8_blocks");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, cuda_fp8_matches_reference, 0, 6);
    tcase_add_loop_test(tc, cuda_fp8_cache_matches_reference, 0, 3);
    tcase_add_test(tc, cuda_fp8_host_pointer_refused);
    tcase_add_loop_test(tc, cuda_block_mask_matches_reference, 0, small ? 6 : 12);
    tcase_add_loop_test(tc, cuda_block_mask_bias_grad, 0, 2);
    return tc;
}

/* A backward of 2^40 batches with no rows on the device: nothing to do, at once. */
START_TEST(cuda_empty_huge_batch)
{
    fa_context *ctx = cuda_context(0);
    ht_tensor x;
    ht_alloc(&x, FA_F16, 1, 1, 2, 64, SW_BSHD);
    dtensor dx;
    d_up(&dx, &x);
    fa_params p;
    fa_params_init(&p);
    fa_tensor e[9];
    for (int i = 0; i < 9; i++) {
        e[i] = dx.t;
        e[i].batch = (int64_t)1 << 40, e[i].seqlen = 0, e[i].data = NULL;
    }
    e[4].headdim = 1, e[4].dtype = FA_F32; /* the LSE */
    const fa_status st =
        fa_backward(ctx, &p, &e[0], &e[1], &e[2], &e[3], &e[4], &e[5], &e[6], &e[7], &e[8]);
    ck_assert_msg(st == FA_OK, "empty backward: %s: %s", fa_status_string(st), fa_last_error());
    d_free(&dx);
    fa_context_destroy(ctx);
    ht_free(&x);
}
END_TEST

/* The bias tests, a test case of their own (CK_RUN_CASE=bias runs them alone). */
static TCase *make_bias_tcase(int small)
{
    TCase *tc = ht_tcase_create("bias");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, cuda_keep_mask_equals_causal, 0, small ? 2 : 8);
    tcase_add_loop_test(tc, cuda_bias_matches_reference, 0, small ? 4 : 24);
    if (small)
        tcase_add_loop_test(tc, cuda_bias_matches_reference, 16, 20);
    tcase_add_loop_test(tc, cuda_bias_masked_nonfinite_kv, 0, 2);
    tcase_add_test(tc, cuda_bias_host_pointer_refused);
    return tc;
}

/* CHECK_CUDA_SMALL=1 (`small`): a short sweep for compute-sanitizer (every kernel, small
 * sizes). The plans are made (plans_make) before. */
static Suite *make_cuda_suite(int small)
{
    Suite *s = suite_create("cuda");
    TCase *tc = ht_tcase_create("sweep");
    tcase_set_timeout(tc, 600);
    suite_add_tcase(s, make_bias_tcase(small));
    suite_add_tcase(s, make_fp8_blocks_tcase(small));
    if (small) {
        ADD_PLAN_TEST(tc, cuda_matches_reference);
        ADD_PLAN_TEST(tc, cuda_generic_matches_reference);
        ADD_PLAN_TEST(tc, cuda_deterministic_matches_reference);
        tcase_add_loop_test(tc, cuda_masked_nonfinite_never_reaches_output, 0, 4);
        tcase_add_loop_test(tc, cuda_allowed_inf_v_reaches_output, 0, 8);
        tcase_add_test(tc, cuda_host_pointers_refused);
        tcase_add_test(tc, cuda_empty_sequences);
        tcase_add_test(tc, cuda_deterministic_memory_auto);
        ADD_PLAN_TEST(tc, cuda_sink_tokens_match_reference);
        tcase_add_loop_test(tc, cuda_sequences_match_reference, 0, 16);
        suite_add_tcase(s, tc);
        return s;
    }
    ADD_PLAN_TEST(tc, cuda_matches_reference);
    ADD_PLAN_TEST(tc, cuda_generic_matches_reference);
    ADD_PLAN_TEST(tc, cuda_deterministic_matches_reference);
    ADD_PLAN_TEST(tc, cuda_mma_matches_reference);
    ADD_PLAN_TEST(tc, cuda_large_logits);
    ADD_PLAN_TEST(tc, cuda_negative_logits_padding_keys);
    tcase_add_loop_test(tc, cuda_dropout_mask_exact, 0, 2);
    tcase_add_loop_test(tc, cuda_masked_nonfinite_never_reaches_output, 0, 4);
    tcase_add_loop_test(tc, cuda_allowed_inf_v_reaches_output, 0, 8);
    tcase_add_test(tc, cuda_host_pointers_refused);
    tcase_add_test(tc, cuda_bad_kernel_choice_refused);
    tcase_add_test(tc, cuda_describe_prints_plan);
    tcase_add_test(tc, cuda_deterministic_memory_auto);
    tcase_add_test(tc, cuda_empty_sequences);
    tcase_add_test(tc, cuda_unsupported_head_dim);
    tcase_add_loop_test(tc, cuda_device_allocation_failure, 0, 2);
    ADD_PLAN_TEST(tc, cuda_sinks_match_reference);
    ADD_PLAN_TEST(tc, cuda_sink_tokens_match_reference);
    tcase_add_loop_test(tc, cuda_sink_grad_matches_host, 0, 2);
    tcase_add_loop_test(tc, cuda_kv_dtype_matches_reference, 0, 6);
    tcase_add_loop_test(tc, cuda_sequences_match_reference, 0, 16);
    tcase_add_test(tc, cuda_empty_huge_batch);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev >= 2)
        tcase_add_test(tc, cuda_other_device_refused);
    else
        printf("check_cuda: one device; the other-device test is not run\n");
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* both sets of plans made on every run, device or none, so that a name not in the table
     * fails where there is no GPU too (CI); the set made last runs */
    const int small = getenv("CHECK_CUDA_SMALL") != NULL;
    plans_make(!small);
    plans_make(small);
    if (getenv("CHECK_CUDA_LIST")) { /* the sweep's runs, with or without a device */
        plans_list();
        return EXIT_SUCCESS;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("check_cuda: no CUDA device here; skipped\n");
        return 77;
    }
    SRunner *sr = srunner_create(make_cuda_suite(small));
    /* a forked child cannot use the CUDA context its parent created */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
