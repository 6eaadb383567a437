/* fa_convert: storage conversions for callers, through float64 (one rounding, at the store). */
#include "config.h"

#include "base/base.h"
#include "base/dtype.h"

fa_status fa_convert(const void *src, fa_dtype sd, void *dst, fa_dtype dd, size_t n)
{
    const int bad_s = (unsigned)sd > FA_E5M2 || sd == FA_BOOL,
              bad_d = (unsigned)dd > FA_E5M2 || dd == FA_BOOL;
    if (bad_s || bad_d)
        return fai_fail(FA_ERR_DTYPE, "fa_convert: %s is not a value dtype (f32, f64, f16, bf16, "
                                      "e4m3, e5m2)", bad_s ? "sd" : "dd");
    if (n > 0 && (!src || !dst))
        return fai_fail(FA_ERR_NULL_POINTER, "fa_convert: %s is NULL", src ? "dst" : "src");
    double chunk[256]; /* f64 holds every source value exactly: one rounding, at the store */
    const size_t ss = fai_dtype_size(sd), ds = fai_dtype_size(dd);
    for (size_t i = 0; i < n; i += 256) {
        const int64_t m = (int64_t)(n - i < 256 ? n - i : 256);
        fai_load_f64((const char *)src + i * ss, sd, m, chunk);
        fai_store_f64((char *)dst + i * ds, dd, m, chunk);
    }
    return FA_OK;
}
