/* .npy files <-> fa_tensor views, in the layout the options name. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* The most a single input may declare: the machine's memory. */
static size_t max_input_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : (size_t)1 << 34;
}

/* The dtype an input of kind k holds; opt and path name it in messages. */
static int kind_to_dtype(const cli_opts *o, const char *opt, const char *path, npy_kind k,
                         fa_dtype *dt)
{
    switch (k) {
    case NPY_F16: *dt = FA_F16; return 0;
    case NPY_F32: *dt = FA_F32; return 0;
    case NPY_F64: *dt = FA_F64; return 0;
    case NPY_U2:
        if (o->bf16) {
            *dt = FA_BF16;
            return 0;
        }
        fprintf(stderr, "flashattn: %s %s: a uint16 array; pass --bf16 if it holds bfloat16 bits\n",
                opt, path);
        return EXIT_USAGE;
    case NPY_U1:
        if (o->fp8) {
            *dt = (fa_dtype)o->fp8;
            return 0;
        }
        fprintf(stderr, "flashattn: %s %s: a uint8 array; pass --fp8 e4m3|e5m2 if it holds FP8 "
                        "codes (K, V: --k-dtype / --v-dtype q8_0|q4_0 if ggml's blocks)\n",
                opt, path);
        return EXIT_USAGE;
    case NPY_I4:
    case NPY_I8:
    case NPY_B1: break;
    }
    fprintf(stderr, "flashattn: %s %s: %s array; tensors hold float16, bfloat16, float32 or "
                    "float64\n", opt, path, k == NPY_B1 ? "a bool" : "an integer");
    return EXIT_USAGE;
}

static npy_kind dtype_to_kind(fa_dtype d)
{
    switch (d) {
    case FA_F16: return NPY_F16;
    case FA_F64: return NPY_F64;
    case FA_BF16: return NPY_U2;
    default: return NPY_F32;
    }
}

int cli_file_shape(const cli_opts *o, cli_role role, int64_t b, int64_t s, int64_t h, int64_t d,
                   int64_t shape[4])
{
    if (o->packed) {
        if (role == ROLE_LSE) {
            shape[0] = h, shape[1] = s;
            return 2;
        }
        shape[0] = s, shape[1] = h, shape[2] = d;
        return 3;
    }
    shape[0] = b;
    if (role == ROLE_LSE) {
        shape[1] = h, shape[2] = s;
        return 3;
    }
    if (o->bhsd)
        shape[1] = h, shape[2] = s;
    else
        shape[1] = s, shape[2] = h;
    shape[3] = d;
    return 4;
}

const char *cli_file_dims(const cli_opts *o, cli_role role)
{
    if (o->packed)
        return role == ROLE_LSE ? "(heads, total)" : "(total, heads, headdim)";
    if (role == ROLE_LSE)
        return "(batch, heads, seqlen)";
    return o->bhsd ? "(batch, heads, seqlen, headdim)" : "(batch, seqlen, heads, headdim)";
}

static void view(const cli_opts *o, cli_role role, void *data, fa_dtype dt, int64_t b, int64_t s,
                 int64_t h, int64_t d, fa_tensor *t)
{
    if (role == ROLE_LSE)
        fa_tensor_init(t, data, dt, b, s, h, 1, 1); /* B x H x S storage */
    else
        fa_tensor_init(t, data, dt, b, s, h, d, o->bhsd);
}

/* The head dim of a file of blocks of format `block` whose rows are `bytes` long (0 and a
 * message where that is not whole blocks). */
static int64_t block_headdim(const char *opt, const char *path, int block, int64_t bytes)
{
    const int64_t per = block == FA_Q8_0 ? 34 : 18; /* bytes of 32 elements (flashattn.h) */
    if (bytes > 0 && bytes % per == 0)
        return bytes / per * 32;
    fprintf(stderr, "flashattn: %s %s: a row of %lld bytes is not whole %s blocks (%lld bytes "
                    "each: the last dim is the head dim / 32 x %lld)\n", opt, path,
            (long long)bytes, fa_dtype_name((fa_dtype)block), (long long)per, (long long)per);
    return 0;
}

