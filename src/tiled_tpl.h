/*
 * The tiled algorithm — the framework's loop nest, tiling and edges — written once for a
 * compute type FT and included by tiled.c once per type (float for f32/f16/bf16 storage, with
 * the ISA's kernels; double for f64, with portable ones). The includer defines:
 *   FT, FAI_T(name), FT_DTYPE   the type, the suffix appended to every function name, and the
 *                               storage dtype that is FT itself (read without conversion)
 *   FT_LOAD, FT_STORE           row conversions from/to the storage dtype (kernel set first)
 *   FT_SCORE                    the score pipeline (core/score.h)
 *   FT_GEMM, FT_GEMM_AT,        the block operations (simd/kernels.h for float, portable code
 *   FT_EXPSUM, FT_MAX,          for double): C (+)= A B and A^T B, y = exp(x - m) with its sum,
 *   FT_TRANSPOSE, FT_COLDOT,    a max, a transpose, dots of columns, the
 *   FT_DSOFTMAX, FT_FINITE      backward's row, a finiteness test
 *   FT_PANEL                    rows per panel of the forward's packed Q (the GEMM kernel's MR)
 *   FT_TILES, FT_TILES_QK,      the kernel set's tile products where they take the problem
 *   FT_TILES_PV                 (AMX, bf16 storage), and their two calls (NULL and nothing
 *                               for double)
 *   FT_MOVE, FT_FINALIZE        the recurrence (core/recurrence.h)
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

/* Loads n rows of (b, hk) from t, starting at row j0, into dst (n x dim, row-major). */
static void FAI_T(load_rows)(const fai_kernels_f32 *kern, const fa_tensor *t, fa_dtype dt,
                             int64_t b, int64_t hk, int64_t j0, int64_t n, int64_t dim, FT *dst)
{
    for (int64_t c = 0; c < n; c++)
        FT_LOAD(kern, fai_row(t, b, j0 + c, hk), dt, dim, dst + c * dim);
}

/* The same rows as a row-major matrix to read from: the tensor itself when it stores FT (with
 * its sequence stride as *ld), else converted into buf (*ld = dim). */
static const FT *FAI_T(rows_view)(const fai_kernels_f32 *kern, const fa_tensor *t, fa_dtype dt,
                                  int64_t b, int64_t hk, int64_t j0, int64_t n, int64_t dim,
                                  FT *buf, int64_t *ld)
{
    if (dt == FT_DTYPE) {
        *ld = t->seq_stride;
        return (const FT *)fai_row(t, b, j0, hk);
    }
    FAI_T(load_rows)(kern, t, dt, b, hk, j0, n, dim, buf);
    *ld = dim;
    return buf;
}

/* Whether head h's score pipeline is the scale alone (no softcap, no ALiBi): the Q K^T GEMM then
 * applies it in its store, with the single rounding of the pipeline's multiply. */
static int FAI_T(scale_only)(const fai_problem *pr, FT slope)
{
    return pr->score.softcap == 0 && slope == 0;
}

/* n copies of the score scale from the arena: the GEMM's store factors (filled once carved). */
static FT *FAI_T(carve_scale_rows)(fai_arena *a, const fai_problem *pr, int64_t n)
{
    FT *rows = fai_carve(a, (size_t)n * sizeof(FT));
    for (int64_t r = 0; rows && r < n; r++)
        rows[r] = (FT)pr->score.scale;
    return rows;
}

/* ------------------------------------------------------------------ forward */

typedef struct {
    FT *q;                       /* the query tile, in panels of FT_PANEL rows (FAI_T(gemm_qk)) */
    FT *qrows;                   /* FT_PANEL rows of Q converted from storage, before packing   */
    FT *k, *kt, *v, *acc, *m, *l, *x;
    FT *sp;                      /* a strip's scores S, then its P in place (br x sp_ld; with
                                  * the tile products br rounded up to 16 rows)              */
    FT *scale_rows;              /* FT_PANEL copies of the score scale (FAI_T(gemm_qk))         */
    int64_t *cols;               /* a strip's rows' allowed columns, [c0, c1) pairs (br x 2)    */
    unsigned char *live, *keep;
    const fai_kernels_f32 *kern; /* the f32 path's kernel set (unused by f64) */
    int64_t sp_ld;               /* row pitch of sp: bk, or bk rounded up to 32 with tiles     */
    /* bf16 storage on the tile products (FT_TILES, AMX; NULL otherwise): Q rows as stored
     * (nq rows, then 16 zero rows), K^T and V as the kernels pack them, their scratch */
    const fai_kernels_bf16 *bf16;
    uint16_t *qb, *ktb, *vb;
    void *tile_scratch;
} FAI_T(fwd_ws);

