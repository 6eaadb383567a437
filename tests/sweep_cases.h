/*
 * The backend sweep's cases (docs/DESIGN.md §4): one table of named cases read by every runner
 * (tests/check_backends.c, tests/check_cuda.c, tests/sweep_digest.c), and the one mapping from a
 * case to its sizes, its tensors' shapes, its fa_params and its inputs' draws.
 *
 * Runners pick cases by name (sw_case_named, which aborts on a name not in the table) or by the
 * sweeps a case is marked for (.runs), never by position: a row added anywhere changes no
 * other case's run. Public API only (flashattn.h): sweep_digest.c includes tests/sweep_cases.c
 * to build against old trees' libraries.
 */
#ifndef FA_TEST_SWEEP_CASES_H
#define FA_TEST_SWEEP_CASES_H

#include <stdint.h>

#include "flashattn.h"

/* How a runner lays its tensors out: BSHD, BHSD, or BSHD with gaps (each runner chooses the
 * gaps; the library's results must not depend on them). */
typedef enum { SW_BSHD, SW_BHSD, SW_PADDED } sw_layout;

/* A case's sizes. In the table, sq and sk may be relative to the runner's tiles: SW_BQ(x) is
 * the query tile plus x, SW_BK(x) the key tile plus x (|x| < 2^19); sw_dims_of resolves them. */
typedef struct {
    int64_t b, sq, sk, hq, hk, dqk, dv;
} sw_dims;

#define SW_BQ(x) (((int64_t)1 << 40) + (x))
#define SW_BK(x) (((int64_t)2 << 40) + (x))

/* A local window (fa_params.window_left, window_right; -1: unbounded on that side). A case
 * without one has neither bound. */
typedef struct {
    int on;
    int64_t left, right;
} sw_window;
#define SW_WINDOW(left, right) {1, (left), (right)}

/* The sweeps that take a case by its mark (tests that pick cases by name, as check_cuda.c's
 * sinks and large-logit tests, its short sweep and sweep_digest.c's list, are not marked). */
enum {
    SW_BACKENDS = 1 << 0, /* check_backends.c: every CPU backend and kernel set, every dtype */
    SW_CUDA = 1 << 1,     /* check_cuda.c's sweep: every dtype                              */
    SW_CUDA_TC = 1 << 2,  /* check_cuda.c: f16, bf16 on the generic (FMA) kernels and with the
                           * deterministic backward too (the tensor-core shapes)            */
    SW_CUDA_MMA = 1 << 3, /* check_cuda.c: f16, bf16 on the mma.sync kernels too (the shapes
                           * the wgmma kernels take on Hopper)                              */
};

typedef struct {
    const char *name; /* unique in the table */
    unsigned runs;    /* SW_ marks: the sweeps that take it */
    int seed;         /* the inputs' and the dropout stream's (sw_params, sw_draw) */
    sw_dims dims;
    int causal, top_left; /* top_left: FA_ALIGN_TOP_LEFT (else bottom-right) */
    sw_window window;
    int64_t sink_tokens;
    double softcap;
    int alibi; /* slopes 2^-1 ... 2^-7 and 0.004 (sw_params; at most 8 heads) */
    fa_score_order order;
    double dropout;
    sw_layout layout;
    /* {0, 0}: q, k N(0, 1). Else q and k uniform so that every scaled score q.k / sqrt(Dqk)
     * falls in [logits[0], logits[1]] (both of one sign: k's range negated for negative ones) */
    double logits[2];
    int nonfinite; /* inf/NaN planted in K, V and Q (sweep_digest.c's runs alone) */
} sw_case;

extern const sw_case sw_cases[];
extern const int sw_ncases;

/* The case of that name; a name not in the table (or in it twice) aborts with a message. */
const sw_case *sw_case_named(const char *name);

/* Up to max of the cases marked for any of `runs`, in table order, into out; their number. A
 * selection that does not fit aborts with a message. */
int sw_select(unsigned runs, const sw_case **out, int max);

/* The case's sizes, SW_BQ/SW_BK resolved against tiles of bq query rows and bk keys. */
sw_dims sw_dims_of(const sw_case *c, int64_t bq, int64_t bk);

/* The tensors of one forward + backward, and the shape (batch, seqlen, heads, headdim) of
 * each for sizes d: q, dq (B, Sq, Hq, Dqk); k, dk (B, Sk, Hk, Dqk); v, dv (B, Sk, Hk, Dv);
 * out, dout (B, Sq, Hq, Dv); the LSE (B, Sq, Hq, 1) (stored B x H x S by every runner). */
typedef enum {
    SW_Q, SW_K, SW_V, SW_DOUT, /* the inputs */
    SW_OUT, SW_DQ, SW_DK, SW_DV, SW_LSE, SW_NTENSORS
} sw_tensor;
void sw_shape(const sw_dims *d, sw_tensor t, int64_t shape[4]);

/* The LSE's dtype for the case at sizes d in storage dtype dt: f32 (f64 in f64), but f64 where
 * an f32 LSE's own rounding would reach the gradients' bounds (sweep_cases.c says where). */
fa_dtype sw_lse_dtype(const sw_case *c, const sw_dims *d, fa_dtype dt);

/* fa_params for the case: its mask, score and dropout switches; the dropout stream's seed from
 * the case's seed (offset 3). */
void sw_params(const sw_case *c, fa_params *p);

/* How input t (SW_Q, SW_K, SW_V or SW_DOUT) of the case is drawn: its generator's seed and
 * its range [lo, hi) (lo > hi: N(0, 1)). */
void sw_draw(const sw_case *c, sw_tensor t, uint64_t *seed, double *lo, double *hi);

#endif
