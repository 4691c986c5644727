#!/bin/sh
# process grid and gradient buckets on 4 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 4 "$TS_BUILDDIR/tests/parallel/test_dp"
