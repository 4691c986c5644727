#!/bin/sh
# allreduce correctness matrix on 2 ranks (every algorithm, dtype, op, count, in place or not)
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 2 "$TS_BUILDDIR/tests/coll/test_allreduce"
