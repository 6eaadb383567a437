/*
 * The CUDA backend's launch plan: the one place that decides, for a call's kernel arguments,
 * which kernels run its forward and its backward, and says why (plan.cu). The dispatchers
 * (generic.cu, bwd_mma.cu) run what it names; the kernels' entry points ask nothing again.
 *
 * Today it chooses the family; the tile shapes, pipeline depth and scheduling still live in
 * each family's launcher (the `by_dim` switches) and move here next (docs/notes/cuda.md, "The
 * frontier").
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

typedef struct {
    fai_cuda_family family;
    const char *why; /* static text: the rule that ruled out the next faster family, or what
                        made this one apply */
} fai_cuda_plan;

/* The plan of a's forward, and of its backward (the backward's dQ/dK/dV kernels; the generic
 * kernels' D_i pass and their fallback on non-finite inputs run beside the tensor-core ones,
 * bwd_mma.cu says how). Asks the current device's compute capability. */
fai_cuda_plan fai_cuda_plan_forward(const fai_cuda_args *a);
fai_cuda_plan fai_cuda_plan_backward(const fai_cuda_args *a);

#ifdef __cplusplus
}
#endif
#endif