/* cli_load, with block (a block format, or 0) the format of a uint8 file of K or V rows. */
static int load_as(const cli_opts *o, const char *opt, const char *path, cli_role role,
                   int block, cli_tensor *x)
{
    char err[512];
    memset(x, 0, sizeof *x);
    int r = npy_read(path, max_input_bytes(), &x->a, err, sizeof err);
    if (r) { /* err starts with the path */
        fprintf(stderr, "flashattn: %s %s\n", opt, err);
        return r == NPY_ERR_NO_MEMORY ? EXIT_ERROR : EXIT_USAGE;
    }
    fa_dtype dt = (fa_dtype)block;
    int rc = 0;
    if (!block)
        rc = kind_to_dtype(o, opt, path, x->a.kind, &dt);
    else if (x->a.kind != NPY_U1) {
        fprintf(stderr, "flashattn: %s %s: not a uint8 array; %s-dtype %s reads the blocks' bytes "
                        "('|u1')\n", opt, path, opt, fa_dtype_name(dt));
        rc = EXIT_USAGE;
    }
    const int want = (role == ROLE_LSE ? 3 : 4) - o->packed;
    if (!rc && x->a.ndim != want) {
        fprintf(stderr, "flashattn: %s %s: %d-D array; expected %s\n", opt, path, x->a.ndim,
                o->packed && role == ROLE_LSE ? "2-D (heads, total) for packed sequences"
                : o->packed ? "3-D (total, heads, headdim) for packed sequences"
                : role == ROLE_LSE ? "3-D (batch, heads, seqlen)"
                : o->bhsd          ? "4-D (batch, heads, seqlen, headdim) for --layout bhsd"
                                   : "4-D (batch, seqlen, heads, headdim) for --layout bshd");
        rc = EXIT_USAGE;
    }
    int64_t sh[4];
    memcpy(sh, x->a.shape, sizeof sh);
    if (!rc && block && !(sh[want - 1] = block_headdim(opt, path, block, sh[want - 1])))
        rc = EXIT_USAGE;
    if (rc) {
        npy_free(&x->a);
        return rc;
    }
    if (o->packed && role == ROLE_LSE)
        view(o, role, x->a.data, dt, 1, sh[1], sh[0], 1, &x->t);
    else if (o->packed)
        view(o, role, x->a.data, dt, 1, sh[0], sh[1], sh[2], &x->t);
    else if (role == ROLE_LSE)
        view(o, role, x->a.data, dt, sh[0], sh[2], sh[1], 1, &x->t);
    else if (o->bhsd)
        view(o, role, x->a.data, dt, sh[0], sh[2], sh[1], sh[3], &x->t);
    else
        view(o, role, x->a.data, dt, sh[0], sh[1], sh[2], sh[3], &x->t);
    return 0;
}

int cli_load(const cli_opts *o, const char *opt, const char *path, cli_role role, cli_tensor *x)
{
    return load_as(o, opt, path, role, 0, x);
}

int cli_load_kv(const cli_opts *o, const char *opt, const char *path, int block, cli_tensor *x)
{
    return load_as(o, opt, path, ROLE_QKV, block, x);
}

/* The zeroed data of an output array whose kind and shape a gives. */
static int alloc_array(npy_array *a)
{
    /* An output's size follows its inputs' declared dims (Dv from v even when Sk = 0, so three
     * tiny files can declare any size): bounded like a declared input, by the memory. */
    size_t n = npy_kind_size(a->kind);
    int over = 0;
    for (int i = 0; i < a->ndim; i++)
        over |= __builtin_mul_overflow(n, (size_t)a->shape[i], &n);
    if (over || n > max_input_bytes()) {
        char shp[128];
        int at = 0;
        for (int i = 0; i < a->ndim; i++)
            at += snprintf(shp + at, sizeof shp - (size_t)at, "%s%lld", i ? ", " : "",
                           (long long)a->shape[i]);
        char size[32] = "more than 2^64";
        if (!over)
            snprintf(size, sizeof size, "%zu", n);
        fprintf(stderr, "flashattn: an output of shape (%s) would take %s bytes, more than this "
                "machine's memory (%zu bytes)\n", shp, size, max_input_bytes());
        memset(a, 0, sizeof *a);
        return EXIT_USAGE;
    }
    a->nbytes = n;
    a->data = calloc(1, n ? n : 1);
    if (!a->data) {
        fprintf(stderr, "flashattn: out of memory (%zu bytes)\n", n);
        return EXIT_ERROR;
    }
    return 0;
}

