/* The CUDA backend of a build without CUDA: every call reports it unavailable, so no other
 * file needs to know whether CUDA was built. */
#include "config.h"

#include "internal.h"

int fai_cuda_available(void)
{
    fai_fail(FA_ERR_BACKEND_UNAVAILABLE,
             "backend cuda: this build has no CUDA backend (configure --enable-cuda)");
    return 0;
}

int fai_cuda_is_device_pointer(const void *p)
{
    (void)p;
    return 0;
}

static fa_status unavailable(fa_context *ctx, const fai_problem *pr)
{
    (void)ctx;
    (void)pr;
    return fai_fail(FA_ERR_BACKEND_UNAVAILABLE,
                    "backend cuda: this build has no CUDA backend (configure --enable-cuda)");
}

const fai_backend fai_backend_cuda = {unavailable, unavailable};
