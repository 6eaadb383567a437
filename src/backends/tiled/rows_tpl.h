/*
 * The tiled loop nest's row helpers, shared by its forward (forward_tpl.h) and backward
 * (backward_tpl.h). The three templates are written once for a compute type FT and included
 * by backends/tiled/tiled.c once per type: float (f32, f16 and bf16 storage, with the
 * context's kernel set) and double (f64 storage, with the portable f64 set). The includer
 * defines:
 *   FT                 the compute type
 *   FAI_T(name)        name with the type's suffix (_f32 or _f64): the template's own
 *                      functions, and the per-type names it calls: the kernel table
 *                      FAI_T(fai_kernels) (simd/kernels.h) and its GEMM loops
 *                      FAI_T(fai_gemm), FAI_T(fai_gemm_at); the score pipeline FAI_T(fai_score)
 *                      (core/score.h); the NaN-sticky max FAI_T(fai_nanmax) (core/fmath.h);
 *                      the recurrence FAI_T(fai_online_move), FAI_T(fai_online_sum),
 *                      FAI_T(fai_online_finalize) (core/recurrence.h); the gradient
 *                      FAI_T(fai_dscore) (core/gradient.h)
 *   FT_DTYPE           the storage dtype that is FT itself (read in place, without conversion)
 *   FT_UINT            the unsigned integer type of FT's size (its bits)
 *   FT_TILE_PRODUCTS   1 where the kernel set may have tile products (float), else 0: the two
 *                      calls that pass them FT buffers (their Q K^T and P V take float) are
 *                      compiled only then; with double the plan never gives tile products,
 *                      so their other branches are dead code the compiler drops
 * Everything the loops decide about tiles comes from the plan (backends/tiled/plan.h).
 *
 * Every sum runs in a fixed order (over d for scores, over keys for accumulators; the kernels
 * keep that order, simd/kernels.h), so results are the same at every thread count.
 */

/* The keys of tile [j0, j0 + n) that row i may see, as tile columns [*c0, *c1). */
static void FAI_T(row_cols)(const fai_problem *pr, fai_tile_class cls, int64_t i, int64_t j0,
                            int64_t n, int64_t *c0, int64_t *c1)
{
    if (cls == FAI_TILE_FULL) {
        *c0 = 0;
        *c1 = n;
        return;
    }
    int64_t lo, hi;
    fai_mask_row(&pr->mask, i, &lo, &hi);
    *c0 = lo > j0 ? lo - j0 : 0;
    *c1 = hi < j0 + n ? hi - j0 : n;
}

/* Rows [*r0, *r1) of the nq rows from i0: from the first to the last that sees any of the
 * keys [j0, j0 + n) (all nq for a FULL tile; *r0 == *r1 if none does). */
static void FAI_T(row_span)(const fai_problem *pr, fai_tile_class cls, int64_t i0, int64_t nq,
                            int64_t j0, int64_t n, int64_t *r0, int64_t *r1)
{
    int64_t lo = 0, hi = nq, c0, c1;
    for (; cls != FAI_TILE_FULL && lo < hi; lo++) {
        FAI_T(row_cols)(pr, cls, i0 + lo, j0, n, &c0, &c1);
        if (c0 < c1)
            break;
    }
    for (; cls != FAI_TILE_FULL && hi > lo; hi--) {
        FAI_T(row_cols)(pr, cls, i0 + hi - 1, j0, n, &c0, &c1);
        if (c0 < c1)
            break;
    }
    *r0 = lo;
    *r1 = hi;
}

/* Loads n rows of dim elements of storage dtype dt, row c at src + c ld elements (a run from
 * an accessor of backends/rows.h), into dst (n x dim, row-major). */
static void FAI_T(load_run)(const FAI_T(fai_kernels) *kern, const void *src, int64_t ld,
                            fa_dtype dt, int64_t n, int64_t dim, FT *dst)
{
    for (int64_t c = 0; c < n; c++)
        kern->widen((const char *)src + fai_dtype_bytes(dt, c * ld), dt, dim, dst + c * dim);
}

/* The same rows as a row-major matrix to read from: the run itself when its dtype is FT (with
 * its stride as *ldv), else converted into buf (*ldv = dim). */
static const FT *FAI_T(view_run)(const FAI_T(fai_kernels) *kern, const void *src, int64_t ld,
                                 fa_dtype dt, int64_t n, int64_t dim, FT *buf, int64_t *ldv)
{
    if (dt == FT_DTYPE) {
        *ldv = ld;
        return (const FT *)src;
    }
    FAI_T(load_run)(kern, src, ld, dt, n, dim, buf);
    *ldv = dim;
    return buf;
}

