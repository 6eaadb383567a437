/* Options of the `flashattn` subcommands (the convention profiles are the library's:
 * fa_profile_find). */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"



/* The backend or ISA named v: one of the values from 1 on that the library's name function
 * knows (it says "invalid" past the last), so every name it has is accepted here. */
static int enum_from_name(const char *v, const char *(*name)(int), int *out)
{
    for (int k = 1; strcmp(name(k), "invalid"); k++)
        if (!strcmp(v, name(k))) {
            *out = k;
            return 0;
        }
    return 1;
}

/* Those names joined by sep (the last pair by last_sep), for --help and errors. */
static const char *enum_names(const char *(*name)(int), const char *sep, const char *last_sep,
                              char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (int k = 1; strcmp(name(k), "invalid"); k++) {
        const char *s = k == 1 ? "" : strcmp(name(k + 1), "invalid") ? sep : last_sep;
        int w = snprintf(buf + used, n - used, "%s%s", s, name(k));
        if (w < 0 || (size_t)w >= n - used)
            break;
        used += (size_t)w;
    }
    return buf;
}

static const char *backend_name(int b) { return fa_backend_name((fa_backend)b); }
static const char *isa_name(int i) { return fa_isa_name((fa_isa)i); }

void cli_usage(FILE *f, const char *cmd)
{
    if (!strcmp(cmd, "forward"))
        fprintf(f, "usage: flashattn forward --q Q.npy --k K.npy --v V.npy --out OUT.npy\n"
                   "       [--lse LSE.npy] [--out-dtype f32|f16|bf16|f64] [--k-dtype q8_0|q4_0\n"
                   "       --v-dtype q8_0|q4_0] [attention options] [run options]\n"
                   "Runs a backend on Q, K, V and writes O (the inputs' dtype; FP8 inputs:\n"
                   "--out-dtype, default bf16) and LSE (B, H, S; f32, or f64 for an f64 O).\n"
                   "--k-dtype, --v-dtype: K and V files of ggml's blocks (uint8, the last dim a\n"
                   "row's bytes: head dim / 32 x 34 for q8_0, x 18 for q4_0) under f32, f16 or\n"
                   "bf16 Q.\n");
    else if (!strcmp(cmd, "backward"))
        fprintf(f, "usage: flashattn backward --q Q.npy --k K.npy --v V.npy --out O.npy --lse LSE.npy\n"
                   "       --dout DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy [--dsinks DS.npy]\n"
                   "       [--dbias DB.npy] [attention options] [run options]\n"
                   "Writes the gradients of attention for the cotangent dO (--dsinks, with --sinks:\n"
                   "the sinks' gradient, 1-D f32 of one per query head; --dbias, with a float\n"
                   "--bias or --attn-mask: the bias's gradient in its file's shape, f32, or f64\n"
                   "for f64 inputs).\n");
    else if (!strcmp(cmd, "check"))
        fprintf(f,
                "usage: flashattn check --q Q.npy --k K.npy --v V.npy [--dout DO.npy]\n"
                "       [--candidate-out O.npy] [--candidate-lse LSE.npy] [--candidate-dq DQ.npy]\n"
                "       [--candidate-dk DK.npy] [--candidate-dv DV.npy]\n"
                "       [--candidate-dbias DB.npy] [--profile NAME] [--k-dtype q8_0|q4_0\n"
                "       --v-dtype q8_0|q4_0]\n"
                "       [--atol A] [--rtol R] [--rule all|max] [--dtype f32|f64|f16|bf16] [--json]\n"
                "       [attention options] [--threads T]\n"
                "Compares a kernel's results with the float64 reference on the same inputs.\n"
                "Default rule (FlashAttention's): max |cand - ref| <= 2x (3x for gradients) the\n"
                "error of the conventional path run in the candidate's storage dtype (--dtype;\n"
                "default: the candidate files' dtype — give --dtype bf16 for a bf16 kernel whose\n"
                "outputs were saved as f32), plus eps(dtype) x max(1, |ref|); and beside it four\n"
                "statistics of the errors, each held to the yardstick's (docs/DESIGN.md §4): the\n"
                "bias, the least-squares scale, the RMS error and the decorrelation, which catch\n"
                "what a 16-bit dtype's noise hides from the max (truncation, a 0.5%% scale, a\n"
                "dropped key block); --rule max judges the max alone. The LSE is held to its own\n"
                "dtype: a 16-bit kernel's LSE saved in f32 or f64 is judged against the\n"
                "conventional path in f32 (on the inputs rounded to 16 bits), with allowances for\n"
                "a cheap exp and tensor cores' accumulation (fa_lse_rule). --atol/--rtol give an\n"
                "explicit elementwise bound |cand - ref| <= atol + rtol |ref| instead.\n"
                "Files: Q, K, V, dO and the candidates O, dQ, dK, dV per --layout (bshd:\n"
                "(batch, seqlen, heads, headdim), bhsd: (batch, heads, seqlen, headdim)); the\n"
                "LSE (batch, heads, seqlen), f32 or f64, in the profile's log (natural but for\n"
                "flashinfer's log2); packed sequences: (total, heads, headdim), LSE (heads,\n"
                "total); dbias in the bias's shape. Q, K, V (and dO) share one dtype, but for an\n"
                "f16 or bf16 K/V cache under f32 or bf16 Q, and K and V files of ggml's blocks\n"
                "(--k-dtype, --v-dtype, as forward reads them), whose dequantized values the\n"
                "reference and the yardstick read.\n"
                "Per tensor: max abs error; rel err, that error over the tensor's largest\n"
                "|reference| (- where that is 0); nmse; the worst element's index in its file's\n"
                "own order, each index named (b batch, s seqlen, h head, d head dim; dbias: q\n"
                "query, k key): [b,s,h,d] (bhsd: [b,h,s,d]; packed: [s,h,d]), an LSE [b,h,s]\n"
                "(packed: [h,s]); both values there; NaN/inf mismatches; the rule with its\n"
                "numbers; the statistics, each with its bound (FAILED where above it). --json:\n"
                "the same, worst_index an object in the file's order.\n"
                "Exit status: 0 PASS, 1 FAIL, 2 bad usage or unreadable input, 3 could not run.\n"
                "Profiles: flashattn (default), fa2, fa3, pytorch, flashinfer, xformers, ggml,\n"
                "flex.\n");
    else
        return;
    fprintf(f,
            "attention options:\n"
            "  --causal                  causal mask (window_right = 0)\n"
            "  --align bottom-right|top-left   causal/window alignment when Sq != Sk\n"
            "  --window L,R              inclusive key offsets left/right of the query, -1 unbounded\n"
            "  --window W                one number: the profile's convention (a left bound, or\n"
            "                            a key count W including the query's own = (W-1, 0))\n"
            "  --softcap C               s = C tanh(s / C)\n"
            "  --alibi SLOPES.npy        one slope per query head (1-D)\n"
            "  --sinks SINKS.npy         one attention-sink logit per query head (1-D; -inf: none)\n"
            "  --sink-tokens N           the first N keys stay visible beside the window\n"
            "                            (StreamingLLM: exempt from its left bound)\n"
            "  --scale S                 0 or absent: 1/sqrt(head dim)\n"
            "  --dropout P --seed S --offset O   dropout with the Philox stream of docs/DESIGN.md\n"
            "  --layout bshd|bhsd        how Q, K, V, O files are laid out (default bshd)\n"
            "  --bf16                    read uint16 ('<u2', '|V2') arrays as bfloat16\n"
            "  --fp8 e4m3|e5m2           read uint8 ('|u1') arrays as FP8 codes of that format:\n"
            "                            Q, K, V all FP8 (forward only), or K, V under f32/bf16 Q\n"
            "  --descale-q D.npy --descale-k D.npy --descale-v D.npy   FP8 descale factors\n"
            "                            (f32): one value (per tensor) or (B, Hk) (per kv head)\n"
            "  --profile NAME            conventions of a kernel family (see README); forward\n"
            "                            writes and backward reads the LSE in its convention\n"
            "  --cu-seqlens-q CQ.npy --cu-seqlens-k CK.npy   a variable-length batch: B + 1\n"
            "                            offsets each (1-D int32 or int64, from 0 to the total);\n"
            "                            Q, K, V, O are then (total, heads, headdim), LSE\n"
            "                            (heads, total), as FlashAttention's varlen functions\n");
    fprintf(f,
            "  --seqused-k SU.npy        a KV cache (forward, check): sequence b attends to its\n"
            "                            first SU[b] keys (B lengths, int32 or int64), as\n"
            "                            FlashAttention's cache_seqlens\n"
            "  --block-table BT.npy      with --seqused-k: the cache is paged, K, V files pages\n"
            "                            (num_pages, page_size, Hk, D), BT (B, max_pages) ids\n"
            "  --kv-indptr IP.npy --kv-indices IX.npy --kv-last-page-len LP.npy   the same in\n"
            "                            FlashInfer's CSR form (B + 1 offsets into the page ids,\n"
            "                            the keys of each sequence's last page)\n");
    fprintf(f,
            "  --attn-mask MASK.npy      (B|1, H|1, Sq|1, Sk) in PyTorch's order, or its last 2\n"
            "                            or 3 dims (SDPA's attn_mask): bool keeps the keys that\n"
            "                            are true, floats are added to the scores\n"
            "  --mask-kind keep|bias     read --attn-mask as a keep-mask (any numbers: nonzero\n"
            "                            keeps) or as an additive bias (floats)\n"
            "  --bias BIAS.npy           an additive float bias, shaped as --attn-mask\n"
            "  --bias-place after-scale|after-softcap   where the bias enters the scores\n"
            "                            (default: the profile's; ggml: after softcap, ALiBi)\n"
            "  --bias-by-slope           the ALiBi slopes scale the bias (ggml; its profile's\n"
            "                            default when --alibi is given)\n"
            "  --kv-num-blocks N.npy --kv-block-indices I.npy   a block mask (FlexAttention's\n"
            "                            BlockMask): N (B|1, H|1, nq) counts, I (B|1, H|1, nq,\n"
            "                            nk) key blocks, int32 or int64; query block r sees the\n"
            "                            first N[r] blocks of I[r] (on top of the other masks)\n"
            "  --full-kv-num-blocks N.npy --full-kv-block-indices I.npy   its full lists\n"
            "  --block-size Q[,K]        its query and key block sizes (default 128,128)\n");
    fprintf(f,
            "  --threads T               0: all\n");
    char names[200];
    if (strcmp(cmd, "check")) {
        fprintf(f, "  --backend %s\n", enum_names(backend_name, "|", "|", names, sizeof names));
        fprintf(f, "  --isa %s\n", enum_names(isa_name, "|", "|", names, sizeof names));
    }
    fprintf(f, "  --help\n");
}

