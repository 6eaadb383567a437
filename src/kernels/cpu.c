/*
 * Which kernel sets this CPU can run: CPUID for the instructions, XGETBV for the OS's promise
 * to save the registers (an AVX instruction on an OS that does not save YMM/ZMM state would
 * corrupt other threads' registers), and for AMX the OS's permission. Detected once; every
 * thread then reads the same answer.
 */
#include "config.h"

#include <pthread.h>

#include "kernels/kernels.h"

static int cpu_avx2, cpu_avx512, cpu_amx; /* x86 only; 0 elsewhere */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/*
 * Linux keeps the AMX tile data (XTILEDATA, state component 18) off until a process asks for
 * it; without the permission the first tile instruction faults. The grant is process-wide and
 * has a cost (every signal frame grows by the 8 KiB of tile state, and so does the minimum
 * alternate signal stack), so it is asked for only when the AMX set is about to be chosen,
 * once, and only by a build that carries AMX kernels.
 */
#if FA_HAVE_AMX_KERNELS
static int amx_granted;
static pthread_once_t amx_requested = PTHREAD_ONCE_INIT;

static void amx_request(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    const long req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    amx_granted = syscall(SYS_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0;
#endif
}
#endif

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
              f16c = (c >> 29) & 1;
    if (!osxsave)
        return; /* the OS does not expose XGETBV: no AVX state is saved */
    const uint64_t xcr0 = xgetbv0();
    const int os_ymm = (xcr0 & 0x6) == 0x6;     /* SSE and AVX (YMM) state */
    const int os_zmm = (xcr0 & 0xe6) == 0xe6;   /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    const int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1,
              avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    cpu_avx2 = os_ymm && avx && avx2 && fma && f16c;
    cpu_avx512 = os_zmm && cpu_avx2 && avx512f && avx512dq && avx512bw && avx512vl;
    /* AMX: the tile instructions and bf16 products (leaf 7 EDX), AVX512_BF16 for the P split
     * (leaf 7 subleaf 1 EAX), the OS saving tile config and data (XCR0 bits 17, 18) */
    const int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    const int os_tiles = ((xcr0 >> 17) & 3) == 3;
    if (!cpu_avx512 || !amx_bf16 || !amx_tile || !os_tiles ||
        !__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return;
    cpu_amx = (a >> 5) & 1; /* AVX512_BF16 */
}
#else
static void detect(void) {}
#endif

static pthread_once_t detected = PTHREAD_ONCE_INIT;

/* One predicate per line of kernels/isas.def: whether this CPU and OS can run the set. */
int fai_cpu_scalar(void) { return 1; }

int fai_cpu_avx2(void)
{
    pthread_once(&detected, detect);
    return cpu_avx2;
}

int fai_cpu_avx512(void)
{
    pthread_once(&detected, detect);
    return cpu_avx512;
}

/* The hardware, and the OS's permission (asked for here, once, where there are kernels to
 * run: a build without them has nothing to ask the OS for). */
int fai_cpu_amx(void)
{
    pthread_once(&detected, detect);
#if FA_HAVE_AMX_KERNELS
    if (cpu_amx)
        pthread_once(&amx_requested, amx_request);
    return cpu_amx && amx_granted;
#else
    return cpu_amx;
#endif
}

/* Advanced SIMD is part of every AArch64 core. */
int fai_cpu_neon(void)
{
#if defined(__aarch64__)
    return 1;
#else
    return 0;
#endif
}