static size_t FAI_T(fwd_carve)(const fai_problem *pr, fai_tiles tl,
                               const fai_kernels_f32 *kern, char *base, FAI_T(fwd_ws) *w)
{
    fai_arena a = {base, 0};
    w->kern = kern;
    w->bf16 = FT_TILES(pr, kern);
    w->sp_ld = w->bf16 ? (tl.bk + 31) / 32 * 32 : tl.bk;
    const int64_t br_up = w->bf16 ? (tl.br + 15) / 16 * 16 : tl.br;
    w->qb = w->ktb = w->vb = NULL;
    w->tile_scratch = NULL;
    if (w->bf16) {
        w->qb = fai_carve(&a, (size_t)(((tl.bq + 15) / 16 * 16 + 16) * pr->dqk) * 2);
        w->ktb = fai_carve(&a, (size_t)(w->sp_ld * pr->dqk) * 2);
        w->vb = fai_carve(&a, (size_t)(w->sp_ld * pr->dv) * 2);
        w->tile_scratch = fai_carve(&a, (size_t)(16 * (4 * w->sp_ld + 4 * pr->dv)));
    }
    const int64_t panel = FT_PANEL(w->kern), bq_up = (tl.bq + panel - 1) / panel * panel;
    w->q = w->qrows = w->k = w->kt = NULL; /* Q and K for the GEMM kernels: not with tiles */
    if (!w->bf16) {
        w->q = fai_carve(&a, (size_t)(bq_up * pr->dqk) * sizeof(FT));
        w->qrows = fai_carve(&a, (size_t)(panel * pr->dqk) * sizeof(FT));
        w->k = fai_carve(&a, (size_t)(tl.bk * pr->dqk) * sizeof(FT));
        w->kt = fai_carve(&a, (size_t)(tl.bk * pr->dqk) * sizeof(FT));
    }
    w->v = fai_carve(&a, (size_t)(tl.bk * pr->dv) * sizeof(FT));
    w->acc = fai_carve(&a, (size_t)(tl.bq * pr->dv) * sizeof(FT));
    w->m = fai_carve(&a, (size_t)tl.bq * sizeof(FT));
    w->l = fai_carve(&a, (size_t)tl.bq * sizeof(FT));
    w->x = fai_carve(&a, (size_t)tl.bq * sizeof(FT));
    w->sp = fai_carve(&a, (size_t)(br_up * w->sp_ld) * sizeof(FT));
    w->scale_rows = FAI_T(carve_scale_rows)(&a, pr, panel);
    w->cols = fai_carve(&a, (size_t)(2 * tl.br) * sizeof(int64_t));
    w->live = fai_carve(&a, (size_t)tl.bq);
    w->keep = fai_carve(&a, (size_t)tl.bk);
    return a.used;
}

/*
 * Packs rows [0, nq) of the query tile into w->q: panels of FT_PANEL rows (the GEMM kernel's
 * MR), each stored transposed, so that row r's element p lies at q[(r - r % P) dqk + p P + r % P].
 * The GEMM kernel then reads one contiguous stream of A per row block instead of MR rows at
 * once, which the hardware prefetchers follow: on Emerald Rapids the Q K^T products of a strip
 * ran at 146 GFLOP/s from row-major Q and 153.5 from panels (NOTES.md, 2026-12-01).
 */
static void FAI_T(load_q_panels)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                 int64_t nq, FAI_T(fwd_ws) *w)
{
    const int64_t panel = FT_PANEL(w->kern), dqk = pr->dqk;
    for (int64_t r = 0; r < nq; r += panel) {
        const int64_t m = nq - r < panel ? nq - r : panel;
        int64_t ld;
        const FT *rows = FAI_T(rows_view)(w->kern, pr->io.q, pr->dtype, b, h, i0 + r, m, dqk,
                                          w->qrows, &ld);
        FT_TRANSPOSE(w->kern, m, dqk, rows, ld, w->q + r * dqk, panel);
    }
}

/* Rows [0, nq) of the query tile into w->qb as stored (bf16), then 16 zero rows: the tile
 * products read Q in blocks of 16 rows from any row of the tile. */
static void FAI_T(load_q_rows)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                               int64_t nq, FAI_T(fwd_ws) *w)
{
    const size_t row = (size_t)pr->dqk * 2;
    for (int64_t r = 0; r < nq; r++)
        memcpy(w->qb + r * pr->dqk, fai_row(pr->io.q, b, i0 + r, h), row);
    memset(w->qb + nq * pr->dqk, 0, 16 * row);
}

/* S rows [0, r1 - r0), columns [c0, c1) (leading dimension ld) = Q rows [r0, r1) from the
 * panels times those columns of the packed K^T, each product times the score scale if scaled:
 * the GEMM kernel with A stored transposed, one panel at a time (the kernel's bits do not
 * depend on how rows or columns are grouped); or the tile products' Q K^T on bf16 storage. */
static void FAI_T(gemm_qk)(FAI_T(fwd_ws) *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                           int64_t dqk, int64_t ld, int scaled)
{
    if (w->bf16) { /* Q rows as stored, K^T in pairs (the rows and columns around are junk) */
        const float scale = (float)w->scale_rows[0];
        FT_TILES_QK(w->bf16, r1 - r0, c0, c1, dqk, w->qb + r0 * dqk, dqk, w->ktb, w->sp_ld,
                    w->sp, ld, scaled ? &scale : NULL);
        return;
    }
    const int64_t panel = FT_PANEL(w->kern);
    for (int64_t r = r0; r < r1;) {
        const int64_t off = r % panel, m = panel - off < r1 - r ? panel - off : r1 - r;
        FT_GEMM_AT(w->kern, m, c1 - c0, dqk, w->q + (r - off) * dqk + off, panel, w->kt + c0,
                   ld, w->sp + (r - r0) * ld + c0, ld, 0, scaled ? w->scale_rows : NULL);
        r += m;
    }
}

/* What a key tile's strips share: the tile, its class, and how its rows treat it. */
typedef struct {
    int64_t j0, n;        /* keys [j0, j0 + n), packed in w->kt and w->v (tiles: w->ktb, w->vb) */
    fai_tile_class cls;
    FT slope;             /* ALiBi slope of the head */
    int scale_only;       /* the score pipeline is x scale */
    int selective;        /* P V by selection: V holds inf/NaN and P has masked/dropped zeros */
    int pv_tiles;         /* P V by the tile products: V finite and packed in w->vb */
    int64_t nk;           /* with them: the whole key tile's keys rounded up to 32 (P V's chunks) */
    const fai_dropout *drop;
} FAI_T(fwd_ktile);

/*
 * Steps 1-4 below for rows [r0, r1) of the query tile at i0 (at most br of them) against the
 * packed key tile: their scores are formed, turned into P and consumed while they are in L1.
 * Both GEMMs run over the tile's columns [cs0, cs1) that some row of the strip sees (on a
 * causal diagonal, about half): outside them P is 0 for every row, and a term 0 x v leaves
 * acc as it is (but for the sign of a zero, which the finalization makes +0). The tile
 * products' P V runs over every key chunk of the tile instead (simd/amx.c says why).
 */
