#!/bin/sh
# Context parallelism over MPI: tests/check_mpi under mpirun with 1, 2, 3 and 4 ranks (one
# thread each; --oversubscribe, as a 2-core machine has fewer cores than ranks). A hang is a
# failure: each run has FA_MPI_TIMEOUT seconds (default 600).
set -u
bin=${top_builddir:-.}/tests/check_mpi
runner=${MPIRUN:-mpirun}
[ -x "$bin" ] || { echo "mpi.sh: $bin is not built (configure --with-mpi)"; exit 77; }
command -v "$runner" >/dev/null 2>&1 || { echo "mpi.sh: no $runner"; exit 77; }
root=
[ "$(id -u)" = 0 ] && root=--allow-run-as-root
status=0
for w in ${FA_MPI_RANKS:-1 2 3 4}; do
    echo "== $w rank(s)"
    OMP_NUM_THREADS=1 timeout "${FA_MPI_TIMEOUT:-600}" "$runner" $root --oversubscribe \
        --bind-to none --mca btl self,vader -np "$w" "$bin" ||
        { echo "mpi.sh: $w rank(s) failed"; status=1; }
done
exit $status
