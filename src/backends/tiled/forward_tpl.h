/* ------------------------------------------------------------------ forward */

typedef struct {
    FT *q;                       /* the query tile, in panels of MR rows (FAI_T(gemm_qk))       */
    FT *qrows;                   /* MR rows of Q converted from storage, before packing         */
    FT *k, *kt, *v, *acc, *m, *l, *x;
    FT *sp;                      /* a strip's scores S, then its P in place (br x sp_ld; with
                                  * the tile products br rounded up to their rows, and P in
                                  * bf16 at the start of each row where they take P V)       */
    FT *scale_rows;              /* MR copies of the score scale (FAI_T(gemm_qk))               */
    int64_t *cols;               /* a strip's rows' allowed columns, [c0, c1) pairs (br x 2)    */
    unsigned char *live, *keep;
    FT *bias;                    /* a row's bias entries for the tile's keys (bk; with a bias)  */
    const FAI_T(fai_kernels) *kern;
    int64_t sp_ld;               /* row pitch of sp: bk, or bk rounded up to the tile products'
                                  * key chunk                                                */
    /* bf16 storage on the tile products (the plan's; NULL otherwise): Q rows as stored (nq
     * rows, then a block of zero rows), K^T and V as the kernels pack them, P V's scratch */
    const fai_kernels_bf16 *bf16;
    uint16_t *qb, *ktb, *vb;
    void *tile_scratch;
    void *kv_stage;              /* a paged K/V: a key tile's rows gathered (fai_kv_gather)     */
} FAI_T(fwd_ws);

static int64_t FAI_T(round_up)(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static size_t FAI_T(fwd_carve)(const fai_problem *pr, const fai_tiled_plan *plan,
                               const FAI_T(fai_kernels) *kern, char *base, FAI_T(fwd_ws) *w)
{
    const fai_tiles tl = plan->tl;
    fai_arena a = {base, 0};
    w->kern = kern;
    w->bf16 = plan->tile_products;
    const fai_kernels_bf16 *t = w->bf16;
    w->sp_ld = t ? FAI_T(round_up)(tl.bk, t->keys) : tl.bk;
    const int64_t br_up = t ? FAI_T(round_up)(tl.br, t->rows) : tl.br;
    w->qb = w->ktb = w->vb = NULL;
    w->tile_scratch = NULL;
    if (t) {
        const int64_t qrows = FAI_T(round_up)(tl.bq, t->rows) + t->rows;
        w->qb = fai_carve(&a, (size_t)(qrows * pr->dqk) * 2);
        w->ktb = fai_carve(&a, (size_t)(w->sp_ld * pr->dqk) * 2);
        w->vb = fai_carve(&a, (size_t)(w->sp_ld * pr->dv) * 2);
        w->tile_scratch = fai_carve(&a, (size_t)(t->rows * pr->dv) * sizeof(float));
    }
    const int64_t panel = w->kern->mr, bq_up = FAI_T(round_up)(tl.bq, panel);
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
    w->bias = fai_row_biased(pr) ? fai_carve(&a, (size_t)tl.bk * sizeof(FT)) : NULL;
    const int64_t kbytes = fai_dtype_bytes(pr->k_dtype, tl.bk * pr->dqk),
                  vbytes = fai_dtype_bytes(pr->v_dtype, tl.bk * pr->dv);
    w->kv_stage = pr->page_size ? fai_carve(&a, (size_t)(kbytes > vbytes ? kbytes : vbytes))
                                : NULL;
    return a.used;
}

/*
 * Packs rows [0, nq) of the query tile into w->q: panels of MR rows (the GEMM kernel's), each
 * stored transposed, so that row r's element p lies at q[(r - r % P) dqk + p P + r % P]. The
 * GEMM kernel then reads one contiguous stream of A per row block instead of MR rows at once,
 * which the hardware prefetchers follow: on Emerald Rapids the Q K^T products of a strip ran
 * 5% faster from panels than from row-major Q (docs/notes/tiles.md).
 */
static void FAI_T(load_q_panels)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                 int64_t nq, FAI_T(fwd_ws) *w)
{
    const int64_t panel = w->kern->mr, dqk = pr->dqk;
    for (int64_t r = 0; r < nq; r += panel) {
        const int64_t m = nq - r < panel ? nq - r : panel;
        int64_t lq, ld;
        const void *q = fai_q_rows(pr, FAI_Q, b, h, i0 + r, m, &lq);
        const FT *rows = FAI_T(view_run)(w->kern, q, lq, pr->q_dtype, m, dqk, w->qrows, &ld);
        w->kern->transpose(m, dqk, rows, ld, w->q + r * dqk, panel);
    }
}

