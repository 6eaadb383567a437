/*
 * flashattn — exact attention, built the FlashAttention way.
 *
 * The semantics (score pipeline, masks, dropout stream, gradients, dtypes) are those of
 * docs/DESIGN.md §1; this header is its API (docs/DESIGN.md §2). Every function returns FA_OK or a
 * specific fa_status, and a failed call writes nothing to any output; fa_last_error() then says
 * which argument was wrong and why.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(FA_NO_VISIBILITY)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0

typedef enum {
    FA_OK = 0,
    FA_ERR_NULL_POINTER,        /* a required pointer (context, params, tensor, data) is NULL   */
    FA_ERR_INVALID_ARGUMENT,    /* a parameter value is out of its domain (scale, p, window...) */
    FA_ERR_SHAPE,               /* negative or mismatched dims, Hq % Hk != 0, headdim < 1       */
    FA_ERR_STRIDE,              /* negative stride, non-contiguous headdim, overlapping output  */
    FA_ERR_DTYPE,               /* unknown dtype, or tensors whose dtypes do not go together    */
    FA_ERR_UNSUPPORTED,         /* valid request that the chosen backend does not implement     */
    FA_ERR_OVERFLOW,            /* size arithmetic overflows int64 / size_t                     */
    FA_ERR_NO_MEMORY,           /* an allocation failed; nothing was written                    */
    FA_ERR_BACKEND_UNAVAILABLE, /* the backend or ISA asked for is not built or not supported   */
    FA_ERR_DEVICE,              /* the accelerator reported an error                            */
    FA_ERR_COMMUNICATION        /* the communicator (MPI) reported an error (flashattn_mpi.h)   */
} fa_status;

/* FA_BOOL: one byte per element, nonzero true; only a keep-mask (fa_params.bias) has it.
 * FA_E4M3, FA_E5M2: the OCP FP8 formats (e4m3 without infinities, NaN S.1111.111, largest 448;
 * e5m2 IEEE-like, largest 57344), for q, k and v of a forward (fa_params.descale_q says how
 * they are scaled) or a K/V cache under f32 / bf16 q.
 * FA_Q8_0, FA_Q4_0: ggml's quantized blocks (llama.cpp's -ctk/-ctv q8_0 and q4_0), for a K/V
 * cache of a forward under f32, f16 or bf16 q, K and V each its own: 32 consecutive elements
 * of a row per block, an f16 scale d and then the codes; q8_0 34 bytes (32 int8 q, element
 * d q), q4_0 18 bytes (16 bytes of nibbles, element j < 16 the low nibble u of byte j, j >= 16
 * the high nibble of byte j - 16, element d (u - 8)). Strides stay in elements: headdim and
 * every stride a multiple of 32 (element e of a row lies in block e / 32), so a contiguous
 * cache is fa_tensor_init(&t, data, FA_Q8_0, B, S, H, D, 0) over B S H D / 32 blocks.
 * Appending (fa_append_kv) and fa_convert quantize f32 values as ggml's reference does
 * (docs/DESIGN.md §1). */
typedef enum {
    FA_F32, FA_F64, FA_F16, FA_BF16, FA_BOOL, FA_E4M3, FA_E5M2, FA_Q8_0, FA_Q4_0
} fa_dtype;

/*
 * A strided 4-D tensor, logical shape batch x seqlen x heads x headdim (BSHD). Strides are in
 * elements; BHSD storage is expressed by choosing head_stride > seq_stride. headdim must be
 * contiguous: headdim_stride is 0 (meaning 1) or 1, anything else is refused with FA_ERR_STRIDE.
 * An LSE tensor is batch x heads x seqlen with headdim 1 (dtype FA_F32 or FA_F64).
 *
 * Aliasing: an output must share no byte with an input (the ALiBi slopes included) or with
 * another output, and is refused with FA_ERR_STRIDE where it does. Byte ranges are compared
 * (first to last element); views whose ranges intersect but that interleave without touching
 * (Q, K, V or dQ, dK, dV of one packed buffer) are accepted when both have the same element
 * size and the same strides and sizes along every dimension but the run of contiguous
 * elements, every such stride is a multiple of the smallest, and the offset between the two
 * falls in one gap between runs; any other intersecting pair is refused even if no element is
 * shared (docs/DESIGN.md §2).
 */
