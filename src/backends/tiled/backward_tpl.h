/* ------------------------------------------------------------------ backward */

/*
 * Backward by recomputation, in two passes so that every gradient element has one owner:
 *   pass 1, per (b, kv head, key tile): dK and dV of the tile, summed over the group's query
 *           heads and all query rows in a fixed order;
 *   pass 2, per (b, head, query tile): dQ of the tile, summed over key tiles in order.
 * Both work on a block of query rows against a key tile: S = Q K^T and dP = dO V^T by the GEMM
 * kernel (the same kernel and order as the forward, so S is recomputed to the bit; the tile
 * products' S too, where the backward takes them as the forward did),
 * then per row P = exp(S - LSE), P~ = P z and dS = P (dP z - D) with D_i = dO_i . O_i
 * (core/gradient.h), then
 * dV += P~^T dO, dK += scale dS^T Q (pass 1) or dQ += scale dS K (pass 2) by the GEMM kernel.
 * No atomics, no reduction across threads. bf16 storage on the tile products (the plan's) forms
 * all five products on bf16 operands instead (bwd_tiles below), Q, dO, K and V as stored and
 * P~ and scale dS rounded to bf16 once, as FlashAttention-2 does on GPUs. Where enough
 * (b, kv head) tasks share out, one pass does both (bwd_kv_head below): pass 1 over a kv
 * head's key tiles in order, adding each tile's dQ terms to the head group's dQ rows as it
 * goes, with the same bits.
 *
 * The GEMMs multiply the exact zeros of P~ and dS (masked, dropped) with rows of dO, Q and K.
 * Where any of those rows holds inf or NaN, the products are formed by selection instead, in
 * the same order, so the result has the same bits as without the non-finite rows.
 */
typedef struct {
    FT *k, *kt, *vt, *vrow;      /* key tile: K (n x dqk), K^T (dqk x bk), V^T (dv x bk), V   */
    FT *dk, *dv;                 /* pass 1: the key tile's gradients (n x dqk, n x dv)        */
    FT *dk_h, *dv_h;             /* ... one query head's terms of them, where a kv head has
                                    several (GQA), else NULL                                   */
    FT *q, *dout, *o, *dq;       /* a block of up to bq query rows (row-major)                 */
    FT *dot, *ot;                /* dO^T and O^T of the block (dv x bq), for D                 */
    FT *di;                      /* D_i of the block's rows                                    */
    FT *scale_rows;              /* bq copies of the score scale (bwd_block's Q K^T)           */
    double *lse;
    FT *s, *dp, *t, *p, *ds;     /* bq x bk: scores, dP, tanh(x / c), P~, scale dS             */
    unsigned char *keep;
    FT *bias;                    /* a row's bias entries for the key tile (bk; with a bias)    */
    unsigned char *masked;       /* bq x bk: where the bias masks (with a bias)                */
    FT *gb;                      /* bq x bk: d loss / d bias of the block (want_dbias)         */
    FT *dbias;                   /* bq x bk: a key tile's bias gradient rows (with bias_grad)  */
    int want_dbias;              /* bwd_block forms gb                                         */
    FT *dq_all;                  /* single pass: dQ of the group's heads (group x Sq x Dqk),
                                    else NULL                                                  */
    int q_finite, kv_finite;     /* whether the loaded Q and dO, K and V hold no inf or NaN    */
    int q_wide, kv_wide;         /* whether their f32 copies above are formed                  */
    int64_t at_b, at_h, at_i0, at_nq;  /* the loaded query block: (b, h), rows [i0, i0 + nq) */
    int64_t at_kb, at_hk, at_j0, at_n; /* the loaded key tile: (b, hk), keys [j0, j0 + n)    */
    const FAI_T(fai_kernels) *kern;
    /* bf16 storage on the tile products (the plan's; NULL otherwise), which take a block
     * whose Q, dO, K and V are finite (bwd_tiles). Row counts are rounded up to 32 (bq32,
     * bk32: the products' k step), the rows and columns past the block's zero. */
    const fai_kernels_bf16 *bf16;
    int64_t bq32, bk32;
    uint16_t *qb, *dob;          /* the block's Q and dO rows as stored (bq32 rows): A of S, dP */
    uint16_t *qpair, *dopair;    /* ... as pairs of query rows: B of dK, dV                    */
    uint16_t *ktb, *vtb, *kpair; /* key tile: K^T and V^T as pairs along d (B of S, dP), K as
                                    pairs of keys (B of dQ)                                    */
    uint16_t *pt, *dst, *dsb;    /* P~^T (bk32 x bq32), scale dS^T (bk32 x bq32), scale dS
                                    (bq32 x bk32) in bf16: A of dV, dK, dQ                     */
} FAI_T(bwd_ws);

