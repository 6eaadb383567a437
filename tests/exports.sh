#!/bin/sh
# The shared library exports exactly the functions flashattn.h declares FA_API (and, built
# --with-mpi, flashattn_mpi.h), nothing else.
lib="${top_builddir:-.}/.libs/libflashattn.so"
hdr="${srcdir:-.}/include/flashattn.h"
if grep -q '^#define FA_HAVE_MPI 1' "${top_builddir:-.}/config.h"; then
    hdr="$hdr ${srcdir:-.}/include/flashattn_mpi.h"
fi
[ -f "$lib" ] || { echo "no shared library at $lib"; exit 77; }
nm=${NM:-nm} # the build's nm (a cross build's reads the target's ELF)
command -v ${nm%% *} >/dev/null || { echo "no nm"; exit 77; }
want=$(sed -n 's/^FA_API[^(]*[ *]\(fa_[a-z0-9_]*\)(.*/\1/p' $hdr | sort)
got=$($nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}' | grep -v '^_' | sort)
if [ "$want" != "$got" ]; then
    echo "declared in flashattn.h but not exported, or exported but not declared:"
    printf '%s\n' "$want" > exports.want.tmp
    printf '%s\n' "$got" > exports.got.tmp
    diff exports.want.tmp exports.got.tmp
    rm -f exports.want.tmp exports.got.tmp
    exit 1
fi
echo "exports: $(printf '%s\n' "$got" | wc -l) fa_ functions, exactly the header's"