typedef struct {
    void    *data;
    fa_dtype dtype;
    int64_t  batch, seqlen, heads, headdim;
    int64_t  batch_stride, seq_stride, head_stride;
    int64_t  headdim_stride; /* 0 or 1 */
} fa_tensor;

typedef enum { FA_ALIGN_BOTTOM_RIGHT, FA_ALIGN_TOP_LEFT } fa_align;

/* Where ALiBi sits in the score pipeline (docs/DESIGN.md §1, steps 2-3). The default is the
 * order of FlashAttention-2 and ggml; FlashInfer adds the bias before the cap. */
typedef enum { FA_SOFTCAP_THEN_ALIBI, FA_ALIBI_THEN_SOFTCAP } fa_score_order;

/* Where a bias tensor's entries enter the score pipeline (docs/DESIGN.md §1, step 2a): added to
 * the scaled dot product, before softcap and ALiBi (PyTorch SDPA's attn_mask, xformers'
 * attn_bias: the default), or after both (ggml's flash_attn_ext mask). */
typedef enum { FA_BIAS_AFTER_SCALE, FA_BIAS_AFTER_SOFTCAP } fa_bias_place;

/* A block-sparse mask (fa_block_mask, below). */
typedef struct fa_block_mask fa_block_mask;

/* The layout of FP8 descale factors (fa_params.descale_q/k/v): one float for the tensor, or one
 * per (batch, kv head), B x Hk row-major (FlashAttention-3's q_descale, k_descale, v_descale;
 * dense calls only: calls of sequences take them per tensor). */
typedef enum { FA_DESCALE_PER_TENSOR, FA_DESCALE_PER_KV_HEAD } fa_descale_layout;

typedef struct {
    double       scale;                     /* 0: 1/sqrt(Dqk); else finite and > 0            */
    int          causal;                    /* nonzero: window_right = 0                      */
    int64_t      window_left, window_right; /* -1: unbounded; inclusive key offsets           */
    fa_align     align;                     /* where query row i sits among the keys          */
    double       softcap;                   /* 0: off; > 0: cap; < 0, inf or NaN: invalid     */
    const float *alibi_slopes;              /* Hq finite slopes (host memory), or NULL        */
    double       dropout_p;                 /* [0, 1)                                         */
    uint64_t     dropout_seed, dropout_offset; /* every bit drawn on (DESIGN.md §1) */
    fa_score_order score_order;             /* default FA_SOFTCAP_THEN_ALIBI                  */
    /* Attention sinks (gpt-oss): Hq logits (host memory), or NULL. Head h's sink joins every
     * row's softmax denominator as one more logit with no value: LSE_i = ln(sum_j exp(s_ij) +
     * exp(sink_h)), O_i = sum_j exp(s_ij - LSE_i) v_j (docs/DESIGN.md §1). Each is finite or
     * -inf (-inf: no sink for that head); a row with no allowed key has LSE = sink_h, O = 0. */
    const float *sink_logits;
    /* fa_backward with sink_logits: Hq floats (host memory) that receive d loss / d sink_h,
     * summed over batch and rows; NULL: not wanted. Ignored by fa_forward. */
    float *sink_grad;
    /* Sink tokens (StreamingLLM): the first sink_tokens keys stay visible beside a sliding
     * window. The window's left bound does not apply to them; its right bound (causality)
     * does: key j < sink_tokens is allowed for row i iff j <= i + off + R (docs/DESIGN.md §1,
     * step 4). >= 0; 0, or an unbounded window_left, changes nothing. A row's keys are then
     * the sinks left of its window and the window itself, so the keys in between cost
     * nothing. */
    int64_t sink_tokens;
    /* A bias tensor, or NULL: an additive bias (f32, f16, bf16 or f64) or a keep-mask (FA_BOOL:
     * nonzero keeps the key, 0 masks it), viewed as an fa_tensor whose batch is B or 1, seqlen
     * Sq or 1, heads Hq or 1 and headdim Sk (the key axis, contiguous): PyTorch's (B, H, Sq,
     * Sk) attn_mask has head_stride Sq Sk and seq_stride Sk. A dim of 1 broadcasts (its stride
     * is not read), as does a stride of 0. An entry of -inf, or a mask's 0, masks its key as the
     * window does (a row masked entirely is empty: O = 0, LSE = -inf or the sink); NaN makes the
     * row NaN. Memory of the backend's kind (host, or device for CUDA). Calls of sequences
     * (varlen, paged, a cache) do not take one: FA_ERR_UNSUPPORTED. */
    const fa_tensor *bias;
    fa_bias_place    bias_place;    /* default FA_BIAS_AFTER_SCALE                          */
    /* ggml: with alibi_slopes, head h's slope multiplies the bias and ALiBi's distance term
     * is not applied (ggml's mask carries the positions). Needs bias. */
    int              bias_by_slope;
    /* fa_backward: d loss / d bias, in the bias's own shape (batch, seqlen, heads, headdim as
     * the bias has them; a broadcast dim receives the sum over it), f32 or f64; NULL: not
     * wanted. Only for an additive bias (a keep-mask has no gradient). */
    fa_tensor       *bias_grad;
    /* FP8 descale factors (host memory, finite and > 0), or NULL (1): the value an FP8 element
     * c of q (k, v) stands for is descale x c, with the descale of its batch and kv head (a q
     * head h: kv head h / (Hq / Hk)). Only for an FP8 tensor. The fused paths fold
     * descale_q descale_k into the score scale and descale_v into the output's final factor
     * (once each); the reference widens exactly and multiplies in float64. */
    const float      *descale_q, *descale_k, *descale_v;
    fa_descale_layout descale_layout; /* default FA_DESCALE_PER_TENSOR */
    /* A block-sparse mask (FlexAttention's BlockMask; fa_block_mask below), or NULL. Calls of
     * sequences do not take one. */
    const fa_block_mask *block_mask;
} fa_params; /* new fields are only ever appended */

