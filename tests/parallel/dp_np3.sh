#!/bin/sh
# process grid and gradient buckets on 3 ranks
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 3 "$TS_BUILDDIR/tests/parallel/test_dp"
