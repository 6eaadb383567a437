/*
 * Tile-size policy for the CPU backends, in one place.
 *
 * The tiled backend works on a query tile of Bq rows against a key tile of Bk keys: the scores
 * S = Q K^T, their probabilities P and the product P V are formed by the ISA's GEMM
 * micro-kernel (src/simd/), which streams the packed K^T panel (Dqk x Bk) and V panel
 * (Bk x Dv) once per MR rows. The forward forms S and P a strip of Br rows at a time (Br x Bk
 * in L1); the backward holds whole Bq x Bk tiles. Each has its own rule below, with the
 * measurements behind it.
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

/* The key-tile bound both passes start from: the two key panels, K^T and V, fill at most 1/4
 * of L2 (256 KiB of a 1 MiB L2), a power of two in [16, 256]. */
static int64_t key_tile_max(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    return clamp64(floor_pow2((ci->l2 / 4) / ((dqk + dv) * (int64_t)es)), 16, 256);
}

/* Rows per strip: a multiple of the AVX-512, AVX2 and NEON kernels' MR (12, 6, 8), the largest
 * whose score strip (br x bk) fills at most half of L1d, at least 24 (the forward's rule caps it
 * at Bq). */
int64_t fai_plan_strip(const fai_cache_info *ci, int64_t bk, size_t es)
{
    const int64_t br = (ci->l1d / 2) / (bk * (int64_t)es) / 24 * 24;
    return br > 24 ? br : 24;
}

/*
 * Rows per strip for the tile products (AMX, bf16 storage), which take a strip in blocks of 16
 * rows: the largest multiple of 16 whose score strip fills at most 2/3 of L1d, at least 16
 * (32 rows with 256-key tiles and 48 KiB; fai_plan_strip's 24 left half of the second block
 * idle).
 * Measured (bench_attention, N=4096 H=8 D=128 bf16, 1 thread, best of 3, two rounds; the GPU
 * machine's Xeon with AMX, 48 KiB L1d / 2 MiB L2, 2026-12-01, host noisy by +-20%): strips of
 * 24 -> 210.8 / 195.4 GFLOP/s, 32 -> 263.2 / 293.0, 48 -> 239.2 / 189.1 (f32 storage in the
 * same rounds: 102.9 / 121.7).
 */
int64_t fai_plan_strip_tiles(const fai_cache_info *ci, int64_t bk)
{
    const int64_t br = (ci->l1d * 2 / 3) / (bk * (int64_t)sizeof(float)) / 16 * 16;
    return br > 16 ? br : 16;
}

/*
 * Forward. A query tile packs each key tile it visits once (K^T by transposes, V by copies)
 * and takes it in strips of br rows, each strip's scores formed, exponentiated and multiplied
 * by V while they are in L1. So Bk is the panel bound, and Bq is what amortizes the packing,
 * whose reads are K and V rows at the tensor's sequence stride (4 KiB for H=8, D=128 f32: one
 * row per page, which the hardware prefetchers do not follow). Against that, each key tile
 * streams the query tile's Q panels and acc through L2, sequentially, which they do follow;
 * so Bq is the largest power of two up to 4096 whose Q and acc take at most twice L2 (4096 rows
 * at D=128 with 2 MiB of L2; the workspace stays a few MiB a thread).
 *
 * Measured (bench_attention, N=4096 f32 non-causal, 1 thread, alternated rounds, best of each;
 * Intel Xeon (Emerald Rapids) with 48 KiB L1d / 2 MiB L2, 2026-12-01, host noisy by +-10%):
 *   H=8 D=128: 4096x256 -> 514.1-514.3 ms; 2048x256 519.6, 1024x256 523.5;
 *   H=8 D=64:  4096x256 -> 284.7 ms; 2048x256 287.9, 1024x256 288.1;
 *   H=2 D=128 (1 KiB row stride: packing cheaper): 4096x256 130.4, 2048x256 129.5, 1024x256
 *          130.3; strips of 24, 48 and 96 rows within the noise.
 * Before strips (2026-11-30; S and P of the whole query tile, Bq x Bk, had to fit in L2):
 *   D=128: 512x128 -> 551.6 ms (H=8); 1024x128 571.7, 1024x64 582.0, 512x64 587.6;
 *   D=64:  512x256 -> 317.9 ms, 512x128 324.6, 256x256 326.2, 128x256 348.4.
 * On AMD EPYC (Zen 5) with 1 MiB L2 (2026-11-29, before strips) the best tiles were 256x128 at
 * D=128 and D=64.
 */