typedef enum {
    FA_BACKEND_AUTO,
    FA_BACKEND_REFERENCE,    /* float64 two-pass oracle, every feature                        */
    FA_BACKEND_CONVENTIONAL, /* S and P materialized through GEMMs, rounded to the storage type */
    FA_BACKEND_TILED,        /* tiles + online softmax, backward by recomputation             */
    FA_BACKEND_CUDA
} fa_backend;

/* FA_ISA_AMX: the AVX-512 kernels plus AMX tile products for bf16 storage (forward and
 * backward); FA_ISA_AVX512BF16: the AVX-512 kernels plus the same products by AVX512_BF16's dot
 * products (VDPBF16PS), which FA_ISA_AUTO takes only on AMD Zen 5, where VDPBF16PS was measured
 * at 1.85x the FMA rate (the kernels not yet measured there; fa_context_describe names the
 * reason). */
typedef enum {
    FA_ISA_AUTO,
    FA_ISA_SCALAR,
    FA_ISA_AVX2,
    FA_ISA_AVX512,
    FA_ISA_NEON,
    FA_ISA_AMX,
    FA_ISA_AVX512BF16
} fa_isa;

typedef struct {
    fa_backend backend;
    fa_isa     isa;
    int        num_threads; /* 0: OpenMP's default; results do not depend on it            */
    void      *cuda_stream;  /* CUDA backend: a cudaStream_t (NULL: the default stream)  */
    int        deterministic; /* CUDA backend: nonzero makes fa_backward bitwise repeatable
                                 (no floating-point atomics); CPU backends always are       */
} fa_options; /* new fields are only ever appended */

typedef struct fa_context fa_context;

FA_API void      fa_params_init(fa_params *p);
FA_API void      fa_options_init(fa_options *o);
/* Fills every field: strides of a contiguous tensor in BSHD (bhsd = 0) or BHSD order. */
FA_API void      fa_tensor_init(fa_tensor *t, void *data, fa_dtype dtype, int64_t batch,
                                int64_t seqlen, int64_t heads, int64_t headdim, int bhsd);

/* `o` may be NULL (all defaults). FA_BACKEND / FA_ISA in the environment override AUTO. *ctx
 * is written only on success. */
FA_API fa_status fa_context_create(const fa_options *o, fa_context **ctx);
FA_API void      fa_context_destroy(fa_context *ctx);