static void FAI_T(fwd_strip)(const fai_problem *pr, fai_tiles tl, int64_t i0, int64_t r0,
                             int64_t r1, const FAI_T(fwd_ktile) *tile, FAI_T(fwd_ws) *w)
{
    const int64_t dv = pr->dv, ld = w->sp_ld, j0 = tile->j0, n = tile->n;
    const fai_dropout *drop = tile->drop;
    int64_t cs0 = n, cs1 = 0;
    for (int64_t r = r0; r < r1; r++) { /* each row's allowed columns, and their union */
        int64_t *c = w->cols + 2 * (r - r0);
        FAI_T(row_cols)(pr, tile->cls, i0 + r, j0, n, &c[0], &c[1]);
        if (c[0] < c[1]) {
            cs0 = c[0] < cs0 ? c[0] : cs0;
            cs1 = c[1] > cs1 ? c[1] : cs1;
        }
    }
    FAI_T(gemm_qk)(w, r0, r1, cs0, cs1, pr->dqk, ld, tile->scale_only);

    for (int64_t r = r0; r < r1; r++) { /* 2. block max, new reference, rescale exponent */
        const int64_t i = i0 + r;
        FT *s = w->sp + (r - r0) * ld, bmax = -INFINITY;
        const int64_t c0 = w->cols[2 * (r - r0)], c1 = w->cols[2 * (r - r0) + 1];
        if (c0 < c1 && tile->scale_only) /* scaled by the GEMM */
            bmax = FT_MAX(w->kern, c1 - c0, s + c0);
        else
            for (int64_t c = c0; c < c1; c++) {
                s[c] = FT_SCORE(&pr->score, s[c], tile->slope, i, j0 + c, NULL);
                bmax = s[c] > bmax || s[c] != s[c] ? s[c] : bmax; /* a NaN sticks */
            }
        /* A row that sees nothing here, or only -inf before anything finite, leaves its
         * state alone (a = 1) and P at 0; its allowed terms 0 * v still enter acc below
         * or in the GEMM, as they do in the reference. */
        w->live[r] = (unsigned char)FT_MOVE(&w->m[r], bmax, &w->x[r]);
        if (!w->live[r])
            w->x[r] = 0;
    }
    FT_EXPSUM(w->kern, r1 - r0, w->x + r0, 0, w->x + r0); /* x <- a = exp(x); exp(0) = 1 */

    for (int64_t r = r0; r < r1; r++) { /* 3. P (over S) and l */
        const int64_t i = i0 + r;
        FT *p = w->sp + (r - r0) * ld, *acc = w->acc + r * dv;
        const int64_t c0 = w->cols[2 * (r - r0)], c1 = w->cols[2 * (r - r0) + 1];
        if (c0 >= c1) { /* this row sees nothing here: a masked tile inside a live row */
            memset(p + cs0, 0, (size_t)(cs1 - cs0) * sizeof(FT));
            continue;
        }
        if (c0 > cs0 || c1 < cs1) { /* a PARTIAL tile's masked columns */
            memset(p + cs0, 0, (size_t)(c0 - cs0) * sizeof(FT));
            memset(p + c1, 0, (size_t)(cs1 - c1) * sizeof(FT));
        }
        if (drop->threshold)
            fai_dropout_keep_row(drop, i, j0 + c0, c1 - c0, w->keep + c0);
        if (w->live[r]) {
            w->l[r] = w->l[r] * w->x[r] + FT_EXPSUM(w->kern, c1 - c0, p + c0, w->m[r], p + c0);
            for (int64_t c = c0; c < c1 && drop->threshold; c++)
                if (!w->keep[c]) /* l keeps the dropped terms: LSE is pre-dropout */
                    p[c] = 0;
        } else {
            memset(p + c0, 0, (size_t)(c1 - c0) * sizeof(FT));
        }
        if (!tile->selective)
            continue;
        /* by selection: the GEMM kernel over each run of allowed, kept keys. The terms and
         * their order are those of the tile's GEMM less its masked and dropped zeros, so
         * the bits are the same as without the non-finite rows */
        for (int64_t d = 0; d < dv; d++)
            acc[d] *= w->x[r];
        for (int64_t ca = c0; ca < c1;) {
            while (ca < c1 && drop->threshold && !w->keep[ca])
                ca++;
            int64_t cb = ca;
            while (cb < c1 && !(drop->threshold && !w->keep[cb]))
                cb++;
            if (cb > ca)
                FT_GEMM(w->kern, 1, dv, cb - ca, p + ca, ld, w->v + ca * dv, dv, acc, dv, 1,
                        NULL);
            ca = cb;
        }
    }
    if (tile->pv_tiles) /* 4. acc = diag(a) acc + P V */
        FT_TILES_PV(w->bf16, r1 - r0, cs0, cs1, tile->nk, dv, w->sp, ld, w->vb,
                    w->acc + r0 * dv, dv, w->x + r0, w->tile_scratch);
    else if (!tile->selective)
        FT_GEMM(w->kern, r1 - r0, dv, cs1 - cs0, w->sp + cs0, ld, w->v + cs0 * dv, dv,
                w->acc + r0 * dv, dv, 1, w->x + r0);
}

