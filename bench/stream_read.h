/*
 * The decode benchmarks' yardstick, one definition for bench_decode.c and its peer
 * peers/ggml_decode.c: seconds to read a buffer once on nt threads, each taking an equal
 * contiguous part, in 16-float vectors. The buffer is STREAM_BYTES, larger than any cache here.
 */
#ifndef FA_BENCH_STREAM_READ_H
#define FA_BENCH_STREAM_READ_H

#include <omp.h>
#include <stddef.h>

#include "bench_util.h"

#define STREAM_BYTES ((size_t)1 << 30)

/* Seconds to read the n floats of x once on nt threads; their sum is added to *sink, so that
 * the reads cannot be dropped. */
static inline double stream_read(const float *x, size_t n, int nt, float *sink)
{
    float total = 0;
    const double t0 = now();
#pragma omp parallel num_threads(nt) reduction(+ : total)
    {
        const size_t per = n / (size_t)omp_get_num_threads();
        const size_t lo = per * (size_t)omp_get_thread_num();
        float acc[16] = {0};
        for (size_t i = lo; i + 16 <= lo + per; i += 16)
#pragma omp simd
            for (int l = 0; l < 16; l++)
                acc[l] += x[i + l];
        for (int l = 0; l < 16; l++)
            total += acc[l];
    }
    const double t = now() - t0;
    *sink += total;
    return t;
}

#endif