/*
 * out = attention(q, k, v) per docs/DESIGN.md §1; lse (may be NULL) receives the natural-log
 * log-sum-exp of each row (pre-dropout), -inf for rows with no allowed key (the sink's logit
 * with sinks). Outputs must not overlap inputs or each other (see fa_tensor). k and v share a
 * dtype: q's, or an f16 / bf16 / FP8 cache under f32 or bf16 q (out takes q's dtype). FP8 q
 * (FlashAttention-3's FP8 forward) takes k and v of its FP8 format and an out of f32, f16,
 * bf16 or f64 (the reference's); the backward takes no FP8.
 */
FA_API fa_status fa_forward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                            const fa_tensor *k, const fa_tensor *v, fa_tensor *out,
                            fa_tensor *lse);

/*
 * Gradients of attention with respect to q, k, v for the cotangent dout (one storage dtype for
 * all of them: a cache dtype apart from q's is FA_ERR_UNSUPPORTED here). out and lse are the
 * forward's results: the tiled backend recomputes P from lse and reads out for
 * D_i = dout_i . out_i; the reference (in float64) and the conventional path recompute both
 * and only check their shapes and dtypes. With f64 storage, lse must be f64. dk/dv of a GQA
 * group sum over the group's query heads.
 */
FA_API fa_status fa_backward(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                             const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                             const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                             fa_tensor *dk, fa_tensor *dv);

/*
 * Variable-length batches, as FlashAttention's varlen entry points: B sequences packed along
 * seqlen. q and out are (1, total_q, Hq, D), k and v (1, total_k, Hk, D), lse (1, total_q, Hq,
 * 1), with any strides: FlashAttention's packed (total, H, D) tensors and its (H, total) LSE are
 * views. Sequence b is q rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) against keys
 * [cu_seqlens_k[b], cu_seqlens_k[b + 1]), attended as a problem of its own: causal and windows
 * aligned per sequence (bottom-right, or top-left by params->align), ALiBi distances within it,
 * the dropout stream of batch b (so equal lengths give a dense batch's bits). Each offset array
 * has B + 1 entries, starts at 0, never decreases and ends at its tensors' seqlen; a sequence
 * may be empty (no query: no row to write, and in the backward dK = dV = 0; no key: O = 0 and
 * LSE = the sink, or -inf, and dQ = 0). The sink gradient sums over every sequence's rows.
 * Every backend takes them (CUDA: the offsets in host memory, as here, the tensors on the
 * device; a launch per sequence).
 */
typedef enum { FA_INDEX_INT32, FA_INDEX_INT64 } fa_index_type;
typedef struct {
    const void   *data;  /* host memory; NULL only when count is 0 */
    fa_index_type type;
    int64_t       count; /* entries */
} fa_indices;

/*
 * A block-sparse mask in FlexAttention's BlockMask form: queries in blocks of q_block rows and
 * keys in blocks of kv_block keys (FlexAttention's Q_BLOCK_SIZE and KV_BLOCK_SIZE, 128 by
 * default); query block r of (b, h) lists its key blocks in row r of kv_indices, the first
 * kv_num_blocks[r] entries, and, where full_kv_num_blocks is given (count > 0), more in row r
 * of full_kv_indices. Key j is visible to row i iff j's block is listed for i's block (in
 * either list) and the rest of the mask (window, bias) allows it: a listed block is a hint,
 * never a permission. FlexAttention's full blocks are those where its mask_mod is all true
 * (create_block_mask builds them so), where it skips mask_mod: the same keys. The tiled
 * backend skips key tiles that no query block of a tile lists, whole.
 * Shapes (row-major, host memory, int32 or int64): kv_num_blocks batch x heads x
 * ceil(Sq / q_block), kv_indices that x ceil(Sk / kv_block); batch is B or 1 and heads Hq or
 * 1 (broadcast). Indices lie in [0, ceil(Sk / kv_block)), and a key block appears at most once
 * in a query block's two lists together.
 */
struct fa_block_mask {
    int64_t    batch, heads;
    int64_t    q_block, kv_block;
    fa_indices kv_num_blocks, kv_indices;
    fa_indices full_kv_num_blocks, full_kv_indices; /* count 0: none */
};

