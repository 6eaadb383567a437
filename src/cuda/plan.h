/*
 * The CUDA backend's launch plan: the one place that decides, for a call's kernel arguments,
 * which kernels run its forward and its backward, with which tile, and says why (plan.cu). The
 * dispatchers (generic.cu, bwd_mma.cu) run what it names; each family's launcher maps the
 * plan's tile to one of its compiled instances and asks nothing again.
 *
 * Still in the launchers: the grid order (heavy query tiles first) and the generic kernels'
 * launch shapes (one warp a row, no tile); persistent scheduling is the next entry here
 * (docs/notes/cuda.md, "The frontier").
 */
#ifndef FAI_CUDA_PLAN_H
#define FAI_CUDA_PLAN_H

#include "launch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FAI_CUDA_GENERIC, /* the FMA kernels: every dtype, head dim, layout and feature */
    FAI_CUDA_MMA,     /* the mma.sync tensor-core kernels (sm_80 and up) */
    FAI_CUDA_WGMMA,   /* the Hopper kernels: TMA producer, wgmma consumers (sm_90a image) */
} fai_cuda_family;

/* A block's tile. Forward: bq query rows a block, bk keys a step. Backward: bk keys a block, bq
 * queries a step. stages: the depth of the TMA pipeline (wgmma; 0 for mma.sync, whose cp.async
 * double buffer is fixed). All 0 for the generic kernels (a warp a row, no tile). */
typedef struct {
    int bq, bk, stages;
} fai_cuda_tile;

typedef struct {
    fai_cuda_family family;
    const char *why; /* static text: the rule that ruled out the next faster family, or what
                        made this one apply */
    fai_cuda_tile tile;
} fai_cuda_plan;

/* The plan of a's forward, and of its backward (the backward's dQ/dK/dV kernels; the generic
 * kernels' D_i pass and their fallback on non-finite inputs run beside the tensor-core ones,
 * bwd_mma.cu says how). Asks the current device's compute capability. */
fai_cuda_plan fai_cuda_plan_forward(const fai_cuda_args *a);
fai_cuda_plan fai_cuda_plan_backward(const fai_cuda_args *a);

/* The plan as one line, "wgmma q128 k64 x2 (why)" (snprintf's return value). */
int fai_cuda_plan_format(const fai_cuda_plan *p, char *buf, size_t n);

/* The plans of a bf16 self-attention call of 4096 rows with the scale alone, at D 64, 96, 128
 * and 256, on the current device under FA_CUDA_KERNEL choice `kernel` (fai_cuda_kernel): what
 * fa_context_describe prints of a CUDA context. */
void fai_cuda_plan_describe(int kernel, char *buf, size_t n);

/* A launcher handed a tile it has no instance of (plan.cu and the family's instances
 * disagree): FAI_CUDA_UNSUPPORTED, and err names both. */
fai_cuda_result fai_cuda_no_instance(const char *what, const fai_cuda_args *a,
                                     const fai_cuda_tile *t, char *err, size_t n);

#ifdef __cplusplus
}
#endif
#endif
