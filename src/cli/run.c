/* `flashattn forward` and `flashattn backward`: run a backend on .npy files. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The option whose file gave what the library's detail names in a block mask
 * ("params->block_mask->kv_indices[7] = ..."), or "". */
static const char *block_mask_option(const char *detail)
{
    static const char *const field[][2] = {
        {"kv_num_blocks", "--kv-num-blocks"},
        {"kv_indices", "--kv-block-indices"},
        {"full_kv_num_blocks", "--full-kv-num-blocks"},
        {"full_kv_indices", "--full-kv-block-indices"},
        {"batch", "--kv-num-blocks"},
        {"heads", "--kv-num-blocks"},
        {"q_block", "--block-size"}};
    const char *at = strstr(detail, "params->block_mask->");
    for (size_t i = 0; at && i < sizeof field / sizeof *field; i++)
        if (!strncmp(at + strlen("params->block_mask->"), field[i][0], strlen(field[i][0])))
            return field[i][1];
    return "";
}

int cli_fail(fa_status s, const char *what)
{
    const char *detail = fa_last_error(), *opt = block_mask_option(detail);
    fprintf(stderr, "flashattn: %s: %s (%s)%s%s\n", what, fa_status_string(s), detail,
            *opt ? ": see " : "", opt);
    switch (s) { /* the library's argument checks are about the user's input */
    case FA_ERR_NULL_POINTER:
    case FA_ERR_INVALID_ARGUMENT:
    case FA_ERR_SHAPE:
    case FA_ERR_STRIDE:
    case FA_ERR_DTYPE:
    case FA_ERR_OVERFLOW: return EXIT_USAGE;
    default: return EXIT_ERROR;
    }
}

fa_context *cli_context(const cli_opts *o, fa_backend backend)
{
    fa_options fo;
    fa_options_init(&fo);
    fo.backend = backend;
    fo.isa = o->isa;
    fo.num_threads = o->threads;
    fa_context *ctx = NULL;
    fa_status s = fa_context_create(&fo, &ctx);
    if (s != FA_OK) {
        cli_fail(s, "context");
        return NULL;
    }
    return ctx;
}

/* Floats (`what`) of any float dtype from path into *vals as f32, the file's shape in *a (its
 * data freed). */
static int load_floats(const char *path, const char *what, npy_array *a, float **vals)
{
    char err[512];
    int r = npy_read(path, (size_t)1 << 30, a, err, sizeof err);
    if (r) {
        fprintf(stderr, "flashattn: %s\n", err);
        return r == NPY_ERR_NO_MEMORY ? EXIT_ERROR : EXIT_USAGE;
    }
    const npy_kind k = a->kind;
    const size_t n = a->nbytes / npy_kind_size(k);
    if (k == NPY_I4 || k == NPY_I8 || k == NPY_B1 || k == NPY_U1) {
        fprintf(stderr, "flashattn: %s: %s array; %s are floats\n", path,
                k == NPY_B1 ? "a bool" : "an integer", what);
        r = EXIT_USAGE;
    } else if (!(*vals = malloc(n * sizeof(float) + 1))) {
        r = EXIT_ERROR;
    } else {
        const fa_dtype dt = k == NPY_F16   ? FA_F16
                            : k == NPY_F64 ? FA_F64
                            : k == NPY_U2  ? FA_BF16 /* bf16 bits, with or without --bf16 */
                                           : FA_F32;
        fa_convert(a->data, dt, *vals, FA_F32, n);
    }
    free(a->data);
    a->data = NULL;
    return r;
}

/* A 1-D array of one float per query head (`what`) into *vals. */
static int load_per_head(const char *path, const char *what, int64_t heads, float **vals)
{
    npy_array a;
    int rc = load_floats(path, what, &a, vals);
    if (!rc && (a.ndim != 1 || a.shape[0] != heads)) {
        fprintf(stderr, "flashattn: %s: expected a 1-D array of %lld %s (one per query head)\n",
                path, (long long)heads, what);
        rc = EXIT_USAGE;
    }
    return rc;
}

/* --descale-q, -k, -v: one factor each (0-d or 1 element) or B x Hk, every one finite and
 * > 0, one layout for all. */
