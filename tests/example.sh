#!/bin/sh
# The README's API example compiles against the installed-style header and runs.
set -e
src="${srcdir:-.}/examples/forward_backward.c"
out="${top_builddir:-.}/tests/example_forward_backward"
${CC:-cc} -Wall -Wextra -Werror -I"${srcdir:-.}/include" "$src" -o "$out" \
    "${top_builddir:-.}/.libs/libflashattn.so" -Wl,-rpath,"$(cd "${top_builddir:-.}/.libs" && pwd)"
$TEST_RUNNER "$out" | tee "$out.txt"
grep -q "backend=tiled" "$out.txt"