/*
 * One query tile [i0, i1) of head h of batch b: the article's loop, on tiles. Per key tile,
 * packed once for the whole query tile (K^T by transposes, V by copies; for the tile products
 * of bf16 storage, K^T and V as bf16 pairs, with Q kept as stored), and per strip of br
 * rows of the query tile, so that the strip's scores stay in L1 from their GEMM to P V:
 *   1. S = Q K^T by the GEMM kernel over the packed K^T (or the tile products);
 *   2. per row the score pipeline and the max over the row's allowed keys, which moves the
 *      row's reference m (core/recurrence.h); the rescale factors a = exp(m_old - m_new) of
 *      the strip's rows then come from one call of the vector exp;
 *   3. per row l = a l + sum P with P = exp(S - m) by the exp kernel, written over S, exactly
 *      0 outside the allowed keys and where dropout drops;
 *   4. acc = diag(a) acc + P V by the GEMM kernel, the rescale fused into its load of acc (or
 *      by the tile products, where the key tile's V is finite).
 * Key tiles outside the mask's key span are never visited; FULL tiles need no per-element
 * test, PARTIAL ones use each row's allowed interval, and only the rows from the first to the
 * last that see any key of the tile take part (per strip): a row that sees none would have
 * a = 1 and P = 0, which leaves its state as it is (acc + 0 is acc, but for the sign of a zero,
 * which the output's finalization makes +0). On the diagonal of a causal mask that skips up to
 * half of the tile's work. Every row's result is independent of the strip it falls in.
 *
 * The GEMM multiplies the zeros of P with V. That is exact while V is finite; for a tile whose
 * V holds inf or NaN and that has masked or dropped entries, the rows accumulate P V by
 * selection instead, so that §1's "masked NaN never reaches the output" holds to the bit.
 */
static void FAI_T(fwd_qtile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t h,
                             int64_t i0, int64_t i1, FAI_T(fwd_ws) *w)
{
    const int64_t hk = h / pr->group, nq = i1 - i0, dv = pr->dv;
    const fai_dropout drop = fai_dropout_for(pr, b, h);
    FAI_T(fwd_ktile) tile = {.slope = (FT)fai_slope(pr, h), .drop = &drop};
    tile.scale_only = FAI_T(scale_only)(pr, tile.slope);

    if (w->bf16)
        FAI_T(load_q_rows)(pr, b, h, i0, nq, w);
    else
        FAI_T(load_q_panels)(pr, b, h, i0, nq, w);
    for (int64_t r = 0; r < nq; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0;
    }
    memset(w->acc, 0, (size_t)(nq * dv) * sizeof(FT));

    int64_t jlo, jhi;
    fai_mask_key_span(&pr->mask, i0, i1, &jlo, &jhi);
    /* key tiles on the grid of multiples of Bk, whatever the query tile: where the online
     * softmax rescales then does not depend on how the query rows are grouped */
    for (tile.j0 = jlo - jlo % tl.bk; tile.j0 < jhi; tile.j0 += tl.bk) {
        tile.n = jhi - tile.j0 < tl.bk ? jhi - tile.j0 : tl.bk;
        tile.cls = fai_mask_classify(&pr->mask, i0, i1, tile.j0, tile.j0 + tile.n);
        if (tile.cls == FAI_TILE_EMPTY)
            continue;
        int64_t r0, r1;
        FAI_T(row_span)(pr, tile.cls, i0, nq, tile.j0, tile.n, &r0, &r1);
        if (r0 == r1)
            continue;
        if (w->bf16) {
            w->bf16->pack_kt(tile.n, pr->dqk, fai_row(pr->io.k, b, tile.j0, hk),
                             pr->io.k->seq_stride, w->ktb, w->sp_ld);
        } else {
            int64_t ldk;
            const FT *k = FAI_T(rows_view)(w->kern, pr->io.k, pr->dtype, b, hk, tile.j0, tile.n,
                                           pr->dqk, w->k, &ldk);
            FT_TRANSPOSE(w->kern, tile.n, pr->dqk, k, ldk, w->kt, tl.bk);
        }
        /* With tile products, P V takes them or the f32 kernels by whether V is finite, and
         * the two round differently: so that a row's bits do not depend on its query tile,
         * the test covers the whole key tile (not only the keys this query tile sees), and the
         * products run over all of its key chunks. */
        const int64_t nv = w->bf16 ? (pr->sk - tile.j0 < tl.bk ? pr->sk - tile.j0 : tl.bk)
                                    : tile.n;
        FAI_T(load_rows)(w->kern, pr->io.v, pr->dtype, b, hk, tile.j0, nv, dv, w->v);
        const int v_finite = FT_FINITE(w->kern, nv * dv, w->v);
        tile.selective = (tile.cls != FAI_TILE_FULL || drop.threshold) && !v_finite;
        tile.pv_tiles = w->bf16 && v_finite;
        tile.nk = (nv + 31) / 32 * 32;
        if (tile.pv_tiles)
            w->bf16->pack_v(tile.n, tile.nk, dv, fai_row(pr->io.v, b, tile.j0, hk),
                            pr->io.v->seq_stride, w->vb);
        /* strips on a grid of br rows from the tile's first row (the plan's br is a multiple
         * of every kernel's MR, so its strips start on panel boundaries, or with the tile
         * products of 16; any br works) */
        for (int64_t g = r0 - r0 % tl.br; g < r1; g += tl.br) {
            const int64_t s0 = g > r0 ? g : r0, s1 = g + tl.br < r1 ? g + tl.br : r1;
            int64_t a0, a1; /* the strip's rows that see the tile */
            FAI_T(row_span)(pr, tile.cls, i0 + s0, s1 - s0, tile.j0, tile.n, &a0, &a1);
            if (a0 < a1)
                FAI_T(fwd_strip)(pr, tl, i0, s0 + a0, s0 + a1, &tile, w);
        }
    }

    const FT keep_scale = (FT)(1.0 / (1.0 - pr->dropout_p));
    for (int64_t r = 0; r < nq; r++) {
        FT *acc = w->acc + r * dv;
        double lse;
        const FT f = FT_FINALIZE(w->m[r], w->l[r], keep_scale, &lse);
        /* an empty row is exactly 0, whatever acc holds; + 0 turns -0 into +0, so the sign of
         * a zero does not depend on which rows and columns the skips left out */
        if (f == 0) {
            memset(acc, 0, (size_t)dv * sizeof(FT));
        } else {
#pragma omp simd
            for (int64_t d = 0; d < dv; d++)
                acc[d] = acc[d] * f + 0;
        }
        FT_STORE(w->kern, fai_row(pr->io.out, b, i0 + r, h), pr->dtype, dv, acc);
        if (pr->io.lse)
            fai_lse_store(pr->io.lse, b, h, i0 + r, lse);
    }
}