int cli_dtype_from_name(const char *v, fa_dtype *dt)
{
    for (int k = FA_F32; k <= FA_BF16; k++) /* the library's own names: one spelling */
        if (!strcmp(v, fa_dtype_name((fa_dtype)k))) {
            *dt = (fa_dtype)k;
            return 0;
        }
    return 1;
}

static int bad(const char *cmd, const char *opt, const char *val, const char *why)
{
    fprintf(stderr, "flashattn %s: %s %s: %s\n", cmd, opt, val ? val : "", why);
    return EXIT_USAGE;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || errno == ERANGE)
        return 1;
    *out = v;
    return 0;
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        return 1;
    *out = (int64_t)v;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9') /* strtoull would skip blanks and accept a sign */
        return 1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno == ERANGE)
        return 1;
    *out = (uint64_t)v;
    return 0;
}

/* Options and the subcommand groups that accept them. */
typedef struct {
    const char *name;
    const char *groups; /* "io" forward/backward, "fwd" forward, "grad" backward, "check",
                           "pages" a paged K/V (backward refuses it), "attn" all three */
} opt_def;

static const opt_def defs[] = {
    {"--q", "attn"}, {"--k", "attn"}, {"--v", "attn"}, {"--out", "io"}, {"--lse", "io"},
    {"--dout", "grad check"}, {"--dq", "grad"}, {"--dk", "grad"}, {"--dv", "grad"},
    {"--candidate-out", "check"}, {"--candidate-lse", "check"}, {"--candidate-dq", "check"},
    {"--candidate-dk", "check"}, {"--candidate-dv", "check"}, {"--candidate-dbias", "check"},
    {"--atol", "check"},
    {"--rtol", "check"}, {"--rule", "check"}, {"--json", "check"}, {"--dtype", "check"}, {"--causal", "attn"}, {"--align", "attn"},
    {"--window", "attn"}, {"--softcap", "attn"}, {"--alibi", "attn"}, {"--sinks", "attn"},
    {"--dsinks", "grad"}, {"--sink-tokens", "attn"}, {"--scale", "attn"},
    {"--dropout", "attn"}, {"--seed", "attn"}, {"--offset", "attn"}, {"--layout", "attn"},
    {"--bf16", "attn"}, {"--profile", "attn"}, {"--backend", "io"}, {"--isa", "io"},
    {"--threads", "attn"}, {"--cu-seqlens-q", "attn"}, {"--cu-seqlens-k", "attn"},
    {"--block-table", "pages"}, {"--seqused-k", "pages"}, {"--kv-indptr", "pages"},
    {"--kv-indices", "pages"}, {"--kv-last-page-len", "pages"}, {"--attn-mask", "attn"},
    {"--bias", "attn"}, {"--mask-kind", "attn"}, {"--bias-place", "attn"},
    {"--bias-by-slope", "attn"}, {"--dbias", "grad"}, {"--fp8", "attn"},
    {"--k-dtype", "fwd check"}, {"--v-dtype", "fwd check"},
    {"--descale-q", "attn"}, {"--descale-k", "attn"}, {"--descale-v", "attn"},
    {"--out-dtype", "fwd"}, {"--kv-num-blocks", "attn"}, {"--kv-block-indices", "attn"},
    {"--full-kv-num-blocks", "attn"}, {"--full-kv-block-indices", "attn"},
    {"--block-size", "attn"}, {NULL, NULL},
};

