/* Test harness: tensors in any dtype and layout with an exact float64 twin, backend runners,
 * error measures and the tolerance rule of docs/DESIGN.md §4. */
#ifndef FA_TEST_HARNESS_H
#define FA_TEST_HARNESS_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "sweep_cases.h"

typedef struct {
    fa_tensor t;   /* the tensor in its storage dtype and layout                   */
    fa_tensor t64; /* the same values, float64, contiguous BSHD (the oracle's input) */
    void *buf;
    double *buf64;
    size_t nbytes; /* of buf */
} ht_tensor;

void ht_alloc(ht_tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D,
              sw_layout layout);
void ht_free(ht_tensor *x);
/* Values drawn uniformly in [lo, hi) (or N(0,1) when lo > hi), rounded to the dtype; the
 * float64 twin holds exactly the stored values. */
void ht_fill(ht_tensor *x, uint64_t seed, double lo, double hi);
void ht_set(ht_tensor *x, int64_t b, int64_t s, int64_t h, int64_t d, double v); /* both copies */
double ht_get(const ht_tensor *x, int64_t b, int64_t s, int64_t h, int64_t d);  /* from t */
/* Sets every byte of the storage (and the twin) to a recognizable pattern. */
void ht_poison(ht_tensor *x);
/* Whether the storage still holds ht_poison's pattern everywhere, and its guard zones theirs. */
int ht_is_poisoned(const ht_tensor *x);
/* The dropout draw of (head, row i, key j) as docs/DESIGN.md §1 defines it, written out from
 * Philox itself, independently of core/philox.h's helpers: head's key = words 0, 1 of
 * Philox({head lo, head hi, offset lo, offset hi}, seed); the draw = word j % 4 of
 * Philox({j/4 lo, j/4 hi, i lo, i hi}, that key). */
uint32_t ht_dropout_draw(uint64_t seed, uint64_t offset, uint64_t head, uint64_t i, uint64_t j);

/* Whether the guard zones around the storage are untouched (ht_free asserts it). */
int ht_guards_intact(const ht_tensor *x);

/* LSE tensors: B x H x S (the fa_tensor is batch x seqlen x heads x 1), f32 or f64 storage. */
void ht_alloc_lse(ht_tensor *x, fa_dtype dt, int64_t B, int64_t S, int64_t H);

/* The ISA the contexts of ht_context / ht_forward / ht_backward use (default AUTO). */
extern fa_isa ht_isa;
/* The kernel set the contexts of ht_context run with in place of their ISA's, or NULL (the
 * default): the tests set it to ht_emulated_tiles() (tests/tiles_emulated.c), this CPU's best
 * set with portable tile products attached, so that the bf16 tile paths run on any CPU. */
struct fai_kernels_f32_s;
extern const struct fai_kernels_f32_s *ht_kernels;
const struct fai_kernels_f32_s *ht_emulated_tiles(void);
/* Whether the tests' runs on the emulated tile products are to be skipped: FA_TEST_EMULATED_TILES=0
 * (CI's aarch64 stage, where qemu runs their double-precision sums slowly; its native stage runs
 * them). */
int ht_emulated_tiles_skipped(void);
/* Every ISA of the registry (src/simd/isas.def), newest first: the tests' ISA loops. */
extern const fa_isa ht_isas[];
extern const int ht_nisas;
/* Whether ht_isas[i] runs here and is not a run made already for storage dtype dt: the
 * kernels it runs for dt are not those of an ISA earlier in ht_isas (f64 storage runs one set
 * on every ISA; the AMX and AVX512_BF16 sets keep the AVX-512 set's f32 kernels). */
int ht_isa_distinct(int i, fa_dtype dt);
/* Whether the tests' ISA loops over whole calls take ht_isas[i] for dt: ht_isa_distinct, and
 * under emulation (FA_CROSS_BUILD: a cross build's make check, under qemu) not the portable set
 * where a vector set runs: qemu is there for the vector set, and the native build tests the
 * portable one (the kernels' own tests, check_kernels.c, take it under qemu too: cheap, and
 * its C compiles to other code there, FMAs contracted). */
