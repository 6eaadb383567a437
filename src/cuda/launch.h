/*
 * The boundary between the CUDA backend's host side (backend.c, C: argument checks, device
 * memory, the context's counters) and its kernels (*.cu, C++ through nvcc). Everything crosses
 * as plain data: resolved dims, the mask and score of src/core/score.h, the Philox key, and
 * device pointers with element strides. No fa_context (its atomics are C11 only) crosses.
 */
#ifndef FAI_CUDA_LAUNCH_H
#define FAI_CUDA_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include "core/philox.h"
#include "core/score.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor on the device: element (b, s, h, d) is at data + b*sb + s*ss + h*sh + d. */
typedef struct {
    void *data;
    int64_t sb, ss, sh;
} fai_cuda_view;

/* A tensor in the bias's shape (fa_params.bias, or its gradient) on the device: dims B or 1,
 * Sq or 1, Hq or 1 and Sk; entry (b, i, h, j) at data + b*sb + i*ss + h*sh + j (elements). The
 * host side sets the stride of a dim of 1 to 0, so the kernels index every dim with the
 * problem's own (b, i, h): a broadcast dim reads its index 0. data NULL: no such tensor. */
typedef struct {
    void *data;
    int dtype; /* fa_dtype: f32, f64, f16, bf16 or bool (a keep-mask) for the bias; f32 or f64
                  for its gradient */
    int64_t b, s, h, sk;
    int64_t sb, ss, sh;
} fai_cuda_bias_view;

/* A block-sparse mask's map on the device (fai_block_map, backends/blocks.h): key j is listed
 * for row i of (b, h) iff listed[((b' heads + h') q_blocks + i / q_block) kv_blocks + j /
 * kv_block] is nonzero, b' = b unless batch is 1 (then 0), h' likewise. listed NULL: no block
 * mask. */
typedef struct {
    const unsigned char *listed;
    int64_t batch, heads, q_block, kv_block, q_blocks, kv_blocks;
} fai_cuda_block_view;

typedef struct {
    int dtype;    /* fa_dtype of out, dout, dq (and q, k, v, dk, dv but for FP8 q or a cache
                     dtype) */
    int q_dtype;  /* of q: dtype, or FA_E4M3 / FA_E5M2 (a forward's FP8 q; k, v then the same) */
    int kv_dtype; /* of k, v: dtype, or a forward's f16 / bf16 / FP8 cache under f32 / bf16 q,
                     or FP8 q's format */
    int lse_f64; /* the LSE tensor is f64 (else f32) */
    int64_t b, hq, hk, sq, sk, dqk, dv, group;
    fai_mask mask;
    fai_score score;
    const float *slopes;          /* device copy of the Hq ALiBi slopes, or NULL */
    const float *sinks;           /* device copy of the Hq sink logits (forward), or NULL */
    fai_dropout_params drop;      /* seed, offset, threshold (0: off); a kernel derives head
                                     (b, h)'s stream from it (common.cuh: fai_drop_head) */
    int64_t seq0;                 /* the call's index of batch 0 (a sequence's, in a call of
                                     sequences): dropout head (seq0 + b) Hq + h */
    const int64_t *table;         /* a paged K/V: the device page table, batch b's row at
                                     b * table_stride (key j: row j % page_size of page
                                     table[.. + j / page_size]); NULL: rows at tk, tv */
    int64_t page_size, table_stride;
    double keep_scale;            /* 1 / (1 - p) */
    fai_cuda_view tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv; /* the tensors */
    fai_cuda_view tkn, tvn;       /* a cache's new keys and values (fa_forward_kvcache) */
    fai_cuda_bias_view bias;      /* fa_params.bias (score.bias says where it enters), or data
                                     NULL; only the generic kernels read it */
    fai_cuda_bias_view bias_grad; /* the backward's d loss / d bias, or data NULL */
    fai_cuda_block_view blocks;   /* the block mask's map (device copy), or listed NULL; only
                                     the generic kernels read it */
    const double *descale;        /* FP8 descales (device copy), or NULL (all 1): descale[x] =
                                     descale_q descale_k of (b, kv head) x (the score scale's
                                     factor, exact in double), descale[descale_n + x] = descale_v;
                                     x = (seq0 + b) Hk + hk per (batch, kv head), else 0 */
    int64_t descale_n;            /* B Hk per (batch, kv head), else 1 */
    int descale_per_head;
    void *work;                   /* device workspace of fai_cuda_backward_workspace bytes */
    void *stream;                 /* cudaStream_t */
    int deterministic;
    int kernel;                   /* fai_cuda_kernel, from FA_CUDA_KERNEL */
} fai_cuda_args;

/* Which kernels may run (FA_CUDA_KERNEL, for tests and measurements): the fastest that applies
 * (unset), the mma.sync tensor-core kernels and below ("mma": no wgmma), or the FMA path for
 * every dtype ("generic"). */
typedef enum { FAI_CUDA_KERNEL_AUTO, FAI_CUDA_KERNEL_MMA, FAI_CUDA_KERNEL_GENERIC } fai_cuda_kernel;

typedef enum { FAI_CUDA_OK, FAI_CUDA_UNSUPPORTED, FAI_CUDA_DEVICE_ERROR } fai_cuda_result;

/* Whether the kernels take a's head dims (FAI_CUDA_UNSUPPORTED and why in err if not). */
fai_cuda_result fai_cuda_supported(const fai_cuda_args *a, char *err, size_t n);
/* Launch the forward / backward on a->stream. On failure `err` (n bytes) says why. Nothing is
 * launched when the result is FAI_CUDA_UNSUPPORTED. */
fai_cuda_result fai_cuda_forward(const fai_cuda_args *a, char *err, size_t n);
fai_cuda_result fai_cuda_backward(const fai_cuda_args *a, char *err, size_t n);
/* Device workspace bytes the backward needs for these args (0 for none). */
size_t fai_cuda_backward_workspace(const fai_cuda_args *a);
/* grad[h] += d loss / d sink_h over a's rows (core/gradient.h, fai_dsink_term: in double, from
 * its out, lse and dout; a's sinks on the device). One launch per group, in order. */
fai_cuda_result fai_cuda_sink_grad(const fai_cuda_args *a, double *grad, char *err, size_t n);
/* d loss / d bias into a's bias_grad (core/gradient.h, fai_dbias): one thread per element of
 * the gradient, summing in a fixed order over the (b, h, i) that read it, P and dP recomputed
 * from q, k, v, dout and the forward's LSE, D_i from the generic backward's workspace (so it
 * runs after fai_cuda_backward on the same a, with the generic kernels). No atomics: the same
 * bits at every run. */
fai_cuda_result fai_cuda_bias_grad(const fai_cuda_args *a, char *err, size_t n);
/* Copies rows [0, n) of batch 0 of a's tkn and tvn (Hk heads of Dqk and Dv elements, its
 * kv_dtype) to key rows [at, at + n) of batch 0 of its k and v, through its page table where it
 * has one. */
fai_cuda_result fai_cuda_append(const fai_cuda_args *a, int64_t n, int64_t at, char *err,
                                size_t errn);

#ifdef __cplusplus
}
#endif
#endif