static fa_status FAI_T(forward)(fa_context *ctx, const fai_problem *pr, fai_tiles tl)
{
    /* the rows a task takes (forced tiles are taken as they are); the workspace is the plan's */
    const int64_t bq = ctx->forced_tiles.bq > 0
                           ? tl.bq
                           : fai_plan_forward_rows(tl, pr->b * pr->hq, pr->sq, ctx->num_threads);
    FAI_T(fwd_ws) w;
    size_t per = FAI_T(fwd_carve)(pr, tl, ctx->kernels, NULL, &w), bytes;
    const int nt = ctx->num_threads;
    char *base;
    fa_status st = fai_thread_scratch(ctx, "tiled", &per, nt, &base, &bytes);
    if (st != FA_OK)
        return st;
    const int64_t nqt = (pr->sq + bq - 1) / bq, tasks = pr->b * pr->hq * nqt;
#pragma omp parallel num_threads(nt)
    {
        FAI_T(fwd_ws) mine;
        FAI_T(fwd_carve)(pr, tl, ctx->kernels, base + (size_t)omp_get_thread_num() * per, &mine);
        /* dynamic: causal and windowed tiles differ in cost; each task's result is fixed */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t qt = task % nqt, h = (task / nqt) % pr->hq, b = task / (nqt * pr->hq);
            const int64_t i0 = qt * bq, i1 = i0 + bq < pr->sq ? i0 + bq : pr->sq;
            FAI_T(fwd_qtile)(pr, tl, b, h, i0, i1, &mine);
        }
    }
    fai_free(ctx, base, bytes);
    return FA_OK;
}

/* ------------------------------------------------------------------ backward */

/*
 * Backward by recomputation, in two passes so that every gradient element has one owner:
 *   pass 1, per (b, kv head, key tile): dK and dV of the tile, summed over the group's query
 *           heads and all query rows in a fixed order;
 *   pass 2, per (b, head, query tile): dQ of the tile, summed over key tiles in order.
 * Both work on a block of query rows against a key tile: S = Q K^T and dP = dO V^T by the GEMM
 * kernel (the same kernel and order as the forward, so S is recomputed to the bit; not so
 * for bf16 storage on AMX, whose forward forms S on tile products: there to f32 rounding),
 * then per row P = exp(S - LSE), P~ = P z and dS = P (dP z - D) with D_i = dO_i . O_i (§1), then
 * dV += P~^T dO, dK += scale dS^T Q (pass 1) or dQ += scale dS K (pass 2) by the GEMM kernel.
 * No atomics, no reduction across threads. Where enough (b, kv head) tasks share out, one pass
 * does both (bwd_kv_head below): pass 1 over a kv head's key tiles in order, adding each
 * tile's dQ terms to the head group's dQ rows as it goes, with the same bits.
 *
 * The GEMMs multiply the exact zeros of P~ and dS (masked, dropped) with rows of dO, Q and K.
 * Where any of those rows holds inf or NaN, the products are formed by selection instead, in
 * the same order, so the result has the same bits as without the non-finite rows.
 */
typedef struct {
    FT *k, *kt, *vt, *vrow;      /* key tile: K (n x dqk), K^T (dqk x bk), V^T (dv x bk), V   */
    FT *dk, *dv;                 /* pass 1: the key tile's gradients (n x dqk, n x dv)        */
    FT *q, *dout, *o, *dq;       /* a block of up to bq query rows (row-major)                 */
    FT *dot, *ot;                /* dO^T and O^T of the block (dv x bq), for D                 */
    FT *di;                      /* D_i of the block's rows                                    */
    FT *scale_rows;              /* bq copies of the score scale (bwd_block's Q K^T)           */
    double *lse;
    FT *s, *dp, *t, *p, *ds;     /* bq x bk: scores, dP, tanh(x / c), P~, scale dS             */
    unsigned char *keep;
    FT *dq_all;                  /* single pass: dQ of the group's heads (group x Sq x Dqk),
                                    else NULL                                                  */
    int q_finite, kv_finite;     /* whether the loaded Q and dO, K and V hold no inf or NaN    */
    const fai_kernels_f32 *kern;
} FAI_T(bwd_ws);

static size_t FAI_T(bwd_carve)(const fai_problem *pr, fai_tiles tl, int single_pass, char *base,
                               FAI_T(bwd_ws) *w)
{
    fai_arena a = {base, 0};
    w->dq_all = single_pass ? fai_carve(&a, (size_t)(pr->group * pr->sq * pr->dqk) * sizeof(FT))
                            : NULL;
    const size_t bk = (size_t)tl.bk, bq = (size_t)tl.bq, f = sizeof(FT);
    w->k = fai_carve(&a, bk * (size_t)pr->dqk * f);
    w->kt = fai_carve(&a, bk * (size_t)pr->dqk * f);
    w->vt = fai_carve(&a, bk * (size_t)pr->dv * f);
    w->vrow = fai_carve(&a, bk * (size_t)pr->dv * f);
    w->dk = fai_carve(&a, bk * (size_t)pr->dqk * f);
    w->dv = fai_carve(&a, bk * (size_t)pr->dv * f);
    w->q = fai_carve(&a, bq * (size_t)pr->dqk * f);
    w->dout = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->o = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->dot = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->ot = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->dq = fai_carve(&a, bq * (size_t)pr->dqk * f);
    w->di = fai_carve(&a, bq * f);
    w->scale_rows = FAI_T(carve_scale_rows)(&a, pr, tl.bq);
    w->lse = fai_carve(&a, bq * sizeof(double));
    w->s = fai_carve(&a, bq * bk * f);
    w->dp = fai_carve(&a, bq * bk * f);
    w->t = fai_carve(&a, bq * bk * f);
    w->p = fai_carve(&a, bq * bk * f);
    w->ds = fai_carve(&a, bq * bk * f);
    w->keep = fai_carve(&a, bk);
    return a.used;
}