int ht_isa_tested(int i, fa_dtype dt);
fa_context *ht_context(fa_backend be, int threads);
fa_status ht_forward(fa_backend be, int threads, const fa_params *p, const fa_tensor *q,
                     const fa_tensor *k, const fa_tensor *v, fa_tensor *out, fa_tensor *lse);
fa_status ht_backward(fa_backend be, int threads, const fa_params *p, const fa_tensor *q,
                      const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                      fa_tensor *dk, fa_tensor *dv);

/* A test case whose every test ends (by a checked fixture: also after a failure under
 * CK_FORK=no, where the tests share one process) by putting back what tests change for the
 * next one: ht_isa, ht_kernels, and the environment variables the library reads, as they were
 * when the first case was created. The suites that run the library create their cases by it. */
TCase *ht_tcase_create(const char *name);

/* max |got - ref| over all elements (got from its storage, ref from its storage); a NaN on one
 * side only counts as +inf, NaN on both as 0. */
double ht_max_err(const ht_tensor *got, const ht_tensor *ref);
/* fa_compare's statistics in words, each with its bound, the failed ones marked (a buffer of
 * the calling thread's, valid until its next call). */
const char *ht_stats(const fa_comparison *c);
double ht_max_abs(const ht_tensor *x);


/* Tile sizes whose multiples are tile edges of both the tiled forward and backward (internal;
 * the tests link the static library). */
void ht_tiles(int64_t dqk, int64_t dv, fa_dtype dt, int64_t *bq, int64_t *bk);
/* fai_tiled_decode_keys for a forward of these operands on a context of `threads` (0: the
 * tiles; > 0: the decode path's chunk; -1: the operands are refused). Internal too. */
int64_t ht_decode_keys(int threads, const fa_params *p, const fa_tensor *q, const fa_tensor *k,
                       const fa_tensor *v);

/* Suites. */
Suite *make_core_suite(void);
Suite *make_api_suite(void);
Suite *make_reference_suite(void);
Suite *make_backends_suite(void);
Suite *make_semantics_suite(void);
Suite *make_masks_suite(void);
Suite *make_fp8_suite(void);
Suite *make_quant_suite(void);
Suite *make_memory_suite(void);
Suite *make_compare_suite(void);
Suite *make_npy_suite(void);
Suite *make_kernels_suite(void);
Suite *make_faults_suite(void);
Suite *make_inference_suite(void);

/* The tensors of one forward + backward, in one storage dtype (LSE: lse_dt). */
typedef struct {
    ht_tensor q, k, v, dout, out, lse, dq, dk, dv;
} ht_bundle;

/* Allocates a bundle of sizes d (sw_shape's shapes) in layout lay. */
void ht_bundle_alloc(ht_bundle *x, fa_dtype dt, const sw_dims *d, sw_layout lay, fa_dtype lse_dt);
void ht_bundle_free(ht_bundle *x);
/* Fills the bundle's inputs (q, k, v, dout) as case c draws them (sw_draw). */
void ht_bundle_draw(ht_bundle *x, const sw_case *c);

/* The LSE's yardstick as flashattn check takes it (fa_lse_rule, docs/DESIGN.md §4) for a
 * kernel storing dt with x's LSE dtype: where that moves it to f32, allocates lse like x's,
 * fills it with the conventional forward in f32 on the values of x's q, k, v (params p), sets
 * tol's allowances and returns 1; else returns 0 (x's own LSE is the yardstick, tol's
 * allowances 0). */
int ht_lse_yardstick(const fa_params *p, const ht_bundle *x, fa_dtype dt, ht_tensor *lse,
                     fa_tolerance *tol);

#endif
