/*
 * What the benchmarks share: a monotonic clock, and a comma-separated list of integers from the
 * command line.
 */
#ifndef FA_BENCH_UTIL_H
#define FA_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The values of "a,b,c" into out (at most max, each in [lo, hi]): their count, 0 if malformed. */
static inline int parse_list(const char *s, long lo, long hi, long *out, int max)
{
    for (int n = 0;;) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || n == max || (*end != ',' && *end != '\0'))
            return 0;
        out[n++] = v;
        if (*end == '\0')
            return n;
        s = end + 1; /* past the comma */
    }
}

#endif
