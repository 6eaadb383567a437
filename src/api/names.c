/* Names of the public enums and the error detail: fa_status_string, fa_last_error,
 * fa_version_string and the *_name functions (backends and ISAs from their tables). */
#include "config.h"

#include "base/base.h"
#include "backends/table.h"
#include "simd/kernels.h"

const char *fa_last_error(void) { return fai_last_error_text(); }

const char *fa_status_string(fa_status s)
{
    switch (s) {
    case FA_OK: return "success";
    case FA_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERR_SHAPE: return "invalid or mismatched tensor shape";
    case FA_ERR_STRIDE: return "invalid tensor strides";
    case FA_ERR_DTYPE: return "invalid or mismatched dtype";
    case FA_ERR_UNSUPPORTED: return "not supported by this backend";
    case FA_ERR_OVERFLOW: return "size arithmetic overflows";
    case FA_ERR_NO_MEMORY: return "out of memory";
    case FA_ERR_BACKEND_UNAVAILABLE: return "backend or ISA unavailable";
    case FA_ERR_DEVICE: return "device error";
    case FA_ERR_COMMUNICATION: return "communication error";
    }
    return "unknown status";
}

const char *fa_version_string(void) { return PACKAGE_VERSION; }

const char *fa_dtype_name(fa_dtype d)
{
    switch (d) {
    case FA_F32: return "f32";
    case FA_F64: return "f64";
    case FA_F16: return "f16";
    case FA_BF16: return "bf16";
    case FA_BOOL: return "bool";
    case FA_E4M3: return "e4m3";
    case FA_E5M2: return "e5m2";
    case FA_Q8_0: return "q8_0";
    case FA_Q4_0: return "q4_0";
    }
    return "invalid";
}

const char *fa_backend_name(fa_backend b)
{
    if (b == FA_BACKEND_AUTO)
        return "auto";
    const fai_backend *be = fai_backend_of(b);
    return be ? be->name : "invalid";
}

const char *fa_isa_name(fa_isa i) { return fai_isa_name(i); }
