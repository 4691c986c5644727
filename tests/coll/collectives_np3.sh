#!/bin/sh
# reduce-scatter, allgather, bcast on 3 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 3 "$TS_BUILDDIR/tests/coll/test_collectives"