FA_API fa_status fa_forward_varlen(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                                   const fa_tensor *k, const fa_tensor *v,
                                   const fa_indices *cu_seqlens_q,
                                   const fa_indices *cu_seqlens_k, fa_tensor *out,
                                   fa_tensor *lse);
FA_API fa_status fa_backward_varlen(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                                    const fa_tensor *k, const fa_tensor *v,
                                    const fa_indices *cu_seqlens_q,
                                    const fa_indices *cu_seqlens_k, const fa_tensor *out,
                                    const fa_tensor *lse, const fa_tensor *dout, fa_tensor *dq,
                                    fa_tensor *dk, fa_tensor *dv);

/*
 * A paged KV cache (vLLM, FlashInfer, FlashAttention's block_table): k and v are pages,
 * (num_pages, page_size, Hk, D) as fa_tensors of batch num_pages and seqlen page_size, with any
 * strides (NHD is the default layout; HND is head_stride > seq_stride) and any page_size >= 1.
 * Sequence b's keys are the first seqused_k[b] keys of the pages listed in row b of
 * block_table: key j is row j % page_size of page block_table[b * max_pages + j / page_size].
 * Pages may be shared between sequences (prefix caching); the entries past a sequence's used
 * pages are never read. q and out are (B, Sq, Hq, D) and lse (B, Sq, Hq, 1): Sq query rows per
 * sequence (decode: 1; a chunk of prefill: more), aligned with its keys as params->align says
 * (bottom-right: the queries are the sequence's last positions), each sequence attended as a
 * problem of its own (as in a variable-length batch). Forward only, on every backend (the
 * table in host memory; CUDA copies it to the device once a call); the results are those of
 * the same keys stored contiguously, bit for bit (on CUDA, to the tolerance rule).
 */
typedef struct {
    fa_indices block_table; /* B x max_pages page indices, row-major */
    int64_t    max_pages;   /* entries per row of block_table */
    fa_indices seqused_k;   /* B used lengths, each at most max_pages x page_size */
} fa_paged_kv;

FA_API fa_status fa_forward_paged(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                                  const fa_tensor *k, const fa_tensor *v,
                                  const fa_paged_kv *pages, fa_tensor *out, fa_tensor *lse);

/*
 * A KV cache that grows (FlashAttention's flash_attn_with_kvcache): k_cache and v_cache are
 * contiguous, (B, S_cache, Hk, D) with cache_seqlens the B current lengths (pages NULL), or
 * paged (pages given, its seqused_k the current lengths, cache_seqlens NULL). k_new and v_new
 * (B, S_new, Hk, D, the cache's dtype) go to keys [len_b, len_b + S_new) of sequence b; a
 * sequence without room (past S_cache, or past its row's pages: each page it writes must be in
 * its row) is refused with nothing written. The lengths arrays are not changed: the caller
 * adds S_new. fa_append_kv only appends; fa_forward_kvcache appends (k_new and v_new may
 * be NULL: nothing to append) and then attends each sequence's Sq query rows to its len_b +
 * S_new keys, as fa_forward_paged does. Pages a sequence writes must not be shared with
 * another's. Host caches are copied on the host, device caches by the CUDA backend (the
 * context's, or AUTO with k_new in device memory).
 */
FA_API fa_status fa_append_kv(fa_context *ctx, const fa_tensor *k_new, const fa_tensor *v_new,
                              fa_tensor *k_cache, fa_tensor *v_cache,
                              const fa_indices *cache_seqlens, const fa_paged_kv *pages);
FA_API fa_status fa_forward_kvcache(fa_context *ctx, const fa_params *p, const fa_tensor *q,
                                    fa_tensor *k_cache, fa_tensor *v_cache,
                                    const fa_tensor *k_new, const fa_tensor *v_new,
                                    const fa_indices *cache_seqlens, const fa_paged_kv *pages,
                                    fa_tensor *out, fa_tensor *lse);

/*
 * Merges n partial attention states over disjoint key sets (split-KV, ring attention):
 * LSE = ln sum_k exp(LSE_k), O = sum_k exp(LSE_k - LSE) O_k. The empty state (O = 0,
 * LSE = -inf) is neutral. out/lse may be the very tensors of a state (the same memory and
 * strides: a merge in place); any other byte they share with a state, or with each other, is
 * FA_ERR_STRIDE.
 */
