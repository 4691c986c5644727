#!/bin/sh
# process grid and gradient buckets on 2 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 2 "$TS_BUILDDIR/tests/parallel/test_dp"
