/*
 * The layouts of context parallelism (flashattn_mpi.h): which global rows a rank holds. Pure
 * arithmetic, no communicator.
 */
#include "config.h"

#include "flashattn_mpi.h"
#include "api/api.h"

/* Row where chunk c of n chunks of a sequence of s rows starts: floor(c s / n), exact for
 * s < 2^40 and n < 2^22 (their product stays below 2^63). */
static int64_t chunk_start(int64_t s, int64_t c, int64_t n) { return c * s / n; }

fa_status fa_cp_local_size(fa_cp_layout layout, int64_t seqlen, int ranks, int rank,
                           fa_cp_shard *shard)
{
    if (!shard)
        return fai_fail(FA_ERR_NULL_POINTER, "fa_cp_local_size: shard is NULL");
    if (layout != FA_CP_CONTIGUOUS && layout != FA_CP_ZIGZAG)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "layout = %d is not a fa_cp_layout",
                        (int)layout);
    if (ranks < 1 || ranks > (1 << 20) || rank < 0 || rank >= ranks)
        return fai_fail(FA_ERR_INVALID_ARGUMENT, "rank %d of %d ranks; ranks are in [1, 2^20] "
                                                 "and rank in [0, ranks)", rank, ranks);
    if (seqlen < 0 || seqlen > FAI_DIM_MAX)
        return fai_fail(FA_ERR_SHAPE, "seqlen = %lld; it is in [0, 2^40]", (long long)seqlen);
    fa_cp_shard s = {.seqlen = seqlen};
    if (layout == FA_CP_CONTIGUOUS) {
        s.parts = 1;
        s.first[0] = chunk_start(seqlen, rank, ranks);
        s.count[0] = chunk_start(seqlen, rank + 1, ranks) - s.first[0];
    } else {
        const int64_t n = 2 * (int64_t)ranks, c[2] = {rank, n - 1 - rank};
        s.parts = 2;
        for (int x = 0; x < 2; x++) {
            s.first[x] = chunk_start(seqlen, c[x], n);
            s.count[x] = chunk_start(seqlen, c[x] + 1, n) - s.first[x];
        }
    }
    s.local = s.count[0] + s.count[1];
    *shard = s;
    return FA_OK;
}