static int load_descales(cli_opts *o, int64_t b, int64_t hk)
{
    static const char *const opt[3] = {"--descale-q", "--descale-k", "--descale-v"};
    const float **field[3] = {&o->p.descale_q, &o->p.descale_k, &o->p.descale_v};
    int layout = -1;
    for (int x = 0; x < 3; x++) {
        if (!o->descale[x])
            continue;
        npy_array a;
        int rc = load_floats(o->descale[x], "descale factors", &a, &o->descale_vals[x]);
        if (rc)
            return rc;
        const int per_head = a.ndim == 2 && a.shape[0] == b && a.shape[1] == hk;
        const int64_t n = per_head ? b * hk : (int64_t)(a.nbytes / npy_kind_size(a.kind));
        const char *why = NULL;
        if (!per_head && (a.ndim > 1 || n != 1))
            why = "the wrong shape";
        else if (layout >= 0 && layout != per_head)
            why = "not the others' layout";
        for (int64_t i = 0; i < n && !why; i++)
            if (!(o->descale_vals[x][i] > 0) || isinf(o->descale_vals[x][i]))
                why = "a factor that is not finite and > 0";
        if (why) {
            fprintf(stderr, "flashattn: %s %s: %s; expected one factor (per tensor) or (B, Hk) "
                            "= (%lld, %lld) (per kv head), each finite and > 0, one layout for "
                            "all\n", opt[x], o->descale[x], why, (long long)b, (long long)hk);
            return EXIT_USAGE;
        }
        layout = per_head;
        *field[x] = o->descale_vals[x];
    }
    o->p.descale_layout = layout == 1 ? FA_DESCALE_PER_KV_HEAD : FA_DESCALE_PER_TENSOR;
    return 0;
}

int cli_load_params(cli_opts *o, const fa_tensor *q, const fa_tensor *k)
{
    int rc = 0;
    if (o->alibi && !(rc = load_per_head(o->alibi, "slopes", q->heads, &o->slopes)))
        o->p.alibi_slopes = o->slopes;
    if (!rc && o->sinks && !(rc = load_per_head(o->sinks, "sink logits", q->heads,
                                                &o->sink_vals)))
        o->p.sink_logits = o->sink_vals;
    return rc ? rc : load_descales(o, q->batch, k->heads);
}

/* A 1-D (or, for a block table, 2-D) int32 or int64 array from path into *a. */
static int load_index_file(const char *path, int ndim, const char *what, npy_array *a)
{
    char err[512];
    int r = npy_read(path, (size_t)1 << 33, a, err, sizeof err);
    if (r) {
        fprintf(stderr, "flashattn: %s\n", err);
        return r == NPY_ERR_NO_MEMORY ? EXIT_ERROR : EXIT_USAGE;
    }
    if (a->ndim != ndim || (a->kind != NPY_I4 && a->kind != NPY_I8)) {
        fprintf(stderr, "flashattn: %s: expected a %d-D int32 or int64 array of %s\n", path,
                ndim, what);
        return EXIT_USAGE;
    }
    return 0;
}

static fa_indices indices_of(const npy_array *a)
{
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++)
        n *= a->shape[i];
    return (fa_indices){a->data, a->kind == NPY_I8 ? FA_INDEX_INT64 : FA_INDEX_INT32, n};
}

static int64_t index_at(const npy_array *a, int64_t i)
{
    return a->kind == NPY_I8 ? ((const int64_t *)a->data)[i] : ((const int32_t *)a->data)[i];
}

/*
 * FlashInfer's page description (CSR: sequence b's pages are indices[indptr[b] ..
 * indptr[b + 1]), its last page holding last_page_len[b] keys) as a block table and used
 * lengths, into o->pages (o->page_table, o->page_used own them). Checks what the conversion
 * reads; the library checks the rest (page ids against k's pages).
 */