/* Loads query rows [i0, i0 + nq) of (b, h): q, dO (and whether both are finite), LSE and
 * D_i = dO_i . O_i (O as stored, as FA). D_i goes through the column dots of dO^T and O^T,
 * which round as the GEMM kernel rounds dP = dO V^T: where dP z - D_i is 0 in exact arithmetic
 * (a row with one key), the two sums round alike and the difference stays 0. */
static void FAI_T(load_query_block)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                    int64_t nq, int64_t bq, FAI_T(bwd_ws) *w)
{
    const int64_t dv = pr->dv;
    FAI_T(load_rows)(w->kern, pr->io.q, pr->dtype, b, h, i0, nq, pr->dqk, w->q);
    FAI_T(load_rows)(w->kern, pr->io.dout, pr->dtype, b, h, i0, nq, dv, w->dout);
    int64_t ldo;
    const FT *o = FAI_T(rows_view)(w->kern, pr->io.out, pr->dtype, b, h, i0, nq, dv, w->o, &ldo);
    FT_TRANSPOSE(w->kern, nq, dv, w->dout, dv, w->dot, bq);
    FT_TRANSPOSE(w->kern, nq, dv, o, ldo, w->ot, bq);
    FT_COLDOT(w->kern, nq, dv, w->dot, bq, w->ot, bq, w->di);
    w->q_finite = FT_FINITE(w->kern, nq * pr->dqk, w->q) && FT_FINITE(w->kern, nq * dv, w->dout);
    for (int64_t r = 0; r < nq; r++)
        w->lse[r] = fai_lse_load(pr->io.lse, b, h, i0 + r);
}

/* Loads key tile [j0, j0 + n) of (b, hk): K and K^T, V and V^T, and whether they are finite. */
static void FAI_T(load_key_tile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t hk,
                                 int64_t j0, int64_t n, FAI_T(bwd_ws) *w)
{
    FAI_T(load_rows)(w->kern, pr->io.k, pr->dtype, b, hk, j0, n, pr->dqk, w->k);
    FAI_T(load_rows)(w->kern, pr->io.v, pr->dtype, b, hk, j0, n, pr->dv, w->vrow);
    FT_TRANSPOSE(w->kern, n, pr->dqk, w->k, pr->dqk, w->kt, tl.bk);
    FT_TRANSPOSE(w->kern, n, pr->dv, w->vrow, pr->dv, w->vt, tl.bk);
    w->kv_finite = FT_FINITE(w->kern, n * pr->dqk, w->k) && FT_FINITE(w->kern, n * pr->dv, w->vrow);
}

/*
 * Rows [i0, i0 + nq) of (b, h) (loaded in w) against key tile [j0, j0 + n): S and dP by the
 * GEMM kernel, then per row over its allowed keys P~ into w->p and scale dS into w->ds, exact
 * zeros elsewhere (and in rows that are empty or see no key here). Returns whether any row
 * contributes.
 */
static int FAI_T(bwd_block)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t h,
                            int64_t i0, int64_t nq, int64_t j0, int64_t n, fai_tile_class cls,
                            FAI_T(bwd_ws) *w)
{
    const int64_t ld = tl.bk;
    const FT keep_scale = (FT)(1.0 / (1.0 - pr->dropout_p)), scale = (FT)pr->score.scale;
    const FT slope = (FT)fai_slope(pr, h);
    const int softcap = pr->score.softcap > 0, scale_only = FAI_T(scale_only)(pr, slope);
    const fai_dropout drop = fai_dropout_for(pr, b, h);
    FT_GEMM(w->kern, nq, n, pr->dqk, w->q, pr->dqk, w->kt, ld, w->s, ld, 0,
            scale_only ? w->scale_rows : NULL); /* Q K^T, scaled as the forward's */
    FT_GEMM(w->kern, nq, n, pr->dv, w->dout, pr->dv, w->vt, ld, w->dp, ld, 0, NULL); /* dO V^T */
    int any = 0;
    for (int64_t r = 0; r < nq; r++) {
        const int64_t i = i0 + r;
        const double lse = w->lse[r]; /* P = exp(s - LSE) with the subtraction in double */
        FT *s = w->s + r * ld, *dp = w->dp + r * ld, *t = w->t + r * ld, *p = w->p + r * ld,
           *ds = w->ds + r * ld;
        int64_t c0, c1;
        FAI_T(row_cols)(pr, cls, i, j0, n, &c0, &c1);
        if (c0 >= c1 || lse == -INFINITY) { /* -inf: empty row, every gradient through it is 0 */
            memset(p, 0, (size_t)n * sizeof(FT));
            memset(ds, 0, (size_t)n * sizeof(FT));
            continue;
        }
        memset(p, 0, (size_t)c0 * sizeof(FT));
        memset(ds, 0, (size_t)c0 * sizeof(FT));
        memset(p + c1, 0, (size_t)(n - c1) * sizeof(FT));
        memset(ds + c1, 0, (size_t)(n - c1) * sizeof(FT));
        any = 1;
        /* the forward's pipeline, operation for operation (scale_only: done by the GEMM) */
        if (!scale_only)
            for (int64_t c = c0; c < c1; c++)
                s[c] = FT_SCORE(&pr->score, s[c], slope, i, j0 + c, softcap ? &t[c] : NULL);
        if (!softcap && !drop.threshold) { /* P~ = P, dS = P (dP - D) by one kernel */
            FT_DSOFTMAX(w->kern, c1 - c0, s + c0, lse, dp + c0, w->di[r], scale, p + c0, ds + c0);
            continue;
        }
        if (drop.threshold)
            fai_dropout_keep_row(&drop, i, j0 + c0, c1 - c0, w->keep + c0);
        for (int64_t c = c0; c < c1; c++) /* P = exp(s - LSE) by the exp kernel, in place */
            p[c] = (FT)((double)s[c] - lse);
        FT_EXPSUM(w->kern, c1 - c0, p + c0, 0, p + c0);
        for (int64_t c = c0; c < c1; c++) {
            const FT P = p[c];
            const FT z = (drop.threshold && !w->keep[c]) ? 0 : keep_scale;
            FT g = P * (dp[c] * z - w->di[r]);
            if (softcap)
                g *= 1 - t[c] * t[c];
            p[c] = P * z;
            ds[c] = scale * g;
        }
    }
    return any;
}

