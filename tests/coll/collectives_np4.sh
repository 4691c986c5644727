#!/bin/sh
# reduce-scatter, allgather, bcast on 4 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 4 "$TS_BUILDDIR/tests/coll/test_collectives"