static int pages_from_csr(cli_opts *o, int64_t page_size)
{
    const npy_array *ip = &o->idx[IDX_INDPTR], *ix = &o->idx[IDX_INDICES],
                    *lp = &o->idx[IDX_LAST];
    const int64_t B = ip->shape[0] - 1, total = ix->shape[0];
    if (B < 0 || lp->shape[0] != B) {
        fprintf(stderr, "flashattn: %s: %lld entries, but %s has %lld: B + 1 and B\n",
                o->kv_indptr, (long long)ip->shape[0], o->kv_last, (long long)lp->shape[0]);
        return EXIT_USAGE;
    }
    int64_t most = 0;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = index_at(ip, b + 1) - index_at(ip, b);
        if (index_at(ip, 0) != 0 || n < 0 || index_at(ip, b + 1) > total) {
            fprintf(stderr, "flashattn: %s: expected offsets from 0, never decreasing, to the "
                            "%lld entries of %s\n", o->kv_indptr, (long long)total, o->kv_indices);
            return EXIT_USAGE;
        }
        const int64_t last = index_at(lp, b);
        if (n > 0 ? last < 1 || last > page_size : last != 0) {
            fprintf(stderr, "flashattn: %s[%lld] = %lld: a last page holds 1 to %lld keys (0 "
                            "for a sequence of no page)\n", o->kv_last, (long long)b,
                    (long long)last, (long long)page_size);
            return EXIT_USAGE;
        }
        most = n > most ? n : most;
    }
    if (B > 0 && index_at(ip, B) != total) {
        fprintf(stderr, "flashattn: %s: its last offset is %lld, but %s has %lld entries\n",
                o->kv_indptr, (long long)index_at(ip, B), o->kv_indices, (long long)total);
        return EXIT_USAGE;
    }
    o->page_table = calloc((size_t)(B * most) + 1, sizeof(int64_t));
    o->page_used = calloc((size_t)B + 1, sizeof(int64_t));
    if (!o->page_table || !o->page_used)
        return EXIT_ERROR;
    for (int64_t b = 0; b < B; b++) {
        const int64_t p0 = index_at(ip, b), n = index_at(ip, b + 1) - p0;
        for (int64_t i = 0; i < n; i++)
            o->page_table[b * most + i] = index_at(ix, p0 + i);
        o->page_used[b] = n > 0 ? (n - 1) * page_size + index_at(lp, b) : 0;
    }
    o->pages = (fa_paged_kv){{o->page_table, FA_INDEX_INT64, B * most}, most,
                             {o->page_used, FA_INDEX_INT64, B}};
    return 0;
}

/* The block mask's files as o->bm: counts (B|1, H|1, nq), indices (B|1, H|1, nq, nk), the
 * full lists the same shapes; the library checks the rest (nq and nk against Sq and Sk, the
 * indices). */
static int block_mask_of(cli_opts *o)
{
    const npy_array *a = &o->idx[IDX_KV_NUM];
    for (int x = 1; x < 4; x++) { /* the shape of the counts (x = 1, 2) or the indices (3) */
        const int ref = x == 3 ? 1 : 0;
        if (o->bm_files[x] && memcmp(o->idx[IDX_KV_NUM + x].shape, o->idx[IDX_KV_NUM + ref].shape,
                                     (size_t)(3 + ref) * sizeof(int64_t))) {
            fprintf(stderr, "flashattn: %s %s: its shape does not match %s %s: expected %s\n",
                    cli_bm_options[x], o->bm_files[x], cli_bm_options[ref], o->bm_files[ref],
                    x == 1 ? "(B|1, H|1, nq, nk) with the counts' (B|1, H|1, nq)"
                           : "the same shape");
            return EXIT_USAGE;
        }
    }
    o->bm.batch = a->shape[0];
    o->bm.heads = a->shape[1];
    o->bm.kv_num_blocks = indices_of(a);
    o->bm.kv_indices = indices_of(&o->idx[IDX_KV_BLOCKS]);
    if (o->bm_files[2]) {
        o->bm.full_kv_num_blocks = indices_of(&o->idx[IDX_FULL_NUM]);
        o->bm.full_kv_indices = indices_of(&o->idx[IDX_FULL_BLOCKS]);
    }
    o->p.block_mask = &o->bm;
    return 0;
}

