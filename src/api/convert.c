/* fa_convert: storage conversions for callers, through float64 (one rounding, at the store). */
#include "config.h"

#include <math.h>

#include "base/base.h"
#include "base/dtype.h"

fa_status fa_convert(const void *src, fa_dtype sd, void *dst, fa_dtype dd, size_t n)
{
    const int bad_s = (unsigned)sd > FA_Q4_0 || sd == FA_BOOL,
              bad_d = (unsigned)dd > FA_Q4_0 || dd == FA_BOOL;
    if (bad_s || bad_d)
        return fai_fail(FA_ERR_DTYPE, "fa_convert: %s is not a value dtype (f32, f64, f16, bf16, "
                                      "e4m3, e5m2, q8_0, q4_0)", bad_s ? "sd" : "dd");
    if ((fai_dtype_is_block(sd) || fai_dtype_is_block(dd)) && n % FAI_QBLOCK != 0)
        return fai_fail(FA_ERR_SHAPE, "fa_convert: n = %zu is not a multiple of 32, the block "
                                      "of %s", n, fa_dtype_name(fai_dtype_is_block(sd) ? sd : dd));
    if (n > 0 && (!src || !dst))
        return fai_fail(FA_ERR_NULL_POINTER, "fa_convert: %s is NULL", src ? "dst" : "src");
    double chunk[256]; /* f64 holds every source value exactly: one rounding, at the store */
    if (fai_dtype_is_block(dd)) /* nothing written unless every value can be quantized */
        for (size_t i = 0; i < n; i += 256) {
            const int64_t m = (int64_t)(n - i < 256 ? n - i : 256);
            fai_load_f64((const char *)src + fai_dtype_bytes(sd, (int64_t)i), sd, m, chunk);
            for (int64_t e = 0; e < m; e++)
                if (!isfinite((float)chunk[e]))
                    return fai_fail(FA_ERR_INVALID_ARGUMENT,
                                    "fa_convert: src[%zu] = %g; %s quantizes finite f32 values "
                                    "only", i + (size_t)e, chunk[e], fa_dtype_name(dd));
        }
    for (size_t i = 0; i < n; i += 256) {
        const int64_t m = (int64_t)(n - i < 256 ? n - i : 256);
        fai_load_f64((const char *)src + fai_dtype_bytes(sd, (int64_t)i), sd, m, chunk);
        fai_store_f64((char *)dst + fai_dtype_bytes(dd, (int64_t)i), dd, m, chunk);
    }
    return FA_OK;
}
