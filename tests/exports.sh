#!/bin/sh
# Only the public fa_* API may be exported from the shared library.
lib="${top_builddir:-.}/.libs/libflashattn.so"
[ -f "$lib" ] || { echo "no shared library at $lib"; exit 77; }
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | grep -v '^fa_' | grep -v '^_')
if [ -n "$bad" ]; then
    echo "symbols exported outside the fa_ prefix:"; echo "$bad"; exit 1
fi
n=$(nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^fa_/' | wc -l)
[ "$n" -ge 20 ] || { echo "only $n fa_ functions exported"; exit 1; }
echo "exports: $n fa_ functions, nothing else"
