/*
 * What the benchmarks share: a monotonic clock, a comma-separated list of integers from the
 * command line, and normal draws.
 */
#ifndef FA_BENCH_UTIL_H
#define FA_BENCH_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A N(0, 1) draw from the splitmix64 stream *state (two uniforms in (0, 1), Box-Muller). */
static inline double normal_draw(uint64_t *state)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        u[i] = ((double)(z >> 11) + 0.5) * 0x1p-53;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
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
