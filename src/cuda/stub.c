/* The CUDA backend of a build without CUDA: never available (the context's creation says
 * so), holding no memory, so no other file needs to know whether CUDA was built. */
#include "config.h"

#include "base/base.h"
#include "backends/table.h"

#define FAI_NO_CUDA "backend cuda: this build has no CUDA backend (configure --enable-cuda)"

static int unavailable_here(void)
{
    fai_fail(FA_ERR_BACKEND_UNAVAILABLE, FAI_NO_CUDA);
    return 0;
}

static fa_status unavailable(fa_context *ctx, const fai_problem *pr)
{
    (void)ctx;
    (void)pr;
    return fai_fail(FA_ERR_BACKEND_UNAVAILABLE, FAI_NO_CUDA);
}

const fai_backend fai_backend_cuda = {
    .name = "cuda",
    .device_memory = 1,
    .ops = {[FAI_OP_FORWARD] = unavailable, [FAI_OP_BACKWARD] = unavailable},
    .available = unavailable_here,
};