/* Rows [0, nq) of the query tile into w->qb as stored (bf16), then a block of zero rows: the
 * tile products read Q in blocks of their rows from any row of the tile. */
static void FAI_T(load_q_rows)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                               int64_t nq, FAI_T(fwd_ws) *w)
{
    const size_t row = (size_t)pr->dqk * 2;
    for (int64_t r = 0; r < nq; r++)
        memcpy(w->qb + r * pr->dqk, fai_q_row(pr, FAI_Q, b, h, i0 + r), row);
    memset(w->qb + nq * pr->dqk, 0, (size_t)w->bf16->rows * row);
}

/* S rows [0, r1 - r0), columns [c0, c1) (leading dimension ld) = Q rows [r0, r1) from the
 * panels times those columns of the packed K^T, each product times the score scale if scaled:
 * the GEMM kernel with A stored transposed, one panel at a time (the kernel's bits do not
 * depend on how rows or columns are grouped); or the tile products' Q K^T on bf16 storage. */
static void FAI_T(gemm_qk)(FAI_T(fwd_ws) *w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                           int64_t dqk, int64_t ld, int scaled)
{
#if FT_TILE_PRODUCTS
    if (w->bf16) { /* Q rows as stored, K^T in pairs (the rows and columns around are junk) */
        const float scale = (float)w->scale_rows[0];
        w->bf16->qk(r1 - r0, c0, c1, dqk, w->qb + r0 * dqk, dqk, w->ktb, w->sp_ld, w->sp, ld,
                    scaled ? &scale : NULL);
        return;
    }
#endif
    const int64_t panel = w->kern->mr;
    for (int64_t r = r0; r < r1;) {
        const int64_t off = r % panel, m = panel - off < r1 - r ? panel - off : r1 - r;
        FAI_T(fai_gemm_at)(w->kern, m, c1 - c0, dqk, w->q + (r - off) * dqk + off, panel,
                           w->kt + c0, ld, w->sp + (r - r0) * ld + c0, ld, 0,
                           scaled ? w->scale_rows : NULL);
        r += m;
    }
}

/* What a key tile's strips share: the tile, its class, and how its rows treat it. */
typedef struct {
    int64_t j0, n;        /* keys [j0, j0 + n), packed in w->kt and w->v (tiles: w->ktb, w->vb) */
    fai_tile_class cls;
    int64_t b, h, i1;     /* the query tile's batch and head, and its end */
    int64_t span0, span1; /* the strip's columns in key blocks its rows' blocks list (all but
                           * with a block mask: fai_blocks_span) */
    FT slope;             /* ALiBi slope of the head */
    FT bias_factor;       /* the bias's factor (fai_bias_factor) */
    int scale_only;       /* the score pipeline is x scale */
    int selective;        /* P V by selection: V holds inf/NaN and P has masked/dropped zeros */
    int pv_tiles;         /* P V by the tile products: V finite and packed in w->vb */
    int fold_ok;          /* with them, the score scale may be applied by their exp (fwd_strip) */
    int64_t nk;           /* with them: the whole key tile's keys rounded up to their chunk */
    const fai_dropout *drop;
} FAI_T(fwd_ktile);

/* P of a strip's row p set to 0 on columns [c0, c1) (none if c1 <= c0): in bf16 from the row's
 * start where the tile products take P V, else in FT. */