int cli_load_indices(cli_opts *o, int64_t page_size)
{
    const char *paths[IDX_N] = {o->cu_q,        o->cu_k,        o->block_table, o->seqused,
                                o->kv_indptr,   o->kv_indices,  o->kv_last,     o->bm_files[0],
                                o->bm_files[1], o->bm_files[2], o->bm_files[3]};
    const char *what[IDX_N] = {"B + 1 offsets", "B + 1 offsets", "(B, max_pages) page ids",
                               "B used lengths", "B + 1 offsets", "page ids",
                               "B last-page lengths", "key block counts (--kv-num-blocks)",
                               "key block indices (--kv-block-indices)",
                               "full key block counts (--full-kv-num-blocks)",
                               "full key block indices (--full-kv-block-indices)"};
    static const int ndim[IDX_N] = {1, 1, 2, 1, 1, 1, 1, 3, 4, 3, 4};
    for (int i = 0; i < IDX_N; i++) {
        int rc = paths[i] ? load_index_file(paths[i], ndim[i], what[i], &o->idx[i]) : 0;
        if (rc)
            return rc;
    }
    if (o->bm_files[0]) /* a dense batch: neither offsets nor pages */
        return block_mask_of(o);
    if (o->packed) {
        o->cu[0] = indices_of(&o->idx[IDX_CU_Q]);
        o->cu[1] = indices_of(&o->idx[IDX_CU_K]);
    }
    if (o->block_table) {
        const npy_array *t = &o->idx[IDX_TABLE];
        o->pages = (fa_paged_kv){indices_of(t), t->shape[1], indices_of(&o->idx[IDX_USED])};
    } else if (o->seqused) {
        o->pages.seqused_k = indices_of(&o->idx[IDX_USED]); /* a contiguous cache's lengths */
    }
    if (o->kv_indptr)
        return pages_from_csr(o, page_size);
    return 0;
}

fa_status cli_forward(fa_context *ctx, const cli_opts *o, const fa_tensor *q, const fa_tensor *k,
                      const fa_tensor *v, fa_tensor *out, fa_tensor *lse)
{
    if (o->paged && !o->block_table && !o->kv_indptr) /* a contiguous cache with lengths:
                                                         read only (no new keys) */
        return fa_forward_kvcache(ctx, &o->p, q, (fa_tensor *)k, (fa_tensor *)v, NULL, NULL,
                                  &o->pages.seqused_k, NULL, out, lse);
    if (o->paged)
        return fa_forward_paged(ctx, &o->p, q, k, v, &o->pages, out, lse);
    if (o->packed)
        return fa_forward_varlen(ctx, &o->p, q, k, v, &o->cu[0], &o->cu[1], out, lse);
    return fa_forward(ctx, &o->p, q, k, v, out, lse);
}

fa_status cli_backward(fa_context *ctx, const cli_opts *o, const fa_tensor *q,
                       const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                       const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                       fa_tensor *dk, fa_tensor *dv)
{
    if (o->packed)
        return fa_backward_varlen(ctx, &o->p, q, k, v, &o->cu[0], &o->cu[1], out, lse, dout, dq,
                                  dk, dv);
    return fa_backward(ctx, &o->p, q, k, v, out, lse, dout, dq, dk, dv);
}

static int need(const char *cmd, const char *opt, const char *val)
{
    if (val)
        return 0;
    fprintf(stderr, "flashattn %s: %s is required\n", cmd, opt);
    return EXIT_USAGE;
}

