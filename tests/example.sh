#!/bin/sh
# The README's API example compiles against the installed-style header and runs.
set -e
src="${srcdir:-.}/examples/forward_backward.c"
out="${top_builddir:-.}/tests/example_forward_backward"
# with the build's compiler and flags: a sanitizer build's example links its runtime too
${CC:-cc} $CFLAGS -Wall -Wextra -Werror -I"${srcdir:-.}/include" "$src" -o "$out" \
    "${top_builddir:-.}/.libs/libflashattn.so" -Wl,-rpath,"$(cd "${top_builddir:-.}/.libs" && pwd)" \
    $LDFLAGS
$TEST_RUNNER "$out" | tee "$out.txt"
grep -q "backend=tiled" "$out.txt"