int cli_alloc(const cli_opts *o, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d,
              cli_role role, cli_tensor *x)
{
    memset(x, 0, sizeof *x);
    x->a.kind = dtype_to_kind(dt);
    x->a.ndim = cli_file_shape(o, role, b, s, h, d, x->a.shape);
    int rc = alloc_array(&x->a);
    if (!rc)
        view(o, role, x->a.data, dt, b, s, h, d, &x->t);
    return rc;
}

int cli_convert(const cli_opts *o, const cli_tensor *x, fa_dtype dt, cli_role role, cli_tensor *y)
{
    const fa_tensor *t = &x->t;
    int rc = cli_alloc(o, dt, t->batch, t->seqlen, t->heads, t->headdim, role, y);
    if (rc)
        return rc;
    size_t n = y->a.nbytes / npy_kind_size(y->a.kind); /* same element order as x's file */
    fa_status s = fa_convert(x->a.data, t->dtype, y->a.data, dt, n);
    if (s != FA_OK) {
        cli_free(y);
        return cli_fail(s, "convert");
    }
    return 0;
}

/* x->a, an array of (B|1, H|1, Sq|1, Sk) or its last 2 or 3 dims, as the bias tensor of
 * fa_params: batch B, seqlen Sq, heads H, headdim Sk (the keys, contiguous). */
static void bias_view(cli_tensor *x, fa_dtype dt)
{
    int64_t d[4] = {1, 1, 1, 1};
    for (int i = 0; i < x->a.ndim; i++)
        d[4 - x->a.ndim + i] = x->a.shape[i];
    x->t = (fa_tensor){x->a.data, dt, d[0], d[2], d[1], d[3], d[1] * d[2] * d[3], d[3],
                       d[2] * d[3], 1};
}

/* A numeric array as a keep-mask, in place: one byte per element, 1 where the element is
 * nonzero (floats: any bit but the sign's, so -0 masks and NaN keeps; 16-bit words are
 * bfloat16 with --bf16, else integers). Byte i is written once element i is read and lies at
 * or before it, so no element is overwritten before it is read. */
static void to_keep_mask(const cli_opts *o, npy_array *a)
{
    const size_t w = npy_kind_size(a->kind), n = a->nbytes / w;
    const int is_float = a->kind == NPY_F16 || a->kind == NPY_F32 || a->kind == NPY_F64 ||
                         (a->kind == NPY_U2 && o->bf16);
    unsigned char *m = a->data;
    for (size_t i = 0; i < n; i++) {
        unsigned char any = 0;
        for (size_t j = 0; j < w; j++)
            any |= m[i * w + j] & (is_float && j == w - 1 ? 0x7f : 0xff);
        m[i] = any != 0;
    }
    a->kind = NPY_B1;
    a->nbytes = n;
}

/* path (the option opt) as a bias-shaped tensor into x: a keep-mask or floats, as kind (MASK_*)
 * says; MASK_INFER: a bool array is a keep-mask, any other floats. */
static int load_bias_file(const cli_opts *o, const char *path, const char *opt, int kind,
                          cli_tensor *x)
{
    char err[512];
    memset(x, 0, sizeof *x);
    int r = npy_read(path, max_input_bytes(), &x->a, err, sizeof err);
    if (r) {
        fprintf(stderr, "flashattn: %s\n", err);
        return r == NPY_ERR_NO_MEMORY ? EXIT_ERROR : EXIT_USAGE;
    }
    const npy_kind k = x->a.kind;
    fa_dtype dt = FA_BOOL;
    int rc = 0;
    if (x->a.ndim < 2 || x->a.ndim > 4) {
        fprintf(stderr, "flashattn: %s: %s: %d-D array; expected 4-D (B|1, H|1, Sq|1, Sk) in "
                        "PyTorch's order, or its last 2 or 3 dims\n", path, opt, x->a.ndim);
        rc = EXIT_USAGE;
    } else if (kind == MASK_KEEP) {
        to_keep_mask(o, &x->a);
    } else if (k == NPY_B1 ? kind == MASK_BIAS : (k == NPY_I4 || k == NPY_I8)) {
        fprintf(stderr, "flashattn: %s: %s array; %s takes floats%s\n", path,
                k == NPY_B1 ? "a bool" : "an integer", opt,
                strcmp(opt, "--attn-mask") ? "" : " as a bias (--mask-kind keep reads any array "
                                                  "as a keep-mask)");
        rc = EXIT_USAGE;
    } else if (k != NPY_B1) {
        rc = kind_to_dtype(o, opt, path, k, &dt);
    }
    if (rc) {
        npy_free(&x->a);
        return rc;
    }
    bias_view(x, dt);
    return 0;
}

