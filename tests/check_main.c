/* One runner for every suite (each tests/check_<area>.c exports make_<area>_suite). */
#include "config.h"

#include <stdlib.h>

#include "harness.h"

int main(void)
{
    SRunner *sr = srunner_create(make_core_suite());
    srunner_add_suite(sr, make_api_suite());
    srunner_add_suite(sr, make_reference_suite());
    srunner_add_suite(sr, make_backends_suite());
    srunner_add_suite(sr, make_semantics_suite());
    srunner_add_suite(sr, make_inference_suite());
    srunner_add_suite(sr, make_memory_suite());
    srunner_add_suite(sr, make_compare_suite());
    srunner_add_suite(sr, make_npy_suite());
    srunner_add_suite(sr, make_kernels_suite());
    srunner_add_suite(sr, make_faults_suite());
    srunner_add_suite(sr, make_masks_suite());
    srunner_add_suite(sr, make_fp8_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
