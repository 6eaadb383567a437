/*
 * The training step of the report's §7.1 section: a small pre-norm transformer written on
 * OpenBLAS GEMMs and this library's attention, forward, backward and an Adam step.
 */
#ifndef FA_REPORT_TRAIN_H
#define FA_REPORT_TRAIN_H

#include <stddef.h>

#include "flashattn.h"

typedef struct {
    int layers, dmodel, dff, heads, batch, seqlen;
} train_shape;

typedef struct {
    double step_s;      /* one whole step: forward, backward, optimizer (best of the steps) */
    double attn_s;      /* of which inside fa_forward / fa_backward                           */
    double loss_first, loss_last;
    size_t peak_bytes;  /* the model's own buffers plus the attention context's peak           */
} train_result;

/* `steps` steps of the model (seed-fixed weights and batch) with attention on backend `be`. */
int train_run(const train_shape *sh, fa_backend be, int threads, int steps, train_result *r);

/* The largest relative error of the step's gradient against a central difference of the loss,
 * along the gradient of each weight matrix in turn (a 2-layer f32 model; INFINITY when a call
 * fails): the check that the hand-written backward is the forward's. */
double train_gradient_error(void);

#endif
