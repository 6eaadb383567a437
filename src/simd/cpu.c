/*
 * Which kernel sets this CPU can run: CPUID for the instructions, XGETBV for the OS's promise
 * to save the registers (an AVX instruction on an OS that does not save YMM/ZMM state would
 * corrupt other threads' registers), and for AMX the OS's permission. Detected once; every
 * thread then reads the same answer.
 */
#include "config.h"

#include <pthread.h>

#include "simd/kernels.h"

static int cpu_avx2, cpu_avx512, cpu_avx512bf16, cpu_amx; /* x86 only; 0 elsewhere */
static int cpu_amd_family;                                /* AMD's family, else 0 */

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
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    const int amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163; /* "AuthenticAMD" */
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    /* the family: the base field, plus the extended one where the base is 0xf */
    const int base_family = (int)((a >> 8) & 0xf), extended_family = (int)((a >> 20) & 0xff);
    cpu_amd_family = amd ? base_family + (base_family == 0xf ? extended_family : 0) : 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
              f16c = (c >> 29) & 1;
    if (!osxsave)
        return; /* the OS does not expose XGETBV: no AVX state is saved */
    const uint64_t xcr0 = xgetbv0();
    const int os_ymm = (xcr0 & 0x6) == 0x6;     /* SSE and AVX (YMM) state */
    const int os_zmm = (xcr0 & 0xe6) == 0xe6;   /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    const unsigned leaf7_subleaves = a; /* the highest subleaf of leaf 7 */
    const int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1,
              avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    cpu_avx2 = os_ymm && avx && avx2 && fma && f16c;
    cpu_avx512 = os_zmm && cpu_avx2 && avx512f && avx512dq && avx512bw && avx512vl;
    /* AMX: the tile instructions and bf16 products (leaf 7 EDX), the OS saving tile config and
     * data (XCR0 bits 17, 18); on top of AVX512_BF16 (leaf 7 subleaf 1 EAX), whose set's
     * packing and exp the AMX set takes */
    const int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    const int os_tiles = ((xcr0 >> 17) & 3) == 3;
    if (!cpu_avx512 || leaf7_subleaves < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d))
        return;
    cpu_avx512bf16 = (a >> 5) & 1;
    cpu_amx = cpu_avx512bf16 && amx_bf16 && amx_tile && os_tiles;
}
#else
static void detect(void) {}
#endif

static pthread_once_t detected = PTHREAD_ONCE_INIT;

/* One predicate per line of simd/isas.def: whether this CPU and OS can run the set. */
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

int fai_cpu_avx512bf16(void)
{
    pthread_once(&detected, detect);
    return cpu_avx512bf16;
}

/*
 * Whether FA_ISA_AUTO takes a set this CPU runs, with the reason (*why, a sentence or NULL).
 * fai_cpu_bf16_dots_rule is the rule for AVX512_BF16 by AMD's family (0: not AMD), apart so
 * that the tests can ask it about CPUs they do not run on.
 * Every set but one is taken where it runs: each outruns the sets after it in the registry.
 * The exception is AVX512_BF16: its dot products take bf16 operands where the AVX-512 set
 * widens them to f32 first, and which is faster follows the core, not the feature bit. So a
 * CPU takes it only where it was measured faster. On a Zen 5 (AMD family 0x1a) a register-only
 * loop of 12 independent VDPBF16PS zmm chains ran at 475 GFLOP/s against 257 for VFMADD231PS
 * (1.85x; issue 19's measurement, docs/notes/bf16.md): taken. On an Emerald Rapids VM the same
 * loop ran at half the FMA rate, and on the GPU machine's Xeon (where AMX goes first) at
 * 0.4-0.6x, and this set ran the bf16 forward at 0.49x our f32 forward where widening ran at
 * 0.77x (D=128, 1 thread): Intel cores without AMX widen. Zen 4 (family 0x19) has not been
 * measured, nor has any later family: they widen until one is.
 */
int fai_cpu_bf16_dots_rule(int amd_family, const char **why)
{
    if (amd_family == 0x1a) {
        *why = "Zen 5: VDPBF16PS measured 1.85x the FMA rate";
        return 1;
    }
    *why = "VDPBF16PS not measured faster than widening here";
    return 0;
}

int fai_cpu_auto_takes(fa_isa isa, const char **why)
{
    pthread_once(&detected, detect);
    *why = NULL;
    return isa != FA_ISA_AVX512BF16 || fai_cpu_bf16_dots_rule(cpu_amd_family, why);
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