static size_t FAI_T(bwd_carve)(const fai_problem *pr, const fai_tiled_plan *plan, char *base,
                               FAI_T(bwd_ws) *w)
{
    const fai_tiles tl = plan->tl;
    const int single_pass = plan->single_pass;
    fai_arena a = {base, 0};
    w->bf16 = plan->tile_products;
    w->bq32 = (tl.bq + 31) / 32 * 32;
    w->bk32 = (tl.bk + 31) / 32 * 32;
    w->qb = w->dob = w->qpair = w->dopair = w->ktb = w->vtb = w->kpair = NULL;
    w->pt = w->dst = w->dsb = NULL;
    if (w->bf16) {
        const size_t q = (size_t)w->bq32 * 2, k = (size_t)w->bk32 * 2;
        w->qb = fai_carve(&a, q * (size_t)pr->dqk);
        w->dob = fai_carve(&a, q * (size_t)pr->dv);
        w->qpair = fai_carve(&a, q * (size_t)pr->dqk);
        w->dopair = fai_carve(&a, q * (size_t)pr->dv);
        w->ktb = fai_carve(&a, k * (size_t)pr->dqk);
        w->vtb = fai_carve(&a, k * (size_t)pr->dv);
        w->kpair = fai_carve(&a, k * (size_t)pr->dqk);
        w->pt = fai_carve(&a, k * (size_t)w->bq32);
        w->dst = fai_carve(&a, k * (size_t)w->bq32);
        w->dsb = fai_carve(&a, q * (size_t)w->bk32);
    }
    w->dq_all = single_pass ? fai_carve(&a, (size_t)(pr->group * pr->sq * pr->dqk) * sizeof(FT))
                            : NULL;
    const size_t bk = (size_t)tl.bk, bq = (size_t)tl.bq, f = sizeof(FT);
    w->k = fai_carve(&a, bk * (size_t)pr->dqk * f);
    w->kt = fai_carve(&a, bk * (size_t)pr->dqk * f);
    w->vt = fai_carve(&a, bk * (size_t)pr->dv * f);
    w->vrow = fai_carve(&a, bk * (size_t)pr->dv * f);
    w->dk = fai_carve(&a, bk * (size_t)pr->dqk * f);
    w->dv = fai_carve(&a, bk * (size_t)pr->dv * f);
    w->dk_h = pr->group > 1 ? fai_carve(&a, bk * (size_t)pr->dqk * f) : NULL;
    w->dv_h = pr->group > 1 ? fai_carve(&a, bk * (size_t)pr->dv * f) : NULL;
    w->q = fai_carve(&a, bq * (size_t)pr->dqk * f);
    w->dout = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->o = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->dot = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->ot = fai_carve(&a, bq * (size_t)pr->dv * f);
    w->dq = fai_carve(&a, bq * (size_t)pr->dqk * f);
    w->di = fai_carve(&a, bq * f);
    w->scale_rows = FAI_T(carve_scale_rows)(&a, pr, tl.bq);
    w->lse = fai_carve(&a, bq * sizeof(double));
    /* the tile products store S and dP in blocks of 16 rows */
    w->s = fai_carve(&a, (w->bf16 ? (size_t)w->bq32 : bq) * bk * f);
    w->dp = fai_carve(&a, (w->bf16 ? (size_t)w->bq32 : bq) * bk * f);
    w->t = fai_carve(&a, bq * bk * f);
    w->p = fai_carve(&a, bq * bk * f);
    w->ds = fai_carve(&a, bq * bk * f);
    w->keep = fai_carve(&a, bk);
    w->bias = fai_row_biased(pr) ? fai_carve(&a, bk * f) : NULL;
    w->masked = fai_row_biased(pr) ? fai_carve(&a, bq * bk) : NULL;
    w->gb = pr->bias_grad ? fai_carve(&a, bq * bk * f) : NULL;
    w->dbias = pr->bias_grad ? fai_carve(&a, bq * bk * f) : NULL;
    w->want_dbias = 0;
    return a.used;
}

/* The f32 copies of the loaded query block that the GEMM kernels take: Q and dO, and
 * D_i = dO_i . O_i (O as stored, as FA) by the column dots of dO^T and O^T, which round as
 * the GEMM kernel rounds dP = dO V^T: where dP z - D_i is 0 in exact arithmetic (a row with one
 * key), the two sums round alike and the difference stays 0. With the tile products D_i is
 * load_query_bf16's whatever kernels a block takes (the two passes load blocks differently,
 * and a row's D_i must not change with that); there dP comes from the tiles, so a row with one
 * key gets dS of the order of 2^-24 |dP| rather than 0. */
static void FAI_T(widen_query_block)(const fai_problem *pr, int64_t bq, FAI_T(bwd_ws) *w)
{
    const int64_t b = w->at_b, h = w->at_h, i0 = w->at_i0, nq = w->at_nq, dv = pr->dv;
    int64_t lq, lg, lo, ldo;
    const void *q = fai_q_rows(pr, FAI_Q, b, h, i0, nq, &lq);
    const void *g = fai_q_rows(pr, FAI_DOUT, b, h, i0, nq, &lg);
    const void *out = fai_q_rows(pr, FAI_OUT, b, h, i0, nq, &lo);
    FAI_T(load_run)(w->kern, q, lq, pr->dtype, nq, pr->dqk, w->q);
    FAI_T(load_run)(w->kern, g, lg, pr->dtype, nq, dv, w->dout);
    w->q_wide = 1;
    if (w->bf16)
        return;
    const FT *o = FAI_T(view_run)(w->kern, out, lo, pr->dtype, nq, dv, w->o, &ldo);
    w->kern->transpose(nq, dv, w->dout, dv, w->dot, bq);
    w->kern->transpose(nq, dv, o, ldo, w->ot, bq);
    w->kern->coldot(nq, dv, w->dot, bq, w->ot, bq, w->di);
}