int cmd_forward(int argc, char **argv)
{
    cli_opts o;
    int rc = cli_parse("forward", argc, argv, "io fwd pages", &o);
    if (rc >= 0)
        return rc;
    if ((rc = need("forward", "--out", o.out)))
        return rc;
    cli_tensor q, k, v, out, lse;
    memset(&out, 0, sizeof out);
    memset(&lse, 0, sizeof lse);
    if ((rc = cli_load(&o, "--q", o.q, ROLE_QKV, &q)))
        return rc;
    if ((rc = cli_load_kv(&o, "--k", o.k, o.k_dtype, &k))) {
        cli_free(&q);
        return rc;
    }
    if ((rc = cli_load_kv(&o, "--v", o.v, o.v_dtype, &v))) {
        cli_free(&q), cli_free(&k);
        return rc;
    }
    const cli_input nq = {"--q", o.q, &q.t, 0}, nk = {"--k", o.k, &k.t, 1},
                    nv = {"--v", o.v, &v.t, 1};
    rc = cli_check_inputs(&o, &nq, &nk, &nv, NULL); /* in the files' terms */
    if (!rc)
        rc = cli_check_blocks(&o, &nq, &nk, &nv, NULL);
    if (!rc)
        rc = cli_load_params(&o, &q.t, &k.t);
    if (!rc)
        rc = cli_load_bias(&o);
    if (!rc)
        rc = cli_apply_profile(&o);
    if (!rc)
        rc = cli_load_indices(&o, k.t.seqlen);
    /* out: q's dtype, or for FP8 q --out-dtype's (default bf16, FlashAttention-3's) */
    const fa_dtype odt = o.has_out_dtype     ? o.out_dtype
                         : cli_is_fp8(q.t.dtype) ? FA_BF16
                                                 : q.t.dtype;
    if (!rc)
        rc = cli_alloc(&o, odt, q.t.batch, q.t.seqlen, q.t.heads, v.t.headdim, ROLE_QKV, &out);
    if (!rc && o.lse)
        rc = cli_alloc(&o, odt == FA_F64 ? FA_F64 : FA_F32, q.t.batch, q.t.seqlen, q.t.heads, 1,
                       ROLE_LSE, &lse);
    cli_outputs files;
    cli_outputs_init(&files);
    cli_outputs_add(&files, o.out, &out);
    cli_outputs_add(&files, o.lse, &lse);
    const char *inputs[20] = {o.q,           o.k,          o.v,          o.alibi,
                              o.sinks,       o.cu_q,       o.cu_k,       o.block_table,
                              o.seqused,     o.kv_indptr,  o.kv_indices, o.kv_last,
                              o.bias,        o.descale[0], o.descale[1], o.descale[2],
                              o.bm_files[0], o.bm_files[1], o.bm_files[2], o.bm_files[3]};
    if (!rc)
        rc = cli_outputs_open(&files, inputs, 20);
    fa_context *ctx = rc ? NULL : cli_context(&o, o.backend);
    if (!rc && !ctx)
        rc = EXIT_ERROR;
    if (!rc) {
        fa_status s = cli_forward(ctx, &o, &q.t, &k.t, &v.t, &out.t, o.lse ? &lse.t : NULL);
        rc = s == FA_OK ? 0 : cli_fail(s, "forward");
    }
    if (!rc && o.lse) { /* written as the profile's kernels write it */
        fa_status s = fa_lse_to_profile(o.profile, &lse.t);
        rc = s == FA_OK ? 0 : cli_fail(s, "lse");
    }
    if (!rc)
        rc = cli_outputs_commit(&files);
    else
        cli_outputs_abort(&files);
    fa_context_destroy(ctx);
    cli_free(&q), cli_free(&k), cli_free(&v), cli_free(&out), cli_free(&lse);
    cli_opts_free(&o);
    return rc;
}

