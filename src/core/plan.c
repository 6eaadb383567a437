/*
 * Tile-size policy for the CPU backends, in one place.
 *
 * The portable tiled kernels (src/tiled.c) stream a key tile through every row of a query
 * tile twice: once as K^T (Dqk x Bk) to form S = Q K^T row by row, once as V (Bk x Dv) to form
 * acc += P V. Each row's pass touches the whole key tile, so the key tile is what must stay in
 * L1; the query tile, its accumulators and the score tile are touched once per key tile and can
 * live in L2.
 */
#include "config.h"

#include "plan.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Used when neither sysconf nor sysfs answers: the smallest L1d/L2 of x86-64 and ARMv8 server
 * cores in use today (Skylake-SP: 32 KiB / 1 MiB), so the plan errs towards tiles that fit. */
#define FAI_DEFAULT_L1D (32 * 1024)
#define FAI_DEFAULT_L2 (1024 * 1024)

static int64_t sysfs_cache_size(int level, const char *type)
{
    for (int idx = 0; idx < 8; idx++) {
        char path[96], buf[32];
        int lv = -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", idx);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        if (fscanf(f, "%d", &lv) != 1)
            lv = -1;
        fclose(f);
        if (lv != level)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", idx);
        if (!(f = fopen(path, "r")))
            continue;
        int type_ok = fgets(buf, sizeof buf, f) && strncmp(buf, type, strlen(type)) == 0;
        fclose(f);
        if (!type_ok)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        if (!(f = fopen(path, "r")))
            continue;
        long kib = 0;
        char unit = 0;
        int got = fscanf(f, "%ld%c", &kib, &unit);
        fclose(f);
        if (got >= 1 && kib > 0)
            return (int64_t)kib * (unit == 'M' ? 1024 * 1024 : 1024);
    }
    return 0;
}

void fai_cache_detect(fai_cache_info *ci)
{
    long l1 = 0, l2 = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (l1 > 0 && l2 > 0) {
        ci->l1d = l1;
        ci->l2 = l2;
        ci->source = "sysconf";
        return;
    }
    ci->l1d = sysfs_cache_size(1, "Data");
    ci->l2 = sysfs_cache_size(2, "Unified");
    if (ci->l1d > 0 && ci->l2 > 0) {
        ci->source = "sysfs";
        return;
    }
    ci->l1d = FAI_DEFAULT_L1D;
    ci->l2 = FAI_DEFAULT_L2;
    ci->source = "default";
}

static int64_t floor_pow2(int64_t x)
{
    int64_t p = 1;
    while (p * 2 <= x)
        p *= 2;
    return p;
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/*
 * Bk: the larger of the two key-tile layouts (K^T or V) takes at most half of L1d, leaving the
 * other half for the streaming query row, its score row and its accumulator row. Rounded down
 * to a power of two, clamped to [8, 256]: below 8 the per-tile rescale of the accumulators
 * (Bq x Dv multiplies per Bk keys) is no longer small against the Bk x (Dqk + Dv) work.
 *
 * Bq: the query tile (Bq x Dqk), its accumulators (Bq x Dv) and score tile (Bq x Bk), plus both
 * key-tile layouts, fill at most half of L2; clamped to [16, 128]. Larger Bq converts and packs
 * each key tile fewer times; 128 rows already amortize that to < 1% of the tile's flops.
 *
 * Measured (bench_attention --tile-sweep, B=1 H=4 N=2048 f32 non-causal, 1 thread, best of 3,
 * AMD EPYC with 48 KiB L1d / 1 MiB L2, portable kernels; NOTES.md keeps the whole sweep):
 *   D=64:  rule 128x64 -> 884 ms; best tried 128x128 866 ms (2%); Bk = 16 costs 11-15%.
 *   D=128: rule 128x32 -> 1434 ms; best tried 128x64 1426 ms (0.6%); Bk = 16 costs 11-18%.
 * The SIMD kernels (issue 3) will need their own rule and their own measurement.
 */
fai_tiles fai_plan_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    fai_tiles t;
    int64_t dmax = dqk > dv ? dqk : dv;
    t.bk = clamp64(floor_pow2((ci->l1d / 2) / (dmax * (int64_t)es)), 8, 256);
    int64_t kv_bytes = 2 * t.bk * (dqk + dv) * (int64_t)es;
    int64_t budget = ci->l2 / 2 - kv_bytes;
    int64_t per_row = (dqk + dv + t.bk) * (int64_t)es;
    t.bq = clamp64(floor_pow2(budget > per_row ? budget / per_row : 1), 16, 128);
    return t;
}
