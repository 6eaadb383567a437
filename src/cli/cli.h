/* The `flashattn` command: shared declarations of its subcommands (src/cli/). */
#ifndef FA_CLI_H
#define FA_CLI_H

#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "flashattn.h"
#include "npy.h"

/* .npy <-> fa_tensor. A loaded tensor owns its npy_array. */
typedef struct {
    fa_tensor t;
    npy_array a;
} cli_tensor;

enum { CAND_OUT, CAND_LSE, CAND_DQ, CAND_DK, CAND_DV, CAND_DBIAS, CAND_N };

/* What --mask-kind says an --attn-mask holds (--bias: MASK_BIAS). */
enum { MASK_INFER, MASK_KEEP, MASK_BIAS };

/* Everything the options of forward, backward and check say. */
typedef struct {
    const char *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const char *cand[CAND_N]; /* check: --candidate-out, -lse, -dq, -dk, -dv, -dbias */
    const char *alibi, *sinks, *dsinks;
    const char *descale[3];   /* --descale-q, -k, -v: FP8 descale factors */
    float *descale_vals[3];   /* as loaded (cli_load_params): o->p.descale_q, _k, _v */
    /* --attn-mask or --bias (bias_opt says which), and the backward's --dbias */
    const char *bias, *bias_opt, *dbias;
    int mask_kind;        /* MASK_* */
    cli_tensor bias_vals; /* the bias as loaded (cli_load_bias): o->p.bias is its view */
    const char *cu_q, *cu_k; /* --cu-seqlens-q, -k: a variable-length batch */
    int packed;              /* those given: tensors are (total, heads, headdim) */
    fa_indices cu[2];
    /* a KV cache (forward and check): --seqused-k (the lengths), with --block-table a paged
     * one, or FlashInfer's --kv-indptr, --kv-indices and --kv-last-page-len (converted to a
     * table) */
    const char *block_table, *seqused, *kv_indptr, *kv_indices, *kv_last;
    int paged; /* any of them: a cache (paged, or contiguous with lengths) */
    fa_paged_kv pages;
    int64_t *page_table, *page_used; /* the CSR conversion's */
    npy_array idx[11];               /* the index files, by IDX_* (cli_load_indices) */
    /* a block mask (FlexAttention's BlockMask; a dense batch): --kv-num-blocks,
     * --kv-block-indices and optionally --full-kv-num-blocks, --full-kv-block-indices (in
     * IDX_* order from IDX_KV_NUM), in blocks of --block-size Q,K (bm's q_block, kv_block) */
    const char *bm_files[4];
    fa_block_mask bm; /* o->p.block_mask once loaded (cli_load_indices) */
    fa_params p;
    float *slopes;    /* from --alibi */
    float *sink_vals; /* from --sinks */
    int bhsd, bf16, json, threads;
    int fp8;                  /* --fp8: FA_E4M3 or FA_E5M2, what 1-byte inputs hold; 0: none */
    int k_dtype, v_dtype;     /* --k-dtype / --v-dtype: FA_Q8_0 or FA_Q4_0, the block format
                                 of a uint8 K / V file (last dim: a row's bytes); 0: none */
    int has_out_dtype;        /* forward --out-dtype: out's dtype for FP8 inputs */
    fa_dtype out_dtype;
    int has_dtype;   /* check --dtype: the candidate kernel's storage dtype */
    fa_dtype dtype;
    fa_backend backend;
    fa_isa isa;
    double atol, rtol;
    int rule_max; /* check --rule max: the max rule alone (fa_tolerance.max_only) */
    const fa_profile *profile; /* --profile (fa_profile_find) */
    /* what cli_apply_profile leaves to the profile: the options not given (FA_GIVEN_ bits of
     * those given), and a --window of one number (window_num as given, window_w its value) */
    unsigned given;
    const char *window_num;
    int64_t window_w;
    const char *cmd; /* the subcommand, for messages */
} cli_opts;

/* Exit codes of every subcommand: 0 success (check: PASS), 1 check's FAIL verdict, 2 bad usage
 * or unreadable input, 3 the work could not be completed (out of memory, a backend or ISA that
 * is unavailable, an output file that cannot be written). */
enum { EXIT_PASS = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_ERROR = 3 };