/* dq (nq rows) += scale dS K by selection: each row over its allowed keys only, so that inf or
 * NaN in K or Q rows that the row does not see stays out (the terms, in order, of the GEMM). */
static void FAI_T(dq_by_selection)(const fai_problem *pr, fai_tiles tl, fai_tile_class cls,
                                   int64_t i0, int64_t nq, int64_t j0, int64_t n,
                                   const FAI_T(bwd_ws) *w, FT *dq)
{
    const int64_t dqk = pr->dqk, ld = tl.bk;
    for (int64_t r = 0; r < nq; r++) {
        int64_t c0, c1;
        FAI_T(row_cols)(pr, cls, i0 + r, j0, n, &c0, &c1);
        if (c0 < c1 && w->lse[r] != -INFINITY)
            FT_GEMM(w->kern, 1, dqk, c1 - c0, w->ds + r * ld + c0, ld, w->k + c0 * dqk, dqk,
                    dq + r * dqk, dqk, 1, NULL);
    }
}

/* Pass 1: dK and dV of key tile [j0, j0 + n) of (b, hk); in the single pass also the tile's
 * terms of dQ, added to w->dq_all. */
static void FAI_T(bwd_ktile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t hk,
                             int64_t j0, int64_t n, FAI_T(bwd_ws) *w)
{
    const int64_t dqk = pr->dqk, dv = pr->dv, ld = tl.bk;
    FAI_T(load_key_tile)(pr, tl, b, hk, j0, n, w);
    memset(w->dk, 0, (size_t)(n * dqk) * sizeof(FT));
    memset(w->dv, 0, (size_t)(n * dv) * sizeof(FT));

    int64_t ilo, ihi;
    fai_mask_query_span(&pr->mask, pr->sq, j0, j0 + n, &ilo, &ihi);
    for (int64_t h = hk * pr->group; h < (hk + 1) * pr->group; h++)
        for (int64_t i0 = ilo; i0 < ihi; i0 += tl.bq) {
            const int64_t nq = ihi - i0 < tl.bq ? ihi - i0 : tl.bq;
            const fai_tile_class cls = fai_mask_classify(&pr->mask, i0, i0 + nq, j0, j0 + n);
            if (cls == FAI_TILE_EMPTY)
                continue;
            FAI_T(load_query_block)(pr, b, h, i0, nq, tl.bq, w);
            if (!FAI_T(bwd_block)(pr, tl, b, h, i0, nq, j0, n, cls, w))
                continue;
            FT *dq = w->dq_all ? w->dq_all + ((h - hk * pr->group) * pr->sq + i0) * dqk : NULL;
            if (w->kv_finite && w->q_finite) {
                /* P~^T dO, dS^T Q */
                FT_GEMM_AT(w->kern, n, dv, nq, w->p, ld, w->dout, dv, w->dv, dv, 1, NULL);
                FT_GEMM_AT(w->kern, n, dqk, nq, w->ds, ld, w->q, dqk, w->dk, dqk, 1, NULL);
                if (dq)
                    FT_GEMM(w->kern, nq, dqk, n, w->ds, ld, w->k, dqk, dq, dqk, 1, NULL);
                continue;
            }
            if (dq)
                FAI_T(dq_by_selection)(pr, tl, cls, i0, nq, j0, n, w, dq);
            /* by selection, rows in order: each (row, key) term one kernel step, as above;
             * masked and dropped terms skipped (an allowed P of 0 still multiplies dO) */
            const fai_dropout drop = fai_dropout_for(pr, b, h);
            for (int64_t r = 0; r < nq; r++) {
                int64_t c0, c1;
                FAI_T(row_cols)(pr, cls, i0 + r, j0, n, &c0, &c1);
                if (w->lse[r] == -INFINITY || c0 >= c1)
                    continue;
                if (drop.threshold)
                    fai_dropout_keep_row(&drop, i0 + r, j0 + c0, c1 - c0, w->keep + c0);
                for (int64_t c = c0; c < c1; c++) {
                    const FT *pc = w->p + r * ld + c, *dsc = w->ds + r * ld + c;
                    if (!drop.threshold || w->keep[c])
                        FT_GEMM(w->kern, 1, dv, 1, pc, 1, w->dout + r * dv, dv, w->dv + c * dv,
                                dv, 1, NULL);
                    FT_GEMM(w->kern, 1, dqk, 1, dsc, 1, w->q + r * dqk, dqk, w->dk + c * dqk,
                            dqk, 1, NULL);
                }
            }
        }
    for (int64_t c = 0; c < n; c++) {
        FT_STORE(w->kern, fai_row(pr->io.dk, b, j0 + c, hk), pr->dtype, dqk, w->dk + c * dqk);
        FT_STORE(w->kern, fai_row(pr->io.dv, b, j0 + c, hk), pr->dtype, dv, w->dv + c * dv);
    }
}

/* Stores dQ rows [i0, i0 + nq) of (b, h) from dq (nq x Dqk). + 0 makes a -0 +0: a masked
 * key's exact 0 term is added by the GEMM but skipped by selection, and the two passes and
 * the one pass split rows and keys differently, so only then do they agree on zeros' signs. */
