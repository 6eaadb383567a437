/*
 * What a problem with nothing to compute gives (backends/empty.h), written on the host: zeros
 * and, for a forward's rows, the LSE of a row with no key (the sink's logit, or -inf).
 */
#include "config.h"

#include <string.h>

#include "backends/empty.h"
#include "backends/rows.h"

/* Zeroes `dim` elements of each of rows [0, n) of every (batch, head) of role r. */
static void zero_rows(const fai_problem *pr, fai_role r, int64_t heads, int64_t n, int64_t dim)
{
    if (n == 0) /* no row, and the batch alone may be 2^40: no loop over it */
        return;
    const int kv = r == FAI_DK || r == FAI_DV;
    const size_t bytes = (size_t)dim * fai_dtype_size(fai_role_dtype(pr, r));
    for (int64_t b = 0; b < pr->b; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t i = 0; i < n; i++)
                memset(kv ? fai_kv_row(pr, r, b, h, i) : fai_q_row(pr, r, b, h, i), 0, bytes);
}

/* Zeroes the bias gradient (host memory): the gradient of a call with no (query, key) pair. */
static void zero_bias_grad(const fai_problem *pr)
{
    const fa_tensor *g = pr->bias_grad;
    const size_t row = (size_t)g->headdim * fai_dtype_size(g->dtype);
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t h = 0; h < g->heads; h++)
            for (int64_t i = 0; i < g->seqlen; i++)
                memset(fai_bias_row_of(g, b, h, i), 0, row);
}

void fai_write_empty(const fai_problem *pr, int backward)
{
    if (backward) { /* no (query, key) pair: every gradient is 0 */
        zero_rows(pr, FAI_DQ, pr->hq, pr->sq, pr->dqk);
        zero_rows(pr, FAI_DK, pr->hk, pr->sk, pr->dqk);
        zero_rows(pr, FAI_DV, pr->hk, pr->sk, pr->dv);
        if (pr->bias_grad)
            zero_bias_grad(pr);
        return;
    }
    zero_rows(pr, FAI_OUT, pr->hq, pr->sq, pr->dv); /* no key: O = 0, LSE = the sink's */
    if (fai_io(pr, FAI_LSE) && pr->sq > 0)
        for (int64_t b = 0; b < pr->b; b++)
            for (int64_t h = 0; h < pr->hq; h++)
                for (int64_t i = 0; i < pr->sq; i++)
                    fai_lse_write(pr, b, h, i, fai_sink(pr, h));
}
