#!/bin/sh
# The README's API example compiles against the installed-style header and runs: linked to the
# shared library, or, in a static-only build (--disable-shared: CI's sanitizer builds), to the
# archive with the libraries libtool recorded for it.
set -e
src="${srcdir:-.}/examples/forward_backward.c"
out="${top_builddir:-.}/tests/example_forward_backward"
libs="${top_builddir:-.}/.libs"
if [ -f "$libs/libflashattn.so" ]; then
    lib="$libs/libflashattn.so -Wl,-rpath,$(cd "$libs" && pwd)"
else
    la="${top_builddir:-.}/libflashattn.la"
    lib="$libs/libflashattn.a $(sed -n "s/^inherited_linker_flags='\(.*\)'/\1/p" "$la")"
    lib="$lib $(sed -n "s/^dependency_libs='\(.*\)'/\1/p" "$la")"
fi
# with the build's compiler and flags: a sanitizer build's example links its runtime too
${CC:-cc} $CFLAGS -Wall -Wextra -Werror -I"${srcdir:-.}/include" "$src" -o "$out" $lib $LDFLAGS
$TEST_RUNNER "$out" | tee "$out.txt"
grep -q "backend=tiled" "$out.txt"
