#!/bin/sh
# spatial plan and halo exchange on every Cartesian layout of 3 rank(s)
. "$TS_SRCDIR/tests/mpi/lib.sh"
ts_mpirun 3 "$TS_BUILDDIR/tests/parallel/test_spatial"