int cli_load_bias(cli_opts *o)
{
    if (!o->bias)
        return 0;
    int rc = load_bias_file(o, o->bias, o->bias_opt, o->mask_kind, &o->bias_vals);
    if (!rc)
        o->p.bias = &o->bias_vals.t;
    return rc;
}

int cli_load_bias_shaped(const cli_opts *o, const char *path, const char *opt, cli_tensor *x)
{
    return load_bias_file(o, path, opt, MASK_BIAS, x);
}

int cli_alloc_bias_grad(const cli_opts *o, const char *opt, fa_dtype dt, cli_tensor *g)
{
    memset(g, 0, sizeof *g);
    if (!o->p.bias || o->p.bias->dtype == FA_BOOL) {
        fprintf(stderr, "flashattn: %s needs a float --bias or --attn-mask (a keep-mask has no "
                        "gradient)\n", opt);
        return EXIT_USAGE;
    }
    g->a.kind = dtype_to_kind(dt);
    g->a.ndim = o->bias_vals.a.ndim;
    memcpy(g->a.shape, o->bias_vals.a.shape, sizeof g->a.shape);
    int rc = alloc_array(&g->a);
    if (!rc)
        bias_view(g, dt);
    return rc;
}

/* ------------------------------------------------------------------ inputs in the user's terms */

enum { DIM_B, DIM_S, DIM_H, DIM_D };

static int64_t dim_of(const fa_tensor *t, int d)
{
    return d == DIM_B ? t->batch : d == DIM_S ? t->seqlen : d == DIM_H ? t->heads : t->headdim;
}

/* Dimension d of x as its file says it: "batch 2", "sequence length 40", "3 heads", "head dim
 * 64"; K and V pages (a paged cache): "5 pages", "page size 16"; packed sequences: "total
 * length 40". */
static void dim_words(const cli_opts *o, const cli_input *x, int d, char *buf, size_t n)
{
    const long long v = (long long)dim_of(x->t, d);
    const int pages = x->kv && o->paged && (o->block_table || o->kv_indptr);
    if (d == DIM_B)
        snprintf(buf, n, pages ? "%lld pages" : "batch %lld", v);
    else if (d == DIM_S)
        snprintf(buf, n,
                 pages       ? "page size %lld"
                 : o->packed ? "total length %lld"
                             : "sequence length %lld",
                 v);
    else if (d == DIM_H)
        snprintf(buf, n, v == 1 ? "%lld head" : "%lld heads", v);
    else
        snprintf(buf, n, "head dim %lld", v);
}

/* "flashattn CMD: --k k.npy: head dim 32, but --q q.npy has 64 (why)": x is at fault. */
static int blame(const cli_opts *o, const cli_input *x, const cli_input *ref, int d,
                 const char *why)
{
    char words[64];
    dim_words(o, x, d, words, sizeof words);
    fprintf(stderr, "flashattn %s: %s %s: %s, but %s %s has %lld%s%s%s\n", o->cmd, x->opt, x->path,
            words, ref->opt, ref->path, (long long)dim_of(ref->t, d), *why ? " (" : "", why,
            *why ? ")" : "");
    return EXIT_USAGE;
}

/* The order of the checks blames the input at fault where the others tell which it is: of q,
 * k and v, the one whose batch the other two do not share; of k and v, the one whose heads do
 * not divide q's. Where nothing tells (k's and v's seqlen, q's and k's head dim), it blames v
 * against k, and k against q, naming both files. */
