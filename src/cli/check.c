/*
 * `flashattn check`: the float64 reference on the given inputs, the conventional path in the
 * candidate's storage dtype as the yardstick, and fa_compare's verdict per candidate tensor.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *const cand_names[CAND_N] = {"out", "lse", "dq", "dk", "dv", "dbias"};
static const char *const cand_opts[CAND_N] = {"--candidate-out", "--candidate-lse",
                                              "--candidate-dq",  "--candidate-dk",
                                              "--candidate-dv",  "--candidate-dbias"};

/* fa_comparison's statistics, k = 0 .. N_STATS - 1: name, value, bound, FA_CMP_ bit (the
 * scale's value is the scale, its bound on |scale - 1|). */
enum { N_STATS = 4 };
typedef struct {
    const char *name;
    double value, bound;
    int bit;
} stat_view;

static stat_view stat_of(const fa_comparison *r, int k)
{
    switch (k) {
    case 0: return (stat_view){"bias", r->bias, r->bias_bound, FA_CMP_BIAS};
    case 1: return (stat_view){"scale", r->scale, r->scale_bound, FA_CMP_SCALE};
    case 2: return (stat_view){"rms", r->rms, r->rms_bound, FA_CMP_RMS};
    default: return (stat_view){"decorrelation", r->decorr, r->decorr_bound, FA_CMP_DECORR};
    }
}