fai_tiles fai_plan_tiles(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    const int64_t bk = key_tile_max(ci, dqk, dv, es);
    int64_t bq = 4096;
    while (bq > 16 && bq * (dqk + dv) * (int64_t)es > 2 * ci->l2)
        bq /= 2;
    const int64_t br = fai_plan_strip(ci, bk, es);
    return (fai_tiles){bq, bk, br < bq ? br : bq};
}

/*
 * The query rows a forward task takes: the plan's Bq, halved (down to one strip) while the
 * (batch, head, query tile) tasks number fewer than four per thread. Tasks are whole tiles and
 * threads take them dynamically, so four per thread bounds the imbalance by about a quarter
 * (the backward's single-pass rule below uses the same bound). The workspace keeps the plan's
 * size, and no row's result depends on its query tile, so results stay the same at every
 * thread count.
 */
int64_t fai_plan_forward_rows(fai_tiles tl, int64_t heads, int64_t sq, int threads)
{
    int64_t bq = tl.bq;
    while (bq / 2 >= tl.br && heads * ((sq + bq - 1) / bq) < 4 * (int64_t)threads)
        bq /= 2;
    return bq;
}

/*
 * Backward. Each pass holds five Bq x Bk tiles (S, dP, tanh, P~, dS) next to the key tile's
 * K, K^T, V, V^T and gradients and the query block's Q, dO, O, their transposes and dQ. Bk is
 * the panel bound; Bq the largest power of two up to 256 whose five tiles fit in 2/3 of L2.
 *
 * Measured (as the forward, --backward, 3 rounds): Emerald Rapids 2 MiB L2, D=128: rule
 * 256x256 -> 1922.6 ms; 128x256 1990.9, 256x128 2036.0, 512x128 2039.5, 512x64 2291.1;
 * D=64: rule 256x256 -> 1108.6 ms; 128x256 1120.7, 512x128 1133.3, 256x128 1139.9.
 * Zen 5 1 MiB L2, D=128 (2026-11-29): rule 128x256 -> 232 ms at N=2048 H=4, 128x64 287.
 */
fai_tiles fai_plan_tiles_backward(const fai_cache_info *ci, int64_t dqk, int64_t dv, size_t es)
{
    const int64_t bk = key_tile_max(ci, dqk, dv, es);
    const int64_t bq = floor_pow2((ci->l2 / 3 * 2) / (5 * bk * (int64_t)es));
    return (fai_tiles){clamp64(bq, 16, 256), bk, 0}; /* br: forward only */
}

/*
 * The backward in one pass (dQ accumulated per (b, kv head) as its key tiles go by) or in two
 * (dK/dV per key tile, then dQ per query tile, each recomputing S and dP): one pass does 5 tile
 * GEMMs per block pair where two do 7, and reads K and V once. It holds dQ of a kv head's
 * query heads (group x Sq x Dqk) per thread, so it is taken while that stays within 8 MiB and
 * while there are enough (b, kv head) tasks to share out: a multiple of the thread count, or
 * at least four per thread (the tasks are whole heads, so that bounds the imbalance by 1/4).
 *
 * Measured (bench_attention --backward, B=1 H=8 N=4096 f32, 1 thread, best of 3, Emerald
 * Rapids, 2026-11-30; FA_BACKWARD_PASSES forces either): D=128 two passes 2065.8 ms (0.53 of
 * SGEMM), one pass 1449.5 (0.76); D=64 1099.9 and 858.5.
 */
int fai_plan_backward_single_pass(int64_t tasks, int threads, int64_t dq_bytes)
{
    return dq_bytes <= ((int64_t)8 << 20) && (tasks % threads == 0 || tasks >= 4 * threads);
}
