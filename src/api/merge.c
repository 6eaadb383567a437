/*
 * fa_merge_states: partial attention states over disjoint key sets combined by core's merge
 * (core/recurrence.h), in float64, one row per task. It runs on no backend: the states may
 * come from any.
 */
#include "config.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/api.h"
#include "core/recurrence.h"

/* The same view of the same memory: every field alike. */
static int same_view(const fa_tensor *a, const fa_tensor *b)
{
    return a->data == b->data && a->dtype == b->dtype && a->batch == b->batch &&
           a->seqlen == b->seqlen && a->heads == b->heads && a->headdim == b->headdim &&
           a->batch_stride == b->batch_stride && a->seq_stride == b->seq_stride &&
           a->head_stride == b->head_stride;
}

fa_status fa_merge_states(int n, const fa_tensor *outs, const fa_tensor *lses, fa_tensor *out,
                          fa_tensor *lse)
{
    if (n < 1)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "n = %d; at least one state is needed", n);
    if (!outs || !lses)
        return fai_fail(FA_ERR_NULL_POINTER, "%s is NULL", outs ? "lses" : "outs");
    FAI_TRY(fai_check_tensor(out, "out", FAI_OUTPUT, 0));
    if (fai_dtype_is_fp8(out->dtype) || fai_dtype_is_block(out->dtype)) /* no output is */
        return fai_fail(FA_ERR_DTYPE, "out->dtype = %s; states are f32, f64, f16 or bf16",
                        fa_dtype_name(out->dtype));
    FAI_TRY(fai_check_tensor(lse, "lse", FAI_OUTPUT, 1));
    FAI_TRY(fai_check_shape(lse, "lse", out->batch, out->seqlen, out->heads, 1, "out"));
    for (int k = 0; k < n; k++) {
        char name[40];
        snprintf(name, sizeof name, "outs[%d]", k);
        FAI_TRY(fai_check_tensor(&outs[k], name, FAI_INPUT, 0));
        if (fai_dtype_is_fp8(outs[k].dtype) || fai_dtype_is_block(outs[k].dtype))
            return fai_fail(FA_ERR_DTYPE, "%s->dtype = %s; states are f32, f64, f16 or bf16",
                            name, fa_dtype_name(outs[k].dtype));
        FAI_TRY(fai_check_shape(&outs[k], name, out->batch, out->seqlen, out->heads,
                                out->headdim, "out"));
        snprintf(name, sizeof name, "lses[%d]", k);
        FAI_TRY(fai_check_tensor(&lses[k], name, FAI_INPUT, 1));
        FAI_TRY(fai_check_shape(&lses[k], name, out->batch, out->seqlen, out->heads, 1, "out"));
    }
    /* In place: out (lse) may be the very view of a state's O (LSE), since each row reads all
     * its states before it writes; any other shared byte is refused. */
    FAI_TRY(fai_check_disjoint(lse, "lse", out, "out"));
    for (int k = 0; k < n; k++) {
        char oname[40], lname[40];
        snprintf(oname, sizeof oname, "outs[%d]", k);
        snprintf(lname, sizeof lname, "lses[%d]", k);
        if (!same_view(out, &outs[k]))
            FAI_TRY(fai_check_disjoint(out, "out", &outs[k], oname));
        FAI_TRY(fai_check_disjoint(out, "out", &lses[k], lname));
        if (!same_view(lse, &lses[k]))
            FAI_TRY(fai_check_disjoint(lse, "lse", &lses[k], lname));
        FAI_TRY(fai_check_disjoint(lse, "lse", &outs[k], oname));
    }
    const int64_t D = out->headdim, rows = out->batch * out->seqlen * out->heads;
    const int nt = omp_get_max_threads();
    size_t per = 0, all = 0;
    if (!fai_mul_size((size_t)(2 * D + n), sizeof(double), &per) ||
        !fai_mul_size(per, (size_t)nt, &all))
        return fai_fail(FA_ERR_OVERFLOW, "fa_merge_states: scratch size overflows");
    double *scratch = fai_fault_now() ? NULL : malloc(all);
    if (!scratch)
        return fai_fail(FA_ERR_NO_MEMORY, "fa_merge_states: %zu bytes of scratch", all);

#pragma omp parallel num_threads(nt)
    {
        double *acc = scratch + (size_t)omp_get_thread_num() * (per / sizeof(double));
        double *row = acc + D, *l = row + D;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t h = r % out->heads, s = (r / out->heads) % out->seqlen,
                    b = r / (out->heads * out->seqlen);
            for (int k = 0; k < n; k++)
                l[k] = fai_lse_load(&lses[k], b, h, s);
            double L = fai_merge_lse_f64(l, n);
            for (int64_t d = 0; d < D; d++)
                acc[d] = 0;
            for (int k = 0; k < n; k++) {
                double w = fai_merge_weight_f64(l[k], L);
                if (w == 0) /* dropped by selection: a neutral state's O is never read */
                    continue;
                fai_load_f64(fai_row(&outs[k], b, s, h), outs[k].dtype, D, row);
                for (int64_t d = 0; d < D; d++)
                    acc[d] += w * row[d];
            }
            fai_store_f64(fai_row(out, b, s, h), out->dtype, D, acc);
            fai_lse_store(lse, b, h, s, L);
        }
    }
    free(scratch);
    return FA_OK;
}
