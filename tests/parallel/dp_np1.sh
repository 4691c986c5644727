#!/bin/sh
# process grid and gradient buckets on 1 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 1 "$TS_BUILDDIR/tests/parallel/test_dp"