static void FAI_T(store_dq)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0, int64_t nq,
                            FT *dq, const FAI_T(bwd_ws) *w)
{
    for (int64_t r = 0; r < nq; r++) {
        FT *row = dq + r * pr->dqk;
#pragma omp simd
        for (int64_t d = 0; d < pr->dqk; d++)
            row[d] += 0;
        FT_STORE(w->kern, fai_row(pr->io.dq, b, i0 + r, h), pr->dtype, pr->dqk, row);
    }
}

/* Pass 2: dQ of query tile [i0, i1) of (b, h). */
static void FAI_T(bwd_qtile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t h,
                             int64_t i0, int64_t i1, FAI_T(bwd_ws) *w)
{
    const int64_t hk = h / pr->group, nq = i1 - i0, dqk = pr->dqk, ld = tl.bk;
    FAI_T(load_query_block)(pr, b, h, i0, nq, tl.bq, w);
    memset(w->dq, 0, (size_t)(nq * dqk) * sizeof(FT));

    int64_t jlo, jhi;
    fai_mask_key_span(&pr->mask, i0, i1, &jlo, &jhi);
    for (int64_t j0 = jlo; j0 < jhi; j0 += tl.bk) {
        const int64_t n = jhi - j0 < tl.bk ? jhi - j0 : tl.bk;
        const fai_tile_class cls = fai_mask_classify(&pr->mask, i0, i1, j0, j0 + n);
        if (cls == FAI_TILE_EMPTY)
            continue;
        FAI_T(load_key_tile)(pr, tl, b, hk, j0, n, w);
        if (!FAI_T(bwd_block)(pr, tl, b, h, i0, nq, j0, n, cls, w))
            continue;
        if (w->q_finite && w->kv_finite) /* dQ += scale dS K */
            FT_GEMM(w->kern, nq, dqk, n, w->ds, ld, w->k, dqk, w->dq, dqk, 1, NULL);
        else
            FAI_T(dq_by_selection)(pr, tl, cls, i0, nq, j0, n, w, w->dq);
    }
    FAI_T(store_dq)(pr, b, h, i0, nq, w->dq, w);
}

/*
 * The single pass: one task per (b, kv head) runs pass 1 over its key tiles in order and adds
 * each tile's dQ terms to the group's dQ rows as it goes (5 tile GEMMs per block pair instead
 * of 7, and no second reading of K and V per query tile). Each dQ element receives the terms
 * of pass 2, in pass 2's order (key tiles ascending, keys ascending within a tile; the GEMM
 * kernel's k split over calls keeps the bits), so both ways give the same bits.
 */
static void FAI_T(bwd_kv_head)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t hk,
                               FAI_T(bwd_ws) *w)
{
    const int64_t dqk = pr->dqk;
    memset(w->dq_all, 0, (size_t)(pr->group * pr->sq * dqk) * sizeof(FT));
    for (int64_t j0 = 0; j0 < pr->sk; j0 += tl.bk)
        FAI_T(bwd_ktile)(pr, tl, b, hk, j0, pr->sk - j0 < tl.bk ? pr->sk - j0 : tl.bk, w);
    for (int64_t g = 0; g < pr->group; g++)
        FAI_T(store_dq)(pr, b, hk * pr->group + g, 0, pr->sq, w->dq_all + g * pr->sq * dqk, w);
}

static fa_status FAI_T(backward)(fa_context *ctx, const fai_problem *pr, fai_tiles tl)
{
    FAI_T(bwd_ws) w;
    const int nt = ctx->num_threads;
    const int64_t dq_bytes = pr->group * pr->sq * pr->dqk * (int64_t)sizeof(FT);
    const int single = ctx->forced_backward_passes
                           ? ctx->forced_backward_passes == 1
                           : fai_plan_backward_single_pass(pr->b * pr->hk, nt, dq_bytes);
    size_t per = FAI_T(bwd_carve)(pr, tl, single, NULL, &w), bytes;
    char *base;
    fa_status st = fai_thread_scratch(ctx, "tiled", &per, nt, &base, &bytes);
    if (st != FA_OK)
        return st;
    const int64_t head_tasks = single ? pr->b * pr->hk : 0;
    const int64_t nkt = (pr->sk + tl.bk - 1) / tl.bk, ktasks = single ? 0 : pr->b * pr->hk * nkt;
    const int64_t nqt = (pr->sq + tl.bq - 1) / tl.bq, qtasks = single ? 0 : pr->b * pr->hq * nqt;
#pragma omp parallel num_threads(nt)
    {
        FAI_T(bwd_ws) mine;
        FAI_T(bwd_carve)(pr, tl, single, base + (size_t)omp_get_thread_num() * per, &mine);
        mine.kern = ctx->kernels;
        /* the single pass, or else the two passes (the loops of the others run no task) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < head_tasks; task++)
            FAI_T(bwd_kv_head)(pr, tl, task / pr->hk, task % pr->hk, &mine);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ktasks; task++) {
            const int64_t kt = task % nkt, hk = (task / nkt) % pr->hk, b = task / (nkt * pr->hk);
            const int64_t j0 = kt * tl.bk, n = pr->sk - j0 < tl.bk ? pr->sk - j0 : tl.bk;
            FAI_T(bwd_ktile)(pr, tl, b, hk, j0, n, &mine);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < qtasks; task++) {
            const int64_t qt = task % nqt, h = (task / nqt) % pr->hq, b = task / (nqt * pr->hq);
            const int64_t i0 = qt * tl.bq, i1 = i0 + tl.bq < pr->sq ? i0 + tl.bq : pr->sq;
            FAI_T(bwd_qtile)(pr, tl, b, h, i0, i1, &mine);
        }
    }
    fai_free(ctx, base, bytes);
    return FA_OK;
}
