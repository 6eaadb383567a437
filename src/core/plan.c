/*
 * Tile-size policy for the CPU backends, in one place.
 *
 * The tiled backend works on a query tile of Bq rows against a key tile of Bk keys: the score
 * tile S = Q K^T and its probabilities P (Bq x Bk each) and the product P V are formed by the
 * ISA's GEMM micro-kernel (src/simd/), which streams the packed K^T panel (Dqk x Bk) and V
 * panel (Bk x Dv) once per MR rows of the query tile. Per key tile, the row work outside the
 * GEMMs (pipeline, max, rescale, exp) is a fixed cost per row, so Bk should be as large as the
 * panels allow while they stay in L2 next to Q, S, P and the accumulators.
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
 * Bk: the two key panels, K^T and V, fill at most 1/4 of L2 (256 KiB of a 1 MiB L2): a power
 * of two in [16, 256]. Bq: 128 rows, fewer only when Q, S, P and the accumulators
 * (Bq x (Dqk + Dv + 2 Bk)) would pass half of L2.
 *
 * Measured (bench_attention --tile-sweep, B=1 H=4 N=2048 f32 non-causal, 1 thread, best of 5,
 * two runs, AMD EPYC Zen 5 with 48 KiB L1d / 1 MiB L2, AVX-512 12x32 kernel with registers
 * kept; NOTES.md keeps the whole sweeps). With the fast kernels the per-row work of a key tile
 * (max, rescale, exp) is what large Bk amortizes:
 *   D=128: rule 128x256 -> 44.2-45.0 ms; best 256x128 44.1-44.2, 128x128 44.8-45.6,
 *          128x64 (the rule before) 47.9-47.2; backward 128x256 232 ms vs 128x64 287;
 *   D=64:  rule 128x256 -> 25.4-25.8 ms, the best of the 14 tiles tried (128x128: 26.3-26.6).
 */
fai_tiles fai_plan_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    fai_tiles t;
    t.bk = clamp64(floor_pow2((ci->l2 / 4) / ((dqk + dv) * (int64_t)es)), 16, 256);
    int64_t per_row = (dqk + dv + 2 * t.bk) * (int64_t)es;
    t.bq = clamp64(floor_pow2((ci->l2 / 2) / per_row), 16, 128);
    return t;
}
