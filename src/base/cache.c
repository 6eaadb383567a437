/* The machine's cache sizes, which the tile plan is sized to (backends/tiled/plan.c). */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

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
