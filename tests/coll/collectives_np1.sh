#!/bin/sh
# reduce-scatter, allgather, bcast on 1 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 1 "$TS_BUILDDIR/tests/coll/test_collectives"