/* Parses argv (after the subcommand) into o; `allowed` is a string of option groups the
 * subcommand takes ("io", "grad", "check"). Returns -1 to go on, or an exit code (help printed,
 * or a usage error reported on stderr). */
int cli_parse(const char *cmd, int argc, char **argv, const char *allowed, cli_opts *o);
void cli_opts_free(cli_opts *o);
/* The profile's conventions in o->p for the options not given (fa_profile_apply), once the
 * params are loaded (cli_load_params, cli_load_bias: the slopes and the bias decide ggml's
 * bias_by_slope). 0, or EXIT_USAGE after a message (a --window count out of range). */
int cli_apply_profile(cli_opts *o);
/* dt = the dtype named v (f32, f64, f16, bf16); nonzero if v names none. */
int cli_dtype_from_name(const char *v, fa_dtype *dt);
void cli_usage(FILE *f, const char *cmd);

typedef enum { ROLE_QKV, ROLE_LSE } cli_role;
/* Loads `path`, given as option `opt`, as a 4-D tensor in o's layout (ROLE_QKV) or a (B, H, S)
 * LSE (ROLE_LSE); for packed sequences (--cu-seqlens-q) a (total, H, D) tensor or an (H, total)
 * LSE, batch 1. Returns 0, or EXIT_USAGE after printing a message that names the option, the
 * file and the problem. */
int cli_load(const cli_opts *o, const char *opt, const char *path, cli_role role, cli_tensor *x);
/* K or V (opt "--k" / "--v"): as cli_load, but a uint8 file of blocks where --k-dtype /
 * --v-dtype names a block format (block: that dtype, or 0). */
int cli_load_kv(const cli_opts *o, const char *opt, const char *path, int block, cli_tensor *x);
/* Logical (B, S, H, D) as a file of o's layout holds it: (B, S, H, D), (B, H, S, D) or, for an
 * LSE, (B, H, S); packed sequences (B = 1): (S, H, D), an LSE (H, S). Returns the file's ndim. */
int cli_file_shape(const cli_opts *o, cli_role role, int64_t b, int64_t s, int64_t h, int64_t d,
                   int64_t shape[4]);
/* The names of those dims, "(batch, heads, seqlen)" and so on. */
const char *cli_file_dims(const cli_opts *o, cli_role role);
/* An input as the user gave it: its option, its file, its tensor; kv: a K/V file (pages, when
 * o has a block table). */
typedef struct {
    const char *opt, *path;
    const fa_tensor *t;
    int kv;
} cli_input;
/* Refuses inputs whose dims disagree (EXIT_USAGE after a message in the files' terms that
 * names the option and file at fault: "--k k.npy: head dim 32, but --q q.npy has 64"); dout
 * may be NULL. */
int cli_check_inputs(const cli_opts *o, const cli_input *q, const cli_input *k, const cli_input *v,
                     const cli_input *dout);
/* The same for their dtypes: q, k, v (and dout) share one, but for an f16 or bf16 K/V cache
 * under f32 or bf16 q, and a block-format cache as cli_check_blocks says. */
int cli_check_dtypes(const cli_opts *o, const cli_input *q, const cli_input *k, const cli_input *v,
                     const cli_input *dout);
/* A block-format K or V (--k-dtype, --v-dtype): K and V both, under f32, f16 or bf16 q, no
 * dout (forward only); 0 where neither is one. */
int cli_check_blocks(const cli_opts *o, const cli_input *q, const cli_input *k, const cli_input *v,
                     const cli_input *dout);
/* A new zeroed tensor of the given logical shape, laid out as o's layout says (ROLE_LSE:
 * B x H x S storage). */
int cli_alloc(const cli_opts *o, fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d,
              cli_role role, cli_tensor *x);
void cli_free(cli_tensor *x);
/* A copy of x converted to dtype dt, same logical shape and layout. */
int cli_convert(const cli_opts *o, const cli_tensor *x, fa_dtype dt, cli_role role, cli_tensor *y);
/* --attn-mask or --bias: the file, a (B|1, H|1, Sq|1, Sk) array in PyTorch's order (or its
 * last 2 or 3 dims), into o->bias_vals and o->p.bias: a keep-mask (bool, or any numeric array
 * with --mask-kind keep) or an additive bias (floats). The library checks its dims. */