static void FAI_T(p_zero)(const FAI_T(fwd_ktile) *tile, FT *p, int64_t c0, int64_t c1)
{
    if (c1 <= c0)
        return;
    if (tile->pv_tiles)
        memset((uint16_t *)p + c0, 0, (size_t)(c1 - c0) * sizeof(uint16_t));
    else
        memset(p + c0, 0, (size_t)(c1 - c0) * sizeof *p);
}

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
    /* the rows' additions: the bias's, or the block mask's where it does not cover the
     * strip's span of listed blocks */
    FT *const bias = pr->bias || (pr->blocks && !fai_blocks_cover(pr, tile->b, tile->h, i0 + r0,
                                                                  i0 + r1, j0 + tile->span0,
                                                                  tile->span1 - tile->span0))
                         ? w->bias
                         : NULL;
    int64_t cs0 = n, cs1 = 0;
    for (int64_t r = r0; r < r1; r++) { /* each row's allowed columns, and their union */
        int64_t *c = w->cols + 2 * (r - r0);
        FAI_T(row_cols)(pr, tile->cls, i0 + r, j0, n, &c[0], &c[1]);
        c[0] = c[0] > tile->span0 ? c[0] : tile->span0;
        c[1] = c[1] < tile->span1 ? c[1] : tile->span1;
        if (c[0] < c[1]) {
            cs0 = c[0] < cs0 ? c[0] : cs0;
            cs1 = c[1] > cs1 ? c[1] : cs1;
        }
    }
    if (cs0 >= cs1) /* no row sees a listed key here (the span cut them off): all as they are */
        return;
    /* With the fold (P V on the tile products, the score pipeline a scale alone, no bias),
     * S is stored unscaled, and the scale is applied by the max, max_c fl(scale s_c) =
     * fl(scale max_c s_c) as rounding is monotonic (0 < scale < inf), and by the tiles' exp,
     * which forms fl(scale s_c) itself: no load and store of S for the scale. (That product
     * stands alone in its statement and feeds a compare and a store, so no compiler fuses it
     * into an FMA; the exp rounds its own by an explicit rounding mode.) */
    const int fold = tile->pv_tiles && tile->fold_ok;
    const FT scale = w->scale_rows[0];
    FAI_T(gemm_qk)(w, r0, r1, cs0, cs1, pr->dqk, ld, tile->scale_only && !fold);

    for (int64_t r = r0; r < r1; r++) { /* 2. block max, new reference, rescale exponent */
        const int64_t i = i0 + r;
        FT *s = w->sp + (r - r0) * ld, bmax = -INFINITY;
        const int64_t c0 = w->cols[2 * (r - r0)], c1 = w->cols[2 * (r - r0) + 1];
        if (bias && c0 < c1) /* from column c0 */
            FAI_T(load_bias)(pr, w->kern, tile->b, tile->h, i, j0 + c0, c1 - c0, bias);
        if (pr->bias && c0 < c1 && i + tl.br < tile->i1) /* the next strip's row, same columns */
            FAI_T(prefetch_bias)(pr, tile->b, tile->h, i + tl.br, j0 + c0, c1 - c0);
        if (c0 < c1 && tile->scale_only) { /* scaled by the GEMM, or by the fold below */
            if (bias)
                FAI_T(add_bias)(c1 - c0, bias, tile->bias_factor, s + c0);
            bmax = w->kern->max(c1 - c0, s + c0);
            if (fold)
                bmax *= scale;
        } else {
            for (int64_t c = c0; c < c1; c++) {
                s[c] = FAI_T(fai_score_biased)(&pr->score, s[c], tile->slope,
                                               bias ? bias[c - c0] : 0, i, j0 + c, NULL);
                bmax = FAI_T(fai_nanmax)(bmax, s[c]);
            }
        }
        /* A row that sees nothing here, or only -inf before anything finite, leaves its
         * state alone (a = 1) and P at 0; its allowed terms 0 * v still enter acc below
         * or in the GEMM, as they do in the reference. */
        w->live[r] = (unsigned char)FAI_T(fai_online_move)(&w->m[r], bmax, &w->x[r]);
        if (!w->live[r])
            w->x[r] = 0;
    }
    w->kern->expsum(r1 - r0, w->x + r0, 0, w->x + r0); /* x <- a = exp(x); exp(0) = 1 */

    /* P is 0 outside a row's allowed columns: over the strip's columns, or, where the tile
     * products take P V, over all of the key chunks they read. There P is in bf16, written
     * over the row's first half by their exp (each bf16 lands on scores already read), so the
     * zeros go in after it. */
    const int64_t z0 = tile->pv_tiles ? 0 : cs0, z1 = tile->pv_tiles ? tile->nk : cs1;
    for (int64_t r = r0; r < r1; r++) { /* 3. P (over S) and l */
        const int64_t i = i0 + r;
        FT *p = w->sp + (r - r0) * ld, *acc = w->acc + r * dv;
        const int64_t c0 = w->cols[2 * (r - r0)], c1 = w->cols[2 * (r - r0) + 1];
        if (c0 >= c1) { /* this row sees nothing here: a masked tile inside a live row */
            FAI_T(p_zero)(tile, p, z0, z1);
            continue;
        }
        if (drop->threshold)
            fai_dropout_keep_row(drop, i, j0 + c0, c1 - c0, w->keep + c0);
        if (w->live[r]) {
#if FT_TILE_PRODUCTS
            const FT s = tile->pv_tiles ? w->bf16->expsum(c1 - c0, p + c0, fold ? scale : 1,
                                                          w->m[r], (uint16_t *)p + c0)
                                        : w->kern->expsum(c1 - c0, p + c0, w->m[r], p + c0);
#else
            const FT s = w->kern->expsum(c1 - c0, p + c0, w->m[r], p + c0);
#endif
            w->l[r] = FAI_T(fai_online_sum)(w->l[r], w->x[r], s);
            for (int64_t c = c0; c < c1 && drop->threshold; c++)
                if (!w->keep[c]) /* l keeps the dropped terms: LSE is pre-dropout */
                    FAI_T(p_zero)(tile, p, c, c + 1);
        } else {
            FAI_T(p_zero)(tile, p, c0, c1);
        }
        FAI_T(p_zero)(tile, p, z0, c0); /* a PARTIAL tile's masked columns */
        FAI_T(p_zero)(tile, p, c1, z1);
        if (!tile->selective)
            continue;
        /* by selection: the GEMM kernel over each run of allowed, kept keys. The terms and
         * their order are those of the tile's GEMM less its masked and dropped zeros, so
         * the bits are the same as without the non-finite rows. Keys the bias masks are
         * skipped as the window's are (their flags in keep, which dropout may have filled) */
        for (int64_t d = 0; d < dv; d++)
            acc[d] *= w->x[r];
        const int skip = drop->threshold || bias;
        if (bias) {
            FAI_T(load_bias)(pr, w->kern, tile->b, tile->h, i, j0 + c0, c1 - c0, bias);
            for (int64_t c = c0; c < c1; c++)
                w->keep[c] = (!drop->threshold || w->keep[c]) && !fai_bias_masks(bias[c - c0]);
        }
        for (int64_t ca = c0; ca < c1;) {
            while (ca < c1 && skip && !w->keep[ca])
                ca++;
            int64_t cb = ca;
            while (cb < c1 && !(skip && !w->keep[cb]))
                cb++;
            if (cb > ca)
                FAI_T(fai_gemm)(w->kern, 1, dv, cb - ca, p + ca, ld, w->v + ca * dv, dv, acc,
                                dv, 1, NULL);
            ca = cb;
        }
    }