/* The f32 copies of the loaded key tile that the GEMM kernels take: K and K^T, V and V^T. */
static void FAI_T(widen_key_tile)(const fai_problem *pr, fai_tiles tl, FAI_T(bwd_ws) *w)
{
    const int64_t n = w->at_n;
    int64_t ldk, ldv;
    /* one run at one stride: no backward is paged (fai_kv_run_len is n) */
    const void *k = fai_kv_rows(pr, FAI_K, w->at_kb, w->at_hk, w->at_j0, n, &ldk);
    const void *v = fai_kv_rows(pr, FAI_V, w->at_kb, w->at_hk, w->at_j0, n, &ldv);
    FAI_T(load_run)(w->kern, k, ldk, pr->dtype, n, pr->dqk, w->k);
    FAI_T(load_run)(w->kern, v, ldv, pr->dtype, n, pr->dv, w->vrow);
    w->kern->transpose(n, pr->dqk, w->k, pr->dqk, w->kt, tl.bk);
    w->kern->transpose(n, pr->dv, w->vrow, pr->dv, w->vt, tl.bk);
    w->kv_wide = 1;
}

#if FT_TILE_PRODUCTS
/* dst = n bf16 rows of dim elements from src (rows ld elements apart), then zero rows up to a
 * multiple of 32: the tile products' A operand as stored. */
static void FAI_T(bf16_rows)(const void *src, int64_t ld, int64_t n, int64_t dim, uint16_t *dst)
{
    for (int64_t r = 0; r < n; r++)
        memcpy(dst + r * dim, (const uint16_t *)src + r * ld, (size_t)dim * 2);
    memset(dst + n * dim, 0, (size_t)(((n + 31) / 32 * 32 - n) * dim) * 2);
}

/* The query block's operands of the tile products (load_query_block). */
static void FAI_T(load_query_bf16)(const fai_problem *pr, FAI_T(bwd_ws) *w)
{
    const int64_t b = w->at_b, h = w->at_h, i0 = w->at_i0, nq = w->at_nq, dv = pr->dv;
    int64_t lq, lg, lo;
    const void *q = fai_q_rows(pr, FAI_Q, b, h, i0, nq, &lq);
    const void *g = fai_q_rows(pr, FAI_DOUT, b, h, i0, nq, &lg);
    const char *out = fai_q_rows(pr, FAI_OUT, b, h, i0, nq, &lo);
    const int64_t nq32 = (nq + 31) / 32 * 32;
    FAI_T(bf16_rows)(q, lq, nq, pr->dqk, w->qb);
    FAI_T(bf16_rows)(g, lg, nq, dv, w->dob);
    w->bf16->pack_v(nq, nq32, pr->dqk, q, lq, w->qpair);
    w->bf16->pack_v(nq, nq32, dv, g, lg, w->dopair);
    w->q_finite = FAI_T(bf16_finite)(nq * pr->dqk, w->qb) && FAI_T(bf16_finite)(nq * dv, w->dob);
    w->kern->widen(w->dob, FA_BF16, nq * dv, w->dout);
    for (int64_t r = 0; r < nq; r++)
        w->kern->dot_rows(1, 1, dv, w->dout + r * dv, dv, out + (size_t)(r * lo) * 2, lo,
                          FA_BF16, w->di + r, 1, NULL);
    w->q_wide = 0;
}
#endif

/*
 * Loads query rows [i0, i0 + nq) of (b, h): LSE, whether Q and dO are finite, and their f32
 * copies (widen_query_block). With the tile products instead: Q and dO rows as stored and as
 * pairs, and D_i by the decode kernels' row dot of dO (widened) and O as stored; the f32
 * copies are then formed only for a block that goes to the GEMM kernels (bwd_block).
 */
static void FAI_T(load_query_block)(const fai_problem *pr, int64_t b, int64_t h, int64_t i0,
                                    int64_t nq, int64_t bq, FAI_T(bwd_ws) *w)
{
    const int64_t dv = pr->dv;
    w->at_b = b, w->at_h = h, w->at_i0 = i0, w->at_nq = nq;
    for (int64_t r = 0; r < nq; r++)
        w->lse[r] = fai_lse_read(pr, b, h, i0 + r);
#if FT_TILE_PRODUCTS
    if (w->bf16) {
        FAI_T(load_query_bf16)(pr, w);
        return;
    }
#endif
    FAI_T(widen_query_block)(pr, bq, w);
    w->q_finite = w->kern->finite(nq * pr->dqk, w->q) && w->kern->finite(nq * dv, w->dout);
}

#if FT_TILE_PRODUCTS
/* The key tile's operands of the tile products (load_key_tile). */
static void FAI_T(load_key_bf16)(const fai_problem *pr, FAI_T(bwd_ws) *w)
{
    const int64_t n = w->at_n;
    int64_t ldk, ldv;
    const uint16_t *k = fai_kv_rows(pr, FAI_K, w->at_kb, w->at_hk, w->at_j0, n, &ldk);
    const uint16_t *v = fai_kv_rows(pr, FAI_V, w->at_kb, w->at_hk, w->at_j0, n, &ldv);
    w->bf16->pack_kt(n, pr->dqk, k, ldk, w->ktb, w->bk32);
    w->bf16->pack_kt(n, pr->dv, v, ldv, w->vtb, w->bk32);
    w->bf16->pack_v(n, (n + 31) / 32 * 32, pr->dqk, k, ldk, w->kpair);
    /* K^T in pairs holds every element of K once (and zeros), V^T every one of V */
    w->kv_finite = FAI_T(bf16_finite)(pr->dqk * w->bk32, w->ktb) &&
                   FAI_T(bf16_finite)(pr->dv * w->bk32, w->vtb);
    w->kv_wide = 0;
}
#endif