int cli_check_inputs(const cli_opts *o, const cli_input *q, const cli_input *k, const cli_input *v,
                     const cli_input *dout)
{
    const int pages = o->paged && (o->block_table || o->kv_indptr);
    /* the batch: pages stand in for it in a paged K/V; packed sequences have one */
    if (pages && v->t->batch != k->t->batch)
        return blame(o, v, k, DIM_B, "k and v are pages of one cache");
    if (!pages && !o->packed) {
        const int kb = k->t->batch == q->t->batch, vb = v->t->batch == q->t->batch;
        if (!kb && !vb && k->t->batch == v->t->batch)
            return blame(o, q, k, DIM_B, "");
        if (!kb)
            return blame(o, k, q, DIM_B, "");
        if (!vb)
            return blame(o, v, q, DIM_B, "");
    }
    if (k->t->seqlen != v->t->seqlen)
        return blame(o, v, k, DIM_S,
                     pages ? "k and v are pages of one cache" : "k and v hold the same keys");
    const int64_t hq = q->t->heads, hk = k->t->heads, hv = v->t->heads;
    if (hk != hv) {
        const int k_at_fault = hv > 0 && hq % hv == 0 && !(hk > 0 && hq % hk == 0);
        return k_at_fault ? blame(o, k, v, DIM_H, "k and v share their heads")
                          : blame(o, v, k, DIM_H, "k and v share their heads");
    }
    if (k->t->heads > 0 && q->t->heads % k->t->heads != 0) {
        fprintf(stderr,
                "flashattn %s: %s %s: %lld heads, not a multiple of the %lld of %s %s (each "
                "K/V head serves a whole group of query heads)\n",
                o->cmd, q->opt, q->path, (long long)q->t->heads, (long long)k->t->heads, k->opt,
                k->path);
        return EXIT_USAGE;
    }
    if (k->t->headdim != q->t->headdim)
        return blame(o, k, q, DIM_D, "q and k share their head dim");
    if (!dout)
        return 0;
    const char *why = "dO is shaped as out: q's batch, sequence length and heads, v's head dim";
    for (int d = DIM_B; d <= DIM_H; d++)
        if (dim_of(dout->t, d) != dim_of(q->t, d))
            return blame(o, dout, q, d, why);
    if (dout->t->headdim != v->t->headdim)
        return blame(o, dout, v, DIM_D, why);
    return 0;
}

/* "x holds dtype, but ref holds dtype (why)": usage. */
static int dtype_blame(const cli_opts *o, const cli_input *x, const cli_input *ref, const char *why)
{
    fprintf(stderr, "flashattn %s: %s %s holds %s, but %s %s holds %s (%s)\n", o->cmd, x->opt,
            x->path, fa_dtype_name(x->t->dtype), ref->opt, ref->path, fa_dtype_name(ref->t->dtype),
            why);
    return EXIT_USAGE;
}

static int is_block(fa_dtype d) { return d == FA_Q8_0 || d == FA_Q4_0; }

int cli_check_blocks(const cli_opts *o, const cli_input *q, const cli_input *k, const cli_input *v,
                     const cli_input *dout)
{
    const char *why = "a block-format cache is K and V both (--k-dtype, --v-dtype) under f32, "
                      "f16 or bf16 q";
    const fa_dtype qd = q->t->dtype;
    const int kb = is_block(k->t->dtype), vb = is_block(v->t->dtype);
    if (!kb && !vb)
        return 0;
    if (kb != vb)
        return kb ? dtype_blame(o, v, k, why) : dtype_blame(o, k, v, why);
    if (qd != FA_F32 && qd != FA_F16 && qd != FA_BF16)
        return dtype_blame(o, q, k, why);
    if (dout)
        return dtype_blame(o, dout, k, "a block-format cache is forward only");
    return 0;
}

/* Wide enough for every pair the library's forward takes: one dtype, an f16 or bf16 cache
 * under f32 or bf16 q (FP8 caches are check's to refuse), or a block-format cache
 * (cli_check_blocks). */
int cli_check_dtypes(const cli_opts *o, const cli_input *q, const cli_input *k, const cli_input *v,
                     const cli_input *dout)
{
    const fa_dtype qd = q->t->dtype, kd = k->t->dtype, vd = v->t->dtype;
    const char *one = "q, k and v share one dtype, but for an f16 or bf16 K/V cache under f32 "
                      "or bf16 q";
    if (is_block(kd) || is_block(vd))
        return cli_check_blocks(o, q, k, v, dout);
    if (vd != kd && vd == qd) /* k is the odd one out */
        return dtype_blame(o, k, q, one);
    if (vd != kd)
        return dtype_blame(o, v, k, "k and v share one dtype");
    if (kd != qd && !((kd == FA_F16 || kd == FA_BF16) && (qd == FA_F32 || qd == FA_BF16)))
        return dtype_blame(o, k, q, one);
    if (dout && dout->t->dtype != qd)
        return dtype_blame(o, dout, q, "dO has q's dtype");
    return 0;
}

void cli_free(cli_tensor *x)
{
    npy_free(&x->a);
    memset(x, 0, sizeof *x);
}