FA_API fa_status fa_merge_states(int n, const fa_tensor *outs, const fa_tensor *lses,
                                 fa_tensor *out, fa_tensor *lse);

FA_API const char *fa_status_string(fa_status s);
FA_API const char *fa_last_error(void); /* this thread's detail for its last failed call */

/* Bytes the library allocated for this context: now, and the most at once since reset. */
FA_API fa_status fa_memory_stats(const fa_context *ctx, size_t *current, size_t *peak);
FA_API fa_status fa_memory_stats_reset(fa_context *ctx);
/* One line: backend, ISA, threads, detected L1d/L2, tile sizes. Returns FA_OK even when
 * truncated (like snprintf, the line is always terminated when n > 0). */
FA_API fa_status fa_context_describe(const fa_context *ctx, char *buf, size_t n);

/*
 * Comparing a candidate against a reference: the tolerance rule of docs/DESIGN.md §4 as a function.
 *
 * Default rule (FlashAttention's, and the statistics beside it): the candidate's max
 * |cand - ref| must be at most `factor` x max |baseline - ref| + floor, where baseline is the
 * conventional path computed in the candidate's storage dtype on the same inputs (factor 2 for
 * outputs, 3 for gradients) and floor = eps(dtype) x max(1, max |ref|), dtype the coarser of
 * cand's and baseline's (64 eps for f64, whose reference has no headroom); and, unless
 * max_only, four statistics of the errors, each held
 * to the baseline's measured the same way plus a bound written in docs/DESIGN.md §4: the
 * bias (sum (cand - ref) / sum |ref|), the least-squares scale of cand on ref, the RMS error
 * and the decorrelation 1 - corr(cand, ref). They catch what hides under a 16-bit dtype's
 * noise: rounding by truncation, a scale off by 0.5%, a biased softmax denominator, a key
 * block dropped where the outputs are small.
 * Explicit rule (atol or rtol > 0): every element must satisfy |cand - ref| <= atol + rtol |ref|
 * (the statistics are reported, not judged).
 * Under both, NaN and inf must match exactly: NaN where the reference has NaN, the same infinity
 * where it has one; any other disagreement fails.
 */
typedef struct {
    double factor;     /* FlashAttention rule: 2 (outputs) or 3 (gradients); 0 means 2 */
    double atol, rtol; /* > 0: the explicit rule instead                                  */
    /* appended since (new fields are only ever appended): */
    int max_only;      /* default rule: judge the max error alone (the statistics reported) */
    /* default rule: an error each element may have beyond the rule's, allowance +
     * allowance_rel x max |ref| (both finite, >= 0; 0 for none), taken as if systematic: added
     * to the max bound and to the RMS floor (and so to the decorrelation's), and whatever a
     * shift of that size moves the bias and the scale by, to their bounds. fa_lse_rule sets
     * them for an LSE candidate. */
    double allowance, allowance_rel;
} fa_tolerance;

/* The LSE of a kernel with 16-bit outputs is judged against the conventional path in f32 (its
 * scores are f32), with two allowances (docs/DESIGN.md §4). FA_LSE16_ALLOWANCE, absolute: the
 * exp that forms its P may err by up to 2^-16 relative (1/256 of bf16's unit roundoff, the
 * most P's rounding errs by, 1/32 of f16's), which P cannot show and the LSE inherits (this
 * library's bf16 tile kernels: 2^-18.4). FA_LSE16_ALLOWANCE_REL, times max |LSE|: the systematic part of f32 scores, from
 * tensor cores' accumulation (not rounded to nearest) and constants folded into base-2 units
 * (scale log2(e), ln 2): 8 eps(f32), where an H100's kernels showed 3.7. */
#define FA_LSE16_ALLOWANCE 0x1p-16
#define FA_LSE16_ALLOWANCE_REL 0x1p-20