/* Loads key tile [j0, j0 + n) of (b, hk): whether K and V are finite, and their f32 copies
 * (widen_key_tile); with the tile products instead K^T and V^T as pairs along d and K as
 * pairs of keys, the f32 copies formed only for a block that goes to the GEMM kernels. */
static void FAI_T(load_key_tile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t hk,
                                 int64_t j0, int64_t n, FAI_T(bwd_ws) *w)
{
    w->at_kb = b, w->at_hk = hk, w->at_j0 = j0, w->at_n = n;
#if FT_TILE_PRODUCTS
    if (w->bf16) {
        FAI_T(load_key_bf16)(pr, w);
        return;
    }
#endif
    FAI_T(widen_key_tile)(pr, tl, w);
    w->kv_finite = w->kern->finite(n * pr->dqk, w->k) && w->kern->finite(n * pr->dv, w->vrow);
}

#if FT_TILE_PRODUCTS
/* Whether the loaded block forms S, dP and dQ on the tile products: bf16 storage on them, and
 * K and V finite. Those three are row by row (a row's inf or NaN in Q or dO stays in its own
 * row), so the choice must not depend on the query rows the block holds: it would then depend
 * on how pass 1 and pass 2 group rows, and so on the thread count. dK and dV, which sum over
 * the block's rows, take the tiles only where Q and dO are finite too (bwd_ktile_head). */
static int FAI_T(tiles_take)(const FAI_T(bwd_ws) *w)
{
    return w->bf16 && w->kv_finite;
}
#endif

/* The f32 copies of the loaded block and key tile, where not formed yet. */
static void FAI_T(widen_block)(const fai_problem *pr, fai_tiles tl, FAI_T(bwd_ws) *w)
{
    if (!w->q_wide)
        FAI_T(widen_query_block)(pr, tl.bq, w);
    if (!w->kv_wide)
        FAI_T(widen_key_tile)(pr, tl, w);
}

/* Whether the bias masks column c of block row r (bwd_block's w->masked). */
static int FAI_T(bias_masked)(const fai_problem *pr, fai_tiles tl, const FAI_T(bwd_ws) *w,
                              int64_t r, int64_t c)
{
    return fai_row_biased(pr) && w->masked[r * tl.bk + c];
}

/*
 * Rows [i0, i0 + nq) of (b, h) (loaded in w) against key tile [j0, j0 + n): S and dP by the
 * GEMM kernel, then per row over its allowed keys P~ into w->p and scale dS into w->ds, exact
 * zeros elsewhere (and in rows that are empty or see no key here); with a bias, where it
 * masks into w->masked, and with want_dbias, d loss / d bias into w->gb (core/gradient.h).
 * Returns whether any row contributes.
 */