const char *const cli_bm_options[4] = {"--kv-num-blocks", "--kv-block-indices",
                                       "--full-kv-num-blocks", "--full-kv-block-indices"};

/* --block-size Q or Q,K (K = Q), each >= 1, into bm's q_block and kv_block. */
static int parse_block_size(const char *s, fa_block_mask *bm)
{
    const char *comma = strchr(s, ',');
    char q[32];
    const size_t n = comma ? (size_t)(comma - s) : strlen(s);
    if (n >= sizeof q)
        return 1;
    memcpy(q, s, n);
    q[n] = '\0';
    return parse_i64(q, 1, INT64_MAX, &bm->q_block) ||
           parse_i64(comma ? comma + 1 : q, 1, INT64_MAX, &bm->kv_block);
}

static const opt_def *find_def(const char *name)
{
    for (const opt_def *d = defs; d->name; d++)
        if (!strcmp(d->name, name))
            return d;
    return NULL;
}

static int accepted(const opt_def *d, const char *allowed)
{
    char groups[64];
    snprintf(groups, sizeof groups, "%s", d->groups);
    for (char *g = strtok(groups, " "); g; g = strtok(NULL, " "))
        if (!strcmp(g, "attn") || strstr(allowed, g))
            return 1;
    return 0;
}

static int is_flag(const char *name)
{
    return !strcmp(name, "--causal") || !strcmp(name, "--json") || !strcmp(name, "--bf16") ||
           !strcmp(name, "--bias-by-slope");
}