#if FT_TILE_PRODUCTS
    if (tile->pv_tiles) { /* 4. acc = diag(a) acc + P V */
        w->bf16->pv(r1 - r0, tile->nk, dv, (const uint16_t *)w->sp, 2 * ld, w->vb,
                    w->acc + r0 * dv, dv, w->x + r0, w->tile_scratch);
        return;
    }
#endif
    if (!tile->selective)
        FAI_T(fai_gemm)(w->kern, r1 - r0, dv, cs1 - cs0, w->sp + cs0, ld, w->v + cs0 * dv, dv,
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
 *      0 outside the allowed keys and where dropout drops (with the tile products' P V: by
 *      their exp, in bf16 over each row's first half, the scale applied there; fwd_strip);
 *   4. acc = diag(a) acc + P V by the GEMM kernel, the rescale fused into its load of acc (or
 *      by the tile products, where the key tile's V is finite).
 * Key tiles outside the mask's key span are never visited; FULL tiles need no per-element
 * test, PARTIAL ones use each row's allowed interval, and only the rows from the first to the
 * last that see any key of the tile take part (per strip): a row that sees none would have
 * a = 1 and P = 0, which leaves its state as it is (acc + 0 is acc, but for the sign of a zero,
 * which the output's finalization makes +0). On the diagonal of a causal mask that skips up to
 * half of the tile's work. Every row's result is independent of the strip it falls in.
 *
 * The GEMM multiplies the zeros of P with V. That is exact while V is finite; for a tile whose V
 * holds inf or NaN and that has masked or dropped entries, the rows accumulate P V by selection
 * instead, so that docs/DESIGN.md §1's "masked NaN never reaches the output" holds to the bit.
 */
static void FAI_T(fwd_qtile)(const fai_problem *call, fai_tiles tl, int64_t b, int64_t h,
                             int64_t i0, int64_t i1, FAI_T(fwd_ws) *w)
{
    const int64_t hk = h / call->group, nq = i1 - i0, dv = call->dv;
    /* FP8: the descales of q and k fold into the score scale (the GEMM's store factors too),
     * v's into the output's final factor; each multiplies once */
    fai_problem scaled = *call;
    const fai_problem *pr = &scaled;
    const FT descale_v = (FT)fai_descale_v(call, b, hk);
    if (call->descale_q || call->descale_k) {
        scaled.score.scale *= fai_descale_qk(call, b, hk);
        for (int64_t r = 0; r < w->kern->mr; r++)
            w->scale_rows[r] = (FT)scaled.score.scale;
    }
    const fai_dropout drop = fai_dropout_for(pr, b, h);
    FAI_T(fwd_ktile) tile = {.b = b, .h = h, .i1 = i1, .slope = (FT)fai_slope(pr, h),
                             .drop = &drop};
    tile.bias_factor = (FT)fai_bias_factor(pr, h);
    tile.scale_only = FAI_T(scale_only)(pr, tile.slope);
    /* decided per call, not per strip, so that every row of it takes the same kernels */
    tile.fold_ok = tile.scale_only && !fai_row_biased(pr) && w->scale_rows[0] > 0 &&
                   isfinite(w->scale_rows[0]);

    if (w->bf16)
        FAI_T(load_q_rows)(pr, b, h, i0, nq, w);
    else
        FAI_T(load_q_panels)(pr, b, h, i0, nq, w);
    for (int64_t r = 0; r < nq; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0;
    }
    memset(w->acc, 0, (size_t)(nq * dv) * sizeof(FT));

    /* the mask's parts in key order (two with sink tokens: the sinks, then the window), one
     * recurrence over both; a key tile that holds keys of each is visited once per part */
    fai_problem part[2];
    const int np = fai_mask_part_problems(pr, part);
    for (int p = 0; p < np; p++) {
        const fai_problem *pm = &part[p];
        int64_t jlo, jhi;
        fai_mask_key_span(&pm->mask, i0, i1, &jlo, &jhi);
        /* key tiles on the grid of multiples of Bk, whatever the query tile: where the online
         * softmax rescales then does not depend on how the query rows are grouped */
        for (tile.j0 = jlo - jlo % tl.bk; tile.j0 < jhi; tile.j0 += tl.bk) {
            tile.n = jhi - tile.j0 < tl.bk ? jhi - tile.j0 : tl.bk;
            tile.cls = fai_mask_classify(&pm->mask, i0, i1, tile.j0, tile.j0 + tile.n);
            if (tile.cls == FAI_TILE_EMPTY || !fai_blocks_meet(pr, b, h, i0, i1, tile.j0, tile.n))
                continue;
            int64_t r0, r1;
            FAI_T(row_span)(pm, tile.cls, i0, nq, tile.j0, tile.n, &r0, &r1);
            if (r0 == r1)
                continue;
            int64_t ldk, ldv;
            const void *k =
                fai_kv_gather(pr, FAI_K, b, hk, tile.j0, tile.n, pr->dqk, w->kv_stage, &ldk);
            if (w->bf16) {
                w->bf16->pack_kt(tile.n, pr->dqk, k, ldk, w->ktb, w->sp_ld);
            } else {
                int64_t ld;
                const FT *kr =
                    FAI_T(view_run)(w->kern, k, ldk, pr->k_dtype, tile.n, pr->dqk, w->k, &ld);
                w->kern->transpose(tile.n, pr->dqk, kr, ld, w->kt, tl.bk);
            }
            /* With tile products, P V takes them or the f32 kernels by whether V is finite,
             * and the two round differently: so that a row's bits do not depend on its query
             * tile, the test covers the whole key tile (not only the keys this query tile
             * sees), and the products run over all of its key chunks. */
            const int64_t nv = w->bf16 ? (pr->sk - tile.j0 < tl.bk ? pr->sk - tile.j0 : tl.bk)
                                        : tile.n;
            /* (the gathered K rows are packed by now: the stage takes V's) */
            const void *v = fai_kv_gather(pr, FAI_V, b, hk, tile.j0, nv, dv, w->kv_stage, &ldv);
            int v_finite = 1;
#if FT_TILE_PRODUCTS
            /* the tile products read V as stored: tested on its bf16 bits, widened to f32
             * only for the f32 kernels of a tile with inf or NaN */
            for (int64_t r = 0; w->bf16 && r < nv; r++)
                v_finite = v_finite && FAI_T(bf16_finite)(dv, (const uint16_t *)v + r * ldv);
            if (!w->bf16 || !v_finite)
#endif
            {
                FAI_T(load_run)(w->kern, v, ldv, pr->v_dtype, nv, dv, w->v);
                v_finite = w->kern->finite(nv * dv, w->v);
            }
            tile.selective =
                (tile.cls != FAI_TILE_FULL || drop.threshold || fai_row_biased(pr)) && !v_finite;
            tile.pv_tiles = w->bf16 && v_finite;
            if (tile.pv_tiles) {
                tile.nk = FAI_T(round_up)(nv, w->bf16->keys);
                w->bf16->pack_v(tile.n, tile.nk, dv, v, ldv, w->vb);
            }
            /* strips on a grid of br rows from the tile's first row (the plan's br is a
             * multiple of the kernel's MR, so its strips start on panel boundaries, or of the
             * tile products' rows; any br works) */
            for (int64_t g = r0 - r0 % tl.br; g < r1; g += tl.br) {
                const int64_t g1 = g + tl.br < r1 ? g + tl.br : r1;
                /* with a block mask, strips are cut where query blocks end, each block's rows
                 * seeing their own key blocks: a strip that sees none of the tile's is
                 * skipped, one that sees all of it takes no mask */
                for (int64_t s0 = g > r0 ? g : r0, s1; s0 < g1; s0 = s1) {
                    s1 = g1;
                    if (pr->blocks) {
                        const int64_t qb = pr->blocks->q_block, end = ((i0 + s0) / qb + 1) * qb;
                        s1 = end - i0 < g1 ? end - i0 : g1;
                    }
                    int64_t a0, a1; /* the strip's rows that see the tile */
                    FAI_T(row_span)(pm, tile.cls, i0 + s0, s1 - s0, tile.j0, tile.n, &a0, &a1);
                    if (a0 >= a1)
                        continue;
                    /* the strip's work narrows to the span of its listed key blocks (where
                     * blocks are whole vectors of the kernels, 16 keys): the columns left out
                     * would add exact zeros, so the results are those of the key blocks as a
                     * dense mask but for how sums group in lanes (the same bits unless a
                     * window's edge shares the tile) */
                    tile.span0 = 0, tile.span1 = tile.n;
                    if (pr->blocks && pr->blocks->kv_block % 16 == 0)
                        fai_blocks_span(pr, b, h, i0 + s0 + a0, i0 + s0 + a1, tile.j0, tile.n,
                                        &tile.span0, &tile.span1);
                    if (tile.span0 < tile.span1 &&
                        fai_blocks_meet(pr, b, h, i0 + s0 + a0, i0 + s0 + a1, tile.j0, tile.n))
                        FAI_T(fwd_strip)(pm, tl, i0, s0 + a0, s0 + a1, &tile, w);
                }
            }
        }
    }

    const FT keep_scale = (FT)pr->keep_scale;
    for (int64_t r = 0; r < nq; r++) {
        FT *acc = w->acc + r * dv;
        double lse;
        FT f;
        /* an empty row is exactly 0, whatever acc holds; + 0 turns -0 into +0, so the sign of
         * a zero does not depend on which rows and columns the skips left out */
        if (!FAI_T(fai_online_end)(w->m[r], w->l[r], (FT)fai_sink(pr, h), keep_scale, &lse, &f)) {
            memset(acc, 0, (size_t)dv * sizeof(FT));
        } else {
            f *= descale_v; /* 1 but for FP8 v */
#pragma omp simd
            for (int64_t d = 0; d < dv; d++)
                acc[d] = FAI_T(fai_online_out)(acc[d], f);
        }
        w->kern->narrow(fai_q_row(pr, FAI_OUT, b, h, i0 + r), pr->dtype, dv, acc);
        if (fai_io(pr, FAI_LSE))
            fai_lse_write(pr, b, h, i0 + r, lse);
    }
}

/* Each thread's workspace: sized by the tiles alone, whatever the sequence lengths. */
static size_t FAI_T(forward_need)(const fai_problem *pr, const FAI_T(fai_kernels) *kern,
                                  const fai_tiled_plan *plan)
{
    FAI_T(fwd_ws) w;
    return FAI_T(fwd_carve)(pr, plan, kern, NULL, &w);
}

/* The tiles of a call: the tasks (batch, head, query tile) of its groups g[0 .. n - 1], group
 * g[x]'s from first[x] (first[n]: all of them), in one task space. */
static void FAI_T(forward)(fa_context *ctx, const fai_problem *call,
                           const FAI_T(fai_kernels) *kern, const fai_tiled_plan *plan,
                           const int64_t *g, const int64_t *first, int64_t n,
                           const fai_scratch *sc)
{
    const fai_tiles tl = plan->tl;
    const int64_t bq = plan->task_rows; /* the workspace is sized by tl.bq */
    const int64_t tasks = first[n];
#pragma omp parallel num_threads(ctx->num_threads)
    {
        FAI_T(fwd_ws) mine;
        FAI_T(fwd_carve)(call, plan, kern, sc->base + (size_t)omp_get_thread_num() * sc->per,
                         &mine);
        fai_problem pr;
        int64_t at = -1; /* the group pr holds */
        /* dynamic: causal and windowed tiles differ in cost; each task's result is fixed */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t part = fai_task_part(first, n, task);
            if (part != at) {
                pr = fai_group(call, g[part]);
                at = part;
            }
            const int64_t nqt = (pr.sq + bq - 1) / bq, u = task - first[part];
            const int64_t qt = u % nqt, h = (u / nqt) % pr.hq, b = u / (nqt * pr.hq);
            const int64_t i0 = qt * bq, i1 = i0 + bq < pr.sq ? i0 + bq : pr.sq;
            FAI_T(fwd_qtile)(&pr, tl, b, h, i0, i1, &mine);
        }
    }
}