static int FAI_T(bwd_block)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t h,
                            int64_t i0, int64_t nq, int64_t j0, int64_t n, fai_tile_class cls,
                            FAI_T(bwd_ws) *w)
{
    const int64_t ld = tl.bk;
    const FT keep_scale = (FT)pr->keep_scale, scale = (FT)pr->score.scale;
    const FT slope = (FT)fai_slope(pr, h);
    const int softcap = pr->score.softcap > 0, scale_only = FAI_T(scale_only)(pr, slope);
    const int after_cap = pr->score.bias == FAI_BIAS_AFTER_CAP;
    const FT factor = (FT)fai_bias_factor(pr, h);
    const fai_dropout drop = fai_dropout_for(pr, b, h);
#if FT_TILE_PRODUCTS
    if (FAI_T(tiles_take)(w)) { /* as the forward's tiles form S (the scale alike) */
        const float sc = (float)w->scale_rows[0];
        w->bf16->qk(nq, 0, n, pr->dqk, w->qb, pr->dqk, w->ktb, w->bk32, w->s, ld,
                    scale_only ? &sc : NULL);
        w->bf16->qk(nq, 0, n, pr->dv, w->dob, pr->dv, w->vtb, w->bk32, w->dp, ld, NULL);
    } else
#endif
    {
        FAI_T(widen_block)(pr, tl, w);
        FAI_T(fai_gemm)(w->kern, nq, n, pr->dqk, w->q, pr->dqk, w->kt, ld, w->s, ld, 0,
                        scale_only ? w->scale_rows : NULL); /* Q K^T, scaled as the forward's */
        FAI_T(fai_gemm)(w->kern, nq, n, pr->dv, w->dout, pr->dv, w->vt, ld, w->dp, ld, 0,
                        NULL); /* dO V^T */
    }
    int any = 0;
    for (int64_t r = 0; r < nq; r++) {
        const int64_t i = i0 + r;
        const double lse = w->lse[r]; /* P = exp(s - LSE) with the subtraction in double */
        FT *s = w->s + r * ld, *dp = w->dp + r * ld, *t = w->t + r * ld, *p = w->p + r * ld,
           *ds = w->ds + r * ld;
        FT *gb = w->want_dbias ? w->gb + r * ld : NULL;
        int64_t c0, c1;
        FAI_T(row_cols)(pr, cls, i, j0, n, &c0, &c1);
        if (gb)
            memset(gb, 0, (size_t)n * sizeof(FT));
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
        /* the forward's pipeline, operation for operation (scale_only: the scale done by the
         * GEMM, the bias by add_bias; where the forward folds the scale into its max and exp,
         * fwd_strip, its scores are these to the bit, as it says) */
        if (fai_row_biased(pr)) {
            FAI_T(load_bias)(pr, w->kern, b, h, i, j0 + c0, c1 - c0, w->bias);
            for (int64_t c = c0; c < c1; c++)
                w->masked[r * ld + c] = (unsigned char)fai_bias_masks(w->bias[c - c0]);
            if (scale_only)
                FAI_T(add_bias)(c1 - c0, w->bias, factor, s + c0);
        }
        if (!scale_only)
            for (int64_t c = c0; c < c1; c++)
                s[c] = FAI_T(fai_score_biased)(&pr->score, s[c], slope,
                                               fai_row_biased(pr) ? w->bias[c - c0] : 0, i, j0 + c,
                                               softcap ? &t[c] : NULL);
        if (!softcap && !drop.threshold) { /* P~ = P, dS = P (dP - D) by one kernel */
            w->kern->dsoftmax(c1 - c0, s + c0, lse, dp + c0, w->di[r], scale, p + c0, ds + c0);
            for (int64_t c = c0; gb && c < c1; c++) /* 0 where masked, whatever dP holds */
                gb[c] = FAI_T(bias_masked)(pr, tl, w, r, c)
                            ? 0
                            : FAI_T(fai_dbias)(p[c], dp[c], 1, w->di[r], 0, 0, after_cap, factor);
            continue;
        }
        if (drop.threshold)
            fai_dropout_keep_row(&drop, i, j0 + c0, c1 - c0, w->keep + c0);
        for (int64_t c = c0; c < c1; c++) /* P = exp(s - LSE) by the exp kernel, in place */
            p[c] = (FT)((double)s[c] - lse);
        w->kern->expsum(c1 - c0, p + c0, 0, p + c0);
        for (int64_t c = c0; c < c1; c++) {
            const FT P = p[c];
            const FT z = (drop.threshold && !w->keep[c]) ? 0 : keep_scale;
            const FT g = FAI_T(fai_dscore)(P, dp[c], z, w->di[r], softcap ? t[c] : 0, softcap);
            if (gb)
                gb[c] = FAI_T(bias_masked)(pr, tl, w, r, c)
                            ? 0
                            : FAI_T(fai_dbias)(P, dp[c], z, w->di[r], softcap ? t[c] : 0,
                                               softcap, after_cap, factor);
            p[c] = P * z;
            ds[c] = scale * g;
        }
    }
    return any;
}

/* dq (nq rows) += scale dS K by selection: each row over its allowed keys only (the window's
 * and the bias's), so that inf or NaN in K or Q rows that the row does not see stays out (the
 * terms, in order, of the GEMM). */
static void FAI_T(dq_by_selection)(const fai_problem *pr, fai_tiles tl, fai_tile_class cls,
                                   int64_t i0, int64_t nq, int64_t j0, int64_t n,
                                   const FAI_T(bwd_ws) *w, FT *dq)
{
    const int64_t dqk = pr->dqk, ld = tl.bk;
    for (int64_t r = 0; r < nq; r++) {
        int64_t c0, c1;
        FAI_T(row_cols)(pr, cls, i0 + r, j0, n, &c0, &c1);
        if (w->lse[r] == -INFINITY)
            continue;
        for (int64_t ca = c0; ca < c1;) { /* runs of keys the bias does not mask */
            while (ca < c1 && FAI_T(bias_masked)(pr, tl, w, r, ca))
                ca++;
            int64_t cb = ca;
            while (cb < c1 && !FAI_T(bias_masked)(pr, tl, w, r, cb))
                cb++;
            if (cb > ca)
                FAI_T(fai_gemm)(w->kern, 1, dqk, cb - ca, w->ds + r * ld + ca, ld,
                                w->k + ca * dqk, dqk, dq + r * dqk, dqk, 1, NULL);
            ca = cb;
        }
    }
}

#if FT_TILE_PRODUCTS
/* dst = rows x cols of src (rows lds apart) rounded to bf16, to nearest even, each row then
 * zero up to ldd columns: an A operand of the tile products. */
static void FAI_T(bf16_block)(const FAI_T(bwd_ws) *w, int64_t rows, int64_t cols, const FT *src,
                              int64_t lds, uint16_t *dst, int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++) {
        w->kern->narrow(dst + r * ldd, FA_BF16, cols, src + r * lds);
        memset(dst + r * ldd + cols, 0, (size_t)(ldd - cols) * 2);
    }
}

/*
 * The gradient products of a block that takes the tile products (nq rows, key tile of n):
 * P~ and scale dS rounded to bf16 once, then dV += P~^T dO and dK += (scale dS)^T Q over the
 * block's rows as pairs (nq rounded up to 32 with zero rows), dQ += (scale dS) K over the
 * tile's keys likewise (dk and dv NULL in pass 2, dq NULL in pass 1 of two). P~^T and dS^T go
 * through the f32 transpose into w->t (bwd_block's, free again by now). Each product's sum
 * runs in chunks of 32 from the block's first row or the tile's first key: so the block and
 * tile boundaries are part of the bits (pass 2 keeps pass 1's key tiles for that).
 */