/* fa_comparison.failed: the tests that failed, as bits. */
typedef enum {
    FA_CMP_MAX = 1,     /* the max error (or a NaN/inf mismatch); the explicit rule's elements */
    FA_CMP_BIAS = 2,    /* the bias                                                            */
    FA_CMP_SCALE = 4,   /* the least-squares scale                                             */
    FA_CMP_RMS = 8,     /* the RMS error                                                       */
    FA_CMP_DECORR = 16  /* the decorrelation                                                   */
} fa_cmp_test;

typedef struct {
    double max_abs;         /* max |cand - ref| over elements where both are finite          */
    double max_rel;         /* max |cand - ref| / |ref| over finite, nonzero ref             */
    double nmse;            /* sum (cand - ref)^2 / sum ref^2 over finite elements (0 if 0/0) */
    int64_t worst[4];       /* batch, seq, head, dim of the max |cand - ref| (or first mismatch) */
    double worst_cand, worst_ref;
    int64_t nonfinite_mismatches; /* elements where NaN/inf do not match                     */
    double baseline_err;    /* default rule: max |baseline - ref|; else 0                    */
    double bound;           /* default rule: the bound max_abs is held to; explicit rule: the
                             * bound at the worst element, atol + rtol |worst_ref|            */
    int pass;
    char rule[200];         /* the rule applied, with its numbers, in words                  */
    /* appended since (new fields are only ever appended): the statistics over the elements
     * where both are finite (docs/DESIGN.md §4), each with the bound it is held to (under the
     * explicit rule or max_only: reported, not judged, bounds INFINITY) */
    double bias, bias_bound;     /* sum (cand - ref) / sum |ref|; |bias| <= bias_bound        */
    double scale, scale_bound;   /* sum cand ref / sum ref^2; |scale - 1| <= scale_bound      */
    double rms, rms_bound;       /* sqrt(mean (cand - ref)^2); rms <= rms_bound               */
    double decorr, decorr_bound; /* 1 - corr(cand, ref); decorr <= decorr_bound               */
    int failed;                  /* FA_CMP_* bits of the tests that failed (0 if pass)        */
    double ref_max;              /* max |ref| over ref's finite elements (max_abs / ref_max:
                                  * the error relative to the tensor's scale)               */
} fa_comparison;

/* ref may be any dtype (f64 usually); baseline may be NULL only under the explicit rule. All
 * three tensors must have the same shape. tol may be NULL (default rule, factor 2). */
FA_API fa_status fa_compare(const fa_tensor *cand, const fa_tensor *ref, const fa_tensor *baseline,
                            const fa_tolerance *tol, fa_comparison *result);

/*
 * Convention profiles: what a kernel family's interface means where the families disagree,
 * so that a check compares like with like (README.md, "Convention profiles", gives each
 * fact's source). "flashattn" is this library's own; the others are "fa2", "fa3", "pytorch",
 * "flashinfer", "xformers", "ggml" and "flex" (FlexAttention, with its BlockMask).
 * fa_profile_at(i) lists them (NULL past the last).
 */
typedef enum {
    FA_EMPTY_LSE_NEG_INF, /* a row with no allowed key carries LSE -inf (this library)        */
    FA_EMPTY_LSE_POS_INF, /* ... +inf (FlashAttention-2)                                       */
    FA_EMPTY_LSE_ANY      /* the kernels write no defined value there: not compared           */
} fa_empty_lse;

/* What a kernel family writes to O for a row with no allowed key (a mask or bias that masks the
 * whole row): 0 (this library, FlashAttention), NaN (softmax over -inf only), or no defined
 * value (not compared). */
typedef enum { FA_EMPTY_OUT_ZERO, FA_EMPTY_OUT_NAN, FA_EMPTY_OUT_ANY } fa_empty_out;

typedef struct {
    const char    *name;
    fa_align       align;           /* what causal means when Sq != Sk                        */
    int            lse_base2;       /* the kernels' LSE is log2-sum-exp2 (FlashInfer)         */
    fa_empty_lse   empty_lse;       /* the LSE of a fully masked row                          */
    int            window_is_count; /* one window number W counts keys, the query's own
                                       included: window (W - 1, 0)                          */
    fa_score_order score_order;     /* ALiBi before or after softcap                          */
    int            has_lse;         /* the kernels return an LSE at all                       */
    fa_bias_place  bias_place;      /* where its mask or bias tensor enters the scores        */
    int            bias_by_slope;   /* its ALiBi slopes scale the bias (fa_params.bias_by_slope) */
    fa_empty_out   empty_out;       /* O of a row that a mask or bias masks entirely          */
    fa_descale_layout descale_layout; /* its FP8 descale factors' layout (fa3: per kv head)   */
} fa_profile;