int cmd_backward(int argc, char **argv)
{
    cli_opts o;
    int rc = cli_parse("backward", argc, argv, "io grad pages", &o);
    if (rc >= 0)
        return rc;
    if (o.paged) {
        fprintf(stderr, "flashattn backward: a KV cache (--seqused-k, pages) is forward only\n");
        cli_opts_free(&o);
        return EXIT_USAGE;
    }
    const char *req[6][2] = {{"--out", o.out}, {"--lse", o.lse}, {"--dout", o.dout},
                             {"--dq", o.dq},   {"--dk", o.dk},   {"--dv", o.dv}};
    for (int i = 0; i < 6; i++)
        if ((rc = need("backward", req[i][0], req[i][1])))
            return rc;
    cli_tensor in[6], g[3], ds, db;
    memset(in, 0, sizeof in);
    memset(g, 0, sizeof g);
    memset(&ds, 0, sizeof ds);
    memset(&db, 0, sizeof db);
    const char *paths[6] = {o.q, o.k, o.v, o.out, o.lse, o.dout};
    const char *opts[6] = {"--q", "--k", "--v", "--out", "--lse", "--dout"};
    for (int i = 0; i < 6 && !rc; i++)
        rc = cli_load(&o, opts[i], paths[i], i == 4 ? ROLE_LSE : ROLE_QKV, &in[i]);
    if (!rc) { /* q, k, v and dO in the files' terms (out and the LSE: the library's checks) */
        const cli_input nq = {"--q", o.q, &in[0].t, 0}, nk = {"--k", o.k, &in[1].t, 1},
                        nv = {"--v", o.v, &in[2].t, 1}, ng = {"--dout", o.dout, &in[5].t, 0};
        rc = cli_check_inputs(&o, &nq, &nk, &nv, &ng);
    }
    if (!rc)
        rc = cli_load_params(&o, &in[0].t, &in[1].t);
    if (!rc)
        rc = cli_load_bias(&o);
    if (!rc)
        rc = cli_apply_profile(&o);
    if (!rc)
        rc = cli_load_indices(&o, in[1].t.seqlen);
    if (!rc) { /* read as the profile's kernels write it */
        fa_status s = fa_lse_from_profile(o.profile, &in[4].t);
        rc = s == FA_OK ? 0 : cli_fail(s, "lse");
    }
    for (int i = 0; i < 3 && !rc; i++) /* dq, dk, dv shaped like q, k, v */
        rc = cli_alloc(&o, in[i].t.dtype, in[i].t.batch, in[i].t.seqlen, in[i].t.heads,
                       in[i].t.headdim, ROLE_QKV, &g[i]);
    cli_outputs files;
    cli_outputs_init(&files);
    cli_outputs_add(&files, o.dq, &g[0]);
    cli_outputs_add(&files, o.dk, &g[1]);
    cli_outputs_add(&files, o.dv, &g[2]);
    if (!rc && o.dsinks) { /* --dsinks: d loss / d sink, a 1-D f32 array of Hq */
        if (!o.sinks) {
            fprintf(stderr, "flashattn backward: --dsinks needs --sinks\n");
            rc = EXIT_USAGE;
        } else {
            ds.a.kind = NPY_F32;
            ds.a.ndim = 1;
            ds.a.shape[0] = in[0].t.heads;
            ds.a.nbytes = (size_t)in[0].t.heads * sizeof(float);
            ds.a.data = calloc(1, ds.a.nbytes + 1);
            rc = ds.a.data ? 0 : EXIT_ERROR;
            o.p.sink_grad = ds.a.data;
            cli_outputs_add(&files, o.dsinks, &ds);
        }
    }
    if (!rc && o.dbias && /* d loss / d bias, in the bias file's shape */
        !(rc = cli_alloc_bias_grad(&o, "--dbias", in[0].t.dtype == FA_F64 ? FA_F64 : FA_F32,
                                   &db))) {
        o.p.bias_grad = &db.t;
        cli_outputs_add(&files, o.dbias, &db);
    }
    const char *inputs[18] = {o.q,           o.k,           o.v,           o.out,
                              o.lse,         o.dout,        o.alibi,       o.sinks,
                              o.cu_q,        o.cu_k,        o.bias,        o.descale[0],
                              o.descale[1],  o.descale[2],  o.bm_files[0], o.bm_files[1],
                              o.bm_files[2], o.bm_files[3]};
    if (!rc)
        rc = cli_outputs_open(&files, inputs, 18);
    fa_context *ctx = rc ? NULL : cli_context(&o, o.backend);
    if (!rc && !ctx)
        rc = EXIT_ERROR;
    if (!rc) {
        fa_status s = cli_backward(ctx, &o, &in[0].t, &in[1].t, &in[2].t, &in[3].t, &in[4].t,
                                   &in[5].t, &g[0].t, &g[1].t, &g[2].t);
        rc = s == FA_OK ? 0 : cli_fail(s, "backward");
    }
    if (!rc)
        rc = cli_outputs_commit(&files);
    else
        cli_outputs_abort(&files);
    fa_context_destroy(ctx);
    for (int i = 0; i < 6; i++)
        cli_free(&in[i]);
    for (int i = 0; i < 3; i++)
        cli_free(&g[i]);
    npy_free(&ds.a);
    cli_free(&db);
    cli_opts_free(&o);
    return rc;
}