/* What a bad --window W is told: one number means what the profile says. */
static const char *window_why(const fa_profile *pf)
{
    return pf->window_is_count
               ? "expected a key count W >= 1 (this profile counts the query's own key)"
               : "expected a left bound >= -1, or L,R";
}

int cli_parse(const char *cmd, int argc, char **argv, const char *allowed, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    fa_params_init(&o->p);
    o->profile = fa_profile_at(0);
    o->backend = FA_BACKEND_AUTO;
    o->isa = FA_ISA_AUTO;
    const char *window = NULL, *align = NULL, *mask_kind = NULL, *bias_place = NULL;
    const char *block_size = NULL;
    int by_slope = 0;
    o->bm.q_block = o->bm.kv_block = 128; /* FlexAttention's default */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_usage(stdout, cmd);
            return EXIT_PASS;
        }
        const opt_def *d = find_def(a);
        if (!d || !accepted(d, allowed)) {
            fprintf(stderr, "flashattn %s: unknown option '%s' (see flashattn %s --help)\n", cmd,
                    a, cmd);
            return EXIT_USAGE;
        }
        const char *v = NULL;
        if (!is_flag(a)) {
            if (i + 1 >= argc)
                return bad(cmd, a, NULL, "needs a value");
            v = argv[++i];
        }
        if (!strcmp(a, "--q")) o->q = v;
        else if (!strcmp(a, "--k")) o->k = v;
        else if (!strcmp(a, "--v")) o->v = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--lse")) o->lse = v;
        else if (!strcmp(a, "--dout")) o->dout = v;
        else if (!strcmp(a, "--dq")) o->dq = v;
        else if (!strcmp(a, "--dk")) o->dk = v;
        else if (!strcmp(a, "--dv")) o->dv = v;
        else if (!strcmp(a, "--candidate-out")) o->cand[CAND_OUT] = v;
        else if (!strcmp(a, "--candidate-lse")) o->cand[CAND_LSE] = v;
        else if (!strcmp(a, "--candidate-dq")) o->cand[CAND_DQ] = v;
        else if (!strcmp(a, "--candidate-dk")) o->cand[CAND_DK] = v;
        else if (!strcmp(a, "--candidate-dv")) o->cand[CAND_DV] = v;
        else if (!strcmp(a, "--candidate-dbias")) o->cand[CAND_DBIAS] = v;
        else if (!strcmp(a, "--alibi")) o->alibi = v;
        else if (!strcmp(a, "--sinks")) o->sinks = v;
        else if (!strcmp(a, "--dsinks")) o->dsinks = v;
        else if (!strcmp(a, "--cu-seqlens-q")) o->cu_q = v;
        else if (!strcmp(a, "--cu-seqlens-k")) o->cu_k = v;
        else if (!strcmp(a, "--block-table")) o->block_table = v;
        else if (!strcmp(a, "--seqused-k")) o->seqused = v;
        else if (!strcmp(a, "--kv-indptr")) o->kv_indptr = v;
        else if (!strcmp(a, "--kv-indices")) o->kv_indices = v;
        else if (!strcmp(a, "--kv-last-page-len")) o->kv_last = v;
        else if (!strcmp(a, "--dbias")) o->dbias = v;
        else if (!strcmp(a, "--descale-q")) o->descale[0] = v;
        else if (!strcmp(a, "--descale-k")) o->descale[1] = v;
        else if (!strcmp(a, "--descale-v")) o->descale[2] = v;
        else if (!strcmp(a, "--kv-num-blocks")) o->bm_files[0] = v;
        else if (!strcmp(a, "--kv-block-indices")) o->bm_files[1] = v;
        else if (!strcmp(a, "--full-kv-num-blocks")) o->bm_files[2] = v;
        else if (!strcmp(a, "--full-kv-block-indices")) o->bm_files[3] = v;
        else if (!strcmp(a, "--block-size")) {
            if (parse_block_size(v, &o->bm))
                return bad(cmd, a, v, "expected Q or Q,K: query and key block sizes >= 1");
            block_size = v;
        }
        else if (!strcmp(a, "--fp8")) {
            if (strcmp(v, "e4m3") && strcmp(v, "e5m2"))
                return bad(cmd, a, v, "expected e4m3 or e5m2");
            o->fp8 = !strcmp(v, "e4m3") ? FA_E4M3 : FA_E5M2;
        }
        else if (!strcmp(a, "--k-dtype") || !strcmp(a, "--v-dtype")) {
            if (strcmp(v, "q8_0") && strcmp(v, "q4_0"))
                return bad(cmd, a, v, "expected q8_0 or q4_0 (a block format of uint8 files)");
            const int fmt = !strcmp(v, "q8_0") ? FA_Q8_0 : FA_Q4_0;
            if (!strcmp(a, "--k-dtype"))
                o->k_dtype = fmt;
            else
                o->v_dtype = fmt;
        }
        else if (!strcmp(a, "--mask-kind")) mask_kind = v;
        else if (!strcmp(a, "--bias-place")) bias_place = v;
        else if (!strcmp(a, "--bias-by-slope")) by_slope = 1;
        else if (!strcmp(a, "--attn-mask") || !strcmp(a, "--bias")) {
            if (o->bias && strcmp(o->bias_opt, d->name))
                return bad(cmd, a, v, "give --attn-mask or --bias, not both: they set the one "
                                      "bias tensor");
            o->bias = v;
            o->bias_opt = d->name;
        }
        else if (!strcmp(a, "--causal")) o->p.causal = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--bf16")) o->bf16 = 1;
        else if (!strcmp(a, "--align")) align = v;
        else if (!strcmp(a, "--window")) window = v;
        else if (!strcmp(a, "--dtype")) {
            if (cli_dtype_from_name(v, &o->dtype))
                return bad(cmd, a, v, "expected f32, f64, f16 or bf16");
            o->has_dtype = 1;
        }
        else if (!strcmp(a, "--out-dtype")) {
            if (cli_dtype_from_name(v, &o->out_dtype))
                return bad(cmd, a, v, "expected f32, f64, f16 or bf16");
            o->has_out_dtype = 1;
        }
        else if (!strcmp(a, "--atol")) {
            if (parse_double(v, &o->atol) || !(o->atol >= 0) || isinf(o->atol))
                return bad(cmd, a, v, "expected a finite number >= 0");
        } else if (!strcmp(a, "--rule")) {
            if (strcmp(v, "all") && strcmp(v, "max"))
                return bad(cmd, a, v, "expected all (the max and the statistics) or max");
            o->rule_max = !strcmp(v, "max");
        } else if (!strcmp(a, "--rtol")) {
            if (parse_double(v, &o->rtol) || !(o->rtol >= 0) || isinf(o->rtol))
                return bad(cmd, a, v, "expected a finite number >= 0");
        } else if (!strcmp(a, "--softcap")) {
            if (parse_double(v, &o->p.softcap))
                return bad(cmd, a, v, "expected a number");
        } else if (!strcmp(a, "--sink-tokens")) {
            if (parse_i64(v, 0, INT64_MAX, &o->p.sink_tokens))
                return bad(cmd, a, v, "expected a count of keys >= 0");
        } else if (!strcmp(a, "--scale")) {
            if (parse_double(v, &o->p.scale))
                return bad(cmd, a, v, "expected a number");
        } else if (!strcmp(a, "--dropout")) {
            if (parse_double(v, &o->p.dropout_p))
                return bad(cmd, a, v, "expected a probability in [0, 1)");
        } else if (!strcmp(a, "--seed")) {
            if (parse_u64(v, &o->p.dropout_seed))
                return bad(cmd, a, v, "expected an unsigned 64-bit integer");
        } else if (!strcmp(a, "--offset")) {
            if (parse_u64(v, &o->p.dropout_offset))
                return bad(cmd, a, v, "expected an unsigned 64-bit integer");
        } else if (!strcmp(a, "--threads")) {
            int64_t t;
            if (parse_i64(v, 0, 4096, &t))
                return bad(cmd, a, v, "expected an integer in [0, 4096]");
            o->threads = (int)t;
        } else if (!strcmp(a, "--layout")) {
            if (strcmp(v, "bshd") && strcmp(v, "bhsd"))
                return bad(cmd, a, v, "expected bshd or bhsd");
            o->bhsd = !strcmp(v, "bhsd");
        } else if (!strcmp(a, "--profile")) {
            if (!(o->profile = fa_profile_find(v))) {
                char names[200] = "expected one of";
                for (int x = 0; fa_profile_at(x); x++)
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s %s",
                             x ? "," : "", fa_profile_at(x)->name);
                return bad(cmd, a, v, names);
            }
        } else if (!strcmp(a, "--backend")) {
            int k;
            char names[200], why[220];
            if (enum_from_name(v, backend_name, &k)) {
                snprintf(why, sizeof why, "expected %s",
                         enum_names(backend_name, ", ", " or ", names, sizeof names));
                return bad(cmd, a, v, why);
            }
            o->backend = (fa_backend)k;
        } else if (!strcmp(a, "--isa")) {
            int k;
            char names[200], why[220];
            if (enum_from_name(v, isa_name, &k)) {
                snprintf(why, sizeof why, "expected %s",
                         enum_names(isa_name, ", ", " or ", names, sizeof names));
                return bad(cmd, a, v, why);
            }
            o->isa = (fa_isa)k;
        }
    }

    /* the options given; the profile decides the others (cli_apply_profile) */
    if (by_slope) {
        o->p.bias_by_slope = 1;
        o->given |= FA_GIVEN_BIAS_BY_SLOPE;
    }
    if (bias_place) {
        if (strcmp(bias_place, "after-scale") && strcmp(bias_place, "after-softcap"))
            return bad(cmd, "--bias-place", bias_place, "expected after-scale or after-softcap");
        o->p.bias_place = !strcmp(bias_place, "after-softcap") ? FA_BIAS_AFTER_SOFTCAP
                                                               : FA_BIAS_AFTER_SCALE;
        o->given |= FA_GIVEN_BIAS_PLACE;
    }
    o->mask_kind = o->bias && !strcmp(o->bias_opt, "--bias") ? MASK_BIAS : MASK_INFER;
    if (mask_kind) {
        if (strcmp(mask_kind, "keep") && strcmp(mask_kind, "bias"))
            return bad(cmd, "--mask-kind", mask_kind, "expected keep or bias");
        if (!o->bias || strcmp(o->bias_opt, "--attn-mask"))
            return bad(cmd, "--mask-kind", mask_kind, "goes with --attn-mask (--bias is a "
                                                      "float bias)");
        o->mask_kind = !strcmp(mask_kind, "keep") ? MASK_KEEP : MASK_BIAS;
    }
    if (align) {
        if (strcmp(align, "bottom-right") && strcmp(align, "top-left"))
            return bad(cmd, "--align", align, "expected bottom-right or top-left");
        o->p.align = !strcmp(align, "top-left") ? FA_ALIGN_TOP_LEFT : FA_ALIGN_BOTTOM_RIGHT;
        o->given |= FA_GIVEN_ALIGN;
    }
    if (window) {
        const char *comma = strchr(window, ',');
        if (comma) {
            int64_t l, r;
            char left[32];
            size_t n = (size_t)(comma - window);
            if (n >= sizeof left)
                return bad(cmd, "--window", window, "expected L,R or W");
            memcpy(left, window, n);
            left[n] = '\0';
            if (parse_i64(left, -1, INT64_MAX, &l) || parse_i64(comma + 1, -1, INT64_MAX, &r))
                return bad(cmd, "--window", window, "expected L,R with L, R >= -1");
            o->p.window_left = l;
            o->p.window_right = r;
        } else if (parse_i64(window, o->profile->window_is_count ? INT64_MIN : -1, INT64_MAX,
                             &o->window_w)) { /* a count's range is the profile's to check */
            return bad(cmd, "--window", window, window_why(o->profile));
        } else {
            o->window_num = window;
        }
    }
    if (!o->q || !o->k || !o->v)
        return bad(cmd, !o->q ? "--q" : !o->k ? "--k" : "--v", NULL, "is required");
    if (!o->cu_q != !o->cu_k)
        return bad(cmd, o->cu_q ? "--cu-seqlens-k" : "--cu-seqlens-q", NULL,
                   "is required with the other: a variable-length batch has both");
    if (o->cu_q && o->bhsd)
        return bad(cmd, "--layout", "bhsd", "packed sequences are (total, heads, headdim)");
    o->packed = o->cu_q != NULL;
    const int table = o->block_table || o->seqused;
    const int csr = o->kv_indptr || o->kv_indices || o->kv_last;
    if (o->block_table && !o->seqused)
        return bad(cmd, "--seqused-k", NULL, "is required with --block-table: a paged K/V "
                                             "has both");
    if (csr && (!o->kv_indptr || !o->kv_indices || !o->kv_last))
        return bad(cmd, !o->kv_indptr ? "--kv-indptr" : !o->kv_indices ? "--kv-indices"
                                                                        : "--kv-last-page-len",
                   NULL, "is required with the others: FlashInfer's pages take all three");
    if (table + csr + o->packed > 1)
        return bad(cmd, o->block_table ? "--block-table" : o->seqused ? "--seqused-k"
                                                                       : "--kv-indptr",
                   NULL, "goes with neither the other page description nor --cu-seqlens-q");
    o->paged = table || csr;
    if (o->bias && (o->packed || o->paged))
        return bad(cmd, o->bias_opt, o->bias, "a bias is (B, H, Sq, Sk) of a dense batch: not "
                                              "with --cu-seqlens-q or a KV cache");
    const int bm = o->bm_files[0] || o->bm_files[1] || o->bm_files[2] || o->bm_files[3];
    for (int x = 0; x < 4 && bm; x++)
        if (!o->bm_files[x] && (x < 2 || o->bm_files[x ^ 1]))
            return bad(cmd, cli_bm_options[x], NULL,
                       x < 2 ? "is required for a block mask: its counts and its indices"
                             : "is required with the other full list");
    if (bm && (o->packed || o->paged))
        return bad(cmd, cli_bm_options[0], o->bm_files[0], "a block mask is of a dense batch: "
                                                           "not with --cu-seqlens-q or a KV cache");
    if (block_size && !bm)
        return bad(cmd, "--block-size", block_size, "goes with a block mask (--kv-num-blocks, "
                                                    "--kv-block-indices)");
    return -1;
}

int cli_apply_profile(cli_opts *o)
{
    if (fa_profile_apply(o->profile, &o->p, o->window_num ? &o->window_w : NULL, o->given))
        return bad(o->cmd, "--window", o->window_num, window_why(o->profile));
    return 0;
}

void cli_opts_free(cli_opts *o)
{
    free(o->slopes);
    free(o->sink_vals);
    o->slopes = o->sink_vals = NULL;
    for (int i = 0; i < 3; i++) {
        free(o->descale_vals[i]);
        o->descale_vals[i] = NULL;
    }
    o->p.descale_q = o->p.descale_k = o->p.descale_v = NULL;
    npy_free(&o->bias_vals.a); /* npy_free: this file goes without arrays.c (the fuzz harness) */
    o->p.bias = NULL;
    for (int i = 0; i < IDX_N; i++)
        npy_free(&o->idx[i]);
    free(o->page_table);
    free(o->page_used);
    o->page_table = o->page_used = NULL;
}
