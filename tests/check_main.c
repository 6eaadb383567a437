/*
 * One runner for every suite (each tests/check_<area>.c exports make_<area>_suite).
 *
 * FA_CHECK_JOBS=2 (make check sets it) runs the suites as two halves in two processes side by
 * side; unset or 1, in one. The halves are balanced by their times under qemu-aarch64, where
 * the suite is slowest (2026-12-02, seconds: backends 153, semantics 74, masks 65,
 * inference 45, kernels 31, memory 21, core 10, fp8 8, the rest 12 together): 219 s against
 * 199 s, where one process took 418 s.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const struct {
    Suite *(*make)(void);
    int half;
} suites[] = {
    {make_core_suite, 0},     {make_api_suite, 0},     {make_reference_suite, 0},
    {make_backends_suite, 0}, {make_semantics_suite, 1}, {make_inference_suite, 0},
    {make_memory_suite, 1},   {make_compare_suite, 0}, {make_npy_suite, 0},
    {make_kernels_suite, 1},  {make_faults_suite, 0},  {make_masks_suite, 1},
    {make_fp8_suite, 1},      {make_quant_suite, 0},
};

/* Runs the suites of one half (or every suite for half < 0): 1 when all passed. */
static int run_suites(int half)
{
    SRunner *sr = NULL;
    for (size_t i = 0; i < sizeof suites / sizeof *suites; i++) {
        if (half >= 0 && suites[i].half != half)
            continue;
        if (sr)
            srunner_add_suite(sr, suites[i].make());
        else
            sr = srunner_create(suites[i].make());
    }
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0;
}

int main(void)
{
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
