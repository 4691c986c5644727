#!/bin/sh
# allreduce correctness matrix on 8 ranks (every algorithm, dtype, op, count, in place or not)
. "$TS_SRCDIR/tests/mpi/lib.sh"
TS_TEST_TIMEOUT=${TS_TEST_TIMEOUT:-900}
ts_mpirun 8 "$TS_BUILDDIR/tests/coll/test_allreduce"