/* Whether head h's score pipeline is the scale alone, and a bias added (no softcap, no ALiBi
 * distance): the Q K^T GEMM then applies the scale in its store, with the single rounding of
 * the pipeline's multiply, and add_bias the bias. */
static int FAI_T(scale_only)(const fai_problem *pr, FT slope)
{
    return fai_score_is_affine(&pr->score, slope);
}

/* Row i of (b, h)'s additions to the scores of keys [j, j + n) into dst (fai_row_biased): the
 * bias tensor's entries widened to FT (a keep-mask as 0 / -inf, base/dtype.h, here in a loop
 * the compiler vectorizes), or 0 without one; then -inf in the key blocks that the block mask
 * does not list for the row's block. */
static void FAI_T(load_bias)(const fai_problem *pr, const FAI_T(fai_kernels) *kern, int64_t b,
                             int64_t h, int64_t i, int64_t j, int64_t n, FT *dst)
{
    if (!pr->bias) {
        for (int64_t c = 0; c < n; c++)
            dst[c] = 0;
    } else if (pr->bias->dtype != FA_BOOL) {
        const fa_dtype dt = pr->bias->dtype;
        kern->widen((const char *)fai_bias_row(pr, b, h, i) + (size_t)j * fai_dtype_size(dt), dt,
                    n, dst);
    } else {
        const unsigned char *keep = (const unsigned char *)fai_bias_row(pr, b, h, i) + j;
#pragma omp simd
        for (int64_t c = 0; c < n; c++)
            dst[c] = keep[c] != 0 ? (FT)0 : (FT)-INFINITY;
    }
    const fai_block_map *m = pr->blocks;
    for (int64_t c = 0; m && c < n;) { /* key block by key block */
        const int64_t end = ((j + c) / m->kv_block + 1) * m->kv_block - j,
                      stop = end < n ? end : n;
        if (!fai_block_listed(pr, b, h, i, j + c))
            for (int64_t x = c; x < stop; x++)
                dst[x] = (FT)-INFINITY;
        c = stop;
    }
}

/* Asks for row i of (b, h)'s bias entries for keys [j, j + n) ahead of their load_bias: bias
 * rows lie a whole key row apart, which the hardware prefetchers do not follow (on a Zen 3,
 * the loads of an f16 bias broadcast over 8 heads stalled the forward by half its time). */
static void FAI_T(prefetch_bias)(const fai_problem *pr, int64_t b, int64_t h, int64_t i,
                                 int64_t j, int64_t n)
{
    const size_t es = fai_dtype_size(pr->bias->dtype);
    const char *row = (const char *)fai_bias_row(pr, b, h, i) + (size_t)j * es;
    for (size_t x = 0; x < (size_t)n * es; x += 64)
        __builtin_prefetch(row + x, 0, 3);
}

/* s[c] += factor bias[c] for n scores that the scale alone formed, -inf where the bias masks:
 * core/score.h's pipeline without cap or distance term (factor: fai_bias_factor). The choice of
 * -inf is made on the bits (the bias's own -inf where it masks, else the sum), because gcc -O2
 * turns a floating-point select into a branch, which stops it vectorizing the loop. */
static void FAI_T(add_bias)(int64_t n, const FT *bias, FT factor, FT *s)
{
    const FT neg_inf = -INFINITY;
    FT_UINT inf_bits;
    memcpy(&inf_bits, &neg_inf, sizeof inf_bits);
#pragma omp simd
    for (int64_t c = 0; c < n; c++) {
        const FT sum = s[c] + factor * bias[c];
        FT_UINT sb, bb;
        memcpy(&sb, &sum, sizeof sb);
        memcpy(&bb, &bias[c], sizeof bb);
        const FT_UINT masks = (FT_UINT)0 - (FT_UINT)(bb == inf_bits); /* all ones or none */
        const FT_UINT r = (sb & ~masks) | (bb & masks);
        memcpy(&s[c], &r, sizeof r);
    }
}

/* n copies of the score scale from the arena: the GEMM's store factors (filled once carved). */
static FT *FAI_T(carve_scale_rows)(fai_arena *a, const fai_problem *pr, int64_t n)
{
    FT *rows = fai_carve(a, (size_t)n * sizeof(FT));
    for (int64_t r = 0; rows && r < n; r++)
        rows[r] = (FT)pr->score.scale;
    return rows;
}

#if FT_TILE_PRODUCTS
/* Whether n bf16 values hold no inf and no NaN (an exponent of all ones): the tile products'
 * operands tested as stored, without an f32 copy. */
static int FAI_T(bf16_finite)(int64_t n, const uint16_t *x)
{
    unsigned bad = 0;
#pragma omp simd reduction(| : bad)
    for (int64_t i = 0; i < n; i++)
        bad |= (x[i] & 0x7f80u) == 0x7f80u;
    return !bad;
}
#endif