FA_API const fa_profile *fa_profile_find(const char *name); /* NULL: no profile of that name */
FA_API const fa_profile *fa_profile_at(int i);

/* The options a caller of fa_profile_apply set itself, which the profile leaves as they are
 * (bits of its `given`). */
typedef enum {
    FA_GIVEN_ALIGN = 1,
    FA_GIVEN_SCORE_ORDER = 2,
    FA_GIVEN_BIAS_PLACE = 4,
    FA_GIVEN_BIAS_BY_SLOPE = 8
} fa_given;

/*
 * The params of a call as the profile's kernel family means the options its caller left to it:
 * p->align, p->score_order and p->bias_place take the profile's values, and p->bias_by_slope
 * the profile's where p has both alibi_slopes and a bias (else 0), each unless `given` holds
 * its FA_GIVEN_ bit. `window`, where not NULL, is the family's one window number W: for a
 * window_is_count profile (xformers, ggml) a count of keys, the query's own included, W >= 1:
 * window (W - 1, 0); for the others the left bound: window (W, -1) (causal bounds the right;
 * fa_forward checks W as it checks window_left). FA_ERR_INVALID_ARGUMENT for a count below 1,
 * with p untouched. The `flashattn` command's --profile and the Python package's
 * check(profile=) apply a profile this way, once every other field of p is set.
 */
FA_API fa_status fa_profile_apply(const fa_profile *pf, fa_params *p, const int64_t *window,
                                  unsigned given);
/*
 * How an LSE candidate is judged (docs/DESIGN.md §4; flashattn check and flashattn.check call
 * this): for a kernel whose outputs are stored in `storage`, whose LSE is saved in
 * `lse_dtype`, with FP8 inputs or not, under `profile` (NULL: this library's convention),
 * *yardstick is the dtype the conventional path runs in for the LSE's yardstick, on the
 * inputs rounded to `storage`: f32 for a 16-bit kernel's f32 or f64 LSE (FP8 inputs aside,
 * whose tensor cores accumulate in fewer bits), else `storage`. Where it is f32 there,
 * tol->allowance and tol->allowance_rel are FA_LSE16_ALLOWANCE (in the profile's units: x
 * log2(e) for a base-2 LSE) and FA_LSE16_ALLOWANCE_REL, else 0; tol's other fields are left
 * as they are. FA_ERR_NULL_POINTER for a NULL yardstick or tol, FA_ERR_DTYPE for a dtype that
 * is not one.
 */
FA_API fa_status fa_lse_rule(const fa_profile *profile, fa_dtype storage, fa_dtype lse_dtype,
                             int fp8_inputs, fa_dtype *yardstick, fa_tolerance *tol);
/* An LSE tensor (f32 or f64) rewritten in place from this library's convention (natural log,
 * -inf for an empty row) to the profile's, or back. */
FA_API fa_status fa_lse_to_profile(const fa_profile *pf, fa_tensor *lse);
FA_API fa_status fa_lse_from_profile(const fa_profile *pf, fa_tensor *lse);

/* Converts n elements from src (dtype sd) to dst (dtype dd): widening is exact, narrowing
 * rounds to nearest even once, straight from the source precision. To or from q8_0 / q4_0, n
 * is a multiple of 32 (else FA_ERR_SHAPE): a block format's values dequantize exactly, and
 * quantizing takes the values rounded to f32 through ggml's reference rule (docs/DESIGN.md
 * §1), all finite (else FA_ERR_INVALID_ARGUMENT, nothing written). */
FA_API fa_status fa_convert(const void *src, fa_dtype sd, void *dst, fa_dtype dd, size_t n);

FA_API const char *fa_version_string(void);
FA_API const char *fa_dtype_name(fa_dtype d);
FA_API const char *fa_backend_name(fa_backend b);
FA_API const char *fa_isa_name(fa_isa i);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */
