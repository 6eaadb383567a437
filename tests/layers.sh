#!/bin/sh
# The tree's layers hold (docs/DESIGN.md §3), read off the built objects and the sources:
#  1. an object of a layer uses only what objects of its own layer or a layer below define,
#     in the order base < simd < backends = cuda < api < mpi (core/ is headers: it has no
#     objects; cuda/ is a backend beside backends/, the two using each other: the registry
#     lists the CUDA backend, which runs groups as every backend does; mpi/, context
#     parallelism, is made of api's calls);
#  2. no two objects depend on each other, directly or through others (no include circle
#     reaches the link either);
#  3. every public fa_ symbol is defined in src/api/ (flashattn_mpi.h's in src/mpi/);
#  4. intrinsic headers are included only in src/simd/;
#  5. the backends address tensor rows only through the accessors of src/backends/rows.h
#     (fai_q_rows, fai_kv_rows, ...): no fai_row() and no io[] outside it (and problem.h,
#     which declares io[]).
set -u
: "${top_builddir:=.}" "${srcdir:=.}" "${NM:=nm}"
status=0

objs=$(find "$top_builddir/src" -name '*.o' ! -path '*/.libs/*' ! -path '*/cli/*' | sort)
[ -n "$objs" ] || { echo "layers: no objects under $top_builddir/src"; exit 99; }

for o in $objs; do
    $NM "$o" | sed "s|^|$o |"
done | awk -v root="$top_builddir/src/" '
function layer(o,    p) { p = substr(o, length(root) + 1); sub(/\/.*/, "", p); return p }
function rank(l) { return l == "base" ? 0 : l == "simd" ? 1 : l == "backends" || l == "cuda" ? 2 : l == "api" ? 3 : l == "mpi" ? 4 : 9 }
function short(o) { return substr(o, length(root) + 1) }
{
    o = $1
    if (NF == 4 && $3 ~ /^[TDBRCV]$/) { def[$4] = o; if ($4 ~ /^fa_/) pub[$4] = o }
    else if (NF == 3 && $2 == "U") uses[o, ++nu[o]] = $3
    seen[o] = 1
}
function visit(v,    i, w) {
    state[v] = 1
    for (i = 1; i <= nu[v]; i++) {
        if (!((v, i) in uses) || !(uses[v, i] in def)) continue
        w = def[uses[v, i]]
        if (w == v) continue
        if (state[w] == 1) { printf "layers: circle through %s -> %s\n", short(v), short(w); bad = 1 }
        else if (!state[w]) visit(w)
    }
    state[v] = 2
}
END {
    for (o in seen)
        for (i = 1; i <= nu[o]; i++) {
            s = uses[o, i]
            if (!(s in def)) continue
            if (rank(layer(def[s])) > rank(layer(o))) {
                printf "layers: %s (%s) uses %s of %s (%s, a layer above)\n", short(o), layer(o), s, short(def[s]), layer(def[s])
                bad = 1
            }
        }
    for (o in seen) if (!state[o]) visit(o)
    for (s in pub) {
        home = s ~ /^fa_cp_/ ? "mpi" : "api"
        if (layer(pub[s]) != home) { printf "layers: public %s is defined in %s, not in src/%s/\n", s, short(pub[s]), home; bad = 1 }
    }
    n = 0; for (o in seen) n++
    printf "layers: %d objects read\n", n
    exit bad
}' || status=1

hits=$(grep -rln -e '<immintrin.h>' -e '<arm_neon.h>' -e '<x86intrin.h>' "$srcdir/src" | grep -v "/src/simd/")
if [ -n "$hits" ]; then
    echo "layers: intrinsic headers outside src/simd/: $hits"
    status=1
fi

hits=$(grep -rn -e 'fai_row(' -e 'io\[' "$srcdir/src/backends" "$srcdir/src/cuda" |
    grep -v -e "src/backends/rows.h:" -e "src/backends/problem.h:")
if [ -n "$hits" ]; then
    echo "layers: rows addressed outside backends/rows.h's accessors:"
    echo "$hits"
    status=1
fi
exit $status