static void FAI_T(bwd_tiles)(const fai_problem *pr, fai_tiles tl, int64_t nq, int64_t n,
                             FAI_T(bwd_ws) *w, FT *dk, FT *dv, FT *dq)
{
    const int64_t ld = tl.bk, nq32 = (nq + 31) / 32 * 32, n32 = (n + 31) / 32 * 32;
    const int64_t dqk = pr->dqk, dvd = pr->dv;
    if (dv) {
        w->kern->transpose(nq, n, w->p, ld, w->t, tl.bq);
        FAI_T(bf16_block)(w, n, nq, w->t, tl.bq, w->pt, w->bq32);
        w->bf16->gemm(n, dvd, nq32, w->pt, w->bq32, w->dopair, dvd, dv, dvd, 1);
        w->kern->transpose(nq, n, w->ds, ld, w->t, tl.bq);
        FAI_T(bf16_block)(w, n, nq, w->t, tl.bq, w->dst, w->bq32);
        w->bf16->gemm(n, dqk, nq32, w->dst, w->bq32, w->qpair, dqk, dk, dqk, 1);
    }
    if (dq) {
        FAI_T(bf16_block)(w, nq, n, w->ds, ld, w->dsb, w->bk32);
        w->bf16->gemm(nq, dqk, n32, w->dsb, w->bk32, w->kpair, dqk, dq, dqk, 1);
    }
}
#endif

/* Pass 1 for query head h of kv head hk: its terms of the key tile's dK and dV, added to dk
 * and dv (n x dqk, n x dv); in the single pass also the tile's terms of its dQ rows. */
static void FAI_T(bwd_ktile_head)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t hk,
                                  int64_t h, int64_t j0, int64_t n, FAI_T(bwd_ws) *w, FT *dk,
                                  FT *dv)
{
    const int64_t dqk = pr->dqk, dvd = pr->dv, ld = tl.bk;
    /* the mask's parts in turn (core/score.h: the sinks, then the window) */
    fai_problem part[2];
    const int np = fai_mask_part_problems(pr, part);
    for (int p = 0; p < np; p++) {
        const fai_problem *pm = &part[p];
        int64_t ilo, ihi;
        fai_mask_query_span(&pm->mask, pr->sq, j0, j0 + n, &ilo, &ihi);
        for (int64_t i0 = ilo; i0 < ihi; i0 += tl.bq) {
            const int64_t nq = ihi - i0 < tl.bq ? ihi - i0 : tl.bq;
            const fai_tile_class cls = fai_mask_classify(&pm->mask, i0, i0 + nq, j0, j0 + n);
            if (cls == FAI_TILE_EMPTY || !fai_blocks_meet(pr, b, h, i0, i0 + nq, j0, n))
                continue;
            FAI_T(load_query_block)(pr, b, h, i0, nq, tl.bq, w);
            if (!FAI_T(bwd_block)(pm, tl, b, h, i0, nq, j0, n, cls, w))
                continue;
            FT *dq = w->dq_all ? w->dq_all + ((h - hk * pr->group) * pr->sq + i0) * dqk : NULL;
#if FT_TILE_PRODUCTS
            if (FAI_T(tiles_take)(w)) {
                if (w->q_finite) {
                    FAI_T(bwd_tiles)(pr, tl, nq, n, w, dk, dv, dq);
                    continue;
                }
                /* dQ on the tiles; dK and dV by selection below, on the f32 copies */
                FAI_T(bwd_tiles)(pr, tl, nq, n, w, NULL, NULL, dq);
                dq = NULL;
                FAI_T(widen_block)(pr, tl, w);
            }
#endif
            if (w->kv_finite && w->q_finite) {
                /* P~^T dO, dS^T Q */
                FAI_T(fai_gemm_at)(w->kern, n, dvd, nq, w->p, ld, w->dout, dvd, dv, dvd, 1, NULL);
                FAI_T(fai_gemm_at)(w->kern, n, dqk, nq, w->ds, ld, w->q, dqk, dk, dqk, 1, NULL);
                if (dq)
                    FAI_T(fai_gemm)(w->kern, nq, dqk, n, w->ds, ld, w->k, dqk, dq, dqk, 1, NULL);
                continue;
            }
            if (dq)
                FAI_T(dq_by_selection)(pm, tl, cls, i0, nq, j0, n, w, dq);
            /* by selection, rows in order: each (row, key) term one kernel step, as above;
             * masked and dropped terms skipped (an allowed P of 0 still multiplies dO) */
            const fai_dropout drop = fai_dropout_for(pr, b, h);
            for (int64_t r = 0; r < nq; r++) {
                int64_t c0, c1;
                FAI_T(row_cols)(pm, cls, i0 + r, j0, n, &c0, &c1);
                if (w->lse[r] == -INFINITY || c0 >= c1)
                    continue;
                if (drop.threshold)
                    fai_dropout_keep_row(&drop, i0 + r, j0 + c0, c1 - c0, w->keep + c0);
                for (int64_t c = c0; c < c1; c++) {
                    if (FAI_T(bias_masked)(pm, tl, w, r, c))
                        continue;
                    const FT *pc = w->p + r * ld + c, *dsc = w->ds + r * ld + c;
                    if (!drop.threshold || w->keep[c])
                        FAI_T(fai_gemm)(w->kern, 1, dvd, 1, pc, 1, w->dout + r * dvd, dvd,
                                        dv + c * dvd, dvd, 1, NULL);
                    FAI_T(fai_gemm)(w->kern, 1, dqk, 1, dsc, 1, w->q + r * dqk, dqk,
                                    dk + c * dqk, dqk, 1, NULL);
                }
            }
        }
    }
}