int cli_load_bias(cli_opts *o);
/* An array of the same shape as the file `path` names (`opt` in messages): a candidate's bias
 * gradient, of float dtype. */
int cli_load_bias_shaped(const cli_opts *o, const char *path, const char *opt, cli_tensor *x);
/* A new zeroed bias gradient of dtype dt (f32 or f64) in the bias's own shape, for the option
 * opt; EXIT_USAGE after a message where o has no float bias. */
int cli_alloc_bias_grad(const cli_opts *o, const char *opt, fa_dtype dt, cli_tensor *g);

/* The output files of a command, written all or nothing (src/cli/outputs.c). */
#define CLI_MAX_OUTPUTS 5
#define CLI_FILE_SLACK 4096 /* bytes per file beyond its data: header, last block */
typedef struct {
    const char *path;      /* as given */
    const cli_tensor *x;   /* what goes into it */
    char dest[PATH_MAX];   /* resolved: what the rename replaces */
    char tmp[PATH_MAX];    /* the temporary file beside dest, "" when none */
    struct stat st;        /* dest's, if it exists */
    int exists;
    FILE *f;               /* open on tmp until written */
} cli_output;
typedef struct {
    cli_output o[CLI_MAX_OUTPUTS];
    int n;
} cli_outputs;
void cli_outputs_init(cli_outputs *s);
/* Adds an output (path NULL: none); x's array must be allocated by the time of commit. */
void cli_outputs_add(cli_outputs *s, const char *path, const cli_tensor *x);
/* Checks the set before any work (no output names an input or another output; outputs are
 * regular files or new; their size fits the free space) and creates the temporary files.
 * 0, or an exit code after a message (nothing left behind). */
int cli_outputs_open(cli_outputs *s, const char *const *inputs, int nin);
/* Writes every array into its temporary file, then renames all of them into place. 0, or
 * EXIT_ERROR after a message, with every temporary file removed. */
int cli_outputs_commit(cli_outputs *s);
/* Removes the temporary files (after a failed computation). */
void cli_outputs_abort(cli_outputs *s);

fa_context *cli_context(const cli_opts *o, fa_backend backend);
/* Prints the library's detail; returns EXIT_USAGE for argument errors, else EXIT_ERROR. */
int cli_fail(fa_status s, const char *what);
/* --alibi and --sinks: load one slope and one sink logit per q head into o->slopes and
 * o->p.alibi_slopes, o->sink_vals and o->p.sink_logits; --descale-q, -k, -v: one factor each
 * (per tensor) or q's batch x k's heads (per kv head) into o->descale_vals and o->p. */
int cli_load_params(cli_opts *o, const fa_tensor *q, const fa_tensor *k);
static inline int cli_is_fp8(fa_dtype d) { return d == FA_E4M3 || d == FA_E5M2; }
/* The block mask's options, by IDX_* from IDX_KV_NUM. */
extern const char *const cli_bm_options[4];
/* The index files of o, by what they are. */
enum { IDX_CU_Q, IDX_CU_K, IDX_TABLE, IDX_USED, IDX_INDPTR, IDX_INDICES, IDX_LAST,
       IDX_KV_NUM, IDX_KV_BLOCKS, IDX_FULL_NUM, IDX_FULL_BLOCKS, IDX_N };
/* The index files given (int32 or int64; a block table 2-D, a block mask's counts 3-D and
 * indices 4-D, the others 1-D) into o->cu, o->pages and o->bm (page_size: k's, for
 * FlashInfer's last-page lengths); 0 or an exit code after a message. */
int cli_load_indices(cli_opts *o, int64_t page_size);
/* fa_forward or fa_backward, or their variable-length forms when o has offsets. */
fa_status cli_forward(fa_context *ctx, const cli_opts *o, const fa_tensor *q, const fa_tensor *k,
                      const fa_tensor *v, fa_tensor *out, fa_tensor *lse);
fa_status cli_backward(fa_context *ctx, const cli_opts *o, const fa_tensor *q,
                       const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                       const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                       fa_tensor *dk, fa_tensor *dv);

const char *cli_blas_core(void); /* OpenBLAS's core name, "unknown" without OpenBLAS */

int cmd_forward(int argc, char **argv);
int cmd_backward(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_demo(int argc, char **argv);

#endif
