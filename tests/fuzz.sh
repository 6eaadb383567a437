#!/bin/sh
# The fuzz corpora replayed through their harnesses with the plain driver (tests/fuzz/fuzz.h):
# every input that ever found something stays a regression test.
set -e
for h in npy options api; do
    $TEST_RUNNER "${top_builddir:-.}/tests/fuzz/replay_$h" "${srcdir:-.}/tests/fuzz/corpus/$h"
done