/*
 * Pass 1: dK and dV of key tile [j0, j0 + n) of (b, hk); in the single pass also the tile's
 * terms of dQ, added to w->dq_all. With a GQA group, each query head's terms are summed apart
 * (from 0) and the heads' sums then added in order, as a framework sums per-head gradients:
 * summed in one chain over group x Sq rows, an f32 dK or dV of 4 or 8 heads carried 3-4.5x the
 * conventional path's error, 1-2.7x without a group (6 seeds, 128 x 128 causal, D 64).
 */
static void FAI_T(bwd_ktile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t hk,
                             int64_t j0, int64_t n, FAI_T(bwd_ws) *w)
{
    const int64_t dqk = pr->dqk, dv = pr->dv;
    FAI_T(load_key_tile)(pr, tl, b, hk, j0, n, w);
    memset(w->dk, 0, (size_t)(n * dqk) * sizeof(FT));
    memset(w->dv, 0, (size_t)(n * dv) * sizeof(FT));
    for (int64_t h = hk * pr->group; h < (hk + 1) * pr->group; h++) {
        if (pr->group == 1) {
            FAI_T(bwd_ktile_head)(pr, tl, b, hk, h, j0, n, w, w->dk, w->dv);
            continue;
        }
        memset(w->dk_h, 0, (size_t)(n * dqk) * sizeof(FT));
        memset(w->dv_h, 0, (size_t)(n * dv) * sizeof(FT));
        FAI_T(bwd_ktile_head)(pr, tl, b, hk, h, j0, n, w, w->dk_h, w->dv_h);
#pragma omp simd
        for (int64_t x = 0; x < n * dqk; x++)
            w->dk[x] += w->dk_h[x];
#pragma omp simd
        for (int64_t x = 0; x < n * dv; x++)
            w->dv[x] += w->dv_h[x];
    }
    for (int64_t c = 0; c < n; c++) {
        w->kern->narrow(fai_kv_row(pr, FAI_DK, b, hk, j0 + c), pr->dtype, dqk, w->dk + c * dqk);
        w->kern->narrow(fai_kv_row(pr, FAI_DV, b, hk, j0 + c), pr->dtype, dv, w->dv + c * dv);
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
        w->kern->narrow(fai_q_row(pr, FAI_DQ, b, h, i0 + r), pr->dtype, pr->dqk, row);
    }
}

