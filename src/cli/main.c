/*
 * flashattn — the command: the float64 oracle and the library's backends on .npy files.
 * Subcommands: forward, backward, check, info, demo.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#ifdef HAVE_OPENBLAS_GET_CORENAME
char *openblas_get_corename(void);
#endif

const char *cli_blas_core(void)
{
#ifdef HAVE_OPENBLAS_GET_CORENAME
    return openblas_get_corename();
#else
    return "unknown";
#endif
}

static int usage(FILE *f, int code)
{
    fprintf(f, "usage: flashattn <command> [options]   (flashattn <command> --help)\n"
               "       flashattn --version | --help\n"
               "  check      compare a kernel's O, LSE, dQ, dK, dV (.npy) with the float64 reference\n"
               "  forward    run a backend on Q, K, V (.npy); write O and LSE\n"
               "  backward   run a backend's backward; write dQ, dK, dV\n"
               "  info       CPU features, chosen kernels, caches and tiles, version, CUDA\n"
               "  demo       conventional vs tiled: time, peak memory, error vs float64\n"
               "  --version  the library's version\n");
    return code;
}

/* The CPU's relevant features, from /proc/cpuinfo (Linux) — what the kernels could use. */
static void cpu_features(void)
{
    static const char *const wanted[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw",
                                         "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16",
                                         "asimd", "fphp", "bf16", NULL};
    char line[8192], model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    printf("cpu features:");
    int found = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10) && strchr(line, ':'))
            snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
        if (found || (strncmp(line, "flags", 5) && strncmp(line, "Features", 8)))
            continue;
        found = 1;
        for (int i = 0; wanted[i]; i++) {
            char pat[32];
            snprintf(pat, sizeof pat, " %s", wanted[i]);
            const char *at = strstr(line, pat);
            if (at && (at[strlen(pat)] == ' ' || at[strlen(pat)] == '\n'))
                printf(" %s", wanted[i]);
        }
    }
    if (f)
        fclose(f);
    model[strcspn(model, "\n")] = '\0';
    printf("%s\ncpu model: %s\n", found ? "" : " unknown", model);
}

int cmd_info(int argc, char **argv)
{
    if (argc > 0 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf("usage: flashattn info\nPrints the library version, CPU features, the backend, "
               "ISA and tiles it chooses here, cache sizes, OpenBLAS core, and CUDA status.\n");
        return EXIT_PASS;
    }
    if (argc > 0) {
        fprintf(stderr, "flashattn info: unexpected argument '%s'\n", argv[0]);
        return EXIT_USAGE;
    }
    fa_context *ctx;
    fa_status s = fa_context_create(NULL, &ctx);
    if (s != FA_OK)
        return cli_fail(s, "context");
    char line[4096]; /* the CUDA backend's launch plans make it long */
    fa_context_describe(ctx, line, sizeof line);
    fa_context_destroy(ctx);
    printf("flashattn %s\n", fa_version_string());
    cpu_features();
    printf("%s\nOpenBLAS core: %s\n", line, cli_blas_core());
    fa_options o;
    fa_options_init(&o);
    o.backend = FA_BACKEND_CUDA;
    s = fa_context_create(&o, &ctx);
    printf("CUDA: %s\n", s == FA_OK ? "built and usable" : fa_last_error());
#ifdef FA_FAULT_INJECTION
    printf("fault injection: FLASHATTN_FAULT_ALLOC (a test build)\n");
#endif
    if (s == FA_OK)
        fa_context_destroy(ctx);
    return EXIT_PASS;
}

int main(int argc, char **argv)
{
#ifdef FA_FAULT_INJECTION
    /* a test build: fail the reader's n-th allocation (tests/test_cli.py's fault loop) */
    const char *fault = getenv("FLASHATTN_FAULT_ALLOC");
    if (fault && *fault)
        npy_fault_arm(atol(fault));
#endif
    if (argc < 2)
        return usage(stderr, EXIT_USAGE);
    const char *cmd = argv[1];
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } cmds[] = {{"check", cmd_check}, {"forward", cmd_forward}, {"backward", cmd_backward},
                {"info", cmd_info},   {"demo", cmd_demo}};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        if (!strcmp(cmd, cmds[i].name))
            return cmds[i].run(argc - 2, argv + 2);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h"))
        return usage(stdout, EXIT_PASS);
    if (!strcmp(cmd, "--version")) {
        printf("flashattn %s\n", fa_version_string());
        return EXIT_PASS;
    }
    fprintf(stderr, "flashattn: unknown command '%s'\n", cmd);
    return usage(stderr, EXIT_USAGE);
}
