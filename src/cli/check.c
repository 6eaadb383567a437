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
 * on inputs converted to dt (FP8 inputs as they are, their out in dt), into r[CAND_N]. */
static int run_all(cli_opts *o, check_state *st, fa_backend be, fa_dtype dt,
                   cli_tensor r[CAND_N])
{
    cli_tensor x[4];
    memset(x, 0, sizeof x);
    const int fp8 = cli_is_fp8(st->in[0].t.dtype);
    int rc = 0, n = st->grads ? 4 : 3;
    for (int i = 0; i < n && !rc && !fp8; i++)
        rc = cli_convert(o, &st->in[i], dt, ROLE_QKV, &x[i]);
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

static int same_dims(const fa_tensor *a, const fa_tensor *b)
{
    return a->batch == b->batch && a->seqlen == b->seqlen && a->heads == b->heads &&
           a->headdim == b->headdim;
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
    const char *inputs[4] = {o.q, o.k, o.v, o.dout};
    for (int i = 0; i < (grads ? 4 : 3) && !rc; i++)
        rc = cli_load(&o, inputs[i], ROLE_QKV, &st.in[i]);
    for (int c = 0; c < CAND_N && !rc; c++)
        if (c == CAND_DBIAS && o.cand[c])
            rc = cli_load_bias_shaped(&o, o.cand[c], "--candidate-dbias", &cand[c]);
        else if (o.cand[c])
            rc = cli_load(&o, o.cand[c], c == CAND_LSE ? ROLE_LSE : ROLE_QKV, &cand[c]);
    if (!rc)
        rc = cli_load_params(&o, &st.in[0].t, &st.in[1].t);
    if (!rc)
        rc = cli_load_bias(&o);
    if (!rc)
        rc = cli_apply_profile(&o);
    if (!rc)
        rc = cli_load_indices(&o, st.in[1].t.seqlen);
    /* the candidate's storage dtype: --dtype, else that of its outputs, else of its inputs
     * (FP8: bf16, forward's default) */
    const int fp8 = cli_is_fp8(st.in[0].t.dtype);
    fa_dtype dt = fp8 ? FA_BF16 : st.in[0].t.dtype;
    if (!rc && !fp8 && cli_is_fp8(st.in[1].t.dtype)) {
        fprintf(stderr, "flashattn check: an FP8 K/V under wider Q is not checked (the float64 "
                        "reference and the FP8 yardstick need FP8 Q)\n");
        rc = EXIT_USAGE;
    }
    for (int c = 0; c < CAND_N && !rc && !o.has_dtype; c++)
        if (o.cand[c] && c != CAND_LSE && c != CAND_DBIAS) { /* those are f32 or f64 */
            dt = cand[c].t.dtype;
            break;
        }
    if (o.has_dtype)
        dt = o.dtype;
    const int explicit_rule = o.atol > 0 || o.rtol > 0; /* needs no yardstick */
    if (!rc)
        rc = run_all(&o, &st, FA_BACKEND_REFERENCE, FA_F64, st.ref);
    if (!rc && !explicit_rule)
        rc = run_all(&o, &st, FA_BACKEND_CONVENTIONAL, dt, st.base);
    for (int c = 0; c < CAND_N && !rc; c++)
        if (o.cand[c] && !same_dims(&cand[c].t, &st.ref[c].t)) {
            const fa_tensor *a = &cand[c].t, *b = &st.ref[c].t;
            fprintf(stderr,
                    "flashattn check: %s: logical shape (B=%lld, S=%lld, H=%lld, D=%lld) does "
                    "not match the %s the inputs give (B=%lld, S=%lld, H=%lld, D=%lld)\n",
                    o.cand[c], (long long)a->batch, (long long)a->seqlen, (long long)a->heads,
                    (long long)a->headdim, cand_names[c], (long long)b->batch,
                    (long long)b->seqlen, (long long)b->heads, (long long)b->headdim);
            rc = EXIT_USAGE;
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
    int pass = 1;
    for (int c = 0; c < CAND_N && !rc; c++) {
        if (!o.cand[c])
            continue;
        fa_tolerance tol = {.factor = c >= CAND_DQ ? 3 : 2, .atol = o.atol, .rtol = o.rtol};
        fa_status s = fa_compare(&cand[c].t, &st.ref[c].t, explicit_rule ? NULL : &st.base[c].t,
                                 &tol, &res[c]);
        if (s != FA_OK)
            rc = cli_fail(s, "compare");
        else
            pass &= res[c].pass;
    }
    if (!rc && o.json) {
        printf("{\"verdict\": \"%s\", \"profile\": \"%s\", \"storage_dtype\": \"%s\", "
               "\"tensors\": [",
               pass ? "PASS" : "FAIL", o.profile->name, fa_dtype_name(dt));
        const char *sep = "";
        for (int c = 0; c < CAND_N; c++) {
            if (!o.cand[c])
                continue;
            const fa_comparison *r = &res[c];
            printf("%s\n  {\"name\": \"%s\", \"file\": ", sep, cand_names[c]);
            json_str(o.cand[c]);
            printf(", \"verdict\": \"%s\", \"max_abs\": ", r->pass ? "PASS" : "FAIL");
            json_num(r->max_abs);
            printf(", \"max_rel\": ");
            json_num(r->max_rel);
            printf(", \"nmse\": ");
            json_num(r->nmse);
            printf(", \"worst_index\": {\"batch\": %lld, \"seq\": %lld, \"head\": %lld, "
                   "\"dim\": %lld}, \"worst_candidate\": ",
                   (long long)r->worst[0], (long long)r->worst[1], (long long)r->worst[2],
                   (long long)r->worst[3]);
            json_num(r->worst_cand);
            printf(", \"worst_reference\": ");
            json_num(r->worst_ref);
            printf(", \"nonfinite_mismatches\": %lld, \"bound\": ", (long long)r->nonfinite_mismatches);
            json_num(r->bound);
            printf(", \"baseline_error\": ");
            json_num(r->baseline_err);
            printf(", \"rule\": ");
            json_str(r->rule);
            putchar('}');
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
               "max rel", "nmse", "worst [b,s,h,d]", "candidate", "reference", "nan/inf");
        for (int c = 0; c < CAND_N; c++) {
            if (!o.cand[c])
                continue;
            const fa_comparison *r = &res[c];
            char at[64];
            snprintf(at, sizeof at, "[%lld,%lld,%lld,%lld]", (long long)r->worst[0],
                     (long long)r->worst[1], (long long)r->worst[2], (long long)r->worst[3]);
            printf("%-5s %-7s %10.3g %10.3g %10.3g %-22s %13.6g %13.6g %9lld\n", cand_names[c],
                   r->pass ? "PASS" : "FAIL", r->max_abs, r->max_rel, r->nmse, at, r->worst_cand,
                   r->worst_ref, (long long)r->nonfinite_mismatches);
            printf("      rule: %s\n", r->rule);
        }
        printf("verdict: %s\n", pass ? "PASS" : "FAIL");
    }
    for (int i = 0; i < 4; i++)
        cli_free(&st.in[i]);
    for (int c = 0; c < CAND_N; c++)
        cli_free(&st.ref[c]), cli_free(&st.base[c]), cli_free(&cand[c]);
    cli_opts_free(&o);
    return rc ? rc : pass ? EXIT_PASS : EXIT_FAILED;
}