/* JSON has no NaN or infinity: those travel as strings. */
static void json_num(double x)
{
    if (isnan(x))
        printf("\"NaN\"");
    else if (isinf(x))
        printf(x > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    else
        printf("%.17g", x);
}

/* The reference's and the yardstick's LSE as the profile's kernels write it (fa_lse_to_profile),
 * and for profiles whose empty-row LSE varies (FA_EMPTY_LSE_ANY) the candidate's own value in
 * those rows, so that they are not compared. */
static void lse_as_candidate_writes_it(const fa_profile *pf, cli_tensor *x, const cli_tensor *cand)
{
    fa_lse_to_profile(pf, &x->t); /* the library's own LSE: cannot fail */
    if (pf->empty_lse != FA_EMPTY_LSE_ANY)
        return;
    const size_t n = x->a.nbytes / npy_kind_size(x->a.kind);
    double v, c;
    for (size_t i = 0; i < n; i++) {
        fa_convert((char *)x->a.data + i * npy_kind_size(x->a.kind), x->t.dtype, &v, FA_F64, 1);
        if (v != -INFINITY)
            continue;
        fa_convert((char *)cand->a.data + i * npy_kind_size(cand->a.kind), cand->t.dtype, &c,
                   FA_F64, 1);
        fa_convert(&c, FA_F64, (char *)x->a.data + i * npy_kind_size(x->a.kind), x->t.dtype, 1);
    }
}

/* Element (b, s, h, d) of x. */
static char *elem(const cli_tensor *x, int64_t b, int64_t s, int64_t h, int64_t d)
{
    const fa_tensor *t = &x->t;
    return (char *)x->a.data + (size_t)(b * t->batch_stride + s * t->seq_stride +
                                        h * t->head_stride + d) * npy_kind_size(x->a.kind);
}

/* The reference's or the yardstick's O (x) as the profile's kernels write it in the rows that
 * the reference leaves empty (its LSE -inf, in this library's convention; its O 0): NaN for
 * FA_EMPTY_OUT_NAN, and for FA_EMPTY_OUT_ANY the candidate's own values, so that those rows are
 * not compared. */
static void out_as_candidate_writes_it(const fa_profile *pf, const cli_tensor *ref_lse,
                                       cli_tensor *x, const cli_tensor *cand)
{
    if (pf->empty_out == FA_EMPTY_OUT_ZERO)
        return;
    const fa_tensor *t = &x->t;
    double v;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++) {
                fa_convert(elem(ref_lse, b, s, h, 0), ref_lse->t.dtype, &v, FA_F64, 1);
                for (int64_t d = 0; d < t->headdim && v == -INFINITY; d++) {
                    double y = NAN;
                    if (pf->empty_out == FA_EMPTY_OUT_ANY)
                        fa_convert(elem(cand, b, s, h, d), cand->t.dtype, &y, FA_F64, 1);
                    fa_convert(&y, FA_F64, elem(x, b, s, h, d), t->dtype, 1);
                }
            }
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

typedef struct {
    cli_tensor in[4];            /* q, k, v, dout as given                          */
    cli_tensor ref[CAND_N];      /* float64 reference: out, lse, dq, dk, dv, dbias   */
    cli_tensor base[CAND_N];     /* conventional in the candidate dtype              */
    int grads;
} check_state;

/* Runs forward (and backward if grads, with the bias's gradient if it is a candidate) of `be`
 * on inputs converted to dt (FP8 inputs as they are, their out in dt), into r[CAND_N]; with
 * via != dt, on the inputs rounded to `via` first (the values a kernel storing `via` saw). */
static int run_all(cli_opts *o, check_state *st, fa_backend be, fa_dtype dt, fa_dtype via,
                   cli_tensor r[CAND_N])
{
    cli_tensor x[4];
    memset(x, 0, sizeof x);
    const int fp8 = cli_is_fp8(st->in[0].t.dtype);
    int rc = 0, n = st->grads ? 4 : 3;
    for (int i = 0; i < n && !rc && !fp8; i++) {
        cli_tensor y;
        memset(&y, 0, sizeof y);
        rc = cli_convert(o, &st->in[i], via, ROLE_QKV, via == dt ? &x[i] : &y);
        if (!rc && via != dt)
            rc = cli_convert(o, &y, dt, ROLE_QKV, &x[i]);
        cli_free(&y);
    }
    const cli_tensor *in = fp8 ? st->in : x;
    const fa_tensor *q = &in[0].t, *k = &in[1].t, *v = &in[2].t;
    if (!rc)
        rc = cli_alloc(o, dt, q->batch, q->seqlen, q->heads, v->headdim, ROLE_QKV, &r[0]);
    if (!rc)
        rc = cli_alloc(o, dt == FA_F64 ? FA_F64 : FA_F32, q->batch, q->seqlen, q->heads, 1,
                       ROLE_LSE, &r[1]);
    for (int i = 0; i < 3 && st->grads && !rc; i++)
        rc = cli_alloc(o, dt, in[i].t.batch, in[i].t.seqlen, in[i].t.heads, in[i].t.headdim,
                       ROLE_QKV, &r[2 + i]);
    if (!rc && st->grads && o->cand[CAND_DBIAS] &&
        !(rc = cli_alloc_bias_grad(o, "--candidate-dbias", dt == FA_F64 ? FA_F64 : FA_F32,
                                   &r[CAND_DBIAS])))
        o->p.bias_grad = &r[CAND_DBIAS].t;
    fa_context *ctx = rc ? NULL : cli_context(o, be);
    if (!rc && !ctx)
        rc = EXIT_ERROR;
    if (!rc) {
        fa_status s = cli_forward(ctx, o, q, k, v, &r[0].t, &r[1].t);
        if (s == FA_OK && st->grads)
            s = cli_backward(ctx, o, q, k, v, &r[0].t, &r[1].t, &in[3].t, &r[2].t, &r[3].t,
                             &r[4].t);
        if (s != FA_OK)
            rc = cli_fail(s, be == FA_BACKEND_REFERENCE ? "reference" : "conventional baseline");
    }
    o->p.bias_grad = NULL;
    fa_context_destroy(ctx);
    for (int i = 0; i < 4; i++)
        cli_free(&x[i]);
    return rc;
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
    int at = snprintf(buf, n, "(");
    for (int i = 0; i < ndim && at > 0 && (size_t)at < n; i++)
        at += snprintf(buf + at, n - (size_t)at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at > 0 && (size_t)at < n)
        snprintf(buf + at, n - (size_t)at, ndim == 1 ? ",)" : ")");
}

/* Candidate c against the shape the inputs give it (out: q's batch, seqlen and heads with v's
 * head dim; lse: q's rows; dq, dk, dv: q's, k's, v's; dbias: the bias's), compared as logical
 * dims (a bias gradient may leave out leading dims of 1, as the bias may) and reported as the
 * files' shapes. 0, or EXIT_USAGE after a message naming the option and file. */
static int check_candidate_shape(const cli_opts *o, const check_state *st, int c,
                                 const cli_tensor *cand)
{
    const fa_tensor *q = &st->in[0].t, *v = &st->in[2].t;
    int64_t want[4] = {q->batch, q->seqlen, q->heads, c == CAND_LSE ? 1 : v->headdim};
    int64_t shape[4];
    int ndim;
    const char *from = "the inputs give", *dims = NULL;
    const int64_t *file = shape;
    if (c == CAND_OUT || c == CAND_LSE) {
        ndim = cli_file_shape(o, c == CAND_LSE ? ROLE_LSE : ROLE_QKV, want[0], want[1], want[2],
                              want[3], shape);
        dims = cli_file_dims(o, c == CAND_LSE ? ROLE_LSE : ROLE_QKV);
    } else {
        const cli_tensor *x = c == CAND_DBIAS ? &o->bias_vals : &st->in[c - CAND_DQ];
        if (c == CAND_DBIAS && !o->p.bias)
            return 0; /* refused as it runs: a bias gradient needs a float bias */
        const fa_tensor *t = &x->t;
        want[0] = t->batch, want[1] = t->seqlen, want[2] = t->heads, want[3] = t->headdim;
        ndim = x->a.ndim, file = x->a.shape;
        from = c == CAND_DBIAS ? o->bias_opt : c == CAND_DQ ? "--q" : c == CAND_DK ? "--k" : "--v";
        dims = c == CAND_DBIAS ? NULL : cli_file_dims(o, ROLE_QKV);
    }
    const fa_tensor *t = &cand->t;
    if (t->batch == want[0] && t->seqlen == want[1] && t->heads == want[2] && t->headdim == want[3])
        return 0;
    char got[160], exp[160], src[PATH_MAX + 64];
    shape_text(got, sizeof got, cand->a.ndim, cand->a.shape);
    shape_text(exp, sizeof exp, ndim, file);
    if (c == CAND_OUT || c == CAND_LSE)
        snprintf(src, sizeof src, "%s", from);
    else
        snprintf(src, sizeof src, "%s %s gives", from,
                 c == CAND_DBIAS ? o->bias
                 : c == CAND_DQ  ? o->q
                 : c == CAND_DK  ? o->k
                                 : o->v);
    /* an LSE saved as (batch, seqlen, heads), or (total, heads) */
    const int n = cand->a.ndim;
    const int transposed =
        c == CAND_LSE && n == ndim && n >= 2 && cand->a.shape[n - 1] == file[n - 2] &&
        cand->a.shape[n - 2] == file[n - 1] && (n == 2 || cand->a.shape[0] == file[0]);
    fprintf(stderr, "flashattn check: %s %s: shape %s, but %s %s%s%s%s\n", cand_opts[c], o->cand[c],
            got, src, exp, dims ? ", " : "", dims ? dims : "",
            !transposed ? ""
            : o->packed ? "; it looks like (total, heads): save the LSE as (heads, total), "
                          "lse.T"
                        : "; it looks like (batch, seqlen, heads): save the LSE as (batch, "
                          "heads, seqlen), lse.transpose(0, 2, 1)");
    return EXIT_USAGE;
}

/* Candidate c's worst element, fa_comparison's (batch, seq, head, dim) of its view, as the
 * indices of its file in the file's own order: at[i], named names[i]. Returns their count. */
static int file_index(const cli_opts *o, int c, int ndim, const int64_t w[4], const char **names,
                      int64_t *at)
{
    static const char *const qkv[4] = {"batch", "seq", "head", "dim"};
    static const char *const bias[4] = {"batch", "query", "head", "key"}; /* the view's */
    static const int bshd[4] = {0, 1, 2, 3}, bhsd[4] = {0, 2, 1, 3}, lse[3] = {0, 2, 1};
    const char *const *nm = qkv;
    const int *map = bshd;
    int n = 4, first = 0;
    if (c == CAND_DBIAS) /* (B|1, H|1, Sq|1, Sk): the view's batch, heads, seqlen, headdim */
        nm = bias, map = bhsd, first = 4 - ndim;
    else if (c == CAND_LSE) /* (B, H, S), or (H, S) */
        map = lse, n = 3, first = o->packed;
    else if (o->packed) /* (S, H, D) */
        first = 1;
    else if (o->bhsd)
        map = bhsd;
    for (int i = first; i < n; i++) {
        names[i - first] = nm[map[i]];
        at[i - first] = w[map[i]];
    }
    return n - first;
}

int cmd_check(int argc, char **argv)
{
    cli_opts o;
    int rc = cli_parse("check", argc, argv, "check pages", &o);
    if (rc >= 0)
        return rc;
    rc = 0;
    int any = 0, grads = 0;
    for (int c = 0; c < CAND_N; c++) {
        any |= o.cand[c] != NULL;
        grads |= c >= CAND_DQ && o.cand[c];
    }
    if (!any) {
        fprintf(stderr, "flashattn check: give at least one "
                        "--candidate-out/-lse/-dq/-dk/-dv/-dbias\n");
        return EXIT_USAGE;
    }
    if (grads && o.paged) {
        fprintf(stderr, "flashattn check: a KV cache (--seqused-k, pages) is forward only: no "
                        "gradient candidates\n");
        return EXIT_USAGE;
    }
    if (grads && !o.dout) {
        fprintf(stderr, "flashattn check: gradient candidates need --dout (the cotangent)\n");
        return EXIT_USAGE;
    }
    if (o.cand[CAND_LSE] && !o.profile->has_lse) {
        fprintf(stderr, "flashattn check: profile %s: these kernels return no LSE\n",
                o.profile->name);
        return EXIT_USAGE;
    }
    check_state st;
    memset(&st, 0, sizeof st);
    st.grads = grads;
    cli_tensor cand[CAND_N];
    memset(cand, 0, sizeof cand);
    const char *inputs[4] = {o.q, o.k, o.v, o.dout},
               *input_opts[4] = {"--q", "--k", "--v", "--dout"};
    cli_input named[4];
    for (int i = 0; i < (grads ? 4 : 3) && !rc; i++) {
        rc = i == 1 || i == 2
                 ? cli_load_kv(&o, input_opts[i], inputs[i], i == 1 ? o.k_dtype : o.v_dtype,
                               &st.in[i])
                 : cli_load(&o, input_opts[i], inputs[i], ROLE_QKV, &st.in[i]);
        named[i] = (cli_input){input_opts[i], inputs[i], &st.in[i].t, i == 1 || i == 2};
    }
    const int fp8 = cli_is_fp8(st.in[0].t.dtype);
    if (!rc && !fp8 && cli_is_fp8(st.in[1].t.dtype)) {
        fprintf(stderr, "flashattn check: --k %s: an FP8 K/V under wider Q is not checked (the "
                        "float64 reference and the FP8 yardstick need FP8 Q)\n", o.k);
        rc = EXIT_USAGE;
    }
    if (!rc)
        rc = cli_check_dtypes(&o, &named[0], &named[1], &named[2], grads ? &named[3] : NULL);
    if (!rc)
        rc = cli_check_inputs(&o, &named[0], &named[1], &named[2], grads ? &named[3] : NULL);
    for (int c = 0; c < CAND_N && !rc; c++)
        if (c == CAND_DBIAS && o.cand[c])
            rc = cli_load_bias_shaped(&o, o.cand[c], cand_opts[c], &cand[c]);
        else if (o.cand[c])
            rc = cli_load(&o, cand_opts[c], o.cand[c], c == CAND_LSE ? ROLE_LSE : ROLE_QKV,
                          &cand[c]);
    if (!rc)
        rc = cli_load_params(&o, &st.in[0].t, &st.in[1].t);
    if (!rc)
        rc = cli_load_bias(&o);
    if (!rc)
        rc = cli_apply_profile(&o);
    if (!rc)
        rc = cli_load_indices(&o, st.in[1].t.seqlen);
    for (int c = 0; c < CAND_N && !rc; c++)
        if (o.cand[c])
            rc = check_candidate_shape(&o, &st, c, &cand[c]);
    /* the candidate's storage dtype: --dtype, else that of its outputs (the first of them:
     * dt_from), else of its inputs (FP8: bf16, forward's default) */
    fa_dtype dt = fp8 ? FA_BF16 : st.in[0].t.dtype;
    int dt_from = -1;
    for (int c = 0; c < CAND_N && !rc && !o.has_dtype; c++)
        if (o.cand[c] && c != CAND_LSE && c != CAND_DBIAS) { /* those are f32 or f64 */
            dt = cand[c].t.dtype;
            dt_from = c;
            break;
        }
    if (o.has_dtype)
        dt = o.dtype;
    const int explicit_rule = o.atol > 0 || o.rtol > 0; /* needs no yardstick */
    if (!rc)
        rc = run_all(&o, &st, FA_BACKEND_REFERENCE, FA_F64, FA_F64, st.ref);
    if (!rc && !explicit_rule)
        rc = run_all(&o, &st, FA_BACKEND_CONVENTIONAL, dt, dt, st.base);
    /* the LSE's yardstick and allowances (fa_lse_rule: held to its own dtype) */
    fa_dtype lse_dt = dt;
    fa_tolerance lse_tol = {0};
    if (!rc && o.cand[CAND_LSE])
        fa_lse_rule(o.profile, dt, cand[CAND_LSE].t.dtype, fp8, &lse_dt, &lse_tol);
    if (!rc && !explicit_rule && lse_dt != dt) { /* a forward in lse_dt for the LSE alone */
        cli_tensor w[CAND_N];
        memset(w, 0, sizeof w);
        st.grads = 0;
        rc = run_all(&o, &st, FA_BACKEND_CONVENTIONAL, lse_dt, dt, w); /* dt's values */
        st.grads = grads;
        cli_free(&st.base[CAND_LSE]);
        st.base[CAND_LSE] = w[CAND_LSE];
        cli_free(&w[CAND_OUT]);
    }
    if (!rc && o.cand[CAND_OUT]) { /* before the LSE leaves the library's convention */
        out_as_candidate_writes_it(o.profile, &st.ref[CAND_LSE], &st.ref[CAND_OUT],
                                   &cand[CAND_OUT]);
        if (!explicit_rule)
            out_as_candidate_writes_it(o.profile, &st.ref[CAND_LSE], &st.base[CAND_OUT],
                                       &cand[CAND_OUT]);
    }
    if (!rc && o.cand[CAND_LSE]) {
        lse_as_candidate_writes_it(o.profile, &st.ref[CAND_LSE], &cand[CAND_LSE]);
        if (!explicit_rule)
            lse_as_candidate_writes_it(o.profile, &st.base[CAND_LSE], &cand[CAND_LSE]);
    }

    fa_comparison res[CAND_N];
    double rel[CAND_N]; /* max abs / max |ref|; NaN where max |ref| is 0 */
    int pass = 1;
    for (int c = 0; c < CAND_N && !rc; c++) {
        if (!o.cand[c])
            continue;
        fa_tolerance tol = {.factor = c >= CAND_DQ ? 3 : 2, .atol = o.atol, .rtol = o.rtol,
                            .max_only = o.rule_max};
        if (c == CAND_LSE)
            tol.allowance = lse_tol.allowance, tol.allowance_rel = lse_tol.allowance_rel;
        fa_status s = fa_compare(&cand[c].t, &st.ref[c].t, explicit_rule ? NULL : &st.base[c].t,
                                 &tol, &res[c]);
        if (s != FA_OK)
            rc = cli_fail(s, "compare");
        else
            pass &= res[c].pass;
        rel[c] = res[c].ref_max > 0 ? res[c].max_abs / res[c].ref_max : NAN;
    }
    /* A FAIL against the yardstick of a candidate file's dtype, wider than the inputs': a
     * kernel computing in the inputs' dtype that saved its output wider was held to the wider
     * dtype's rule. */
    char hint[PATH_MAX + 256] = "";
    if (!rc && !pass && dt_from >= 0 && !explicit_rule && !fp8 &&
        npy_kind_size(cand[dt_from].a.kind) > npy_kind_size(st.in[0].a.kind))
        snprintf(hint, sizeof hint,
                 "%s %s holds %s but the inputs hold %s, so the yardstick ran in %s; if the "
                 "kernel computes in %s, pass --dtype %s",
                 cand_opts[dt_from], o.cand[dt_from], fa_dtype_name(dt),
                 fa_dtype_name(st.in[0].t.dtype), fa_dtype_name(dt),
                 fa_dtype_name(st.in[0].t.dtype), fa_dtype_name(st.in[0].t.dtype));
    if (!rc && o.json) {
        printf("{\"verdict\": \"%s\", \"profile\": \"%s\", \"storage_dtype\": \"%s\", "
               "\"hint\": ",
               pass ? "PASS" : "FAIL", o.profile->name, fa_dtype_name(dt));
        if (*hint)
            json_str(hint);
        else
            printf("null");
        printf(", \"tensors\": [");
        const char *sep = "";
        for (int c = 0; c < CAND_N; c++) {
            if (!o.cand[c])
                continue;
            const fa_comparison *r = &res[c];
            printf("%s\n  {\"name\": \"%s\", \"file\": ", sep, cand_names[c]);
            json_str(o.cand[c]);
            printf(", \"verdict\": \"%s\", \"max_abs\": ", r->pass ? "PASS" : "FAIL");
            json_num(r->max_abs);
            printf(", \"rel_error\": ");
            if (isnan(rel[c]))
                printf("null");
            else
                json_num(rel[c]);
            printf(", \"nmse\": ");
            json_num(r->nmse);
            const char *names[4];
            int64_t at[4];
            const int n = file_index(&o, c, cand[c].a.ndim, r->worst, names, at);
            printf(", \"worst_index\": {");
            for (int i = 0; i < n; i++)
                printf("%s\"%s\": %lld", i ? ", " : "", names[i], (long long)at[i]);
            printf("}, \"worst_candidate\": ");
            json_num(r->worst_cand);
            printf(", \"worst_reference\": ");
            json_num(r->worst_ref);
            printf(", \"nonfinite_mismatches\": %lld, \"bound\": ", (long long)r->nonfinite_mismatches);
            json_num(r->bound);
            printf(", \"baseline_error\": ");
            json_num(r->baseline_err);
            printf(", \"rule\": ");
            json_str(r->rule);
            printf(", \"statistics\": {");
            for (int k = 0; k < N_STATS; k++) {
                const stat_view v = stat_of(r, k);
                printf("%s\"%s\": {\"value\": ", k ? ", " : "", v.name);
                json_num(v.value);
                printf(", \"bound\": ");
                json_num(v.bound);
                printf(", \"pass\": %s}", r->failed & v.bit ? "false" : "true");
            }
            printf("}}");
            sep = ",";
        }
        printf("\n]}\n");
    } else if (!rc) {
        if (explicit_rule)
            printf("flashattn check: reference float64; explicit tolerance; profile %s\n",
                   o.profile->name);
        else
            printf("flashattn check: reference float64; yardstick conventional %s%s%s; "
                   "profile %s\n", fp8 ? fa_dtype_name(st.in[0].t.dtype) : "",
                   fp8 ? " -> " : "", fa_dtype_name(dt), o.profile->name);
        printf("%-5s %-7s %10s %10s %10s %-22s %13s %13s %9s\n", "", "verdict", "max abs",
               "rel err", "nmse", "worst index", "candidate", "reference", "nan/inf");
        for (int c = 0; c < CAND_N; c++) {
            if (!o.cand[c])
                continue;
            const fa_comparison *r = &res[c];
            const char *names[4];
            int64_t idx[4];
            const int n = file_index(&o, c, cand[c].a.ndim, r->worst, names, idx);
            char at[160], rl[32] = "-";
            int w = snprintf(at, sizeof at, "[");
            for (int i = 0; i < n; i++)
                w += snprintf(at + w, sizeof at - (size_t)w, "%s%c=%lld", i ? "," : "", names[i][0],
                              (long long)idx[i]);
            snprintf(at + w, sizeof at - (size_t)w, "]");
            if (!isnan(rel[c]))
                snprintf(rl, sizeof rl, "%.3g", rel[c]);
            printf("%-5s %-7s %10.3g %10s %10.3g %-22s %13.6g %13.6g %9lld\n", cand_names[c],
                   r->pass ? "PASS" : "FAIL", r->max_abs, rl, r->nmse, at, r->worst_cand,
                   r->worst_ref, (long long)r->nonfinite_mismatches);
            printf("      rule: %s\n", r->rule);
            printf("      stats:");
            for (int k = 0; k < N_STATS; k++) {
                const stat_view v = stat_of(r, k);
                printf(k == 1 ? "%s %s %.6g %s %.3g%s" : "%s %s %.3g %s %.3g%s", k ? "," : "",
                       v.name, v.value, k == 1 ? "(1 +-" : "(<=", v.bound,
                       r->failed & v.bit ? ") FAILED" : ")");
            }
            putchar('\n');
        }
        printf("verdict: %s\n", pass ? "PASS" : "FAIL");
        if (*hint)
            printf("hint: %s\n", hint);
    }
    for (int i = 0; i < 4; i++)
        cli_free(&st.in[i]);
    for (int c = 0; c < CAND_N; c++)
        cli_free(&st.ref[c]), cli_free(&st.base[c]), cli_free(&cand[c]);
    cli_opts_free(&o);
    return rc ? rc : pass ? EXIT_PASS : EXIT_FAILED;
}