/* Pass 2: dQ of query tile [i0, i1) of (b, h). */
static void FAI_T(bwd_qtile)(const fai_problem *pr, fai_tiles tl, int64_t b, int64_t h,
                             int64_t i0, int64_t i1, FAI_T(bwd_ws) *w)
{
    const int64_t hk = h / pr->group, nq = i1 - i0, dqk = pr->dqk, ld = tl.bk;
    FAI_T(load_query_block)(pr, b, h, i0, nq, tl.bq, w);
    memset(w->dq, 0, (size_t)(nq * dqk) * sizeof(FT));

    /* the mask's parts in key order (core/score.h: the sinks, then the window); a key tile
     * with keys of each is visited once per part */
    fai_problem part[2];
    const int np = fai_mask_part_problems(pr, part);
    for (int p = 0; p < np; p++) {
        const fai_problem *pm = &part[p];
        int64_t jlo, jhi;
        fai_mask_key_span(&pm->mask, i0, i1, &jlo, &jhi);
        /* with the tile products, pass 1's key tiles, whole: their sums run in chunks from a
         * tile's first key, and a tile's finiteness decides its kernels */
        const int64_t jend = w->bf16 ? pr->sk : jhi;
        if (w->bf16)
            jlo -= jlo % tl.bk;
        for (int64_t j0 = jlo; j0 < jhi; j0 += tl.bk) {
            const int64_t n = jend - j0 < tl.bk ? jend - j0 : tl.bk;
            const fai_tile_class cls = fai_mask_classify(&pm->mask, i0, i1, j0, j0 + n);
            if (cls == FAI_TILE_EMPTY || !fai_blocks_meet(pr, b, h, i0, i1, j0, n))
                continue;
            FAI_T(load_key_tile)(pr, tl, b, hk, j0, n, w);
            if (!FAI_T(bwd_block)(pm, tl, b, h, i0, nq, j0, n, cls, w))
                continue;
#if FT_TILE_PRODUCTS
            if (FAI_T(tiles_take)(w)) {
                FAI_T(bwd_tiles)(pr, tl, nq, n, w, NULL, NULL, w->dq);
                continue;
            }
#endif
            if (w->q_finite && w->kv_finite) /* dQ += scale dS K */
                FAI_T(fai_gemm)(w->kern, nq, dqk, n, w->ds, ld, w->k, dqk, w->dq, dqk, 1, NULL);
            else
                FAI_T(dq_by_selection)(pm, tl, cls, i0, nq, j0, n, w, w->dq);
        }
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

/*
 * Pass 3, with a bias gradient: the rows of key tile [j0, j0 + n) of gradient row block (gb,
 * gh), each element the sum over the (b, h) that read it (one, or all of a broadcast dim's:
 * batch, then head, ascending) of bwd_block's d loss / d bias, and over the query rows too
 * where the bias has one row. A task owns its elements: no reduction across threads. It
 * recomputes S and dP once more per (b, h) (a bias gradient costs one more pass over the
 * backward's GEMMs of S and dP).
 */
static void FAI_T(bias_grad_tile)(const fai_problem *pr, fai_tiles tl, int64_t gb, int64_t gh,
                                  int64_t j0, int64_t n, FAI_T(bwd_ws) *w)
{
    const fa_tensor *g = pr->bias_grad, *bias = pr->bias;
    const int one_row = bias->seqlen == 1;
    const int64_t b0 = bias->batch == 1 ? 0 : gb, b1 = bias->batch == 1 ? pr->b : gb + 1;
    const int64_t h0 = bias->heads == 1 ? 0 : gh, h1 = bias->heads == 1 ? pr->hq : gh + 1;
    const int64_t ld = tl.bk;
    fai_problem part[2];
    const int np = fai_mask_part_problems(pr, part);
    w->want_dbias = 1;
    if (one_row)
        memset(w->dbias, 0, (size_t)n * sizeof(FT));
    for (int64_t i0 = 0; i0 < pr->sq; i0 += tl.bq) {
        const int64_t nq = pr->sq - i0 < tl.bq ? pr->sq - i0 : tl.bq;
        if (!one_row)
            memset(w->dbias, 0, (size_t)(nq * ld) * sizeof(FT));
        for (int64_t b = b0; b < b1; b++)
            for (int64_t h = h0; h < h1; h++) {
                int loaded = 0;
                for (int p = 0; p < np; p++) {
                    const fai_problem *pm = &part[p];
                    const fai_tile_class cls =
                        fai_mask_classify(&pm->mask, i0, i0 + nq, j0, j0 + n);
                    if (cls == FAI_TILE_EMPTY)
                        continue;
                    if (!loaded) {
                        FAI_T(load_key_tile)(pr, tl, b, h / pr->group, j0, n, w);
                        FAI_T(load_query_block)(pr, b, h, i0, nq, tl.bq, w);
                        loaded = 1;
                    }
                    if (!FAI_T(bwd_block)(pm, tl, b, h, i0, nq, j0, n, cls, w))
                        continue;
                    for (int64_t r = 0; r < nq; r++) {
                        FT *acc = w->dbias + (one_row ? 0 : r * ld);
                        const FT *x = w->gb + r * ld;
#pragma omp simd
                        for (int64_t c = 0; c < n; c++)
                            acc[c] += x[c];
                    }
                }
            }
        for (int64_t r = 0; !one_row && r < nq; r++)
            w->kern->narrow((char *)fai_bias_row_of(g, gb, gh, i0 + r) +
                                (size_t)j0 * fai_dtype_size(g->dtype),
                            g->dtype, n, w->dbias + r * ld);
    }
    if (one_row)
        w->kern->narrow((char *)fai_bias_row_of(g, gb, gh, 0) +
                            (size_t)j0 * fai_dtype_size(g->dtype),
                        g->dtype, n, w->dbias);
    w->want_dbias = 0;
}

static size_t FAI_T(backward_need)(const fai_problem *pr, const fai_tiled_plan *plan)
{
    FAI_T(bwd_ws) w;
    return FAI_T(bwd_carve)(pr, plan, NULL, &w);
}

static void FAI_T(backward)(fa_context *ctx, const fai_problem *pr,
                            const FAI_T(fai_kernels) *kern, const fai_tiled_plan *plan,
                            const fai_scratch *sc)
{
    const fai_tiles tl = plan->tl;
    const int single = plan->single_pass;
    const int64_t head_tasks = single ? pr->b * pr->hk : 0;
    const int64_t nkt = (pr->sk + tl.bk - 1) / tl.bk;
    const int64_t ktasks = single ? 0 : pr->b * pr->hk * nkt;
    const int64_t nqt = (pr->sq + tl.bq - 1) / tl.bq, qtasks = single ? 0 : pr->b * pr->hq * nqt;
#pragma omp parallel num_threads(ctx->num_threads)
    {
        FAI_T(bwd_ws) mine;
        FAI_T(bwd_carve)(pr, plan, sc->base + (size_t)omp_get_thread_num() * sc->per, &mine);
        mine.kern = kern;
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
        const fa_tensor *g = pr->bias_grad;
        const int64_t gtasks = g ? g->batch * g->heads * nkt : 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < gtasks; task++) {
            const int64_t kt = task % nkt, gh = (task / nkt) % g->heads,
                          gb = task / (nkt * g->heads);
            const int64_t j0 = kt * tl.bk, n = pr->sk - j0 < tl.bk ? pr->sk - j0 : tl.bk;
            FAI_T(bias_grad_tile)(pr, tl, gb, gh, j0, n, &mine);
        }
    }
}
