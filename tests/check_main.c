/*
 * One runner for every suite (each tests/check_<area>.c exports make_<area>_suite).
 *
 * FA_CHECK_JOBS=2 (make check sets it) runs the suites as two halves in two processes side by
 * side; unset or 1, in one. The halves are balanced by their times under qemu-aarch64, where
 * the suite is slowest (2026-12-07, a Zen 4, one suite at a time as the cross build's make
 * check runs them, seconds: backends 114, masks 103, semantics 96, inference 48, kernels 43,
 * memory 27, core 12, fp8 12, quant 9, api 9, faults 5, the rest 4 together; compare 164,
 * but that make check leaves it out): 231 s against 252 s.
 *
 * FA_CHECK_SKIP=name,name,... leaves those suites out (the cross build's make check under qemu
 * leaves out `compare`: the oracle's statistics are portable C over OpenBLAS, run by the
 * native and sanitizer builds, and took 40% of the emulated run).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const struct {
    const char *name; /* as suite_create names it */
    Suite *(*make)(void);
    int half;
} suites[] = {
    {"core", make_core_suite, 0},         {"api", make_api_suite, 0},
    {"reference", make_reference_suite, 0}, {"backends", make_backends_suite, 0},
    {"semantics", make_semantics_suite, 1}, {"inference", make_inference_suite, 0},
    {"memory", make_memory_suite, 1},     {"compare", make_compare_suite, 0},
    {"npy", make_npy_suite, 0},           {"kernels", make_kernels_suite, 0},
    {"faults", make_faults_suite, 1},     {"masks", make_masks_suite, 1},
    {"fp8", make_fp8_suite, 1},           {"quant", make_quant_suite, 1},
};

#define NSUITES (sizeof suites / sizeof *suites)

/* The suites FA_CHECK_SKIP leaves out (read_skips). */
static int skip[NSUITES];

/* Reads FA_CHECK_SKIP (names separated by commas; empty ones ignored) into skip[], saying
 * which suites it leaves out; 0 and a message where it names no suite (a typo). */
static int read_skips(void)
{
    const char *list = getenv("FA_CHECK_SKIP");
    for (const char *p = list; p && *p; p += *p == ',') {
        const size_t n = strcspn(p, ",");
        size_t i = 0;
        while (n > 0 && i < NSUITES &&
               (strlen(suites[i].name) != n || strncmp(p, suites[i].name, n) != 0))
            i++;
        if (i == NSUITES) {
            fprintf(stderr, "check_flashattn: FA_CHECK_SKIP names no suite: %.*s\n", (int)n, p);
            return 0;
        }
        if (n > 0 && !skip[i])
            fprintf(stderr, "check_flashattn: leaving out suite %s (FA_CHECK_SKIP)\n",
                    suites[i].name);
        skip[i] |= n > 0;
        p += n;
    }
    return 1;
}

/* Runs the suites of one half (or every suite for half < 0): 1 when all passed. */
static int run_suites(int half)
{
    SRunner *sr = NULL;
    for (size_t i = 0; i < NSUITES; i++) {
        if ((half >= 0 && suites[i].half != half) || skip[i])
            continue;
        if (sr)
            srunner_add_suite(sr, suites[i].make());
        else
            sr = srunner_create(suites[i].make());
    }
    if (!sr) /* every suite of this half skipped */
        return 1;
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0;
}

int main(void)
{
    if (!read_skips())
        return EXIT_FAILURE;
    const char *jobs = getenv("FA_CHECK_JOBS");
    if (!jobs || strcmp(jobs, "2") != 0)
        return run_suites(-1) ? EXIT_SUCCESS : EXIT_FAILURE;
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
        perror("check_flashattn: fork (running the halves one after the other)");
        return run_suites(-1) ? EXIT_SUCCESS : EXIT_FAILURE;
    }
    if (pid == 0) /* exit, not _exit: stdout's buffer and LeakSanitizer's check run at exit */
        exit(run_suites(1) ? EXIT_SUCCESS : EXIT_FAILURE);
    int ok = run_suites(0), status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != EXIT_SUCCESS) {
        fprintf(stderr, "check_flashattn: the second half failed\n");
        ok = 0;
    }
    return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
