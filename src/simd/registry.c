/*
 * Dispatch: the ISA registry (simd/isas.def) expanded into one table, newest set first.
 * Each entry holds the set's fa_isa, its name, its accessor where the set is built (configure
 * defines FA_HAVE_<NAME>_KERNELS to 1 or 0) and its detection (simd/cpu.c).
 */
#include "config.h"

#include <string.h>

#include "simd/kernels.h"

/* FAI_PICK(flag, yes, no): `yes` where flag is a macro defined to 1, `no` where it is 0. The
 * flag is expanded first (FAI_PICK), then pasted onto FAI_PICK_ (FAI_PICK_EXPANDED), so a
 * set that is not built leaves no reference to its accessor for the linker to resolve. */
#define FAI_PICK_0(yes, no) no
#define FAI_PICK_1(yes, no) yes
#define FAI_PICK_EXPANDED(flag, yes, no) FAI_PICK_##flag(yes, no)
#define FAI_PICK(flag, yes, no) FAI_PICK_EXPANDED(flag, yes, no)

typedef struct {
    fa_isa isa;
    const char *name;
    const fai_kernels_f32 *(*kernels)(void); /* NULL: not built */
    int (*cpu)(void);
} isa_entry;

static const isa_entry registry[] = {
#define FAI_ISA(name, NAME)                                                                     \
    {FA_ISA_##NAME, #name, FAI_PICK(FA_HAVE_##NAME##_KERNELS, fai_kernels_##name, NULL),       \
     fai_cpu_##name},
#include "simd/isas.def"
#undef FAI_ISA
};
#define NISA ((int)(sizeof registry / sizeof *registry))
#define FAI_ISA(name, NAME) +1
enum { NISA_LINES = 0
#include "simd/isas.def"
};
#undef FAI_ISA

/* The n entries hold the fa_isa values 1 .. n, each once: the sum of 2^isa over them is
 * 2 + 4 + ... + 2^n = 2^(n+1) - 2 exactly then (no value twice, none skipped). A value appended
 * to fa_isa without a line here is caught at run time instead: fa_isa_name calls it "invalid"
 * and fa_context_create refuses it (tests/check_api.c: isa_names_round_trip). */
#define FAI_ISA(name, NAME) +(1u << FA_ISA_##NAME)
_Static_assert((0
#include "simd/isas.def"
                ) == (2u << NISA_LINES) - 2,
               "simd/isas.def must hold the fa_isa values 1 .. n, each once");
#undef FAI_ISA

static const isa_entry *entry(fa_isa isa)
{
    for (int i = 0; i < NISA; i++)
        if (registry[i].isa == isa)
            return &registry[i];
    return NULL;
}

int fai_cpu_supports(fa_isa isa)
{
    const isa_entry *e = entry(isa);
    return e && e->cpu();
}

const fai_kernels_f32 *fai_kernels_for(fa_isa isa)
{
    const isa_entry *e = entry(isa);
    if (!e || !e->cpu() || !e->kernels)
        return NULL;
    return e->kernels();
}

fa_isa fai_isa_best(const char **why)
{
    const char *passed_over = NULL;
    for (int i = 0; i < NISA; i++) {
        if (!fai_kernels_for(registry[i].isa))
            continue;
        const char *rule;
        if (!fai_cpu_auto_takes(registry[i].isa, &rule)) {
            passed_over = rule;
            continue;
        }
        if (why)
            *why = rule ? rule : passed_over;
        return registry[i].isa;
    }
    if (why)
        *why = NULL;
    return FA_ISA_SCALAR;
}

const char *fai_isa_name(fa_isa isa)
{
    if (isa == FA_ISA_AUTO)
        return "auto";
    const isa_entry *e = entry(isa);
    return e ? e->name : "invalid";
}

fa_isa fai_isa_from_name(const char *name)
{
    for (int i = 0; i < NISA; i++)
        if (strcmp(registry[i].name, name) == 0)
            return registry[i].isa;
    return FA_ISA_AUTO;
}
